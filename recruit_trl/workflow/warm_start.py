"""The SFT warm start: imitate a teacher policy's decisions, rendered exactly like the RL prompts.

Both recipes run this pipeline: ``recipes/sft_clinical.py`` on its own (:func:`train_sft`), and the GRPO and
REINFORCE recipes before RL (:func:`run_warm_start`, into ``<output_dir>/sft``). Its steps:

1. Data: teacher traces on the training seeds (balanced by action type within each task) and the held-out seeds
   (untouched), as conversational prompt/completion rows (:func:`recruit_trl.workflow.sft_data.build_sft_datasets`), or
   with ``--sft_data teacher_sets`` the teacher decision sets' ``train`` and ``heldout`` splits
   (:func:`recruit_trl.workflow.sft_data.teacher_set_datasets`, the sets kept in ``<output_dir>/dataset/sets``); saved
   to ``<output_dir>/dataset`` and reused on re-runs.
2. ``SFTTrainer`` trains a LoRA adapter on the completions only (``use_peft`` false: every weight, which suits the
   tiny model, whose LoRA lacks the capacity to condition on the state). For a small vocabulary the loss is the
   model's own cross-entropy (``--sft_token_metrics``; see :class:`WarmStartSFTTrainer`).
3. DAgger (``dagger_rounds``): the student plays the DAgger seeds itself, the teacher labels every state it
   reaches, and training continues on all data so far (``dagger_epochs``); each round is cached in
   ``<output_dir>/round-K``. The last round's student plays those seeds too, and the round whose student scored
   best is kept (``--sft_keep_best_round``): its adapter (or model) and the tokenizer are saved to the output folder.
4. Held-out report (``<output_dir>/heldout_report.json``): teacher match (also by task and teacher action type),
   strict-JSON and valid-action rates, predicted vs teacher action-type distributions. With ``--sft_data teacher_sets``
   the set benchmark scores the held-out rows (:func:`benchmark_sft`; the RL report's), and this report keeps the
   data's and the model's facts only.

Every step's output is vouched for by a marker written after it (atomically): the held-out report for the whole run,
``stats.json`` for the data, ``info.json`` for a DAgger round's rows. A marker that is missing or torn, or weights
that do not open, redo the step.
"""

from __future__ import annotations

import copy
import json
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from transformers import AutoTokenizer, Trainer
from trl import ModelConfig, SFTConfig, SFTTrainer, get_peft_config

from recruit_trl.files import read_json, write_json_atomic
from recruit_trl.models.batching import length_bucketed_batches
from recruit_trl.models.loading import (
    is_trained,
    load_trainable,
    loading_config,
    model_fingerprint,
    model_summary,
    used_settings,
    whole_models,
)
from recruit_trl.ranges import parse_int_ranges
from recruit_trl.rollout.config import PromptConfig
from recruit_trl.training.distributed import release_accelerator
from recruit_trl.training.trl_api import check_trl_private_api
from recruit_trl.workflow.arguments import WarmStartArguments
from recruit_trl.workflow.configs import WarmStart
from recruit_trl.workflow.decisions.benchmark import format_result, run_benchmark
from recruit_trl.workflow.decisions.teacher_sets import SetConfig
from recruit_trl.workflow.model_card import sft_model_card, write_model_card
from recruit_trl.workflow.model_setup import RunSetup, full_finetune, last_checkpoint, model_init_kwargs
from recruit_trl.workflow.sft_data import (
    balance_action_types,
    best_round,
    build_sft_datasets,
    dagger_rows,
    heldout_report,
    kept_rows_warning,
    mean_over_tasks,
    teacher_set_datasets,
    to_conversational,
)

check_trl_private_api()  # WarmStartSFTTrainer overrides a private SFTTrainer method: refuse a TRL that changed it

# Written beside each round's weights: the settings its trainer ran with (recruit_trl.models.loading.used_settings).
SETTINGS_FILE = "training_settings.json"


def train_sft(
    prompts: PromptConfig, warm: WarmStartArguments, training_args: SFTConfig, model_args: ModelConfig, setup: RunSetup
) -> dict:
    """Run the warm start into ``training_args.output_dir`` (or reuse what is finished there); returns the held-out
    report.

    ``prompts`` are the run's environment and prompt settings, ``warm`` the warm start's own; ``setup`` holds what the
    run resolved once (:func:`~recruit_trl.workflow.model_setup.setup_run`): the environment interface, the tasks and
    the base model (``tiny`` built and cached, ``smollm2`` unpacked); ``model_args`` says how the model is loaded and
    whether it trains a LoRA adapter.
    """
    model_path = setup.model_path
    out = Path(training_args.output_dir)
    finished = read_json(out / "heldout_report.json")
    if finished is not None and is_trained(out):
        print(f"SFT already finished in {out}; delete the folder to train again")
        write_model_card(out, sft_model_card(prompts, warm, training_args, model_args, setup, finished))
        return finished

    # 1. Teacher traces (or decision sets) -> train / held-out chat datasets (reused when already on disk).
    # Files the processes share are made by the main process while the others wait, then read by them: the traces,
    # a DAgger student's play, the kept model and its report.
    state = PartialState()
    data_dir = out / "dataset"
    with state.main_process_first():
        stats = read_json(data_dir / "stats.json")
        if stats is not None:
            from datasets import load_from_disk

            train, heldout = load_from_disk(str(data_dir / "train")), load_from_disk(str(data_dir / "heldout"))
        else:
            train, heldout, stats = sft_datasets(prompts, warm, setup, data_dir, training_args.seed)
            train.save_to_disk(str(data_dir / "train"))
            heldout.save_to_disk(str(data_dir / "heldout"))
            write_json_atomic(data_dir / "stats.json", stats)
    print(data_summary(stats))

    # 2. Model and fine-tuning on the completions (round 0), then DAgger rounds on the model's own states.
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    if "quantization_config" in training_args.model_init_kwargs and not model_args.use_peft:
        raise ValueError(
            "a quantised model (--load_in_4bit/--load_in_8bit) trains a LoRA adapter: drop --use_peft false"
        )
    loading = loading_config(model_args)  # the students play loaded as they were trained (e.g. 4-bit)
    rounds = warm.dagger_rounds
    data, model, dagger = train, None, []
    for r in range(rounds + 1):
        round_dir = round_dirs(out, rounds)[r]
        if r > 0:  # the previous round's student plays; the teacher labels the states it reaches
            previous, cache = out / f"round-{r - 1}", data_dir / f"dagger-{r}"
            with state.main_process_first():
                data, info = dagger_data(prompts, warm, setup, data, previous, cache, loading)
            dagger.append({"round": r, **info})
        if is_trained(round_dir) and round_dir != out:
            print(f"DAgger round {r} already trained in {round_dir}")
            model = None
            continue
        if model is None and r > 0:
            model = load_trainable(model_path, out / f"round-{r - 1}", training_args.model_init_kwargs)
        args = copy.deepcopy(training_args)
        args.output_dir = str(round_dir)
        if r > 0:
            args.num_train_epochs, args.max_steps = warm.dagger_epochs, -1  # a step cap is the first fit's
        trainer = WarmStartSFTTrainer(
            model_loss=not warm.sft_token_metrics,
            length_buckets=warm.sft_length_buckets,
            model=model if model is not None else model_path,
            args=args,
            train_dataset=data.remove_columns(["task", "seed", "day", "action_type", "candidate_types"]),
            processing_class=tokenizer,
            peft_config=get_peft_config(model_args) if model is None else None,
        )
        trainer.train(resume_from_checkpoint=last_checkpoint(args.output_dir))
        trainer.save_model(args.output_dir)
        settings = used_settings(trainer, script=prompts, warm_start=warm, model_config=model_args)
        write_json_atomic(round_dir / SETTINGS_FILE, settings)
        # The next round's students load this round's weights on every rank: none reads them before rank 0 has
        # written them (save_model writes on the main process only, without a barrier).
        trainer.accelerator.wait_for_everyone()
        # Under DeepSpeed the trainer's model holds this process's shard (ZeRO-3): the next round reads the weights.
        model = None if trainer.is_deepspeed_enabled else trainer.model
        release_accelerator()  # the next trainer's Accelerator is the process's only one
    selected, selection = rounds, None
    if rounds > 0 and warm.sft_keep_best_round:
        scores = [{task: v["final_score_mean"] for task, v in d["student"].items()} for d in dagger]
        with state.main_process_first():
            scores.append(last_round_scores(prompts, warm, setup, out / f"round-{rounds}", data_dir, loading))
        selected = best_round(scores)
        summary = ", ".join(f"round {r}: {mean_over_tasks(s):.3f}" for r, s in enumerate(scores))
        print(f"DAgger students' mean final scores ({summary}); keeping round {selected}")
        selection = {"student_scores": scores, "selected_round": selected}
    if state.is_main_process:
        report = kept_model_report(
            prompts, warm, training_args, model_args, setup, model, selected, tokenizer, heldout
        )
        report.update(data=stats, dagger=dagger, round_selection=selection)
        # Each round's settings, as its trainer, optimizer and model held them.
        report["arguments"] = [read_json(folder / SETTINGS_FILE) for folder in round_dirs(out, rounds)]
        write_json_atomic(out / "heldout_report.json", report)
        # Ours over TRL's card (written at each checkpoint) and PEFT's (written with the adapter).
        write_model_card(out, sft_model_card(prompts, warm, training_args, model_args, setup, report))
        print(json.dumps({k: v for k, v in report.items() if k != "data"}, indent=2))
    state.wait_for_everyone()
    return read_json(out / "heldout_report.json")


def kept_model_report(
    prompts: PromptConfig,
    warm: WarmStartArguments,
    training_args: SFTConfig,
    model_args: ModelConfig,
    setup: RunSetup,
    model: Any,
    selected: int,
    tokenizer: Any,
    heldout: Any,
) -> dict[str, Any]:
    """Save the kept round's model (``model``, or round ``selected`` read back when None or another round) into
    ``training_args.output_dir`` with its tokenizer; returns its held-out report. The main process does this alone."""
    out = Path(training_args.output_dir)
    with whole_models():
        if model is None or selected != warm.dagger_rounds:  # cached, under DeepSpeed, or an earlier round kept
            model = load_trainable(setup.model_path, out / f"round-{selected}", training_args.model_init_kwargs)
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        return held_out_scores(prompts, warm, model, tokenizer, heldout)


def held_out_scores(prompts: PromptConfig, warm: WarmStartArguments, model: Any, tokenizer: Any, heldout: Any) -> dict:
    """The kept model's held-out report and its size; the teacher decision sets' held-out split is scored by the set
    benchmark instead (the same greedy answers, in benchmark.json or the RL report): a real model on CPU takes about
    a second a row."""
    model.eval()
    tokenizer.padding_side = "left"
    if 0 < warm.sft_heldout_rows < len(heldout):  # a fixed subset
        heldout = heldout.shuffle(seed=0).select(range(warm.sft_heldout_rows))
    if warm.sft_data == "teacher_sets":
        report = {"heldout": "scored by the set benchmark"}
    else:
        report = heldout_report(model, tokenizer, heldout, prompts.contract)
    report["model"] = model_summary(model)
    return report


def data_summary(stats: dict[str, Any]) -> str:
    """The warm start's line about its data (the stats of :func:`sft_datasets`): the train rows, before balancing, and
    the held-out rows; under it a warning naming ``--sft_max_type_fraction`` when balancing by action type kept less
    than half of the teacher's rows (:func:`~recruit_trl.workflow.sft_data.kept_rows_warning`).

    The teacher decision sets keep no count of their rows before the cap, so their line gives the cap instead."""
    if stats.get("data") == "teacher_sets":
        share = stats["sets"]["max_share"]
        cap = f", no decision phase above {share} of it (--sft_max_type_fraction)" if share < 1 else ""
        return (
            f"SFT data: {stats['train_rows']} train rows (the teacher decision sets' train split{cap}), "
            f"{stats['heldout_rows']} held out"
        )
    line = (
        f"SFT data: {stats['train_rows']} train rows ({stats['train_rows_raw']} before balancing), "
        f"{stats['heldout_rows']} held out"
    )
    warning = kept_rows_warning(stats["train_rows"], stats["train_rows_raw"], stats.get("max_type_fraction"))
    return line if warning is None else f"{line}\n{warning}"


def round_dirs(out: Path, rounds: int) -> list[Path]:
    """The folders the warm start trains its rounds in: ``out`` itself without DAgger, else ``out/round-K``."""
    return [out] if rounds == 0 else [out / f"round-{r}" for r in range(rounds + 1)]


def benchmark_sft(
    prompts: PromptConfig,
    warm: WarmStartArguments,
    training_args: SFTConfig,
    model_args: ModelConfig,
    setup: RunSetup,
    report: dict,
) -> dict:
    """With ``--sft_data teacher_sets``: the benchmark table
    (:func:`recruit_trl.workflow.decisions.benchmark.run_benchmark`) of the base model, the trained one, the safe agent
    and the teacher on the ``fixed`` and ``heldout`` sets (``--sft_heldout_rows`` of them when set; free decoding, the
    constrained teacher match beside it), printed, added to ``report`` and written to ``<output_dir>/benchmark.json``
    (reused while the weights are the same). Returns ``report``.
    """
    if warm.sft_data != "teacher_sets":
        return report
    out = Path(training_args.output_dir)
    policies = {"base": f"model:{setup.model_path}", "sft": f"model:{out}", "safe": "safe"}
    policies[warm.teacher] = warm.teacher
    config = set_config(prompts, warm, setup.tasks)
    key = {
        "sets": config.key(), "policies": policies, "max_rows": warm.sft_heldout_rows,
        "weights": {"base": model_fingerprint(setup.model_path), "sft": model_fingerprint(out)},
    }  # fmt: skip
    cached = read_json(out / "benchmark.json")
    if isinstance(cached, dict) and cached.get("key") == key:
        result = cached["result"]
    else:
        loading = loading_config(model_args)
        result = benchmark_sets(config, policies, out / "dataset", warm.sft_heldout_rows, loading)
        write_json_atomic(out / "benchmark.json", {"key": key, "result": result})
    print(format_result(result))
    report["benchmark"] = result["benchmark"]
    return report


def benchmark_sets(
    config,
    policies: dict[str, str],
    data_dir: Path,
    max_rows: int,
    model_loading: dict,
    constrained: bool = True,
    base_heldout: bool = True,
) -> dict:
    """The benchmark table (:func:`recruit_trl.workflow.decisions.benchmark.run_benchmark`) of ``policies`` on the
    ``fixed`` and ``heldout`` teacher decision sets of ``config`` kept in ``data_dir/sets`` (``max_rows`` of each when
    set; free decoding, with ``constrained`` the constrained teacher match beside it; without ``base_heldout`` the
    ``base`` label on the fixed set only, as the anchor's table): the SFT recipe's and the RL report's."""
    return run_benchmark(
        config, policies, ["fixed", "heldout"], Path(data_dir) / "sets", constrained=constrained, max_rows=max_rows,
        model_loading=model_loading, policy_sets=None if base_heldout else {"base": ["fixed"]},
    )  # fmt: skip


def sft_datasets(prompts: PromptConfig, warm: WarmStartArguments, setup: RunSetup, data_dir: Path, seed: int):
    """(train, held-out, stats) of ``--sft_data``: teacher traces balanced by action type, or the teacher decision sets
    (built under ``data_dir/sets``)."""
    if warm.sft_data == "teacher_sets":
        config = set_config(prompts, warm, setup.tasks)
        return teacher_set_datasets(setup.interface, config, data_dir / "sets")
    return build_sft_datasets(
        setup.interface,
        setup.tasks,
        parse_int_ranges(warm.sft_train_seeds),
        parse_int_ranges(warm.sft_heldout_seeds),
        teacher=warm.teacher,
        contract=prompts.contract,
        recent_k=prompts.recent_k,
        epsilon=warm.sft_epsilon,
        max_type_fraction=warm.sft_max_type_fraction,
        balance_by="task" if warm.sft_balance_by_task else None,
        seed=seed,
    )


def set_config(prompts: PromptConfig, warm: WarmStartArguments, tasks: Sequence[str]) -> SetConfig:
    """The :class:`recruit_trl.workflow.decisions.teacher_sets.SetConfig` of ``--sft_data teacher_sets``: the
    environment and prompts of ``prompts``, ``tasks``, the teacher and seeds of ``warm``, the benchmark's sizes (a
    100-row fixed set, a 1,000-row held-out set) and ``--sft_max_type_fraction`` as the largest share of a stratum."""
    return SetConfig(
        env=prompts.env_name,
        tasks=tuple(tasks),
        teacher=warm.teacher,
        train_seeds=tuple(parse_int_ranges(warm.sft_train_seeds)),
        fixed_seeds=tuple(parse_int_ranges(warm.sft_fixed_seeds)),
        heldout_seeds=tuple(parse_int_ranges(warm.sft_heldout_seeds)),
        max_share=warm.sft_max_type_fraction,
        recent_k=prompts.recent_k,
    )


def run_warm_start(
    script_args: Any, warm_start: WarmStart, training_args: Any, model_args: ModelConfig, setup: RunSetup
) -> str:
    """The RL recipes' warm start: :func:`train_sft` into ``<output_dir>/sft`` (skipped when already finished
    there) with the SFT config ``warm_start`` (:func:`recruit_trl.workflow.configs.read_warm_start`); returns that
    folder.

    It is the SFT recipe run with that config on this RL run's footing: ``script_args``' environment and prompts,
    ``setup``'s tasks and base model, ``model_args`` (the model loaded and its LoRA adapter shaped exactly as RL will
    load and continue it) and ``training_args``' seed, precision and device. From the config come the teacher, its
    data and DAgger (``warm_start.warm``), the budget and the trainer's settings (``warm_start.training``) and whether
    every weight trains (its ``use_peft``).
    """
    # activation_checkpointing, not its deprecated alias gradient_checkpointing (a config given the old name warns),
    # where transformers has it (not before 5.18, which vLLM's CPU build pins)
    names = ("activation_checkpointing", "gradient_checkpointing")
    checkpointing = next(name for name in names if hasattr(training_args, name))
    shared = ("seed", "bf16", "fp16", "use_cpu", checkpointing, "model_init_kwargs")
    sft_config = replace(
        warm_start.training,
        **{k: getattr(training_args, k) for k in shared},
        output_dir=str(Path(training_args.output_dir) / "sft"),
    )
    sft_model_args = replace(model_args, model_name_or_path=setup.model_path, use_peft=warm_start.model.use_peft)
    full_finetune(sft_model_args)  # refuses every weight of a quantised model
    train_sft(script_args, warm_start.warm, sft_config, sft_model_args, setup)
    return sft_config.output_dir


class WarmStartSFTTrainer(SFTTrainer):
    """``SFTTrainer`` with two savings for small models on CPU, each optional.

    Args:
        model_loss: train on the model's own cross-entropy over the labelled (completion) tokens. TRL's loss runs
            a chunked log-softmax over every position to log entropy and token accuracy as well; with a
            vocabulary of a few hundred tokens the full logits are cheap and that pass costs about a fifth of each
            step on CPU. The loss is the same quantity (summed over the completion tokens, divided by their
            count); only the two metrics are not logged.
        length_buckets: batches of rows of similar lengths (:class:`LengthBucketSampler`) instead of random ones.
    """

    def __init__(self, *args, model_loss: bool = False, length_buckets: bool = False, **kwargs):
        self.model_loss, self.length_buckets = model_loss, length_buckets
        super().__init__(*args, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        plain = self.args.loss_type == "nll" and self.compute_loss_func is None and self.label_smoother is None
        if not (self.model_loss and plain):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        inputs["use_cache"] = False
        return Trainer.compute_loss(self, model, inputs, return_outputs, num_items_in_batch)

    def _get_train_sampler(self, train_dataset=None):
        if not self.length_buckets:
            return super()._get_train_sampler(train_dataset)
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        lengths = [len(ids) for ids in dataset["input_ids"]]
        return LengthBucketSampler(lengths, self.args.per_device_train_batch_size, self.args.seed)


class LengthBucketSampler(torch.utils.data.Sampler):
    """Indices whose consecutive runs of ``batch_size`` are batches of similar lengths, the batches in random order.

    Every epoch: shuffle, sort within pools of 32 batches, cut into batches, shuffle the batches (the tiny model's
    warm-up does the same, :func:`recruit_trl.models.batching.length_bucketed_batches`); a short batch goes last, so
    the data loader's cuts fall on batch boundaries. Random batches of 16 pad every row to about 520 tokens here
    against a mean of 376. Unlike transformers' ``group_by_length``, which plays each sorted pool from its longest
    batch to its shortest, consecutive steps do not march through one range of lengths. Off by default in the SFT
    recipe: a batch of similar lengths is a batch of similar days and tasks, and a warm start that kept its last
    DAgger round collapsed on medium with either order (greedy 0.330 with this one, 0.349 with ``group_by_length``).
    The main job uses it together with ``keep_best_round``, which keeps an earlier round when the last one collapses.
    """

    def __init__(self, lengths: list[int], batch_size: int, seed: int = 0) -> None:
        self.lengths, self.batch_size, self.seed, self.epoch = lengths, batch_size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        rng = random.Random(self.seed * 1_000_003 + self.epoch)
        batches = list(length_bucketed_batches(self.lengths, self.batch_size, rng))
        for batch in sorted(batches, key=lambda b: len(b) < self.batch_size):  # stable: full batches keep their order
            yield from batch


def dagger_data(
    prompts: PromptConfig,
    warm: WarmStartArguments,
    setup: RunSetup,
    data,
    policy_dir: Path,
    cache: Path,
    loading=None,
):
    """All data so far plus the teacher-labelled states that the adapter in ``policy_dir`` reaches (cached);
    ``loading`` loads the student as it was trained (:func:`recruit_trl.models.loading.loading_config`)."""
    from datasets import concatenate_datasets, load_from_disk

    info = read_json(cache / "info.json")
    if info is not None:
        rows = load_from_disk(str(cache / "rows"))
    else:
        labelled, student = dagger_rows(
            str(policy_dir),
            setup.interface,
            setup.tasks,
            parse_int_ranges(warm.dagger_seeds),
            teacher=warm.teacher,
            contract=prompts.contract,
            recent_k=prompts.recent_k,
            env=prompts.env_name,
            model_loading=loading,
        )
        group_by = "task" if warm.sft_balance_by_task else None
        rows = to_conversational(balance_action_types(labelled, warm.sft_max_type_fraction, group_by=group_by))
        info = {
            "student": {r["task"]: {k: r[k] for k in ("final_score_mean", "teacher_match")} for r in student},
            "rows": len(rows),
            "rows_raw": len(labelled),
            "max_type_fraction": warm.sft_max_type_fraction,
            "action_types": dict(Counter(r["action_type"] for r in labelled)),
        }
        rows.save_to_disk(str(cache / "rows"))
        write_json_atomic(cache / "info.json", info)
    print(f"DAgger: {info['rows']} new rows; the student scored {info['student']}")
    warning = kept_rows_warning(info["rows"], info["rows_raw"], info.get("max_type_fraction"))
    if warning is not None:
        print(warning)
    return concatenate_datasets([data, rows]), info


def last_round_scores(
    prompts: PromptConfig, warm: WarmStartArguments, setup: RunSetup, policy_dir: Path, data_dir: Path, loading=None
) -> dict:
    """Mean final score per task of the last round's student playing the DAgger seeds (cached), as the earlier
    rounds' students did while their states were labelled."""
    cache = data_dir / f"student-{warm.dagger_rounds}.json"
    scores = read_json(cache)
    if scores is not None:
        return scores
    _, results = dagger_rows(
        str(policy_dir),
        setup.interface,
        setup.tasks,
        parse_int_ranges(warm.dagger_seeds),
        teacher=None,
        contract=prompts.contract,
        recent_k=prompts.recent_k,
        env=prompts.env_name,
    )
    scores = {r["task"]: r["final_score_mean"] for r in results}
    write_json_atomic(cache, scores)
    return scores

"""SFT warm start: imitate a teacher policy's decisions, rendered exactly like the RL prompts, with LoRA.

    python recipes/sft_clinical.py                                  # CPU: tiny model, safe-agent teacher
    python recipes/sft_clinical.py --teacher expert --train_seeds 300-347
    accelerate launch recipes/sft_clinical.py --model_name_or_path Qwen/Qwen3-4B --bf16 true --load_in_4bit

Top to bottom:
1. Arguments: ``SFTScriptArguments`` + TRL's ``SFTConfig`` + ``ModelConfig`` through ``TrlParser``.
2. Data: teacher traces on ``--train_seeds`` (balanced by action type within each task) and ``--heldout_seeds``
   (untouched), as conversational prompt/completion rows; saved to ``<output_dir>/dataset`` and reused on re-runs.
3. ``SFTTrainer`` trains a LoRA adapter on the completions only (``--use_peft false``: every weight, which suits the
   tiny model, whose LoRA lacks the capacity to condition on the state; a real model keeps LoRA). For a small
   vocabulary the loss is the model's own cross-entropy (``--token_metrics``; see ``WarmStartSFTTrainer``).
4. DAgger (``--dagger_rounds N``): the student plays ``--dagger_seeds`` itself, the teacher labels every state
   it reaches, and training continues on all data so far (``--dagger_epochs``); each round is cached in
   ``<output_dir>/round-K``. The last round's student plays those seeds too, and the round whose student scored
   best is kept (``--keep_best_round``): its adapter (or model) and the tokenizer are saved to ``--output_dir``.
   Start GRPO / REINFORCE from it with ``--sft_adapter <output_dir>``.
5. Held-out report (``<output_dir>/heldout_report.json``): teacher match (also by task and teacher action type),
   strict-JSON and valid-action rates, predicted vs teacher action-type distributions.
"""

from __future__ import annotations

import copy
import json
import os
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoTokenizer, Trainer
from trl import ModelConfig, SFTConfig, SFTTrainer, TrlParser, get_peft_config

from recruit_trl.files import read_json, write_json_atomic
from recruit_trl.models import is_trained, length_bucketed_batches, load_trainable, loading_config, model_summary
from recruit_trl.protocol import get_env_interface
from recruit_trl.sft import (
    balance_action_types,
    best_round,
    build_sft_datasets,
    check_drop_candidate,
    check_extra_traces,
    check_oversample,
    dagger_rows,
    drop_candidates,
    heldout_report,
    mean_over_tasks,
    oversample_rows,
    to_conversational,
)
from recruit_trl.training import model_defaults, model_init_kwargs, parse_int_ranges, resolve_model_for, with_env_tasks


@dataclass
class SFTScriptArguments:
    env: str = field(default="clinical", metadata={"help": "Environment interface (name or module:attr)."})
    tasks: list[str] = field(
        default_factory=list, metadata={"help": "Tasks to trace (default: the environment's tasks)."}
    )
    teacher: str = field(default="safe", metadata={"help": "Teacher policy registered by the environment."})
    train_seeds: str = field(default="300-311", metadata={"help": "Reset seeds of the training episodes."})
    heldout_seeds: str = field(default="400-402", metadata={"help": "Reset seeds of the held-out episodes."})
    heldout_rows: int = field(
        default=0, metadata={"help": "Held-out rows in the report: a fixed random subset of them (0: all)."}
    )
    contract: str = field(default="index", metadata={"help": "Action contract: 'index' or 'json'."})
    recent_k: int = field(default=2, metadata={"help": "Recent actions in the prompt digest (as in the rollouts)."})
    epsilon: float = field(default=0.1, metadata={"help": "Random-candidate rate while tracing (state coverage)."})
    max_type_fraction: float = field(default=0.35, metadata={"help": "Cap on any action type's share of rows."})
    balance_by_task: bool = field(default=True, metadata={"help": "Apply the cap within every task's rows."})
    oversample: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Repeat the rows of some task days, TASK:FIRST-LAST:FACTOR (e.g. hard_bench:137-179:3: each "
            "row of hard's days 137..179 three times), in the traces and every DAgger round's rows."
        },
    )
    extra_traces: list[str] = field(
        default_factory=list,
        metadata={
            "help": "More teacher episodes for some task days, TASK:FIRST-LAST:SEEDS (e.g. "
            "hard_bench:137-180:500-531: the teacher's rows of hard's days 137..180 from 32 more episodes), added "
            "to the training traces before balancing."
        },
    )
    drop_candidate: float = field(
        default=0.0,
        metadata={
            "help": "Fraction of the training rows (traces and every DAgger round's rows) shown with one listed "
            "candidate, not the answer, left out and the rest renumbered: the same choices at shifted positions, "
            "against answers learnt as positions (index contract; 0 = off)."
        },
    )
    dagger_rounds: int = field(
        default=0,
        metadata={"help": "DAgger rounds after the first fit: the model plays, the teacher labels its states."},
    )
    dagger_seeds: str = field(
        default="300-307", metadata={"help": "Reset seeds the model plays in each DAgger round."}
    )
    dagger_epochs: float = field(default=1.0, metadata={"help": "Epochs over all data so far in each DAgger round."})
    keep_best_round: bool = field(
        default=True,
        metadata={
            "help": "With DAgger rounds: the last round's student also plays --dagger_seeds, and the round whose "
            "student scored best (mean final score over the tasks) is the model saved, not necessarily the last."
        },
    )
    tiny_corpus_seeds: int = field(default=8, metadata={"help": "Warm-up episodes per task (model 'tiny' only)."})
    tiny_build_steps: int | None = field(default=None, metadata={"help": "Warm-up steps (model 'tiny' only)."})
    token_metrics: str = field(
        default="auto",
        metadata={
            "help": "'true': TRL's loss (a chunked pass over the LM head that also logs entropy and mean token "
            "accuracy each step, lean on memory for large vocabularies); 'false': the model's own cross-entropy on "
            "the same completion tokens (about 20%% faster steps for the tiny model on CPU); 'auto': false when "
            "the vocabulary has fewer than 32k tokens."
        },
    )
    length_buckets: bool = field(
        default=False,
        metadata={
            "help": "Batches of rows of similar lengths, in random order: about 30%% faster steps for the tiny "
            "model on CPU (prompts run from about 250 to 570 tokens). Each batch then holds one range of days and "
            "tasks; with the last DAgger round kept whatever it scored, the main job once lost medium with it "
            "(greedy 0.330), so the main job turns it on only together with --keep_best_round."
        },
    )

    def __post_init__(self):
        if str(self.token_metrics).lower() not in ("auto", "true", "false"):
            raise ValueError(f"--token_metrics must be auto, true or false, not {self.token_metrics!r}")
        if self.tasks:  # else checked once the environment names its tasks (with_env_tasks)
            self.check_task_specs()
        check_drop_candidate(self.drop_candidate, self.contract)

    def check_task_specs(self) -> None:
        """Raise a clear ``ValueError`` for a task-day spec whose task is not one of ``tasks``."""
        check_oversample(self.oversample, self.tasks)
        check_extra_traces(self.extra_traces, self.tasks)


def main(script_args: SFTScriptArguments, training_args: SFTConfig, model_args: ModelConfig) -> dict:
    interface = get_env_interface(script_args.env)
    with_env_tasks(script_args, interface)
    out = Path(training_args.output_dir)
    # Every step's output is vouched for by a marker written after it (atomically): the held-out report for the whole
    # run, stats.json for the data. A marker that is missing or torn, or weights that do not open, redo the step.
    finished = read_json(out / "heldout_report.json")
    if finished is not None and is_trained(out):
        print(f"SFT already finished in {out}; delete the folder to train again")
        return finished

    # 1. Teacher traces -> balanced train / held-out chat datasets (reused when already on disk).
    data_dir = out / "dataset"
    stats = read_json(data_dir / "stats.json")
    if stats is not None:
        from datasets import load_from_disk

        train, heldout = load_from_disk(str(data_dir / "train")), load_from_disk(str(data_dir / "heldout"))
    else:
        train, heldout, stats = build_sft_datasets(
            interface,
            script_args.tasks,
            parse_int_ranges(script_args.train_seeds),
            parse_int_ranges(script_args.heldout_seeds),
            teacher=script_args.teacher,
            contract=script_args.contract,
            recent_k=script_args.recent_k,
            epsilon=script_args.epsilon,
            max_type_fraction=script_args.max_type_fraction,
            balance_by="task" if script_args.balance_by_task else None,
            oversample=script_args.oversample,
            drop_fraction=script_args.drop_candidate,
            extra_traces=script_args.extra_traces,
            seed=training_args.seed,
        )
        train.save_to_disk(str(data_dir / "train"))
        heldout.save_to_disk(str(data_dir / "heldout"))
        write_json_atomic(data_dir / "stats.json", stats)
    print(f"SFT data: {stats['train_rows']} train rows ({stats['train_rows_raw']} before balancing), ", end="")
    print(f"{stats['heldout_rows']} held out")

    # 2. Model and LoRA fine-tuning on the completions (round 0), then DAgger rounds on the model's own states.
    model_path = resolve_model_for(model_args.model_name_or_path, script_args, interface)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    if "quantization_config" in training_args.model_init_kwargs and not model_args.use_peft:
        raise ValueError(
            "a quantised model (--load_in_4bit/--load_in_8bit) trains a LoRA adapter: drop --use_peft false"
        )
    loading = loading_config(model_args)  # the students play loaded as they were trained (e.g. 4-bit)
    rounds = script_args.dagger_rounds
    data, model, dagger = train, None, []
    for r in range(rounds + 1):
        round_dir = out if rounds == 0 else out / f"round-{r}"
        if r > 0:  # the previous round's student plays; the teacher labels the states it reaches
            previous, cache = out / f"round-{r - 1}", data_dir / f"dagger-{r}"
            data, info = dagger_data(script_args, interface, data, previous, cache, training_args.seed + r, loading)
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
            args.num_train_epochs, args.max_steps = script_args.dagger_epochs, -1  # a step cap is the first fit's
        trainer = WarmStartSFTTrainer(
            model_loss=not token_metrics(script_args, model_path),
            length_buckets=script_args.length_buckets,
            model=model if model is not None else model_path,
            args=args,
            train_dataset=data.remove_columns(["task", "seed", "day", "action_type", "candidate_types"]),
            processing_class=tokenizer,
            peft_config=get_peft_config(model_args) if model is None else None,
        )
        trainer.train(resume_from_checkpoint=_last_checkpoint(args.output_dir))
        trainer.save_model(args.output_dir)
        model = trainer.model
    selected, selection = rounds, None
    if rounds > 0 and script_args.keep_best_round:
        scores = [{task: v["final_score_mean"] for task, v in d["student"].items()} for d in dagger]
        scores.append(last_round_scores(script_args, interface, out / f"round-{rounds}", data_dir, loading))
        selected = best_round(scores)
        summary = ", ".join(f"round {r}: {mean_over_tasks(s):.3f}" for r, s in enumerate(scores))
        print(f"DAgger students' mean final scores ({summary}); keeping round {selected}")
        selection = {"student_scores": scores, "selected_round": selected}
    if model is None or selected != rounds:  # every round was cached, or an earlier round is kept
        model = load_trainable(model_path, out / f"round-{selected}", training_args.model_init_kwargs)
    model.save_pretrained(training_args.output_dir)
    tokenizer.save_pretrained(training_args.output_dir)

    # 3. Held-out report.
    model.eval()
    tokenizer.padding_side = "left"
    if 0 < script_args.heldout_rows < len(heldout):  # a fixed subset: a real model on CPU takes ~1 s a row
        heldout = heldout.shuffle(seed=0).select(range(script_args.heldout_rows))
    report = heldout_report(model, tokenizer, heldout, script_args.contract, interface=interface)
    report["data"] = stats
    report["model"] = model_summary(model)
    report["dagger"] = dagger
    report["round_selection"] = selection
    write_json_atomic(out / "heldout_report.json", report)
    print(json.dumps({k: v for k, v in report.items() if k != "data"}, indent=2))
    return report


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
    warm-up does the same, :func:`recruit_trl.models.length_bucketed_batches`); a short batch goes last, so the
    data loader's cuts fall on batch boundaries. Random batches of 16 pad every row to about 520 tokens here
    against a mean of 376. Unlike transformers' ``group_by_length``, which plays each sorted pool from its longest
    batch to its shortest, consecutive steps do not march through one range of lengths. Off by default here: a
    batch of similar lengths is a batch of similar days and tasks, and a warm start that kept its last DAgger round
    collapsed on medium with either order (greedy 0.330 with this one, 0.349 with ``group_by_length``). The main
    job uses it behind ``--keep_best_round``, which keeps an earlier round when the last one collapses.
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


def token_metrics(script_args: SFTScriptArguments, model_path: str) -> bool:
    """Whether to train through TRL's loss (with its token metrics); see ``--token_metrics``."""
    choice = str(script_args.token_metrics).lower()
    if choice != "auto":
        return choice == "true"
    config_file = Path(model_path, "config.json")
    config = json.loads(config_file.read_text()) if config_file.is_file() else {}
    vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size") or 0
    return not 0 < vocab < 32_768


def dagger_data(
    script_args: SFTScriptArguments, interface, data, policy_dir: Path, cache: Path, seed: int = 0, loading=None
):
    """All data so far plus the teacher-labelled states that the adapter in ``policy_dir`` reaches (cached);
    ``seed`` draws the rows that leave a candidate out (``--drop_candidate``); ``loading`` loads the student as it
    was trained (:func:`recruit_trl.models.loading_config`)."""
    from datasets import concatenate_datasets, load_from_disk

    info = read_json(cache / "info.json")
    if info is not None:
        rows = load_from_disk(str(cache / "rows"))
    else:
        labelled, student = dagger_rows(
            str(policy_dir),
            interface,
            script_args.tasks,
            parse_int_ranges(script_args.dagger_seeds),
            teacher=script_args.teacher,
            contract=script_args.contract,
            recent_k=script_args.recent_k,
            env=script_args.env,
            model_loading=loading,
        )
        group_by = "task" if script_args.balance_by_task else None
        balanced = balance_action_types(labelled, script_args.max_type_fraction, group_by=group_by)
        shifted = drop_candidates(balanced, script_args.drop_candidate, seed)
        rows = to_conversational(oversample_rows(shifted, script_args.oversample))
        info = {
            "student": {r["task"]: {k: r[k] for k in ("final_score_mean", "teacher_match")} for r in student},
            "rows": len(rows),
            "rows_repeated": len(rows) - len(balanced),
            "rows_candidate_dropped": sum(a is not b for a, b in zip(balanced, shifted, strict=True)),
            "rows_raw": len(labelled),
            "action_types": dict(Counter(r["action_type"] for r in labelled)),
        }
        rows.save_to_disk(str(cache / "rows"))
        write_json_atomic(cache / "info.json", info)
    print(f"DAgger: {info['rows']} new rows; the student scored {info['student']}")
    return concatenate_datasets([data, rows]), info


def last_round_scores(
    script_args: SFTScriptArguments, interface, policy_dir: Path, data_dir: Path, loading=None
) -> dict:
    """Mean final score per task of the last round's student playing ``--dagger_seeds`` (cached), as the earlier
    rounds' students did while their states were labelled."""
    cache = data_dir / f"student-{script_args.dagger_rounds}.json"
    scores = read_json(cache)
    if scores is not None:
        return scores
    _, results = dagger_rows(
        str(policy_dir),
        interface,
        script_args.tasks,
        parse_int_ranges(script_args.dagger_seeds),
        teacher=None,
        contract=script_args.contract,
        recent_k=script_args.recent_k,
        env=script_args.env,
    )
    scores = {r["task"]: r["final_score_mean"] for r in results}
    write_json_atomic(cache, scores)
    return scores


def _last_checkpoint(output_dir: str) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None


def sft_defaults() -> dict:
    """``SFTConfig`` values of this recipe (also the GRPO recipe's warm start): CPU-friendly, no hub, no logger."""
    defaults = {
        "output_dir": "outputs/sft_clinical",
        "learning_rate": 1e-3,
        "num_train_epochs": 2,
        "per_device_train_batch_size": 16,
        "max_length": 1024,
        "logging_steps": 10,
        "save_steps": 100,
        "report_to": "none",
        "gradient_checkpointing": False,
        "seed": 0,
    }
    if not torch.cuda.is_available():
        defaults.update({"bf16": False, "use_cpu": True})
    return defaults


def parse_args(argv: list[str] | None = None) -> tuple[SFTScriptArguments, SFTConfig, ModelConfig]:
    parser = TrlParser((SFTScriptArguments, SFTConfig, ModelConfig))
    parser.set_defaults(**sft_defaults(), **model_defaults())
    return parser.parse_args_and_config(args=argv)


if __name__ == "__main__":
    main(*parse_args())

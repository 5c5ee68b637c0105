"""GRPO for an LLM agent on the clinical recruitment environment, through TRL's ``GRPOTrainer``.

With no arguments on a CPU machine this is the main job, end to end in one output folder:

    accelerate launch recipes/grpo_clinical.py
    accelerate launch recipes/grpo_clinical.py --model_name_or_path smollm2   # a real LLM with LoRA, <= 45 min
    accelerate launch --config_file accelerate_configs/cpu_ddp.yaml recipes/grpo_clinical.py --max_steps 10
    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/grpo_clinical.py \\
        --model_name_or_path Qwen/Qwen3-4B --load_in_4bit --bf16 true --per_device_train_batch_size 16
    python recipes/grpo_clinical.py --config recipes/grpo_clinical.yaml

Top to bottom:
1. Arguments: ``ScriptArguments`` (anchors, rollout mode, rewards, warm start, report) + ``GRPOConfig`` +
   ``ModelConfig`` through ``TrlParser`` (``--config file.yaml`` supported); CPU-friendly defaults, and a named
   model's own (``recruit_trl.training.MODEL_PRESETS``: ``smollm2``'s are sized for 45 minutes on 2 cores).
2. The environment interface (``--env``) and its tasks (``--tasks``, default: all of the environment's).
3. The policy model: ``tiny`` (a warm tiny Qwen3 built locally and cached), ``smollm2`` (from its wheel), or
   any local folder / cached hub id, loaded as ``ModelConfig`` says in every stage (dtype, attention,
   ``--load_in_4bit`` for QLoRA).
4. Warm start (``--warm_start auto``): the SFT recipe, in-process with this run's ``ModelConfig``, imitates
   ``--teacher`` (cached in ``<output_dir>/sft``; DAgger rounds, the best round kept). A pretrained model trains a
   LoRA adapter, which RL continues; the tiny model built here fine-tunes every weight (``--sft_full_finetune
   auto``) and RL then trains every weight too (``--rl_full_finetune auto``) or a fresh adapter on it.
5. Anchors: states on tasks x seeds x days, reached by replaying ``--anchor_policy`` (an environment policy) or
   recorded once from the model RL starts from (``--anchor_policy student``: on-policy states); the prompt column
   carries the anchor. Rollouts (``--mode branch|window``; ``--continuation_seeds`` continuations per distinct
   action, the first ``--self_horizon`` days of each played by the policy itself) and rewards (``--reward_funcs``
   x ``--reward_weights``), then ``trainer.train()`` (resumes from the last checkpoint); the adapter is saved to
   ``--output_dir``.
6. Report (``--report``): ``--eval_baselines``, and the base, SFT and RL models (``--eval_episodes``: the tiny model),
   over whole episodes on held-out ``--eval_seeds`` (models greedy; those named by ``--eval_sampled`` also sampled
   at ``--eval_temperature`` / ``--eval_top_p``: rows ``<model>-sampled``); the decision-level report
   (``--eval_decisions``: benchmark table and state values on held-out states, every model);
   ``report.json``, PNG plots and a one-screen summary in ``--output_dir``. The baselines (pure Python) run in a
   background process while the warm start traces the teacher, on the core that would otherwise idle.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from accelerate import PartialState  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer, ModelConfig, SFTConfig, TrlParser, get_peft_config  # noqa: E402

from recruit_trl.evaluate import EvalConfig, cached_evaluation, evaluate_cached, evaluate_cached_runs  # noqa: E402
from recruit_trl.files import read_json, write_json_atomic  # noqa: E402
from recruit_trl.models import (  # noqa: E402
    METADATA_FILE,
    is_adapter,
    keep_4bit_layers_trainable,
    load_trainable,
    loading_config,
    model_fingerprint,
    model_kind,
    model_summary,
)
from recruit_trl.protocol import get_env_interface  # noqa: E402
from recruit_trl.rollout import make_rollout  # noqa: E402
from recruit_trl.training import (  # noqa: E402
    MODEL_PRESETS,
    ScriptArguments,
    cpu_defaults,
    full_finetune,
    make_anchor_dataset,
    model_defaults,
    model_init_kwargs,
    parse_int_ranges,
    preset_name,
    resolve_model_for,
    with_env_tasks,
)
from rewards import get_reward_funcs  # noqa: E402

RECIPES = Path(__file__).resolve().parent


def main(
    script_args: ScriptArguments, training_args: GRPOConfig, model_args: ModelConfig, trainer_cls=GRPOTrainer
) -> GRPOTrainer:
    started = time.perf_counter()
    timings: dict[str, float] = {}
    if training_args.use_vllm:
        raise ValueError("recruit_trl rollouts generate with transformers; vLLM is not supported (drop --use_vllm)")
    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // max(1, training_args.world_size)))

    # 1. Environment (and its tasks, unless --tasks names some).
    interface = get_env_interface(script_args.env)
    with_env_tasks(script_args, interface)

    # 2. Policy model (a local folder).
    t0 = time.perf_counter()
    model_path = resolve_model_for(model_args.model_name_or_path, script_args, interface)
    timings["base_model"] = time.perf_counter() - t0
    # One model configuration (dtype, attention, quantisation) for every stage: warm start, RL and evaluation.
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)

    # 3. Warm start: imitate the teacher first (the SFT recipe, cached), then continue from its adapter.
    background = None
    if script_args.sft_adapter is None and script_args.warm_start == "auto":
        t0 = time.perf_counter()
        background = start_baseline_evals(script_args, training_args, model_args, model_path)
        script_args.sft_adapter = run_warm_start(script_args, training_args, model_args, model_path)
        timings["sft"] = time.perf_counter() - t0
    # Without a warm start: the base model, with a fresh LoRA adapter unless --use_peft false.
    model: object = model_path
    tokenizer_path = model_path
    peft_config = get_peft_config(model_args)
    if script_args.sft_adapter and is_adapter(script_args.sft_adapter):
        # RL continues the SFT adapter (trainable, on the base loaded as configured), and no second peft_config.
        model = load_trainable(model_path, script_args.sft_adapter, training_args.model_init_kwargs)
        peft_config = None
    elif script_args.sft_adapter:  # a fully fine-tuned SFT model: RL trains every weight, or a fresh adapter on it
        model = script_args.sft_adapter
        if Path(model, "tokenizer_config.json").is_file():  # its own tokenizer: the base may be another tiny build
            tokenizer_path = model
        if full_finetune(script_args.rl_full_finetune, model_args, model_path):
            peft_config = None

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, padding_side="left")

    # 4. Anchors (states the samples start from; on-policy ones are recorded by one process, read by the others),
    # rollouts, rewards and training.
    rollout = make_rollout(script_args, interface)
    with PartialState().main_process_first():
        dataset = make_anchor_dataset(
            script_args, interface, rollout.cache, student=script_args.sft_adapter or model_path,
            temperature=training_args.temperature, top_p=training_args.top_p,
            states_file=str(Path(training_args.output_dir) / "anchor_states.json"),
            model_loading=loading_config(model_args),
        )  # fmt: skip
    trainer = trainer_cls(
        model=model,
        reward_funcs=get_reward_funcs(script_args.reward_funcs),
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,  # quantisation, when asked for, is in training_args.model_init_kwargs
        rollout_func=rollout,
    )
    keep_4bit_layers_trainable(trainer.model)  # rollouts generate in eval mode; see its docstring (CPU QLoRA)
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=_last_checkpoint(training_args.output_dir))
    timings["rl"] = time.perf_counter() - t0
    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # trainer_state.json: every logged metric, step by step
    if trainer.accelerator.is_main_process:
        info = {
            "base_model": model_path, "world_size": trainer.accelerator.num_processes, "anchors": len(dataset),
            "model": model_summary(trainer.model), "sft_trained": sft_trained(script_args),
        }  # fmt: skip
        write_json_atomic(Path(training_args.output_dir, "run_info.json"), info)

    # 5. Report: held-out evaluation of base / SFT / RL models and baselines, plots, summary.
    if script_args.report and trainer.accelerator.is_main_process:
        report_run(script_args, training_args, model_args, trainer, model_path, timings, started, background)
    trainer.accelerator.wait_for_everyone()
    return trainer


def run_warm_start(script_args, training_args, model_args, model_path: str) -> str:
    """Run ``recipes/sft_clinical.py`` in-process into ``<output_dir>/sft`` (skipped when already finished there).

    The SFT stage gets this run's ``ModelConfig`` (quantisation, dtype, attention, LoRA rank / alpha / targets), so
    the warm start loads and trains the model exactly as RL will; only ``use_peft`` is set by
    ``--sft_full_finetune``. Its ``SFTConfig`` is the SFT recipe's defaults with this run's seed, precision and
    device settings.
    """
    sys.path.insert(0, str(RECIPES))
    import sft_clinical

    full = full_finetune(script_args.sft_full_finetune, model_args, model_path)
    sft_args = sft_clinical.SFTScriptArguments(
        env=script_args.env, tasks=list(script_args.tasks), teacher=script_args.teacher,
        train_seeds=script_args.sft_train_seeds, heldout_seeds=script_args.sft_heldout_seeds,
        heldout_rows=script_args.sft_heldout_rows,
        contract=script_args.contract, recent_k=script_args.recent_k, epsilon=script_args.sft_epsilon,
        balance_by_task=script_args.sft_balance_by_task, oversample=list(script_args.sft_oversample),
        extra_traces=list(script_args.sft_extra_traces), drop_candidate=script_args.sft_drop_candidate,
        dagger_rounds=script_args.dagger_rounds, dagger_seeds=script_args.dagger_seeds,
        dagger_epochs=script_args.dagger_epochs, keep_best_round=script_args.sft_keep_best_round,
        length_buckets=script_args.sft_length_buckets, tiny_corpus_seeds=script_args.tiny_corpus_seeds,
        tiny_build_steps=script_args.tiny_build_steps,
    )  # fmt: skip
    shared = ("seed", "bf16", "fp16", "use_cpu", "gradient_checkpointing", "model_init_kwargs")
    sft_config = SFTConfig(
        **{
            **sft_clinical.sft_defaults(),
            **{k: getattr(training_args, k) for k in shared},
            "output_dir": str(Path(training_args.output_dir) / "sft"),
            "num_train_epochs": script_args.sft_epochs,
            "learning_rate": script_args.sft_learning_rate or (3e-4 if full else 1e-3),
            "per_device_train_batch_size": script_args.sft_batch_size,
            "max_steps": script_args.sft_max_steps,
        }
    )
    sft_model_args = replace(model_args, model_name_or_path=model_path, use_peft=not full)
    sft_clinical.main(sft_args, sft_config, sft_model_args)
    return sft_config.output_dir


def report_runs(script_args, training_args, model_args, model_path: str) -> list[tuple[str, str, EvalConfig, Path]]:
    """The report's evaluations as ``(label, policy, config, cache file)``: the base, SFT and RL models greedy (and
    sampled for ``--eval_sampled``), then ``--eval_baselines``."""
    out = Path(training_args.output_dir)
    policies = {}
    if eval_model_episodes(script_args, model_path):
        policies["base"] = f"model:{model_path}"
        if script_args.sft_adapter:
            policies["sft"] = f"model:{script_args.sft_adapter}"
        policies["grpo"] = f"model:{out}"
    policies.update({name: name for name in script_args.eval_baselines})
    config = EvalConfig(
        env=script_args.env,
        model_loading=loading_config(model_args),  # the models are evaluated loaded as they were trained
        tasks=tuple(script_args.tasks),
        seeds=tuple(parse_int_ranges(script_args.eval_seeds)),
        contract=script_args.contract,
        recent_k=script_args.recent_k,
        constrained=script_args.eval_constrained,
    )
    runs = []
    for label, policy in policies.items():
        runs.append((label, policy, config))
        if label in script_args.eval_sampled and script_args.eval_temperature > 0:
            sampled = replace(config, temperature=script_args.eval_temperature, top_p=script_args.eval_top_p)
            runs.append((f"{label}-sampled", policy, sampled))
    return [(label, policy, cfg, out / "eval" / f"{label}.json") for label, policy, cfg in runs]


def eval_model_episodes(script_args, model_path: str) -> bool:
    """Whether the report plays whole episodes with the models (``--eval_episodes``; ``auto``: the tiny model)."""
    choice = str(script_args.eval_episodes).lower()
    return model_kind(model_path) == "tiny" if choice == "auto" else choice == "true"


def start_baseline_evals(script_args, training_args, model_args, model_path: str):
    """Evaluate ``--eval_baselines`` in a background process while the warm start traces the teacher.

    Both are single-threaded Python (environment steps and the expert's lookahead), so on a 2-core machine one
    core would idle through the traces. Started only when the traces are about to be collected (the warm start's
    data is not on disk yet) and one process trains: at any other time the background work would take a core
    from torch. It writes the cache files the report reads; should it fail, the report evaluates them itself.

    Returns:
        ``(process, labels)``: the started ``multiprocessing.Process`` and the labels it evaluates, or ``None``.
    """
    import multiprocessing

    data_cached = Path(training_args.output_dir, "sft", "dataset", "stats.json").is_file()
    if not script_args.report or training_args.world_size > 1 or data_cached:
        return None
    runs = [
        (label, policy, cfg, str(path))
        for label, policy, cfg, path in report_runs(script_args, training_args, model_args, model_path)
        if not policy.startswith("model:") and cached_evaluation(policy, cfg, label, path) is None
    ]
    if not runs:
        return None
    process = multiprocessing.get_context("spawn").Process(
        target=evaluate_cached_runs, args=(runs,), name="baseline-evals", daemon=True
    )
    process.start()
    labels = [label for label, *_ in runs]
    print(f"evaluating {', '.join(labels)} in the background (pid {process.pid})")
    return process, labels


def report_run(
    script_args, training_args, model_args, trainer, model_path: str, timings: dict, started: float, background=None
):
    from recruit_trl.report import summary, training_curves, write_report

    out = Path(training_args.output_dir)
    t0 = time.perf_counter()
    if background is not None:
        background[0].join()  # its cache files are read below; anything it did not finish is evaluated here
    results, per_episode = [], {}
    for label, policy, cfg, cache in report_runs(script_args, training_args, model_args, model_path):
        part = evaluate_cached(policy, cfg, label, cache)  # a re-run does not redo finished evaluations
        results.extend(part["results"])
        per_episode[label] = part["config"]["seconds_per_episode"][label]
    timings["eval"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    decisions = decision_report(script_args, model_args, trainer, model_path) if script_args.eval_decisions else None
    timings["eval_decisions"] = time.perf_counter() - t0
    sft_report = Path(script_args.sft_adapter, "heldout_report.json") if script_args.sft_adapter else None
    report = {
        "results": results,
        "decisions": decisions,
        "training": {"curves": training_curves(trainer.state.log_history), "steps": trainer.state.global_step},
        "sft": read_json(sft_report) if sft_report else None,
        # What RL and the warm start saved: "adapter" (LoRA) or "full" (every weight).
        "trained": model_summary(trainer.model)["trained"],
        "sft_trained": sft_trained(script_args),
        "config": {
            "script": {k: v for k, v in vars(script_args).items()},
            "sft_full_finetune_resolved": sft_trained(script_args) == "full",
            "rl_full_finetune_resolved": model_summary(trainer.model)["trained"] == "full",
            "grpo": {
                k: getattr(training_args, k)
                for k in (
                    "learning_rate",
                    "max_steps",
                    "num_generations",
                    "per_device_train_batch_size",
                    "beta",
                    "loss_type",
                    "scale_rewards",
                    "temperature",
                    "seed",
                    "reward_weights",
                )
            },  # fmt: skip
            "model": {
                "name_or_path": model_args.model_name_or_path,
                "resolved": model_path,
                "num_parameters": _built_num_parameters(model_path),
                "lora_r": model_args.lora_r,
                "lora_alpha": model_args.lora_alpha,
                "lora_target_modules": model_args.lora_target_modules,
                "use_peft": model_args.use_peft,
                "dtype": model_args.dtype,
                "load_in_4bit": model_args.load_in_4bit,
                "load_in_8bit": model_args.load_in_8bit,
            },  # fmt: skip
            "eval_seeds": script_args.eval_seeds,
            "eval_sampling": {"temperature": script_args.eval_temperature, "top_p": script_args.eval_top_p},
            "eval_seconds_per_episode": per_episode,
            "eval_in_background": background[1] if background is not None else [],
        },
        "versions": evaluate_versions(),
        "timings_seconds": {k: round(v, 1) for k, v in timings.items()},
        "seconds": round(time.perf_counter() - started, 1),
        "output_dir": str(out),
    }
    interface = get_env_interface(script_args.env)
    paths = write_report(out, report, interface)
    print(summary(report, interface))
    print("\n".join(f"wrote {p}" for p in paths.values()))


def decision_report(script_args, model_args, trainer, model_path: str) -> dict:
    """Decision-level measures on held-out states (``--decision_seeds`` x ``--decision_days``, reached by the
    teacher; a fixed stratified subset of ``--decision_rows``): the benchmark table (strict JSON, valid action,
    teacher match, invalid count; greedy, free decoding) and the state value of each policy's action (the final
    score after the continuation policy plays on from it, common random numbers), for the base, SFT and RL models,
    the teacher and the safe agent, with paired differences to the SFT model. Cached in ``eval/decisions.json``,
    keyed on the environment, the settings and the models' weights (:func:`recruit_trl.models.model_fingerprint`:
    a re-run that trains further into the same folder measures again)."""
    from recruit_trl.decisions import decision_set, evaluate_decisions, sample_decisions

    out = Path(trainer.args.output_dir)
    policies = {"base": f"model:{model_path}"}
    if script_args.sft_adapter:
        policies["sft"] = f"model:{script_args.sft_adapter}"
    policies.update({"grpo": f"model:{out}", script_args.teacher: script_args.teacher, "safe": "safe"})
    key = {
        "policies": policies, "step": trainer.state.global_step, "seeds": script_args.decision_seeds,
        "days": script_args.decision_days, "rows": script_args.decision_rows, "teacher": script_args.teacher,
        "tasks": list(script_args.tasks), "contract": script_args.contract, "recent_k": script_args.recent_k,
        "continuation": script_args.continuation_policy, "model_loading": loading_config(model_args),
        "env": script_args.env, "weights": {
            label: model_fingerprint(p[len("model:") :]) for label, p in policies.items() if p.startswith("model:")
        },
    }  # fmt: skip
    cache = out / "eval" / "decisions.json"
    cached = read_json(cache)
    if isinstance(cached, dict) and cached.get("key") == key:
        return cached["result"]
    interface = get_env_interface(script_args.env)
    states = decision_set(
        interface, script_args.tasks, parse_int_ranges(script_args.decision_seeds),
        parse_int_ranges(script_args.decision_days), teacher=script_args.teacher, contract=script_args.contract,
        recent_k=script_args.recent_k,
    )  # fmt: skip
    states = sample_decisions(interface, states, script_args.decision_rows)
    result = evaluate_decisions(
        interface, policies, states, reference="sft" if "sft" in policies else script_args.teacher,
        continuation=script_args.continuation_policy, model_loading=key["model_loading"],
    )  # fmt: skip
    write_json_atomic(cache, {"key": key, "result": result})
    return result


def sft_trained(script_args) -> str | None:
    """What the warm start saved (``"adapter"`` or ``"full"``), ``None`` without one."""
    if not script_args.sft_adapter:
        return None
    return "adapter" if is_adapter(script_args.sft_adapter) else "full"


def _built_num_parameters(model_path: str) -> int | None:
    """The parameter count recorded by recruit_trl when it built (tiny) or unpacked (SmolLM2) the model, else None."""
    meta = read_json(Path(model_path, METADATA_FILE))
    return meta.get("num_parameters") if isinstance(meta, dict) else None


def evaluate_versions() -> dict:
    from recruit_trl.evaluate import versions

    return versions()


def _last_checkpoint(output_dir: str) -> str | None:
    """Resume from the newest ``checkpoint-*`` in ``output_dir`` when there is one."""
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None


def parse_args(
    argv: list[str] | None = None, defaults: dict | None = None
) -> tuple[ScriptArguments, GRPOConfig, ModelConfig]:
    parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig))
    preset = preset_name(sys.argv[1:] if argv is None else argv)  # e.g. smollm2: defaults sized for its CPU run
    own = {"output_dir": f"outputs/grpo_clinical_{preset}" if preset else "outputs/grpo_clinical"}
    preset_values = MODEL_PRESETS[preset] if preset else {}
    parser.set_defaults(**{**cpu_defaults(), **own, **model_defaults(), **preset_values, **(defaults or {})})
    return parser.parse_args_and_config(args=argv)


if __name__ == "__main__":
    main(*parse_args())

"""The RL recipes' end-of-run report: the held-out evaluations of the base, SFT and RL models and the baselines
(cached, the baselines possibly in a background process during the warm start), the decision-level report, and
``report.json`` with its plots and one-screen summary (:mod:`recruit_trl.workflow.evaluation.report`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from recruit_trl.files import read_json, write_json_atomic
from recruit_trl.models.build_cache import METADATA_FILE
from recruit_trl.models.loading import (
    is_adapter,
    is_trained,
    loading_config,
    model_fingerprint,
    model_summary,
)
from recruit_trl.ranges import parse_int_ranges
from recruit_trl.versions import versions
from recruit_trl.workflow.arguments import ReportArguments, WarmStartArguments
from recruit_trl.workflow.configs import WarmStart
from recruit_trl.workflow.evaluation.cache import cached_evaluation, evaluate_cached, evaluate_cached_runs
from recruit_trl.workflow.evaluation.evaluate import EvalConfig
from recruit_trl.workflow.evaluation.report import paired_differences, summary, training_curves, write_report
from recruit_trl.workflow.model_setup import RunSetup

# Written last by a finished RL stage: the settings it trained with, read back from the trainer, and the model summary.
RL_FINISHED = "run_info.json"


def report_runs(
    prompts, report: ReportArguments, training_args, model_args, setup: RunSetup, sft_adapter: str | None
) -> list[tuple[str, str, EvalConfig, Path]]:
    """The report's evaluations as ``(label, policy, config, cache file)``: the base, SFT (``sft_adapter``, when RL
    started from one) and RL models greedy (and sampled for ``eval_sampled``), then ``eval_baselines``, with the
    run's prompts (``prompts``: its environment, ``recent_k``)."""
    out = Path(training_args.output_dir)
    policies = {}
    if report.eval_episodes:
        policies["base"] = f"model:{setup.model_path}"
        if sft_adapter:
            policies["sft"] = f"model:{sft_adapter}"
        policies["grpo"] = f"model:{out}"
    policies.update({name: name for name in report.eval_baselines})
    config = EvalConfig(
        env=prompts.env_name,
        model_loading=loading_config(model_args),  # the models are evaluated loaded as they were trained
        tasks=tuple(setup.tasks),
        seeds=tuple(parse_int_ranges(report.eval_seeds)),
        contract=prompts.contract,
        recent_k=prompts.recent_k,
        constrained=report.eval_constrained,
        **eval_backend(report, training_args),
    )
    runs = []
    for label, policy in policies.items():
        runs.append((label, policy, config))
        if label in report.eval_sampled and report.eval_temperature > 0:
            sampled = replace(config, temperature=report.eval_temperature, top_p=report.eval_top_p)
            runs.append((f"{label}-sampled", policy, sampled))
    return [(label, policy, cfg, out / "eval" / f"{label}.json") for label, policy, cfg in runs]


def eval_backend(report: ReportArguments, training_args) -> dict[str, Any]:
    """How the models' episodes are played: through vLLM in this process when the run generates with it
    (``--use_vllm``), else with transformers in :func:`eval_workers` processes."""
    if training_args.use_vllm:
        return {"backend": "vllm", "workers": 1}
    return {"backend": "transformers", "workers": eval_workers(report)}


def eval_workers(report: ReportArguments) -> int:
    """``eval_workers``; 0: one process per CPU core without a GPU (episodes are single-threaded Python and small
    models), one with a GPU."""
    import os

    import torch

    if report.eval_workers > 0:
        return report.eval_workers
    return 1 if torch.cuda.is_available() else max(1, os.cpu_count() or 1)


def start_baseline_evals(prompts, report: ReportArguments | None, training_args, model_args, setup: RunSetup):
    """Evaluate the report's ``eval_baselines`` in a background process while the warm start traces the teacher.

    Both are single-threaded Python (environment steps and the expert's lookahead), so on a 2-core machine one
    core would idle through the traces. Started only when the traces are about to be collected (the warm start's
    data is not on disk yet) and one process trains: at any other time the background work would take a core
    from torch. It writes the cache files the report reads; should it fail, the report evaluates them itself.

    Returns:
        ``(process, labels)``: the started ``multiprocessing.Process`` and the labels it evaluates, or ``None``.
    """
    import multiprocessing

    data_cached = Path(training_args.output_dir, "sft", "dataset", "stats.json").is_file()
    if report is None or training_args.world_size > 1 or data_cached:
        return None
    runs = [
        (label, policy, replace(cfg, workers=1), str(path))  # one process: it shares the machine with the warm start
        for label, policy, cfg, path in report_runs(prompts, report, training_args, model_args, setup, None)
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
    script_args,
    report_args: ReportArguments,
    warm_start: WarmStart | None,
    training_args,
    model_args,
    trainer,
    setup: RunSetup,
    sft_adapter: str | None,
    timings: dict,
    started: float,
    background=None,
) -> None:
    """Evaluate, measure decisions, and write ``report.json``, the plots and the summary into ``--output_dir``.

    Args:
        script_args: the recipe's arguments.
        report_args: the report's settings (its config file, ``--report_config``).
        warm_start: the warm start's config (``--sft_config``; ``None``: none, the teacher is the fallback agent).
        training_args: the trainer's ``GRPOConfig``.
        model_args: the ``ModelConfig`` every stage loaded the model with.
        trainer: the trained trainer (its model, state and log history).
        setup: what the run resolved: the interface, the tasks, the base model's folder.
        sft_adapter: the warm start RL continued, ``None`` without one.
        timings: seconds of the run's stages so far; the evaluations' are added.
        started: ``time.perf_counter()`` at the start of the run.
        background: what :func:`start_baseline_evals` returned: its results are waited for and read from the cache.
    """
    out = Path(training_args.output_dir)
    t0 = time.perf_counter()
    if background is not None:
        background[0].join()  # its cache files are read below; anything it did not finish is evaluated here
    results, per_episode = [], {}
    warm = warm_start.warm if warm_start is not None else WarmStartArguments()
    runs = report_runs(script_args, report_args, training_args, model_args, setup, sft_adapter)
    for label, policy, cfg, cache in runs:
        part = evaluate_cached(policy, cfg, label, cache)  # a re-run does not redo finished evaluations
        results.extend(part["results"])
        per_episode[label] = part["config"]["seconds_per_episode"][label]
    timings["eval"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    decisions = None
    if report_args.eval_decisions:
        decisions = decision_report(script_args, report_args, warm, model_args, trainer, setup, sft_adapter)
    timings["eval_decisions"] = time.perf_counter() - t0
    sft_report = Path(sft_adapter, "heldout_report.json") if sft_adapter else None
    reference = "sft" if any(r["policy"] == "sft" for r in results) else "base"
    report = {
        "results": results,
        # Every model and baseline minus the SFT start (else the base), episode by episode on the same seeds.
        "paired": paired_differences(results, reference),
        "paired_reference": reference,
        "decisions": decisions,
        "training": {"curves": training_curves(trainer.state.log_history), "steps": trainer.state.global_step},
        "sft": read_json(sft_report) if sft_report else None,
        # What RL and the warm start saved: "adapter" (LoRA) or "full" (every weight).
        "trained": model_summary(trainer.model)["trained"],
        "sft_trained": sft_trained(sft_adapter),
        "config": {
            "script": {k: v for k, v in vars(script_args).items()},
            "warm_start": {k: v for k, v in vars(warm).items()},
            "sft_config": str(warm_start.path) if warm_start is not None else None,
            "report": {k: v for k, v in vars(report_args).items()},
            "sft_adapter": sft_adapter,
            "sft_full_finetune_resolved": sft_trained(sft_adapter) == "full",
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
                "resolved": setup.model_path,
                "num_parameters": built_num_parameters(setup.model_path),
                "lora_r": model_args.lora_r,
                "lora_alpha": model_args.lora_alpha,
                "lora_target_modules": model_args.lora_target_modules,
                "use_peft": model_args.use_peft,
                "dtype": model_args.dtype,
                "load_in_4bit": model_args.load_in_4bit,
                "load_in_8bit": model_args.load_in_8bit,
            },  # fmt: skip
            "eval_seeds": report_args.eval_seeds,
            "eval_sampling": {"temperature": report_args.eval_temperature, "top_p": report_args.eval_top_p},
            "eval_seconds_per_episode": per_episode,
            "eval_in_background": background[1] if background is not None else [],
            # Every RL setting as the trainer, optimizer and model held it (the warm start's: report["sft"]).
            "rl_settings": (read_json(out / RL_FINISHED) or {}).get("arguments"),
        },
        "versions": evaluate_versions(),
        "timings_seconds": {k: round(v, 1) for k, v in timings.items()},
        "seconds": round(time.perf_counter() - started, 1),
        "output_dir": str(out),
    }
    paths = write_report(out, report, setup.interface)
    print(summary(report, setup.interface, sections=[decision_section(report)]))
    print("\n".join(f"wrote {p}" for p in paths.values()))


def decision_report(
    script_args,
    report: ReportArguments,
    warm: WarmStartArguments,
    model_args,
    trainer,
    setup: RunSetup,
    sft_adapter: str | None,
) -> dict:
    """Decision-level measures on held-out states (``decision_seeds`` x ``decision_days``, reached by the
    teacher; a fixed stratified subset of ``decision_rows``): the benchmark table (strict JSON, valid action,
    teacher match, invalid count; greedy, free decoding) and the state value of each policy's action (the final
    score after the continuation policy plays on from it, common random numbers), for the base, SFT and RL models,
    the teacher and the safe agent, with paired differences to the SFT model. Cached in ``eval/decisions.json``,
    keyed on the environment, the settings and the models' weights
    (:func:`recruit_trl.models.loading.model_fingerprint`: a re-run that trains further into the same folder measures
    again)."""
    from recruit_trl.workflow.decisions.decision_set import decision_set, sample_decisions
    from recruit_trl.workflow.decisions.report import evaluate_decisions

    out = Path(trainer.args.output_dir)
    policies = {"base": f"model:{setup.model_path}"}
    if sft_adapter:
        policies["sft"] = f"model:{sft_adapter}"
    policies.update({"grpo": f"model:{out}", warm.teacher: warm.teacher, "safe": "safe"})
    key = {
        "policies": policies, "step": trainer.state.global_step, "seeds": report.decision_seeds,
        "days": report.decision_days, "rows": report.decision_rows, "teacher": warm.teacher,
        "tasks": list(setup.tasks), "contract": script_args.contract, "recent_k": script_args.recent_k,
        "continuation": script_args.continuation_policy, "model_loading": loading_config(model_args),
        "continuations": report.decision_continuations,
        "benchmark": [report.benchmark_constrained, report.benchmark_base_heldout],
        "sft": {k: v for k, v in vars(warm).items()},
        "env": script_args.env_name, "weights": {
            label: model_fingerprint(p[len("model:") :]) for label, p in policies.items() if p.startswith("model:")
        },
    }  # fmt: skip
    cache = out / "eval" / "decisions.json"
    cached = read_json(cache)
    if isinstance(cached, dict) and cached.get("key") == key:
        return cached["result"]
    interface = setup.interface
    states = decision_set(
        interface, setup.tasks, parse_int_ranges(report.decision_seeds),
        parse_int_ranges(report.decision_days), teacher=warm.teacher, contract=script_args.contract,
        recent_k=script_args.recent_k,
    )  # fmt: skip
    states = sample_decisions(interface, states, report.decision_rows)
    result = evaluate_decisions(
        interface, policies, states, reference="sft" if "sft" in policies else warm.teacher,
        continuation=script_args.continuation_policy, continuation_seeds=report.decision_continuations,
        model_loading=key["model_loading"],
    )  # fmt: skip
    if warm.sft_data == "teacher_sets":
        result["sets"] = set_benchmark(script_args, report, warm, setup.tasks, model_args, policies, out)
    write_json_atomic(cache, {"key": key, "result": result})
    return result


def set_benchmark(
    script_args,
    report: ReportArguments,
    warm: WarmStartArguments,
    tasks: list[str],
    model_args,
    policies: dict[str, str],
    out: Path,
) -> dict:
    """The benchmark table of ``policies`` on the warm start's teacher decision sets (``fixed`` and ``heldout``,
    the warm start's ``sft_heldout_rows`` of each when set; free decoding, the constrained teacher match beside it
    with the report's ``benchmark_constrained``; the base model on the held-out set too with its
    ``benchmark_base_heldout``)."""
    from recruit_trl.workflow.warm_start import benchmark_sets, set_config

    config = set_config(script_args, warm, tasks)
    data_dir = out / "sft" / "dataset"
    return benchmark_sets(
        config, policies, data_dir, warm.sft_heldout_rows, loading_config(model_args),
        constrained=report.benchmark_constrained, base_heldout=report.benchmark_base_heldout,
    )  # fmt: skip


def sft_trained(sft_adapter: str | None) -> str | None:
    """What the warm start ``sft_adapter`` holds (``"adapter"`` or ``"full"``), ``None`` without one."""
    if not sft_adapter:
        return None
    return "adapter" if is_adapter(sft_adapter) else "full"


def built_num_parameters(model_path: str) -> int | None:
    """The parameter count recorded by recruit_trl when it built (tiny) or unpacked (SmolLM2) the model, else None."""
    meta = read_json(Path(model_path, METADATA_FILE))
    return meta.get("num_parameters") if isinstance(meta, dict) else None


def evaluate_versions() -> dict:
    """Library versions, as the evaluation records them, and the CPU: the tiny model's build and every float after it
    are reproducible to the digit on one CPU model, not across models (their vector units round differently)."""
    return {**versions(), "cpu": cpu_model()}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` knows)."""
    import platform

    try:
        with open("/proc/cpuinfo") as lines:
            return next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def decision_section(report: dict[str, Any]) -> str:
    """The summary's decision level: the held-out decisions' table and state values, and the teacher decision sets'
    benchmark when measured (empty without a decision-level report)."""
    decisions = report.get("decisions")
    if not decisions:
        return ""
    from recruit_trl.workflow.decisions.benchmark import format_result
    from recruit_trl.workflow.decisions.report import format_decision_report

    rows = decisions["config"]["decisions"]
    lines = [f"decision level: {rows} held-out decisions (greedy, free decoding), state values", ""]
    lines.append(format_decision_report(decisions))
    if decisions.get("sets"):
        lines += ["", "teacher decision sets (greedy, free decoding; constrained teacher match beside it)", ""]
        lines.append(format_result(decisions["sets"]))
    return "\n".join(lines)


def rl_finished(output_dir: str | Path) -> bool:
    """Whether RL finished in ``output_dir``: its marker (``run_info.json``, written after the weights and the trainer
    state) is whole, the trainer state is there and the saved weights open."""
    folder = Path(output_dir)
    return (
        read_json(folder / RL_FINISHED) is not None
        and read_json(folder / "trainer_state.json") is not None
        and is_trained(folder)
    )

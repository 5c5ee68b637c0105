"""Training-loop benchmark: a few GRPO optimizer steps with recruit_trl's rollouts, and their cost figures.

Usage: ``python -m recruit_trl.tools.bench_rollout [--steps 6] [--json FILE] [flags]``, where the flags are those of
the GRPO recipes' (``ScriptArguments``, ``GRPOConfig`` and ``ModelConfig`` through ``TrlParser``, e.g. ``--mode
episode``, ``--model_name_or_path``, ``--num_generations``), over the environment's GRPO config
(``recipes/configs/grpo_<env>.yaml``, the environment named by ``--env``; ``--config`` names another). It trains the
base model (a fresh LoRA adapter unless ``--use_peft false``) on the anchors, with no warm start and no final
evaluation: ``--sft_config none --report_config none`` are set here, and asking for either is an error.
``--steps`` sets ``--max_steps``; nothing is saved.

Reported (medians over the steps after the first, which pays for warm-up and anchor replay):
seconds per optimizer step, decisions the policy played and decisions trained on per second of a step (one rollout
call per optimizer step, TRL's default), generated tokens per environment decision, prompt tokens per decision, the
environment's share of rollout time, environment steps per sample, and the fraction of zero-variance groups; and the
peak memory of the first step (:class:`recruit_trl.tools.profiling.FirstStepPeakMemory`).

``--compare_baseline`` first runs the same steps on the baseline's paths (:func:`baseline_paths`: every row of a
GRPO group scored on its own in the trainer's passes and prefilled on its own in the rollouts, instead of the packed
groups of :mod:`recruit_trl.training.packed_groups` and the shared prefill of :mod:`recruit_trl.models.generation`;
with ``--use_vllm true``, the same paths generating with transformers instead of vLLM), then the current paths, and
reports both and their ``ratio`` (current over baseline) for decisions played and trained per second. ``--profile``
adds where each step's seconds go (:mod:`recruit_trl.tools.profiling`), for both runs with ``--compare_baseline``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from recruit_trl.files import write_json_atomic
from recruit_trl.models.loading import keep_4bit_layers_trainable
from recruit_trl.workflow.anchor_data import make_anchor_dataset
from recruit_trl.workflow.arguments import NONE, ScriptArguments, check_vllm_arguments
from recruit_trl.workflow.configs import env_named, parse_recipe
from recruit_trl.workflow.model_setup import model_init_kwargs, setup_run

FIGURES = {
    "seconds_per_step": "step_time",
    "gen_tokens_per_decision": "rollout/gen_tokens_per_decision",
    "prompt_tokens_per_decision": "rollout/prompt_tokens_per_decision",
    "env_time_share": "rollout/env_time_share",
    "env_steps_per_sample": "rollout/env_steps_per_row",
    "rollout_seconds": "rollout/seconds",
    "frac_reward_zero_std": "frac_reward_zero_std",
    "fallback_rate": "rollout/fallback_rate",
}


@dataclass
class BenchArguments:
    """The benchmark's own flags (every other flag is the GRPO recipe's)."""

    steps: int = field(default=6, metadata={"help": "Optimizer steps to run (sets --max_steps)."})
    json: str | None = field(default=None, metadata={"help": "Also write the figures to this JSON file."})
    profile: bool = field(
        default=False,
        metadata={"help": "Also time where each step's seconds go (recruit_trl.tools.profiling: prompts, prefill, "
                  "decoding, environment, the trainer's forward, loss, backward, optimizer, the rest), per step after "
                  "the first."},
    )  # fmt: skip
    compare_baseline: bool = field(
        default=False,
        metadata={"help": "Run the steps twice, first on the baseline's paths (each row of a group scored and "
                  "prefilled on its own), and report both and their ratio."},
    )  # fmt: skip


# Per second of an optimizer step: (the figure, the logged count per rollout call).
RATES = {
    "decisions_played_per_second": "rollout/decisions",
    "decisions_trained_per_second": "rollout/decisions_trained",
}


def summarize(log_history: list[dict], peak_mib: float | None = None) -> dict:
    """A run's figures from its log (:data:`FIGURES`, :data:`RATES`: medians over the steps after the first), with
    the peak memory of its first step (:func:`first_step_peak_mib`)."""
    steps = [h for h in log_history if "step_time" in h]
    measured = steps[1:] or steps
    out = {}
    for name, key in FIGURES.items():
        values = [float(h[key]) for h in measured if h.get(key) is not None]
        out[name] = round(statistics.median(values), 4) if values else None
    for name, key in RATES.items():
        values = [float(h[key]) / float(h["step_time"]) for h in measured if h.get(key) and float(h["step_time"]) > 0]
        out[name] = round(statistics.median(values), 2) if values else None
    out["steps_measured"] = len(measured)
    out["first_step_peak_memory_mib"] = peak_mib
    return out


def first_step_peak_mib(trainer) -> float | None:
    """What the trainer's :class:`~recruit_trl.tools.profiling.FirstStepPeakMemory` measured, or None."""
    from recruit_trl.tools.profiling import FirstStepPeakMemory  # torch

    memory = [c for c in trainer.callback_handler.callbacks if isinstance(c, FirstStepPeakMemory)]
    return memory[0].peak_mib if memory else None


@contextmanager
def baseline_paths():
    """The paths the baseline runs: every row on its own, in the trainer's passes (no packed groups:
    :mod:`recruit_trl.training.packed_groups`) and in the rollouts' prefill (each row's prompt through the model,
    :func:`recruit_trl.models.generation.distinct_rows` made the identity)."""
    import recruit_trl.models.generation as generation  # torch: imported when the benchmark runs
    from recruit_trl.training.packed_groups import PackedGroups

    packed, distinct = PackedGroups._get_per_token_logps_and_entropies, generation.distinct_rows

    def unpacked(self, *args, **kwargs):
        return super(PackedGroups, self)._get_per_token_logps_and_entropies(*args, **kwargs)

    def every_row(rows):
        return list(rows), list(range(len(rows)))

    PackedGroups._get_per_token_logps_and_entropies, generation.distinct_rows = unpacked, every_row
    try:
        yield
    finally:
        PackedGroups._get_per_token_logps_and_entropies, generation.distinct_rows = packed, distinct


def parse_args(argv: list[str] | None = None):
    """``(BenchArguments, ScriptArguments, GRPOConfig, ModelConfig)`` from the command line, parsed like the GRPO
    recipe's, from the environment's GRPO config (``recipes/configs/grpo_<env>.yaml``, ``--config`` names another),
    with a fresh LoRA adapter on the base model (``--use_peft false``: every weight), no warm start and no report.

    Raises:
        ValueError: when the flags ask for a warm start, an SFT adapter or a report.
    """
    from trl import GRPOConfig, ModelConfig

    argv = list(sys.argv[1:] if argv is None else argv)
    base = ["--sft_config", NONE, "--report_config", NONE, "--use_peft", "true"]
    types = (BenchArguments, ScriptArguments, GRPOConfig, ModelConfig)
    config = f"grpo_{env_named(argv) or 'clinical'}.yaml"
    bench, script_args, training_args, model_args = parse_recipe(types, config, [*base, *argv], rl=True)
    if script_args.sft_config != NONE or script_args.sft_adapter or script_args.report_config != NONE:
        raise ValueError("bench_rollout trains the base model only: drop --sft_config, --sft_adapter and "
                         "--report_config")  # fmt: skip
    check_vllm_arguments(training_args, model_args)
    training_args.max_steps = bench.steps
    return bench, script_args, training_args, model_args


def train(script_args, training_args, model_args):
    """Build the GRPO trainer (:func:`build`) and train it for ``training_args.max_steps`` steps; returns the
    trainer."""
    from recruit_trl.tools.profiling import FirstStepPeakMemory  # torch

    trainer, _ = build(script_args, training_args, model_args)
    trainer.add_callback(FirstStepPeakMemory())
    trainer.train()
    return trainer


def build(script_args, training_args, model_args):
    """The GRPO trainer the recipe builds without a warm start (environment, model, anchors, rollouts, rewards;
    episode mode: the rows' own advantages; the control with ``--shuffle_advantages``), and its rollout function."""
    import torch
    from transformers import AutoTokenizer
    from trl import get_peft_config

    from recruit_trl.rollout.rollout_funcs import make_rollout
    from recruit_trl.training.trainer import RecruitGRPOTrainer
    from rewards import get_reward_funcs

    if not torch.cuda.is_available():  # as the recipe: the CPU cores shared by the training processes
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // max(1, training_args.world_size)))
    setup = setup_run(script_args, model_args.model_name_or_path)
    interface, model_path = setup.interface, setup.model_path
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    rollout = make_rollout(script_args, interface, seed=training_args.seed)
    episode = script_args.mode == "episode"  # as the pipeline: the rows' own advantages, a generation batch of rows
    dataset = make_anchor_dataset(
        script_args, interface, rollout.cache, tasks=setup.tasks, student=model_path,
        temperature=training_args.temperature, top_p=training_args.top_p,
        min_rows=training_args.generation_batch_size // training_args.num_generations,
    )  # fmt: skip
    trainer = RecruitGRPOTrainer(
        model=model_path,
        reward_funcs=get_reward_funcs(script_args.reward_funcs),
        args=training_args,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(model_path, padding_side="left"),
        peft_config=get_peft_config(model_args),
        rollout_func=rollout,
        episode_advantages=episode,
        shuffle_advantages=script_args.shuffle_advantages,
    )
    keep_4bit_layers_trainable(trainer.model)
    return trainer, rollout


def profiled_train(script_args, training_args, model_args):
    """:func:`train`, timed by share (:func:`recruit_trl.tools.profiling.profile_training`); returns the trainer and
    ``{"seconds_per_step": by share after the first step, "padding": the share of padding positions by share}``."""
    from recruit_trl.tools.profiling import FirstStepPeakMemory, profile_training  # torch

    trainer, rollout = build(script_args, training_args, model_args)
    trainer.add_callback(FirstStepPeakMemory())
    with profile_training(trainer, rollout) as timed:
        trainer.train()
    return trainer, {"seconds_per_step": timed.per_step(), "padding": timed.padding()}


def run(bench: BenchArguments, script_args, training_args, model_args):
    """Train for the benchmark: ``(trainer, profile)``, the profile ``None`` without ``--profile``."""
    if bench.profile:
        return profiled_train(script_args, training_args, model_args)
    return train(script_args, training_args, model_args), None


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL; we know
    argv = sys.argv[1:] if argv is None else argv
    with tempfile.TemporaryDirectory() as out_dir:
        # Nothing is kept: a throwaway output folder and no checkpoints (later flags win over these).
        bench, script_args, training_args, model_args = parse_args(
            ["--output_dir", out_dir, "--save_strategy", "no", *argv]
        )
        baseline, baseline_shares = None, None
        if bench.compare_baseline and training_args.use_vllm:
            described = "the same paths generating with transformers"
            training_args.use_vllm = False
            try:
                trainer, baseline_shares = run(bench, script_args, training_args, model_args)
            finally:
                training_args.use_vllm = True
            baseline = summarize(trainer.state.log_history, first_step_peak_mib(trainer))
        elif bench.compare_baseline:
            described = "each row of a group scored and prefilled on its own"
            with baseline_paths():
                trainer, baseline_shares = run(bench, script_args, training_args, model_args)
            baseline = summarize(trainer.state.log_history, first_step_peak_mib(trainer))
        start = time.perf_counter()
        trainer, shares = run(bench, script_args, training_args, model_args)
        wall = time.perf_counter() - start
    figures = summarize(trainer.state.log_history, first_step_peak_mib(trainer))
    report = {
        "figures": figures,
        "config": {
            "mode": script_args.mode,
            "steps": bench.steps,
            "model": model_args.model_name_or_path,
            "num_generations": training_args.num_generations,
            "per_device_train_batch_size": training_args.per_device_train_batch_size,
            "horizon": script_args.horizon,
            "contract": script_args.contract,
            "constrained_decoding": script_args.constrained_decoding,
            "use_vllm": training_args.use_vllm,
            "wall_seconds": round(wall, 1),
        },
        "machine": {"python": platform.python_version(), "processor": platform.machine()},
    }
    if shares:
        report["profile"] = shares
    if baseline is not None:
        report["baseline"] = baseline
        if baseline_shares:
            report["baseline_profile"] = baseline_shares
        report["ratio"] = {
            name: round(figures[name] / baseline[name], 2) if figures[name] and baseline[name] else None
            for name in (*RATES, "seconds_per_step", "rollout_seconds", "first_step_peak_memory_mib")
        }
        report["baseline_paths"] = described
        print(f"baseline ({described}): {baseline}")
        print(f"ratio (current / baseline): {report['ratio']}")
    width = max(len(k) for k in report["figures"])
    for key, value in report["figures"].items():
        print(f"{key:<{width}}  {value}")
    for name, profile in (("baseline", baseline_shares), ("current", shares)):
        if profile:
            from recruit_trl.tools.profiling import share_table

            print(f"where the seconds of a step go ({name} paths):")
            print(share_table(profile["seconds_per_step"], unit="s/step"))
            print(f"padding share of the model's positions: {profile['padding']}")
    print(json.dumps(report, indent=2))
    if bench.json:
        write_json_atomic(bench.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

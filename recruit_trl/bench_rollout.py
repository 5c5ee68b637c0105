"""Training-loop benchmark: runs the GRPO recipe for a few optimizer steps and prints its cost figures.

Usage: ``python -m recruit_trl.bench_rollout [--mode branch|window] [--steps 6] [--json FILE] [recipe flags]``.
Unknown flags go to ``recipes/grpo_clinical.py`` (e.g. ``--model_name_or_path``, ``--num_generations``).

Reported (medians over the steps after the first, which pays for warm-up and anchor replay):
seconds per optimizer step, generated tokens per environment decision, prompt tokens per decision, the
environment's share of rollout time, environment steps per sample, and the fraction of zero-variance groups.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "grpo_clinical.py"
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


def load_recipe(path: Path = RECIPE):
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run the benchmark from a checkout of recruit_trl")
    spec = importlib.util.spec_from_file_location("grpo_clinical_recipe", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


def summarize(log_history: list[dict]) -> dict:
    steps = [h for h in log_history if "step_time" in h]
    measured = steps[1:] or steps
    out = {}
    for name, key in FIGURES.items():
        values = [float(h[key]) for h in measured if h.get(key) is not None]
        out[name] = round(statistics.median(values), 4) if values else None
    out["steps_measured"] = len(measured)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m recruit_trl.bench_rollout", description=__doc__.splitlines()[0])
    parser.add_argument("--mode", default="branch", choices=("branch", "window"))
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps to run")
    parser.add_argument("--json", help="also write the figures to this JSON file")
    args, recipe_argv = parser.parse_known_args(argv)
    recipe = load_recipe()
    with tempfile.TemporaryDirectory() as out_dir:
        # Rollouts only: no warm start and no final evaluation unless asked for (later flags win).
        flags = ["--mode", args.mode, "--max_steps", str(args.steps), "--output_dir", out_dir, "--save_strategy", "no",
                 "--warm_start", "none", "--report", "false"]  # fmt: skip
        script_args, training_args, model_args = recipe.parse_args([*flags, *recipe_argv])
        start = time.perf_counter()
        trainer = recipe.main(script_args, training_args, model_args)
        wall = time.perf_counter() - start
    report = {
        "figures": summarize(trainer.state.log_history),
        "config": {
            "mode": args.mode,
            "steps": args.steps,
            "model": model_args.model_name_or_path,
            "num_generations": training_args.num_generations,
            "per_device_train_batch_size": training_args.per_device_train_batch_size,
            "horizon": script_args.horizon,
            "window_turns": script_args.window_turns if args.mode == "window" else None,
            "contract": script_args.contract,
            "wall_seconds": round(wall, 1),
        },
        "machine": {"python": platform.python_version(), "processor": platform.machine()},
    }
    width = max(len(k) for k in report["figures"])
    for key, value in report["figures"].items():
        print(f"{key:<{width}}  {value}")
    print(json.dumps(report, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

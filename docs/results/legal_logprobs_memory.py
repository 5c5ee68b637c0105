"""Peak memory of one SmolLM2-135M window-mode GRPO step with constrained decoding: the legal log-probabilities as
the trainer computes them now (the LM head at the positions that offer a choice) against an earlier version of
``recruit_trl/training/legal_logprobs.py`` (the whole-vocabulary logits of every completion position).

Each variant runs in a fresh process (``ru_maxrss`` is a process's peak): the GRPO recipe
(``recipes/grpo_clinical.py``) with SmolLM2's preset (groups of 4, LoRA r=16 on every linear layer), ``--mode window``
with 2 decisions per completion, no warm start, one step, in each configuration of :data:`CONFIGS`. The process's
peak resident memory is read after the rollout and scoring, and after the step (the loss's forward and backward).
The old version is loaded from a file in place of the module, e.g.
``git show ef19a6e:recruit_trl/training/legal_logprobs.py > /tmp/old_legal.py``.

usage:
    python docs/results/legal_logprobs_memory.py --old /tmp/old_legal.py --json docs/results/legal_logprobs_memory.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECIPE_FLAGS = [
    "--model_name_or_path", "smollm2", "--mode", "window", "--window_turns", "2", "--constrained_decoding", "true",
    "--warm_start", "none", "--report", "false", "--max_steps", "1", "--save_strategy", "no",
]  # fmt: skip
# SmolLM2's preset (8 rows) does not fit 24 GB on the CPU without activation checkpointing (the model's own
# activations: 4 rows peaked at 12.7 GB, 8 were killed at 22.6 GB). Checkpointed, the logits weigh more in the step.
CONFIGS = {
    "4 rows": ["--per_device_train_batch_size", "4"],
    "8 rows, activation checkpointing": ["--per_device_train_batch_size", "8", "--activation_checkpointing", "true"],
}


def peak_mb() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_variant(old: str | None, flags: list[str]) -> dict:
    """One GRPO step in this process (``old``: the module file that replaces ``legal_logprobs``); what it measured."""
    if old is not None:  # before anything imports the module, so that the trainer mixes in the old class
        spec = importlib.util.spec_from_file_location("recruit_trl.training.legal_logprobs", old)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    sys.path.insert(0, str(ROOT / "tests"))
    from recipe_files import load_recipe

    import recruit_trl.pipeline as pipeline

    measured: dict = {}
    trainer_class = pipeline.rl_trainer_class

    def measuring(*args):
        class Measuring(trainer_class(*args)):
            def _generate_and_score_completions(self, inputs):
                output = super()._generate_and_score_completions(inputs)
                measured["after_rollout_peak_mb"] = peak_mb()
                measured["completion_tokens"] = int(output["completion_mask"].sum())
                measured["completion_width"] = int(output["completion_ids"].size(1))
                measured["rows"] = int(output["completion_ids"].size(0))
                measured["prompt_tokens"] = int(output["prompt_mask"].sum())
                print(f"after the rollout: {measured}", file=sys.stderr, flush=True)  # what a run killed later saw
                return output

            def training_step(self, *args, **kwargs):
                start = time.perf_counter()
                loss = super().training_step(*args, **kwargs)
                measured["step_seconds"] = time.perf_counter() - start  # the rollout included
                measured["after_step_peak_mb"] = peak_mb()
                return loss

        return Measuring

    pipeline.rl_trainer_class = measuring
    recipe = load_recipe("grpo_clinical")
    with tempfile.TemporaryDirectory() as out:
        recipe.main(*recipe.parse_args([*flags, "--output_dir", out]))
    return measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", required=True, help="The earlier legal_logprobs.py (e.g. from git show).")
    parser.add_argument("--json", required=True, help="Where the measurements are written.")
    parser.add_argument("--variant", choices=["old", "new"], help=argparse.SUPPRESS)  # one variant, in this process
    args, flags = parser.parse_known_args(argv)  # the flags: one configuration's, in a variant's process
    if args.variant is not None:
        result = run_variant(args.old if args.variant == "old" else None, [*RECIPE_FLAGS, *flags])
        Path(args.json).write_text(json.dumps(result))
        return 0

    from recruit_trl.files import write_json_atomic

    report: dict = {
        "command": " ".join(["python", "docs/results/legal_logprobs_memory.py", *(argv or sys.argv[1:])]),
        "recipe_flags": RECIPE_FLAGS,
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "configs": {},
    }
    for name, config_flags in CONFIGS.items():
        measured: dict = {"flags": config_flags}
        for variant in ("new", "old"):
            with tempfile.NamedTemporaryFile(suffix=".json") as tmp:
                cmd = [sys.executable, __file__, "--old", args.old, "--json", tmp.name, "--variant", variant]
                start = time.perf_counter()
                subprocess.run([*cmd, *config_flags], cwd=ROOT, check=True)
                measured[variant] = json.loads(Path(tmp.name).read_text())
                measured[variant]["process_seconds"] = time.perf_counter() - start
            print(name, variant, measured[variant], flush=True)
        measured["peak_saved_mb"] = measured["old"]["after_step_peak_mb"] - measured["new"]["after_step_peak_mb"]
        report["configs"][name] = measured
    write_json_atomic(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Compare two runs of the main job (``recipes/grpo_clinical.py``) that started from the same warm start: how far apart
their trained weights are, their stage timings, and which rows of their reports' tables differ.

Usage: ``python docs/results/compare_main_jobs.py OUTPUT_DIR_A OUTPUT_DIR_B [--json FILE]``, each folder holding the
run's ``model.safetensors`` and ``report.json``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from recruit_trl.files import write_json_atomic

# What the report's episode table (one row per policy and task) and decision benchmark (one per policy) show.
EPISODE_FIGURES = (
    "final_score_mean", "final_score_sd", "enrolled_mean", "strict_json_rate", "valid_action_rate",
    "fallback_rate", "teacher_match", "own_answer_valid_rate",
)  # fmt: skip
DECISION_FIGURES = ("rows", "strict_json", "valid", "teacher_match", "invalid")


def compare(a: Path, b: Path) -> dict:
    weights_a, weights_b = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    if weights_a.keys() != weights_b.keys():
        raise ValueError(f"{a} and {b} hold different tensors")
    squared_diff = squared_norm = largest = 0.0
    for name, tensor in weights_a.items():
        diff = tensor.float() - weights_b[name].float()
        squared_diff += float(diff.norm()) ** 2
        squared_norm += float(tensor.float().norm()) ** 2
        largest = max(largest, float(diff.abs().max()))
    report_a, report_b = (json.loads((folder / "report.json").read_text()) for folder in (a, b))
    episode_rows = []
    for row_a, row_b in zip(report_a["results"], report_b["results"], strict=True):
        differs = {k: [row_a.get(k), row_b.get(k)] for k in EPISODE_FIGURES if row_a.get(k) != row_b.get(k)}
        episode_rows.append({"policy": row_a["policy"], "task": row_a["task"], "differs": differs})
    bench_a, bench_b = report_a["decisions"]["benchmark"], report_b["decisions"]["benchmark"]
    decisions = {
        policy: {k: [bench_a[policy].get(k), bench_b[policy].get(k)] for k in DECISION_FIGURES} for policy in bench_a
    }
    return {
        "runs": [str(a), str(b)],
        "weights": {"max_abs_diff": largest, "relative_norm_diff": (squared_diff**0.5) / (squared_norm**0.5)},
        "timings_seconds": [report_a["timings_seconds"], report_b["timings_seconds"]],
        "episode_rows": len(episode_rows),
        "episode_rows_that_differ": [row for row in episode_rows if row["differs"]],
        "decision_benchmark": decisions,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    parser.add_argument("--json", help="also write the comparison here")
    args = parser.parse_args()
    with torch.no_grad():
        result = compare(args.a, args.b)
    print(json.dumps(result, indent=2))
    if args.json:
        write_json_atomic(args.json, result)


if __name__ == "__main__":
    main()

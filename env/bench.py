"""Environment throughput benchmark: steps/s, resets/s and snapshot+restore/s per task.

Usage: ``python -m env.bench [--tasks easy_bench medium_bench hard_bench] [--episodes 20] [--repeats 5]
[--json FILE]``. Steps/s plays full episodes with the README quick-start policy (the reference's own
benchmark policy) in-process, timing ``env.step`` plus the policy, as the reference's figures did. Each figure is
the median over ``--repeats`` runs, printed as a table with the ratio against the reference's published
in-process figures, and as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time

from env.core import ClinicalRecruitmentEnv
from env.policies import heuristic_policy
from env.tasks import PUBLIC_TASK_IDS

# The reference's in-process figures on a 2-core machine of this kind (shared/spec/reference-results.md).
REFERENCE_STEPS_PER_S = {"easy_bench": 1798.0, "medium_bench": 1379.0, "hard_bench": 1061.0}
REFERENCE_RESET_S = {"easy_bench": 0.006, "medium_bench": 0.010, "hard_bench": 0.013}
SNAPSHOT_GOAL_PER_S = 20_000.0


def bench_steps(task: str, episodes: int) -> float:
    env = ClinicalRecruitmentEnv(task)
    rng = random.Random(0)
    steps = 0
    start = time.perf_counter()
    for seed in range(episodes):
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            obs, _, terminated, truncated, _ = env.step(heuristic_policy(obs, rng))
            done = terminated or truncated
            steps += 1
    return steps / (time.perf_counter() - start)


def bench_resets(task: str, n: int) -> float:
    env = ClinicalRecruitmentEnv(task)
    start = time.perf_counter()
    for seed in range(n):
        env.reset(seed=seed)
    return n / (time.perf_counter() - start)


def bench_snapshots(task: str, n: int, day: int = 90) -> float:
    """Snapshot + restore pairs per second, on a mid-episode state (``day`` steps of the heuristic)."""
    env = ClinicalRecruitmentEnv(task)
    obs, _ = env.reset(seed=0)
    rng = random.Random(0)
    for _ in range(min(day, env.task.max_steps // 2)):
        obs, *_ = env.step(heuristic_policy(obs, rng))
    start = time.perf_counter()
    for _ in range(n):
        env.restore(env.snapshot())
    return n / (time.perf_counter() - start)


def run(tasks: list[str], episodes: int, repeats: int) -> dict:
    results = {}
    for task in tasks:
        steps = statistics.median(bench_steps(task, episodes) for _ in range(repeats))
        resets = statistics.median(bench_resets(task, 200) for _ in range(repeats))
        snaps = statistics.median(bench_snapshots(task, 2000) for _ in range(repeats))
        results[task] = {
            "steps_per_s": round(steps),
            "steps_ratio_vs_reference": round(steps / REFERENCE_STEPS_PER_S[task], 1)
            if task in REFERENCE_STEPS_PER_S
            else None,
            "resets_per_s": round(resets),
            "reset_ms": round(1000 / resets, 3),
            "snapshot_restore_per_s": round(snaps),
        }
    return {
        "results": results,
        "config": {"episodes": episodes, "repeats": repeats, "policy": "heuristic (README quick-start)"},
        "machine": {"python": platform.python_version(), "processor": platform.machine()},
    }


def format_table(report: dict) -> str:
    header = f"{'task':<24}{'steps/s':>10}{'x ref':>8}{'resets/s':>10}{'reset ms':>10}{'snap+restore/s':>16}"
    lines = [header, "-" * len(header)]
    for task, r in report["results"].items():
        ratio = f"{r['steps_ratio_vs_reference']:.1f}" if r["steps_ratio_vs_reference"] is not None else "-"
        lines.append(
            f"{task:<24}{r['steps_per_s']:>10,}{ratio:>8}{r['resets_per_s']:>10,}"
            f"{r['reset_ms']:>10.3f}{r['snapshot_restore_per_s']:>16,}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m env.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(PUBLIC_TASK_IDS), help="task ids to benchmark")
    parser.add_argument("--episodes", type=int, default=20, help="full episodes per steps/s measurement")
    parser.add_argument("--repeats", type=int, default=5, help="measurements per figure (the median is kept)")
    parser.add_argument("--json", help="also write the report to this JSON file")
    args = parser.parse_args(argv)
    report = run(args.tasks, args.episodes, args.repeats)
    print(format_table(report))
    print(json.dumps(report, indent=2))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

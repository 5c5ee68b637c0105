"""The summary of a learning check's JSON as the learning check computes it today, for checks written before it
reported credit minus start.

Reads the rows and the start's rows of each ``learning_check_*.json`` named, recomputes the summary with
:func:`recruit_trl.tools.learning_check.summarize` (credit minus start, credit minus control, control minus start, by
training seed, each with its SE and t on n-1 degrees of freedom), for every task, the mean over tasks and, where the
check ran clinical's medium and hard tasks, their mean; prints a line per decoding and task, and with ``--json`` writes
them all.

Usage: python docs/results/learning_check_summary.py FILE [FILE ...] [--json OUT]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from recruit_trl.files import read_json, write_json_atomic
from recruit_trl.tools.learning_check import summarize

PAIR = ["medium_bench", "hard_bench"]  # clinical's tasks where the credit has room to learn


def summaries(check: dict) -> dict[str, dict]:
    """``{"all": summary over every task, "medium+hard": the summary over medium and hard}`` (the second only where
    the check ran both)."""
    rows, start = check["rows"], check["start"]["rows"]
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    out = {"all": summarize(rows, start, tasks)}
    if all(task in tasks for task in PAIR):
        pick = [r for r in rows if r["task"] in PAIR]
        out["medium+hard"] = summarize(pick, [r for r in start if r["task"] in PAIR], PAIR)
    return out


def figure(d: dict) -> str:
    t = "" if d.get("t") is None else f", t = {d['t']:.2f}"
    return f"{d['mean']:+.3f} ± {d['se']:.3f}{t}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="learning_check JSON files")
    parser.add_argument("--json", type=Path, help="write every file's recomputed summary here")
    args = parser.parse_args()
    written = {}
    for path in args.files:
        written[path.name] = by_set = summaries(read_json(path))
        print(path)
        for name, summary in by_set.items():
            for decoding, cells in summary.items():
                for task, cell in cells.items():
                    if name != "all" and task != "mean":
                        continue
                    label = task if name == "all" else name
                    print(
                        f"  {decoding:8s} {label:13s} start {cell['start']:.3f}"
                        f" | credit-start {figure(cell['credit_minus_start'])}"
                        f" | credit-control {figure(cell['credit_minus_control'])}"
                        f" | control-start {figure(cell['control_minus_start'])}"
                    )
    if args.json:
        write_json_atomic(args.json, written)


if __name__ == "__main__":
    main()

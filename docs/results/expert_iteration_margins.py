"""The planner's margins at the states an expert-iteration run kept: its best proposal and the average other proposal,
each against the model's greedy choice, by the planner's own mean scores (``round-K/rows.json``).

    python docs/results/expert_iteration_margins.py outputs/ei_check/treatment_seed0 outputs/ei_check/treatment_seed1
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from statistics import mean


def margins(rows: list[dict]) -> dict:
    """Per kept row: best minus greedy and the mean of the other proposals minus greedy (the planner's means)."""
    best, other, scored = [], [], []
    for row in rows:
        means = {int(k): v for k, v in row["means"].items()}
        greedy = means[row["greedy"]]
        best.append(means[row["best"]] - greedy)
        other.append(mean(v for k, v in means.items() if k != row["greedy"]) - greedy)
        scored.append(len(means))
    return {"states": len(rows), "scored_per_state": mean(scored), "best_minus_greedy": mean(best),
            "other_minus_greedy": mean(other)}  # fmt: skip


if __name__ == "__main__":
    for run in sys.argv[1:]:
        for folder in sorted(Path(run).glob("round-*")):
            m = margins(json.loads((folder / "rows.json").read_text()))
            print(
                f"{folder}: {m['states']} states, {m['scored_per_state']:.1f} proposals scored each, best - greedy "
                f"{m['best_minus_greedy']:.4f}, average other - greedy {m['other_minus_greedy']:.4f}"
            )

"""The learning check's toy rung, one training seed (slow): on the aimless walk, branch mode's credit run reaches
90 % of the best policy's held-out score from a start at 0, while its control (the same run with the advantages
shuffled) does not; with a learning rate of 0 neither arm does. The command is docs/results.md's toy rung with
``--seeds 0``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
EVAL_SEEDS = "0-49"
TOY_RUNG_FLAGS = [
    "--env", "tests.toy_env:AIMLESS_TOY", "--warm_start", "none", "--anchor_policy", "wanderer",
    "--anchor_seeds", "100-115", "--anchor_days", "1-11", "--save_strategy", "no", "--max_steps", "300",
    "--use_peft", "false", "--constrained_decoding", "true", "--eval_constrained", "true",
]  # fmt: skip


def run(argv: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return proc


def best_policy_score(tmp_path: Path) -> float:
    """The planner's greedy mean final score over both tasks on the rung's held-out seeds."""
    out = tmp_path / "planner.json"
    run([sys.executable, "-m", "recruit_trl", "eval", "--env", "tests.toy_env:AIMLESS_TOY", "--policy", "planner",
         "--seeds", EVAL_SEEDS, "--json", str(out)])  # fmt: skip
    report = json.loads(out.read_text())
    scores = [row["final_score_mean"] for row in report["results"]]
    return sum(scores) / len(scores)


@pytest.mark.slow
@pytest.mark.parametrize(("learning_rate", "learns"), [("2e-4", True), ("0", False)])
def test_the_toy_rung_is_climbed_by_the_credit_and_not_by_its_control(learning_rate, learns, tmp_path):
    best = best_policy_score(tmp_path)
    assert best > 0.9
    out = tmp_path / "check"
    run([
        sys.executable, "-m", "recruit_trl", "learning-check", "grpo_clinical", "--seeds", "0",
        "--eval_seeds", EVAL_SEEDS, "--output_dir", str(out), "--no_progress",
        "--", *TOY_RUNG_FLAGS, "--learning_rate", learning_rate,
    ])  # fmt: skip
    greedy = json.loads((out / "learning_check.json").read_text())["summary"]["greedy"]["mean"]
    credit, control = greedy["credit"]["mean"], greedy["control"]["mean"]
    assert greedy["start"] < 0.5 * best
    assert control < 0.5 * best, "the shuffled credit climbed the rung: the gain is not from the credit"
    if learns:
        assert credit >= 0.9 * best, (credit, best)
    else:
        assert credit < 0.5 * best, "a learning rate of 0 climbed the rung"

"""``recruit-trl learning-check expert_iteration``: its summary against hand computations, its refusals (before
anything trains), and the real command on the smallest model: three arms, every round evaluated, then a re-run that
trains and evaluates nothing and a report-only run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from recruit_trl.cli import main
from recruit_trl.tools.expert_iteration_check import format_summary, summarize


def row(arm: str, seed: int, k: int, task: str, value: float) -> dict:
    return {"arm": arm, "seed": seed, "round": k, "task": task, "value": value}


def test_summary_by_hand():
    # one task, two seeds, two rounds; start 0.5, planner 0.7 (gap 0.2)
    finals = {"treatment": (0.66, 0.64), "self": (0.52, 0.56), "shuffled": (0.50, 0.46)}
    rows = [row(arm, s, 1, "t", v) for arm, pair in finals.items() for s, v in enumerate(pair)]
    rows += [row(arm, s, 0, "t", 0.55) for arm in finals for s in range(2)]
    summary = summarize(rows, {"t": 0.5}, {"t": 0.7}, ["t"], rounds=2)
    assert list(summary) == ["t", "mean"]
    cell = summary["t"]
    assert cell["treatment"]["mean"] == pytest.approx(0.65) and cell["treatment"]["se"] == pytest.approx(0.01)
    assert cell["start"] == 0.5 and cell["planner"] == 0.7
    # treatment - start: 0.16, 0.14 -> mean 0.15, se = sd / sqrt(2) = sqrt(2 * 0.01**2) / sqrt(2) = 0.01, t = 15
    assert cell["treatment_minus_start"]["mean"] == pytest.approx(0.15)
    assert cell["treatment_minus_start"]["t"] == pytest.approx(15.0) and cell["treatment_minus_start"]["df"] == 1
    # treatment - self by seed: 0.14, 0.08 -> mean 0.11, se 0.03, t 3.667
    paired = cell["treatment_minus_self"]
    assert paired["diffs"] == pytest.approx([0.14, 0.08]) and paired["t"] == pytest.approx(0.11 / 0.03)
    assert cell["treatment_minus_shuffled"]["mean"] == pytest.approx(0.17)
    assert cell["shuffled_minus_start"]["mean"] == pytest.approx(-0.02)
    # share of the gap closed: round 0 (0.55 - 0.5) / 0.2 = 0.25; round 1 the treatment's 0.15 / 0.2 = 0.75
    assert cell["gap_closed"]["treatment"] == pytest.approx([0.25, 0.75])
    assert cell["gap_closed"]["shuffled"] == pytest.approx([0.25, -0.1])
    assert summary["mean"]["treatment_minus_self"]["mean"] == pytest.approx(0.11)  # one task: the mean is the task
    table = format_summary(summary, "final_score_mean")
    assert "0.650 ± 0.010 (n 2)" in table and "t = 15.00 (df 1)" in table and "0.25 / 0.75" in table


def test_summary_without_a_gap_or_a_second_seed():
    rows = [row(arm, 0, 0, "t", 0.6) for arm in ("treatment", "self", "shuffled")]
    summary = summarize(rows, {"t": 0.5}, {"t": 0.5}, ["t"], rounds=1)
    cell = summary["t"]
    assert cell["gap_closed"]["treatment"] == [None]  # the planner does not beat the start: no share
    assert cell["treatment_minus_start"]["n"] == 1 and cell["treatment_minus_start"]["t"] is None
    assert math.isclose(cell["treatment_minus_start"]["mean"], 0.1)
    assert "(n 1: no SE, no t)" in format_summary(summary, "final_score_mean")


def flags(start: str) -> list[str]:
    """The smallest expert iteration: the 30-day task, two rounds of one seed, five decision days."""
    return ["--start", start, "--tasks", "hard_bench_stage_30", "--rounds", "2", "--train_seeds", "0-1",
            "--seeds_per_round", "1", "--days", "5-25:5", "--candidates", "3", "--continuations", "2", "--race", "0",
            "--margin", "0", "--per_device_train_batch_size", "4"]  # fmt: skip


@pytest.mark.parametrize(
    ("more", "recipe_flags", "message"),
    [
        ([], ["--labels", "self"], "the check sets --labels for every run itself"),
        ([], ["--seed=3"], "the check sets --seed"),
        (["--eval_seeds", "1-2"], [], "--eval_seeds 1-2 holds seeds the rounds play (1 of --train_seeds 0-1)"),
        ([], ["--rounds", "3"], "expert_iteration.py refuses the recipe flags: --train_seeds 0-1 holds 2 seeds"),
        ([], ["--start", "nowhere"], "--start nowhere: no trained model there"),
    ],
    ids=["labels", "seed", "seen-seeds", "rounds", "start"],
)
def test_bad_arguments_are_refused_before_training(tiny_model, tmp_path, capsys, more, recipe_flags, message):
    out = tmp_path / "check"
    command = ["learning-check", "expert_iteration", "--output_dir", str(out), *more, "--", *flags(tiny_model),
               *recipe_flags]  # fmt: skip
    assert main(command) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("recruit-trl learning-check")]
    assert len(errors) == 1 and message in errors[0], errors
    assert not out.exists()


def test_report_only_is_for_expert_iteration_recipes(tmp_path, capsys):
    assert main(["learning-check", "grpo_clinical", "--report_only", "--output_dir", str(tmp_path / "c"), "--"]) == 2
    assert "--report_only: for expert-iteration recipes only" in capsys.readouterr().err


def test_expert_iteration_check_end_to_end_rerun_and_report_only(tiny_model, tmp_path, capsys):
    """One training seed in the three arms through the real recipe processes (one round each, to keep the suite
    short): every round's model, the start and the planner evaluated; the JSON, the table and the PNG; a re-run
    reuses every run and evaluation; a report-only run reports the same figures."""
    out = tmp_path / "check"
    recipe_flags = [*flags(tiny_model), "--rounds", "1"]
    command = ["learning-check", "expert_iteration", "--seeds", "0", "--eval_seeds", "40", "--output_dir", str(out),
               "--no_progress", "--", *recipe_flags]  # fmt: skip
    assert main(command) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    report = json.loads((out / "learning_check.json").read_text())
    assert [(r["arm"], r["status"]) for r in report["runs"]] == [("treatment", "trained"), ("self", "trained"),
                                                                ("shuffled", "trained")]  # fmt: skip
    for run in report["runs"]:
        assert run["record"]["code"] == report["code"] and len(run["rounds"]) == 1
        labels = {info["labels"] for info in run["rounds"]}
        assert labels == {"planner" if run["arm"] == "treatment" else run["arm"]}
    assert sorted({(r["arm"], r["round"]) for r in report["rows"]}) == [
        (arm, 0) for arm in ("self", "shuffled", "treatment")
    ]
    assert report["start_scores"]["hard_bench_stage_30"] is not None and report["planner_scores"]
    cell = report["summary"]["mean"]
    assert cell["treatment"]["n"] == 1 and len(cell["gap_closed"]["treatment"]) == 1
    assert "treatment-self" in printed and Path(report["png"]).is_file()
    evaluations = sorted(out.rglob("eval/*.json"))
    assert len(evaluations) == 2 + 3  # the start, the planner, every round of every run
    stamps = [p.stat().st_mtime_ns for p in evaluations]

    assert main(command) == 0
    again = json.loads((out / "learning_check.json").read_text())
    assert all(r["status"] == "finished before" for r in again["runs"])
    assert [p.stat().st_mtime_ns for p in evaluations] == stamps and again["summary"] == report["summary"]

    assert main([*command[: -len(recipe_flags) - 1], "--report_only", "--", *recipe_flags]) == 0
    only = json.loads((out / "learning_check.json").read_text())
    assert only["report_only"] and only["summary"] == report["summary"]

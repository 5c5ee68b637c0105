"""``recruit-trl learning-check``: its statistics against hand computations, its argument checks (refused before
anything trains), what it reuses (only what the same clean commit made) and the real command on the toy environment,
twice (the second time everything is skipped)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from recruit_trl.cli import main
from recruit_trl.tools import learning_check as check
from recruit_trl.tools.learning_check import (
    FLAGS_FILE,
    RUN_RECORD,
    format_summary,
    mean_se,
    own_flags_in,
    paired_differences,
    seen_seeds,
    summarize,
)
from recruit_trl.versions import code_commit, code_hash

ROOT = Path(__file__).parents[1]
# A toy run small enough for a test: both toy tasks, one anchor seed, a few anchor days, batches of 8 (4 generations).
TOY_FLAGS = [
    "--env", "tests.toy_env:TOY", "--sft_config", "none", "--max_steps", "2", "--tasks", "near", "far",
    "--anchor_seeds", "100", "--anchor_days", "0-6:3", "--per_device_train_batch_size", "8", "--num_generations", "4",
    "--save_strategy", "no", "--learning_rate", "0.02",
]  # fmt: skip
# The toy run's recipe config (--config), in place of grpo_clinical's own, whose policies, warm start and report are
# clinical's: the fields' environment-neutral defaults (fallback policies, the default rewards) and the tiny model's
# CPU settings, every weight trained; the report config it names is written beside it (toy_flags).
TOY_CONFIG = {
    "model_name_or_path": "tiny", "use_peft": False, "reward_weights": [1.0, 0.5], "max_completion_length": 12,
    "beta": 0.0, "temperature": 1.0, "logging_steps": 1, "report_to": "none", "gradient_checkpointing": None,
    "seed": 0,
}  # fmt: skip
TOY_REPORT = {"eval_workers": 1}  # the check's evaluation in one process; the report's other settings: its defaults
# A toy warm start: the SFT defaults (activation checkpointing left to its own, unset, name: off without a warning)
TOY_SFT = {"env_name": "tests.toy_env:TOY", "model_name_or_path": "tiny", "gradient_checkpointing": None}


def write_yaml(path: Path, values: dict) -> Path:
    """``values`` as a YAML config file at ``path``; returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(values, sort_keys=False))
    return path


def toy_flags(folder: Path, report: dict | None = TOY_REPORT) -> list[str]:
    """:data:`TOY_FLAGS` over the toy's recipe config, written into ``folder`` with ``report`` as its report config
    (``None``: none)."""
    report_config = "none" if report is None else str(write_yaml(folder / "toy_report.yaml", report))
    config = write_yaml(folder / "toy_grpo.yaml", {**TOY_CONFIG, "report_config": report_config})
    return ["--config", str(config), *TOY_FLAGS]


@pytest.fixture(autouse=True)
def importable(monkeypatch):
    """``tests.toy_env`` is imported from the repository root (as ``python -m pytest`` there does anyway)."""
    monkeypatch.syspath_prepend(str(ROOT))


@pytest.fixture
def commit(monkeypatch):
    """The code's commit as the check sees it, ``{"commit", "dirty"}``, set by the test (a clean made-up commit to
    begin with): what a re-run reuses must not depend on whether this checkout has uncommitted changes."""
    state = {"commit": "a" * 40, "dirty": False}
    monkeypatch.setattr(check, "code_commit", lambda: dict(state))
    return state


# --------------------------------------------------------------------------------------------------
# statistics, by hand


def test_mean_and_standard_error_by_hand():
    # mean 2.5; sample variance (2.25 + 0.25 + 0.25 + 2.25) / 3 = 5/3; se = sqrt(5/3 / 4)
    stats = mean_se([1.0, 2.0, 3.0, 4.0])
    assert stats["n"] == 4 and stats["mean"] == 2.5
    assert stats["se"] == pytest.approx(math.sqrt(5 / 12))
    assert mean_se([0.7]) == {"n": 1, "mean": 0.7, "se": None}
    assert mean_se([]) == {"n": 0, "mean": None, "se": None}


def test_paired_differences_by_hand():
    credit = {0: 0.5, 1: 0.7, 2: 0.6, 3: 0.9}  # seed 3 has no control: not paired
    control = {0: 0.4, 1: 0.5, 2: 0.6}
    # d = 0.1, 0.2, 0.0: mean 0.1, sd sqrt((0 + 0.01 + 0.01) / 2) = 0.1, se 0.1 / sqrt(3), t = sqrt(3) on 2 df
    paired = paired_differences(credit, control)
    assert paired["seeds"] == [0, 1, 2] and paired["diffs"] == pytest.approx([0.1, 0.2, 0.0])
    assert paired["n"] == 3 and paired["df"] == 2
    assert paired["mean"] == pytest.approx(0.1)
    assert paired["se"] == pytest.approx(0.1 / math.sqrt(3))
    assert paired["t"] == pytest.approx(math.sqrt(3))
    one = paired_differences({0: 0.5}, {0: 0.25})
    assert one["n"] == 1 and one["mean"] == 0.25 and one["se"] is None and one["t"] is None and one["df"] is None
    flat = paired_differences({0: 0.5, 1: 0.6}, {0: 0.25, 1: 0.35})  # the same difference twice: se 0, no t
    assert flat["se"] == 0 and flat["t"] is None and flat["df"] == 1


def test_summary_by_hand():
    values = {  # (arm, seed) -> (task a, task b)
        ("credit", 0): (0.6, 0.2), ("credit", 1): (0.8, 0.4),
        ("control", 0): (0.5, 0.3), ("control", 1): (0.5, 0.1),
    }  # fmt: skip
    rows = [
        {"arm": arm, "seed": seed, "task": task, "decoding": "greedy", "value": v}
        for (arm, seed), pair in values.items()
        for task, v in zip("ab", pair, strict=True)
    ]
    start = [{"task": "a", "decoding": "greedy", "value": 0.5}, {"task": "b", "decoding": "greedy", "value": 0.1}]
    summary = summarize(rows, start, ["a", "b"])
    assert list(summary) == ["greedy"] and list(summary["greedy"]) == ["a", "b", "mean"]
    a = summary["greedy"]["a"]
    assert a["credit"]["mean"] == pytest.approx(0.7) and a["credit"]["se"] == pytest.approx(0.1)
    assert a["credit"]["values"] == {0: 0.6, 1: 0.8}
    assert a["control"]["mean"] == pytest.approx(0.5) and a["control"]["se"] == 0
    assert a["start"] == 0.5 and a["credit_minus_start"]["mean"] == pytest.approx(0.2)
    assert a["control_minus_start"]["diffs"] == [0, 0] and a["control_minus_start"]["t"] is None  # no spread
    # a: d = 0.1, 0.3 -> mean 0.2, se = sd / sqrt(2) = sqrt(0.02) / sqrt(2) = 0.1, t = 2 on 1 df
    assert a["credit_minus_control"]["mean"] == pytest.approx(0.2)
    assert a["credit_minus_control"]["se"] == pytest.approx(0.1)
    assert a["credit_minus_control"]["t"] == pytest.approx(2.0) and a["credit_minus_control"]["df"] == 1
    # the mean over tasks per seed: credit 0.4, 0.6; control 0.4, 0.3; start 0.3; d = 0.0, 0.3
    mean = summary["greedy"]["mean"]
    assert mean["credit"]["values"] == pytest.approx({0: 0.4, 1: 0.6})
    assert mean["control"]["values"] == pytest.approx({0: 0.4, 1: 0.3})
    assert mean["start"] == pytest.approx(0.3) and mean["credit_minus_start"]["diffs"] == pytest.approx([0.1, 0.3])
    assert mean["credit_minus_control"]["diffs"] == pytest.approx([0.0, 0.3])
    assert mean["credit_minus_control"]["t"] == pytest.approx(0.15 / 0.15)
    text = format_summary(summary, "final_score_mean")
    assert "final_score_mean, greedy:" in text and "+0.200 ± 0.100  t = 2.00 (df 1)" in text


def test_each_arm_minus_the_start_by_hand():
    credit, control = {0: 0.6, 1: 0.9, 2: 0.7}, {0: 0.4, 1: 0.5, 2: 0.3}
    rows = [{"arm": arm, "seed": seed, "task": "a", "decoding": "greedy", "value": v}
            for arm, values in (("credit", credit), ("control", control)) for seed, v in values.items()]  # fmt: skip
    summary = summarize(rows, [{"task": "a", "decoding": "greedy", "value": 0.5}], ["a"])
    cell = summary["greedy"]["a"]
    # credit - start: d = 0.1, 0.4, 0.2 = (3, 12, 6) / 30; mean 7/30; squared deviations (16 + 25 + 1) / 900 over
    # 2 df: variance 21/900; se^2 = 21/900/3 = 7/900, se = sqrt(7)/30; t = (7/30) / (sqrt(7)/30) = sqrt(7) on 2 df
    up = cell["credit_minus_start"]
    assert up["seeds"] == [0, 1, 2] and up["diffs"] == pytest.approx([0.1, 0.4, 0.2])
    assert up["n"] == 3 and up["df"] == 2 and up["mean"] == pytest.approx(7 / 30)
    assert up["se"] == pytest.approx(math.sqrt(7) / 30) and up["t"] == pytest.approx(math.sqrt(7))
    # control - start: d = -0.1, 0.0, -0.2; mean -0.1; squared deviations 0 + 0.01 + 0.01 over 2 df: sd 0.1,
    # se 0.1 / sqrt(3), t = -sqrt(3): the control fell below the start
    down = cell["control_minus_start"]
    assert down["diffs"] == pytest.approx([-0.1, 0.0, -0.2]) and down["mean"] == pytest.approx(-0.1)
    assert down["se"] == pytest.approx(0.1 / math.sqrt(3)) and down["t"] == pytest.approx(-math.sqrt(3))
    # credit - control (d = 0.2, 0.4, 0.4) is the sum of the two: mean 1/3 = 7/30 + 0.1
    assert cell["credit_minus_control"]["mean"] == pytest.approx(up["mean"] - down["mean"])
    text = format_summary(summary, "win_rate")
    header = next(line for line in text.splitlines() if line.startswith("task"))
    assert header.split()[4:] == ["credit-start", "(by", "seed)", "credit-control", "(by", "seed)", "control-start",
                                  "(by", "seed)"]  # fmt: skip
    assert "+0.233 ± 0.088  t = 2.65 (df 2)  +0.333 ± 0.067  t = 5.00 (df 2)  -0.100 ± 0.058  t = -1.73 (df 2)" in text


def test_summary_of_one_seed_says_there_is_no_t():
    rows = [{"arm": arm, "seed": 0, "task": "a", "decoding": "sampled", "value": v} for arm, v in
            (("credit", 0.5), ("control", 0.25))]  # fmt: skip
    summary = summarize(rows, [], ["a"])
    paired = summary["sampled"]["a"]["credit_minus_control"]
    assert paired["n"] == 1 and paired["t"] is None and summary["sampled"]["a"]["start"] is None
    assert summary["sampled"]["a"]["credit_minus_start"] == {"seeds": [], "diffs": [], "n": 0, "mean": None,
                                                             "se": None, "t": None, "df": None}  # fmt: skip
    assert "+0.250 (n 1: no SE, no t)" in format_summary(summary, "win_rate")


# --------------------------------------------------------------------------------------------------
# argument checks: refused with one line before anything trains


def test_the_flags_the_check_sets_itself_are_found_in_every_spelling():
    flags = ["--seed", "1", "--output-dir=x", "--report_to", "none", "--shuffle_advantages", "true",
             "--report-config=none"]  # fmt: skip
    assert own_flags_in(flags) == ["--seed", "--output_dir", "--shuffle_advantages"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["no_such_recipe", "--"], "unknown recipe 'no_such_recipe'"),
        (["grpo_clinical", "--seeds", "3-1", "--"], "--seeds: bad range '3-1'"),
        (["grpo_clinical", "--eval_seeds", "x", "--"], "--eval_seeds: bad range 'x'"),
        (["grpo_clinical", "--", "--seed", "1"], "the check sets --seed for every run itself"),
        (["grpo_clinical", "--", "--shuffle_advantages", "true"], "the check sets --shuffle_advantages"),
        (["grpo_clinical", "--", "--output-dir=elsewhere"], "the check sets --output_dir"),
        (["grpo_clinical", "--", "--no_such_flag", "1"], "grpo_clinical.py refuses the recipe flags: Some"),
        (["grpo_clinical", "--", "--max_steps", "x"], "refuses the recipe flags: argument --max_steps"),
        (["grpo_clinical", "--", "--report", "false"], "--report was replaced by --report_config"),
        (["grpo_clinical", "--", "--warm_start", "auto"], "--warm_start was replaced by --sft_config"),
        (["grpo_clinical", "--", "--eval_seeds", "0-9"], "--eval_seeds is a report setting: set it in"),
        (["grpo_clinical", "--", "--dagger_rounds", "1"], "--dagger_rounds is a warm-start setting"),
        (["grpo_clinical", "--", "--sft_config", "no_such.yaml"], "config file 'no_such.yaml' not found"),
        (["sft_clinical", "--"], "sft_clinical.py is not an RL recipe"),
        (
            ["grpo_clinical", "--eval_seeds", "98-101", "--"],
            "learning-check --eval_seeds 98-101 overlap the recipe's --anchor_seeds 100 on 100: held-out episodes",
        ),
    ],
)
def test_bad_arguments_are_refused_before_training(argv, message, tmp_path, capsys):
    command = ["learning-check", argv[0], "--output_dir", str(tmp_path / "check"), *argv[1:]]
    cut = command.index("--")
    command[cut + 1 : cut + 1] = toy_flags(tmp_path) if argv[0] == "grpo_clinical" else []
    assert message in refused(command, capsys)


def refused(command: list[str], capsys) -> str:
    """The one error line of ``recruit-trl COMMAND``, which must stop with exit status 2 before writing anything."""
    out = Path(command[command.index("--output_dir") + 1])
    assert main(command) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("recruit-trl learning-check")]
    assert len(errors) == 1, errors
    assert not out.exists()  # nothing was written, nothing trained
    return errors[0]


def test_held_out_seeds_training_saw_are_refused(tmp_path, capsys):
    """The held-out seeds by default are the report config's (without one, the report's defaults); the seeds training
    saw are the recipe's anchors and the SFT config's, as parsed (defaults included), for a warm start trained by the
    start or one given (--sft_adapter, whose training the SFT config is the best guess of)."""
    command = ["learning-check", "grpo_clinical", "--output_dir", str(tmp_path / "check")]
    # the report config's own held-out seeds are checked too
    flags = toy_flags(tmp_path / "report", {**TOY_REPORT, "eval_seeds": "100-101"})
    error = refused([*command, "--", *flags], capsys)
    assert "the report config's eval_seeds 100-101 overlap the recipe's --anchor_seeds 100 on 100" in error
    # no report config: the report's default held-out seeds
    error = refused([*command, "--", *toy_flags(tmp_path / "none", None), "--anchor_seeds", "5"], capsys)
    assert "the report's default eval_seeds 0-9 overlap the recipe's --anchor_seeds 5 on 5" in error
    # the warm start's seeds: the SFT config's defaults, as the recipe parsed them
    sft = str(write_yaml(tmp_path / "toy_sft.yaml", {**TOY_SFT, "dagger_rounds": 1}))
    flags = [*toy_flags(tmp_path), "--sft_config", sft]
    error = refused([*command, "--eval_seeds", "0-9,305", "--", *flags], capsys)
    assert ("--eval_seeds 0-9,305 overlap the SFT config's sft_train_seeds 300-311 on 305; the SFT config's "
            "dagger_seeds 300-307 on 305") in error  # fmt: skip
    error = refused([*command, "--eval_seeds", "305", "--", *flags, "--sft_adapter", "some/adapter"], capsys)
    assert "--eval_seeds 305 overlap the SFT config's sft_train_seeds 300-311 on 305" in error


def test_the_start_trains_the_warm_start_the_runs_start_from(tmp_path):
    """With an SFT config and no --sft_adapter, the start trains the warm start once and every run starts from it,
    training none of its own and making no report; with an --sft_adapter, the adapter is the start."""
    sft = str(write_yaml(tmp_path / "toy_sft.yaml", TOY_SFT))
    flags = [*toy_flags(tmp_path), "--sft_config", sft]
    plan = check.make_plan("grpo_clinical", flags, eval_seeds="0-1", output_dir=str(tmp_path / "a"))
    assert plan.warm_start and plan.known_start is None
    argv = check.run_command(plan, "control", 1)
    assert argv[-12:] == ["--seed", "1", "--shuffle_advantages", "true", "--output_dir",
                          str(plan.run_dir("control", 1)), "--report_config", "none",
                          "--sft_adapter", str(plan.start_dir / "sft"), "--sft_config", "none"]  # fmt: skip
    script_args, _, _ = check.parse_recipe_flags(check.load_recipe(plan.recipe), argv[2:])  # as the run parses them
    assert (script_args.sft_adapter, script_args.sft_config, script_args.report_config) == (
        str(plan.start_dir / "sft"), "none", "none",
    )  # fmt: skip
    given = check.make_plan("grpo_clinical", [*flags, "--sft_adapter", "some/adapter"], eval_seeds="0-1",
                            output_dir=str(tmp_path / "b"))  # fmt: skip
    assert not given.warm_start and given.known_start == "some/adapter"
    assert check.run_command(given, "credit", 0)[-2:] == ["--report_config", "none"]  # no start flags


def test_the_seeds_training_used_are_those_of_the_models_evaluated():
    script = SimpleNamespace(anchor_seeds="100-107")
    warm = {"sft_train_seeds": "300-311", "dagger_seeds": "300-307", "dagger_rounds": 0}  # the SFT config's
    seen = seen_seeds(script, SimpleNamespace(**warm))
    assert seen == {"the recipe's --anchor_seeds": "100-107",
                    "the SFT config's sft_train_seeds": "300-311"}  # no DAgger round: no DAgger seed  # fmt: skip
    seen = seen_seeds(script, SimpleNamespace(**{**warm, "dagger_rounds": 1}))
    assert list(seen) == ["the recipe's --anchor_seeds", "the SFT config's sft_train_seeds",
                          "the SFT config's dagger_seeds"]  # fmt: skip
    # --sft_config none: RL from the base model (or a given adapter), no SFT config to say what trained it
    assert seen_seeds(script, None) == {"the recipe's --anchor_seeds": "100-107"}


def test_greedy_only_skips_the_sampled_evaluation(tmp_path):
    flags = toy_flags(tmp_path)
    both = check.make_plan("grpo_clinical", flags, output_dir=str(tmp_path / "a"))
    greedy = check.make_plan("grpo_clinical", flags, output_dir=str(tmp_path / "b"), greedy_only=True)
    assert list(both.decodings()) == ["greedy", "sampled"] and list(greedy.decodings()) == ["greedy"]
    assert greedy.decodings()["greedy"] == both.decodings()["greedy"]


def test_a_folder_of_another_checks_flags_is_refused(tmp_path, capsys):
    out = tmp_path / "check"
    out.mkdir()
    (out / FLAGS_FILE).write_text(json.dumps({"recipe": "other.py", "flags": ["--max_steps", "9"]}))
    assert main(["learning-check", "grpo_clinical", "--output_dir", str(out), "--", *toy_flags(tmp_path)]) == 2
    assert "holds a learning check of other.py" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == [FLAGS_FILE]


# --------------------------------------------------------------------------------------------------
# a crashed run is reported, the others go on; a re-run retries it only

STAND_IN_RECIPE = """
\"\"\"A stand-in RL recipe: grpo_clinical's flags; its run copies the start model into --output_dir with a made-up
trainer state (no training), and crashes for --seed 1.\"\"\"
import argparse
import importlib.util
import json
import shutil
import sys
from pathlib import Path

CALLS = Path({calls!r})


def parse_args(argv=None):
    spec = importlib.util.spec_from_file_location("stand_in_grpo_clinical", {recipe!r})
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.parse_args(argv)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    for name in ("--seed", "--shuffle_advantages", "--output_dir", "--model_name_or_path"):
        parser.add_argument(name)
    args, _ = parser.parse_known_args()
    with CALLS.open("a") as calls:
        calls.write(f"{{args.shuffle_advantages}} {{args.seed}}\\n")
    if args.seed == "1":
        sys.exit("crashed on purpose")
    out = Path(args.output_dir)
    shutil.copytree(args.model_name_or_path, out, dirs_exist_ok=True)
    log = [{{"step": step, "reward": step / 2}} for step in (1, 2)]
    (out / "trainer_state.json").write_text(json.dumps({{"log_history": log}}))
    (out / "run_info.json").write_text("{{}}")
"""


@pytest.fixture
def one_thread():
    """Evaluations in this process on one torch thread: on a busy 2-core machine two threads of a tiny model wait on
    each other (OMP_NUM_THREADS=1 does the same for the command's own process below)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_crashed_run_is_reported_and_retried_alone(warm_model, tmp_path, capsys, one_thread, commit):
    recipe, calls, out = tmp_path / "stand_in.py", tmp_path / "calls.txt", tmp_path / "check"
    recipe.write_text(STAND_IN_RECIPE.format(calls=str(calls), recipe=str(ROOT / "recipes" / "grpo_clinical.py")))
    command = ["learning-check", str(recipe), "--seeds", "0-1", "--eval_seeds", "0", "--output_dir", str(out),
               "--no_progress", "--", *toy_flags(tmp_path), "--model_name_or_path", warm_model]  # fmt: skip
    assert main(command) == 1  # something failed; what finished is reported
    report = json.loads((out / "learning_check.json").read_text())
    assert [(r["arm"], r["seed"], r["status"]) for r in report["runs"]] == [
        ("credit", 0, "trained"), ("control", 0, "trained"), ("credit", 1, "failed"), ("control", 1, "failed"),
    ]  # fmt: skip
    assert len(report["failures"]) == 2 and "credit seed 1: training failed (exit status 1)" in report["failures"][0]
    assert "crashed on purpose" in (out / "credit_seed1" / "train.log").read_text()
    assert {r["seed"] for r in report["rows"]} == {0} and report["start"]["start"] == warm_model
    assert report["summary"]["greedy"]["mean"]["credit_minus_control"]["n"] == 1
    assert report["curves"]["runs"]["credit"] == {"0": {"step": [1, 2], "value": [0.5, 1.0]}}
    assert (out / "learning_curves.png").is_file()
    assert "error: credit seed 1: training failed" in capsys.readouterr().err
    assert main(command) == 1  # the finished runs are kept; only the crashed ones run again
    assert calls.read_text().splitlines() == ["false 0", "true 0", "false 1", "true 1", "false 1", "true 1"]


# --------------------------------------------------------------------------------------------------
# the commit: recorded, and only what the same clean commit made is reused


def test_the_commit_is_read_from_git(tmp_path, monkeypatch):
    here = code_commit()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        assert here == {"commit": None, "dirty": None}  # not a git checkout (or no git): nothing to read
    else:
        status = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True, text=True).stdout
        assert here == {"commit": head.stdout.strip(), "dirty": bool(status.strip())}
    # A folder inside the checkout is not its top: an installed package's site-packages inside a repository
    # (a virtual environment in a checkout) is not that repository's code.
    assert code_commit(ROOT / "recruit_trl") == {"commit": None, "dirty": None}
    assert code_commit(tmp_path) == {"commit": None, "dirty": None}  # no git checkout
    monkeypatch.setenv("PATH", str(tmp_path))  # no git at all: no crash
    assert code_commit(ROOT) == {"commit": None, "dirty": None}


def test_a_run_made_by_other_code_is_moved_aside_and_made_again(warm_model, tmp_path, capsys, one_thread, commit):
    """Runs are faked by the stand-in recipe (a copy of the start model): a run whose record names other code is moved
    aside (nothing deleted) and trained again, while runs of the same code are reused at another commit or with a
    dirty tree; a record from before the code's hash is reused only at the same commit, both trees clean. The JSON and
    each folder's record carry the code, the commit and the tree's state."""
    recipe, calls, out = tmp_path / "stand_in.py", tmp_path / "calls.txt", tmp_path / "check"
    recipe.write_text(STAND_IN_RECIPE.format(calls=str(calls), recipe=str(ROOT / "recipes" / "grpo_clinical.py")))
    command = ["learning-check", str(recipe), "--seeds", "0", "--eval_seeds", "0", "--output_dir", str(out),
               "--no_progress", "--", *toy_flags(tmp_path), "--model_name_or_path", warm_model]  # fmt: skip
    assert main(command) == 0
    here = code_hash()
    report = json.loads((out / "learning_check.json").read_text())
    assert (report["code"], report["commit"], report["dirty"]) == (here, "a" * 40, False)
    record = json.loads((out / "credit_seed0" / RUN_RECORD).read_text())
    assert (record["code"], record["commit"], record["dirty"]) == (here, "a" * 40, False)
    assert "--seed 0 --shuffle_advantages false" in record["command"]
    assert json.loads((out / "start" / RUN_RECORD).read_text())["command"] is None  # a given model: nothing builds it
    evals = {name: out / name / "eval" / "learning_check_greedy.json" for name in ("start", "credit_seed0",
                                                                                     "control_seed0")}  # fmt: skip
    stamps = {name: path.stat().st_mtime_ns for name, path in evals.items()}

    # Another commit, a dirty tree, the same code: everything is reused.
    commit.update({"commit": "b" * 40, "dirty": True})
    assert main(command) == 0
    assert calls.read_text().splitlines() == ["false 0", "true 0"]
    assert all(path.stat().st_mtime_ns == stamps[name] for name, path in evals.items())

    # The credit run was trained by other code: it alone is moved aside, trained and evaluated again.
    (out / "credit_seed0" / RUN_RECORD).write_text(json.dumps({**record, "code": "0" * 16}))
    capsys.readouterr()
    assert main(command) == 0
    lines = capsys.readouterr().out.splitlines()
    old, now = "aaaaaaa (code 00000000)", f"bbbbbbb with uncommitted changes (code {here[:8]})"
    assert (
        f"credit seed 0: trained at {old}, now {now}: training again; what it held is in credit_seed0.stale" in lines
    )
    assert json.loads((out / "credit_seed0.stale" / RUN_RECORD).read_text())["code"] == "0" * 16  # kept, aside
    assert calls.read_text().splitlines() == ["false 0", "true 0", "false 0"]
    assert json.loads((out / "credit_seed0" / RUN_RECORD).read_text())["code"] == here
    report = json.loads((out / "learning_check.json").read_text())
    assert [r["status"] for r in report["runs"]] == ["trained", "skipped (finished before)"]
    assert evals["credit_seed0"].stat().st_mtime_ns != stamps["credit_seed0"]  # its evaluation made again
    for name in ("start", "control_seed0"):  # theirs read back
        assert evals[name].stat().st_mtime_ns == stamps[name]

    # A record from before the hash: reused at its commit with both trees clean, else moved aside (a second one).
    legacy = {k: v for k, v in json.loads((out / "control_seed0" / RUN_RECORD).read_text()).items() if k != "code"}
    (out / "control_seed0" / RUN_RECORD).write_text(json.dumps({**legacy, "commit": "b" * 40, "dirty": False}))
    commit["dirty"] = False
    assert main(command) == 0
    assert calls.read_text().splitlines() == ["false 0", "true 0", "false 0"]
    (out / "control_seed0" / RUN_RECORD).write_text(json.dumps({**legacy, "commit": "c" * 40, "dirty": False}))
    (out / "control_seed0.stale").mkdir()  # taken: the next name is used
    assert main(command) == 0
    assert "control seed 0: trained at ccccccc, now bbbbbbb (code " in capsys.readouterr().out
    assert (out / "control_seed0.stale-2" / RUN_RECORD).is_file()
    # and a folder without a record (an older check's) is made again too
    (out / "control_seed0" / RUN_RECORD).unlink()
    assert main(command) == 0
    assert (
        "control seed 0: no record of the code it was trained with: training again; what it held is in "
        "control_seed0.stale-3" in capsys.readouterr().out.splitlines()
    )
    assert calls.read_text().splitlines() == ["false 0", "true 0", "false 0", "true 0", "true 0"]


def test_the_code_hash_follows_what_runs_and_nothing_else(tmp_path):
    """The hash changes with a module, a recipe config or the toy environment, not with docs or other tests."""
    for folder in ("recruit_trl", "env", "rewards", "recipes/configs", "tests", "docs"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "recruit_trl" / "a.py").write_text("x = 1\n")
    first = code_hash(tmp_path)
    (tmp_path / "docs" / "notes.md").write_text("docs")
    (tmp_path / "tests" / "test_x.py").write_text("def test(): pass\n")
    assert code_hash(tmp_path) == first
    for path in ("recipes/configs/run.yaml", "tests/toy_env.py", "env/b.py"):
        (tmp_path / path).write_text("changed: 1\n")
        assert code_hash(tmp_path) != first
        first = code_hash(tmp_path)
    assert code_hash(tmp_path / "docs") is None  # no recruit_trl folder: an installed package


# --------------------------------------------------------------------------------------------------
# the real command on the toy environment

# The command, with the code's commit pinned to a clean made-up one (a re-run of a dirty checkout reuses nothing).
PINNED_CLI = (
    "import sys; from recruit_trl.tools import learning_check; from recruit_trl.cli import main; "
    "learning_check.code_commit = lambda: {'commit': 'c' * 40, 'dirty': False}; sys.exit(main(sys.argv[1:]))"
)


def learning_check(out: Path, seeds: str, warm_model: str) -> tuple[subprocess.CompletedProcess, float]:
    """``recruit-trl learning-check grpo_clinical`` on the toy walk in a subprocess (:data:`PINNED_CLI`); (process,
    seconds)."""
    command = [sys.executable, "-c", PINNED_CLI, "learning-check", "grpo_clinical", "--seeds", seeds,
               "--eval_seeds", "0-1", "--output_dir", str(out), "--no_progress", "--",
               *toy_flags(out.parent), "--model_name_or_path", warm_model]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    started = time.perf_counter()
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    return proc, time.perf_counter() - started


def check_report(out: Path, seeds: list[int]) -> dict:
    """The JSON file's rows, start, summary, runs and commands, and the curves' PNG, for ``seeds``."""
    report = json.loads((out / "learning_check.json").read_text())
    assert report["metric"] == "final_score_mean" and report["eval_seeds"] == [0, 1] and report["seeds"] == seeds
    assert set(report["decodings"]) == {"greedy", "sampled"} and report["decodings"]["sampled"]["temperature"] == 1.0
    keys = {(r["arm"], r["seed"], r["task"], r["decoding"]) for r in report["rows"]}
    assert keys == {(a, s, t, d) for a in ("credit", "control") for s in seeds for t in ("near", "far")
                    for d in ("greedy", "sampled")}  # fmt: skip
    assert all(0.0 <= r["value"] <= 1.0 for r in report["rows"])
    assert {(r["task"], r["decoding"]) for r in report["start"]["rows"]} == {
        (t, d) for t in ("near", "far") for d in ("greedy", "sampled")
    }
    for decoding in ("greedy", "sampled"):
        assert list(report["summary"][decoding]) == ["near", "far", "mean"]
        for cell in report["summary"][decoding].values():
            assert cell["credit"]["n"] == cell["control"]["n"] == len(seeds)
            assert cell["credit_minus_control"]["n"] == len(seeds)
    assert [c["what"] for c in report["commands"]] == ["start"] + [
        f"{arm} seed {s}" for s in seeds for arm in ("credit", "control")
    ]
    for run in report["runs"]:
        command = next(c["command"] for c in report["commands"] if c["what"] == f"{run['arm']} seed {run['seed']}")
        shuffled = "true" if run["arm"] == "control" else "false"
        assert f"--seed {run['seed']} --shuffle_advantages {shuffled} " in command
        assert "--report_config none" in command
        assert Path(run["log"]).is_file()
    assert report["curves"]["metric"] == "reward" and (out / "learning_curves.png").stat().st_size > 0
    assert set(report["curves"]["runs"]) == {"credit", "control"}
    assert report["failures"] == [] and report["versions"]["recruit_trl"]
    assert report["commit"] == "c" * 40 and report["dirty"] is False
    for folder in ["start"] + [f"{arm}_seed{s}" for s in seeds for arm in ("credit", "control")]:
        assert json.loads((out / folder / RUN_RECORD).read_text())["commit"] == "c" * 40
    return report


def check_rerun_skips_everything(out: Path, seeds: list[int], warm_model: str, first: float) -> None:
    """A second run of the same command trains and evaluates nothing, and says the same."""
    evals = sorted(out.rglob("eval/learning_check_*.json"))
    assert len(evals) == 2 * (1 + 2 * len(seeds))  # the start and every model, greedy and sampled
    stamps = [p.stat().st_mtime_ns for p in evals]
    before = json.loads((out / "learning_check.json").read_text())
    proc, seconds = learning_check(out, ",".join(map(str, seeds)), warm_model)
    report = json.loads((out / "learning_check.json").read_text())
    assert all(c["skipped"] for c in report["commands"])
    assert all(r["status"].startswith("skipped") for r in report["runs"])
    assert [p.stat().st_mtime_ns for p in evals] == stamps  # every evaluation read back from its file
    assert report["summary"] == before["summary"] and report["rows"] == before["rows"]
    assert "start already built" in proc.stdout and seconds < first


def test_learning_check_one_seed_end_to_end_and_rerun(warm_model, tmp_path):
    """One training seed per arm through the real subprocesses: the JSON, the summary (no t on one pair) and the PNG;
    then the same command again skips every run and evaluation."""
    out = tmp_path / "check"
    proc, first = learning_check(out, "0", warm_model)
    report = check_report(out, [0])
    paired = report["summary"]["greedy"]["mean"]["credit_minus_control"]
    assert paired["n"] == 1 and paired["t"] is None
    assert "n 1: no SE, no t" in proc.stdout and "credit-control (by seed)" in proc.stdout
    assert report["start"]["start"] == warm_model and not report["start"]["warm_start_trained"]
    check_rerun_skips_everything(out, [0], warm_model, first)


@pytest.mark.slow
def test_learning_check_two_seeds_end_to_end_and_rerun(warm_model, tmp_path):
    """Two training seeds per arm: the paired summary has its t on 1 degree of freedom wherever the differences
    vary; the re-run skips everything."""
    out = tmp_path / "check"
    proc, first = learning_check(out, "0-1", warm_model)
    report = check_report(out, [0, 1])
    cells = [cell["credit_minus_control"] for cells in report["summary"].values() for cell in cells.values()]
    for paired in cells:
        assert paired["n"] == 2 and paired["df"] == 1
        if paired["se"]:
            assert paired["t"] == pytest.approx(paired["mean"] / paired["se"])
    assert any(paired["t"] is not None for paired in cells), cells
    assert "t = " in proc.stdout
    check_rerun_skips_everything(out, [0, 1], warm_model, first)

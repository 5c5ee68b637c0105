"""The environment benchmark (``python -m env.clinical.bench``) on a tiny budget: its policy, its measurements, its
workers, its report and, where git is available, the comparison against a commit checked out in a worktree."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from env.clinical import bench
from env.clinical.core import ClinicalRecruitmentEnv
from env.clinical.policies import heuristic_policy
from env.clinical.tasks import PUBLIC_TASK_IDS

TASK = "hard_bench_stage_30"
ROOT = Path(__file__).parents[1]


def test_default_tasks_are_the_public_tasks():
    assert bench.DEFAULT_TASKS == PUBLIC_TASK_IDS


@pytest.mark.parametrize("task", ["easy_bench", "hard_bench"])
def test_bench_policy_is_the_readme_quick_start_policy(task):
    """Both action styles make the quick-start's decisions; ``minimal`` leaves out only the optional fields."""
    env = ClinicalRecruitmentEnv(task)
    obs, _ = env.reset(seed=3)
    done = False
    while not done:
        action = bench.quickstart_action(obs)
        assert action == heuristic_policy(obs, random.Random(0))
        minimal = bench.minimal_action(obs)
        assert {k: v for k, v in action.items() if k not in ("confidence", "hypothesis")} == minimal
        obs, _, terminated, truncated, _ = env.step(minimal if env.s.t % 2 else action)
        done = terminated or truncated


@pytest.mark.parametrize("style", bench.ACTION_STYLES)
def test_in_process_measurements(style):
    assert bench.measure(ClinicalRecruitmentEnv, {"measure": "steps", "task": TASK, "episodes": 1, "style": style}) > 0
    assert bench.measure(ClinicalRecruitmentEnv, {"measure": "resets", "task": TASK, "n": 3}) > 0
    assert bench.measure(ClinicalRecruitmentEnv, {"measure": "snapshots", "task": TASK, "n": 3}) > 0
    with pytest.raises(ValueError, match="unknown measurement"):
        bench.measure(ClinicalRecruitmentEnv, {"measure": "nothing"})


def test_worker_imports_the_tree_it_is_given():
    worker = bench.Worker(bench.THIS_TREE)
    try:
        assert worker.run({"measure": "resets", "task": TASK, "n": 2}) > 0
    finally:
        worker.close()
    assert worker.proc.returncode == 0


def test_report_without_a_baseline(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(["--tasks", TASK, "--episodes", "1", "--repeats", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    entry = report["results"][TASK]
    assert set(entry["steps_per_s"]) == set(bench.ACTION_STYLES)
    assert "steps_ratio" not in entry and "against" not in report["config"]
    assert TASK in capsys.readouterr().out
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # the atomic write left no temporary file


def test_write_json_atomic_replaces_the_file(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    bench.write_json_atomic(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    with pytest.raises(TypeError):
        bench.write_json_atomic(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1} and len(list(tmp_path.iterdir())) == 1


def test_table_shows_both_trees_and_the_ratio():
    steps = {"complete": 3000, "minimal": 2900}
    report = {
        "results": {
            TASK: {
                "steps_per_s": steps,
                "against_steps_per_s": {"complete": 1000, "minimal": 1000},
                "steps_ratio": {"complete": 3.0, "minimal": 2.9},
                "resets_per_s": 100,
                "reset_ms": 10.0,
                "snapshot_restore_per_s": 50,
            }
        },
        "config": {"against": {"rev": "89c67b3", "commit": "89c67b3" + "0" * 33}},
    }
    table = bench.format_table(report)
    assert "89c67b3" in table and "3.00x" in table and "2.90x" in table


def _git_available() -> bool:
    if shutil.which("git") is None:
        return False
    proc = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], cwd=ROOT, capture_output=True)
    return proc.returncode == 0


@pytest.mark.skipif(not _git_available(), reason="needs git and a commit to check out")
def test_against_a_commit_in_a_worktree(tmp_path, monkeypatch):
    """``--against HEAD`` checks HEAD out in the cache folder and measures both trees; the checkout is reused
    while it is clean and made again when it is not."""
    cache = tmp_path / "cache"
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    checkout = cache / commit
    marker = checkout / "env" / "__init__.py"  # in every tree: the workers import the environment from ``env``
    try:
        report = bench.run([TASK], episodes=1, repeats=2, against="HEAD", cache_dir=cache)
        assert report["config"]["against"] == {"rev": "HEAD", "commit": commit}
        entry = report["results"][TASK]
        for style in bench.ACTION_STYLES:
            assert entry["against_steps_per_s"][style] > 0 and entry["steps_ratio"][style] > 0
        assert marker.is_file()

        calls = []
        git = bench._git
        monkeypatch.setattr(bench, "_git", lambda *args, **kw: calls.append(args) or git(*args, **kw))
        assert bench.worktree_of("HEAD", cache) == (checkout, commit)
        assert not [c for c in calls if c[0] == "worktree"]  # reused as it was

        marker.write_text("# changed\n")
        assert bench.worktree_of("HEAD", cache) == (checkout, commit)
        assert ("worktree", "add", "--detach", str(checkout), commit) in calls  # made again
        assert marker.read_text() != "# changed\n"
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(checkout)], cwd=ROOT, capture_output=True)
        subprocess.run(["git", "worktree", "prune"], cwd=ROOT, capture_output=True)

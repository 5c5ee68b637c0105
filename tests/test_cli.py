"""The ``recruit-trl`` console entry point: tasks listing and the environment's own commands (entry points)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recruit_trl.cli import main

ROOT = Path(__file__).parents[1]


def test_tasks_lists_the_public_tasks(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    for task in ("easy_bench", "medium_bench", "hard_bench"):
        assert task in out
    assert "hard_bench_stage_30" not in out
    assert main(["tasks", "--all"]) == 0
    assert "hard_bench_stage_30" in capsys.readouterr().out


def test_tasks_of_an_environment_without_a_task_table(capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    assert main(["tasks", "--env", "tests.toy_env:TOY"]) == 0
    assert capsys.readouterr().out.splitlines() == ["id", "----", "near", "far"]
    with pytest.raises(ValueError, match="Unknown environment 'nowhere'"):
        main(["tasks", "--env", "nowhere"])


def test_help_lists_the_environment_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for command in ("tasks", "eval", "golden", "bench", "serve"):
        assert f"    {command} " in out


def test_golden_is_delegated(capsys, tmp_path, golden_episodes):
    path = tmp_path / "one.json"
    path.write_text(json.dumps(golden_episodes[18:19]))
    assert main(["golden", str(path)]) == 0
    assert capsys.readouterr().out.strip().endswith("1 passed, 0 failed")


def test_bench_prints_table_and_json(capsys, tmp_path):
    out_file = tmp_path / "bench.json"
    assert (
        main(["bench", "--tasks", "hard_bench_stage_30", "--episodes", "1", "--repeats", "1", "--json", str(out_file)])
        == 0
    )
    report = json.loads(out_file.read_text())
    figures = report["results"]["hard_bench_stage_30"]
    assert all(v > 0 for v in figures["steps_per_s"].values()) and figures["snapshot_restore_per_s"] > 0
    assert "steps/s" in capsys.readouterr().out

"""The ``recruit-trl`` console entry point: tasks listing and the delegated env CLIs."""

from __future__ import annotations

import json

from recruit_trl.cli import main


def test_tasks_lists_the_public_tasks(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    for task in ("easy_bench", "medium_bench", "hard_bench"):
        assert task in out
    assert "hard_bench_stage_30" not in out
    assert main(["tasks", "--all"]) == 0
    assert "hard_bench_stage_30" in capsys.readouterr().out


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
    assert figures["steps_per_s"] > 0 and figures["snapshot_restore_per_s"] > 0
    assert "steps/s" in capsys.readouterr().out

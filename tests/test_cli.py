"""The ``recruit-trl`` console entry point: tasks listing, the environment's own commands (entry points), and the
flags' one spelling (snake_case; the former kebab-case spellings refused with their new names)."""

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


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (
            ["eval", "--policy", "random", "--recent-k", "3"],
            "recruit-trl eval: error: --recent-k was renamed --recent_k",
        ),
        (
            ["eval", "--policy", "random", "--no-progress"],
            "recruit-trl eval: error: --no-progress was renamed --no_progress",
        ),
        (["eval", "--policy", "random", "--top-p=0.9"], "recruit-trl eval: error: --top-p was renamed --top_p"),
        (
            ["benchmark", "--env", "conquest", "--policy", "safe", "--train-seeds", "0"],
            "recruit-trl benchmark: error: --train-seeds was renamed --train_seeds",
        ),
        (
            ["eval", "--policy", "random", "--contract", "json"],
            "recruit-trl eval: error: --contract was removed: the index contract is the only one",
        ),
        (["serve", "--max-sessions", "2"], "python -m env.server: error: --max-sessions was renamed --max_sessions"),
        (["bench", "--cache-dir", "x"], "python -m env.clinical.bench: error: --cache-dir was renamed --cache_dir"),
    ],
    ids=["eval", "eval-bare", "eval-equals", "benchmark", "removed", "serve", "bench"],
)
def test_a_former_spelling_is_refused_with_its_new_name(argv, error, capsys):
    """Before anything runs: one line on stderr naming the flag's snake_case spelling (or why it went), status 2."""
    if argv[0] == "serve":  # the server's extra
        pytest.importorskip("fastapi")
        pytest.importorskip("uvicorn")
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == error + "\n"


def test_the_loadtests_former_spellings_are_refused(capsys):
    from env.loadtest import build_arg_parser

    with pytest.raises(SystemExit) as exit_info:
        build_arg_parser().parse_args(["--episodes-per-session", "2"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "python -m env.loadtest: error: --episodes-per-session was renamed --episodes_per_session\n"
    )
    assert build_arg_parser().parse_args(["--episodes_per_session", "2"]).episodes_per_session == 2

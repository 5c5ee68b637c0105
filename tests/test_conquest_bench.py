"""The conquest benchmark (``python -m env.conquest.bench``) on a tiny budget: its bot-only games are the games the
env plays with the balanced policy at the agent's seat, its measurements run, and its report is written atomically."""

from __future__ import annotations

import json

import pytest

from env.conquest import TASKS, ConquestEnv, bench, play_episode


def test_default_tasks_are_every_task():
    assert bench.DEFAULT_TASKS == tuple(TASKS)


@pytest.mark.parametrize(("task", "seed"), [("duel", 0), ("easy3", 1), ("classic3", 2), ("classic6", 0)])
def test_bot_only_game_is_the_env_game_of_the_balanced_policy(task, seed):
    """The engine-only loop plays exactly the game the env plays with ``balanced`` answering for the agent."""
    g = bench.play_bot_game(task, seed)
    env = ConquestEnv(task)
    summary = play_episode(env, "balanced", seed=seed)
    played = env.game
    assert g.done and g.outcome == summary["outcome"] and g.score == summary["final_score"]
    assert (g.owner, g.armies, g.hands, g.round, g.turn) == (
        played.owner,
        played.armies,
        played.hands,
        played.round,
        played.turn,
    )
    assert g.rng.getstate() == played.rng.getstate()


def test_measurements_count_what_they_time():
    decisions = bench.bench_decisions("duel", 1)
    env = ConquestEnv("duel")
    assert decisions.count == play_episode(env, "teacher", seed=0)["steps"]
    assert decisions.wall > 0 and decisions.per_s > 0 and decisions.per_cpu_s > 0
    assert bench.bench_bot_games("duel", 2).count == 2
    assert bench.bench_snapshots("duel", 10).count == 10


def test_report(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert bench.main(["--tasks", "duel", "classic3", "--games", "1", "--repeats", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert list(report["results"]) == ["duel", "classic3"]
    entry = report["results"]["classic3"]
    figures = {"decisions_per_s", "bot_games_per_s", "bot_game_ms", "snapshot_restore_per_s"}
    assert set(entry) == figures | {"decisions_per_game", "cpu", "cpu_share"} and set(entry["cpu"]) == figures
    assert entry["decisions_per_game"] == play_episode(ConquestEnv("classic3"), "teacher", seed=0)["steps"]
    assert 0 < entry["cpu_share"] <= 1.05
    met = report["targets_met"]
    assert set(met["snapshot_restore_per_s"]) == {"duel", "classic3"} and list(met["bot_game_ms"]) == ["classic3"]
    assert met["bot_game_ms"]["classic3"] == (entry["cpu"]["bot_game_ms"] <= 100)
    assert set(report["machine"]["load_avg_1m"]) == {"before", "after"}
    table = capsys.readouterr().out.splitlines()
    assert table[2].split()[:2] == ["duel", "wall"] and table[3].split()[:2] == ["duel", "cpu"]
    assert any("snapshot+restore >= 20,000/s" in line for line in table)
    assert [p.name for p in tmp_path.iterdir()] == ["bench.json"]  # the atomic write left no temporary file


def test_bad_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--tasks", "classic4"])
    with pytest.raises(SystemExit):
        bench.main(["--games", "0"])
    with pytest.raises(ValueError, match="Unknown tasks"):
        bench.run(["classic4"], 1, 1)
    capsys.readouterr()


def test_write_json_atomic_keeps_the_old_file_on_failure(tmp_path):
    path = tmp_path / "r.json"
    path.write_text("old")
    bench.write_json_atomic(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    with pytest.raises(TypeError):
        bench.write_json_atomic(path, {"a": object()})
    assert json.loads(path.read_text()) == {"a": 1} and len(list(tmp_path.iterdir())) == 1

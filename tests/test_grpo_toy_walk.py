"""recipes/grpo_toy_walk.py, the README's smoke run: the real script end to end (two GRPO steps), and the pieces it
teaches checked by hand: snapshots, common random numbers, the strict parser and the group advantage."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "recipes" / "grpo_toy_walk.py"
RESULT = re.compile(r"^greedy score on held-out seeds 0-19: (\d\.\d{3}) before, (\d\.\d{3}) after (\d+) steps$", re.M)


@pytest.fixture(scope="module")
def walk():
    spec = importlib.util.spec_from_file_location("grpo_toy_walk", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_script_trains_and_prints_its_result(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, str(SCRIPT), "--max_steps", "2", "--anchors_per_step", "4", "--output_dir", str(tmp_path)]
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = RESULT.findall(proc.stdout)
    before, after, steps = result
    assert 0.0 <= float(before) <= 1.0 and 0.0 <= float(after) <= 1.0 and steps == "2"
    assert re.search(r"^step 0: mean branch score \d\.\d{3}, groups with a signal \d+/4$", proc.stdout, re.M)
    assert (tmp_path / "model" / "config.json").is_file()  # the tiny model it built, in its output folder


def test_a_snapshot_restores_the_walk_and_its_dice(walk):
    env = walk.Walk("far")
    env.reset(7)
    env.step("toward")
    snapshot = env.snapshot()
    first = [env.step(action) for action in ("toward", "wait", "away", "toward")]
    env.restore(snapshot)
    assert [env.step(action) for action in ("toward", "wait", "away", "toward")] == first


def test_branches_meet_the_same_dice_and_differ_by_their_action_alone(walk):
    """From one anchor and step every branch meets the same gusts, so the same action scores the same, and toward
    against away differs by exactly the two steps between them (on anchors where no score is cut at 0)."""
    checked = 0
    for seed in range(100, 116):
        for day in range(walk.DAYS):
            key = json.dumps({"task": "far", "seed": seed, "day": day})
            _, obs = walk.anchor_state(key)
            if abs(obs["target"] - obs["position"]) not in range(2, 6):
                continue
            scores = {a: walk.branch_score(key, a, step=3) for a in walk.ACTIONS}
            assert scores == {a: walk.branch_score(key, a, step=3) for a in walk.ACTIONS}
            assert scores["toward"] - scores["away"] == pytest.approx(2 / obs["target"])
            checked += 1
    assert checked >= 20
    gusts = {walk.branch_score(key, "wait", step) for step in range(40)}  # other steps: other dice
    assert len(gusts) > 1


def test_the_parser_is_strict_and_the_advantage_is_grpos(walk):
    assert walk.parse('{"action_index": 1}') == "away"
    for text in ('{"action_index": 4}', '{"action_index": true}', '{"action_index": 1', "[1]", "toward", ""):
        assert walk.parse(text) == walk.FALLBACK
    advantages = walk.group_advantages([1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.5, 0.5], 4)
    assert advantages[0] == pytest.approx(0.75 / (0.1875**0.5 + 1e-4)) and sum(advantages[:4]) == pytest.approx(0)
    assert advantages[4:] == [0.0] * 4  # a group whose branches all score the same carries no credit

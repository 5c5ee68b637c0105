"""The environment replays every golden episode recorded on the reference bit for bit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from env.clinical.golden import replay_episode

GOLDEN_FILE = Path(__file__).parent / "data" / "golden_trajectories.json"


def _episode_ids():
    import json

    return [f"{e['task']}-{e['seed']}-{e['policy']}" for e in json.loads(GOLDEN_FILE.read_text())]


@pytest.mark.parametrize("index", range(24), ids=_episode_ids())
def test_golden_episode_replays_exactly(golden_episodes, index):
    assert replay_episode(golden_episodes[index]) == []


def test_golden_cli_reports_and_exits_zero():
    command = [sys.executable, "-m", "env.clinical.golden", str(GOLDEN_FILE)]
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "24 passed, 0 failed"


def test_golden_cli_fails_on_a_tampered_episode(golden_episodes, tmp_path):
    import json

    episode = json.loads(json.dumps(golden_episodes[0]))
    episode["steps"][3]["reward"] += 0.0001
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([episode, golden_episodes[1]]))
    proc = subprocess.run([sys.executable, "-m", "env.clinical.golden", str(path)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stdout.strip().splitlines()[-1] == "1 passed, 1 failed"
    assert "step 3" in proc.stdout

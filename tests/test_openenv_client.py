"""OpenEnv's own client (``openenv-core`` 0.3.0's ``GenericEnvClient``, a client no one here wrote) plays a whole
conquest duel and a whole clinical episode on ``recruit-trl serve``, equal step by step to the same episodes played
in-process.

``openenv-core`` is not in the ``test`` extra: installing it into this project's environment would downgrade pillow
(13.0.0 -> 12.3.0) and tomlkit (0.15.3 -> 0.14.0), which its dependency gradio 6.31.0 pins (``pillow<13``,
``tomlkit<0.15``); with both kept, pip finds no solution. The client therefore runs in whichever interpreter has it,
through ``tests/openenv_bridge.py``: this one, or the one ``RECRUIT_TRL_OPENENV_PYTHON`` names, e.g. a separate
virtual environment made with ``python -m venv /tmp/openenv && /tmp/openenv/bin/pip install openenv-core==0.3.0``.
Without either the tests are skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
pytest.importorskip("httpx")

from servers import env_server_cmd, free_port, start_server, stop_server  # noqa: E402

from env import ClinicalRecruitmentEnv, heuristic_policy  # noqa: E402
from env.conquest import ConquestEnv, teacher_index  # noqa: E402

ROOT = Path(__file__).parents[1]
BRIDGE = ROOT / "tests" / "openenv_bridge.py"


def openenv_python() -> str | None:
    """An interpreter that has ``openenv-core``: this one, else ``$RECRUIT_TRL_OPENENV_PYTHON``, else ``None``."""
    if importlib.util.find_spec("openenv") is not None:
        return sys.executable
    return os.environ.get("RECRUIT_TRL_OPENENV_PYTHON") or None


OPENENV_PYTHON = openenv_python()
pytestmark = pytest.mark.skipif(
    OPENENV_PYTHON is None,
    reason="openenv-core is not installed (it would downgrade pillow and tomlkit here): set "
    "RECRUIT_TRL_OPENENV_PYTHON to an interpreter that has openenv-core==0.3.0",
)


class OpenEnvClient:
    """``tests/openenv_bridge.py`` in ``OPENENV_PYTHON``: OpenEnv's ``GenericEnvClient`` on ``url``, one JSON line
    per request and per answer."""

    def __init__(self, url: str) -> None:
        self.proc = subprocess.Popen(
            [OPENENV_PYTHON, str(BRIDGE), url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def ask(self, request: dict) -> dict:
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        assert line, f"the OpenEnv client exited with {self.proc.poll()}"
        answer = json.loads(line)
        assert "error" not in answer, answer["error"]
        return answer

    def close(self) -> None:
        self.proc.stdin.write(json.dumps({"op": "close"}) + "\n")
        self.proc.stdin.close()
        assert self.proc.wait(30) == 0


def serve_cmd(port: int, env: str) -> list[str]:
    """``recruit-trl serve --env ENV`` on 127.0.0.1:``port`` (the console script next to this interpreter, else the
    module it runs)."""
    script = Path(sys.executable).with_name("recruit-trl")
    if not script.exists():
        return env_server_cmd(port, "--env", env)
    return [str(script), "serve", "--env", env, "--host", "127.0.0.1", "--port", str(port), "--log_level", "warning"]


@pytest.fixture
def client(request):
    """OpenEnv's client on a fresh ``recruit-trl serve --env <param>``."""
    port = free_port()
    proc, url = start_server(serve_cmd(port, request.param), port)
    openenv = OpenEnvClient(url)
    try:
        yield openenv
        openenv.close()
    finally:
        if openenv.proc.poll() is None:
            openenv.proc.kill()
        stop_server(proc)


def plain(value):
    """``value`` as it comes back from JSON (tuples as lists)."""
    return json.loads(json.dumps(value))


@pytest.mark.parametrize("client", ["conquest"], indirect=True)
def test_openenv_client_plays_a_whole_conquest_duel(client):
    local = ConquestEnv("duel")
    obs, _ = local.reset(seed=0)
    got = client.ask({"op": "reset", "kwargs": {"seed": 0, "task_id": "duel"}})
    assert got == {"observation": plain(obs), "reward": 0.0, "done": False}
    steps, done = 0, False
    while not done:
        k = teacher_index(local)
        obs, reward, terminated, truncated, info = local.step_index(k)
        done = terminated or truncated
        got = client.ask({"op": "step", "action": {"action_index": k}})
        assert got == {"observation": plain(obs), "reward": reward, "done": done}, steps
        steps += 1
    state = client.ask({"op": "state"})
    assert state["done"] and state["outcome"] == info["outcome"] and state["final_score"] == info["final_score"]
    assert steps > 10


@pytest.mark.parametrize("client", ["clinical"], indirect=True)
def test_openenv_client_plays_a_whole_clinical_episode(client):
    local = ClinicalRecruitmentEnv(task="easy_bench")
    obs, _ = local.reset(seed=0)
    got = client.ask({"op": "reset", "kwargs": {"seed": 0, "task_id": "easy_bench"}})
    assert got == {"observation": plain(obs), "reward": 0.0, "done": False}
    steps, done = 0, False
    while not done:
        action = heuristic_policy(obs)
        obs, reward, terminated, truncated, info = local.step(action)
        done = terminated or truncated
        got = client.ask({"op": "step", "action": action})
        assert got == {"observation": plain(obs), "reward": reward, "done": done}, steps
        steps += 1
    assert steps == 180 and info["final_score"] is not None  # the whole 180 days, step for step
    assert client.ask({"op": "state"})["done"] is True

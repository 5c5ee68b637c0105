"""env.server and env.client with an environment other than the clinical one: the toy walk of ``tests/toy_env.py``
(its :class:`~env.server.served.ServedEnv` is ``tests.toy_env:served_toy``) served in-process (FastAPI TestClient)
and by a real server process (``python -m env.server --env tests.toy_env:served_toy``), played through
``RemoteEnv`` over HTTP and WebSocket with the same observations, rewards, end flags and infos as in-process; the
lookup of environments by name; the routes, errors and session rules for that environment."""

from __future__ import annotations

import importlib.metadata
import random
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
pytest.importorskip("websockets")

from fastapi.testclient import TestClient  # noqa: E402
from servers import env_server_cmd, free_port, start_server, stop_server  # noqa: E402
from toy_env import DAYS, KINDS, TARGETS, Walk, greedy_policy, random_policy, served_toy  # noqa: E402

from env.client import RemoteEnv  # noqa: E402
from env.clinical.served import CLINICAL  # noqa: E402
from env.server import ServedEnv, ServerSettings, create_app, find_served  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
TOY_NAME = "tests.toy_env:served_toy"
WS_URL = "ws://127.0.0.1/ws"  # TestClient's WebSocket host would be "testserver", which the server refuses
TOY = served_toy()


@pytest.fixture
def importable(monkeypatch):
    """``tests.toy_env`` is imported from the repository root (as ``python -m pytest`` there does anyway)."""
    monkeypatch.syspath_prepend(str(ROOT))


def toy_client(**settings) -> TestClient:
    return TestClient(create_app(ServerSettings(**settings), TOY), base_url="http://127.0.0.1")


def policies(seed: int):
    """Greedy on even seeds (it stops on the target: terminated), random on odd ones (it never stops: truncated)."""
    rng = random.Random(seed)
    return (lambda obs: greedy_policy(obs)) if seed % 2 == 0 else (lambda obs: random_policy(obs, rng))


def play_both(remote: RemoteEnv, task: str, seed: int) -> tuple[bool, bool]:
    """One episode on ``remote`` and in-process side by side; every reset and step must be equal. Returns the end
    flags."""
    local = Walk(task)
    obs, info = remote.reset(seed=seed, options={"task": task})
    assert (obs, info) == local.reset(seed=seed)
    policy = policies(seed)
    while True:
        action = policy(obs)
        got = remote.step(action)
        assert got == local.step(action), (task, seed, obs["day"])
        obs, _, terminated, truncated, info = got
        if terminated or truncated:
            assert "final_score" in info
            return terminated, truncated


# ------------------------------------------------------------------------------------------------------------
# finding environments by name


def test_environments_are_found_by_name(importable):
    entry_points = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="recruit_trl.served_envs")}
    assert entry_points["clinical"] == "env.clinical.served:CLINICAL"
    assert find_served("clinical") is CLINICAL and find_served(CLINICAL) is CLINICAL
    toy = find_served(TOY_NAME)  # a factory, called once
    assert isinstance(toy, ServedEnv) and toy.name == "toy" and find_served(TOY_NAME) is toy
    with pytest.raises(ValueError, match=r"Unknown environment 'nope'\. Known: \[.*'clinical'"):
        find_served("nope")
    with pytest.raises(ValueError, match="Cannot load environment"):
        find_served("tests.toy_env:missing")
    with pytest.raises(ValueError, match="is not a ServedEnv"):
        find_served("tests.toy_env:TOY")  # the agent interface, not a server descriptor
    with pytest.raises(ValueError, match="default_task"):
        ServedEnv(**{**vars(TOY), "default_task": "nowhere"})
    with pytest.raises(ValueError, match="Unknown environment"):
        RemoteEnv("http://127.0.0.1:1", env="nope")


def test_serve_takes_an_environment(monkeypatch, capsys, importable):
    import uvicorn

    from env import server

    started = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.append(app))
    assert server.main(["--port", "1", "--env", TOY_NAME]) == 0
    assert started[-1].state.served.name == "toy"
    assert server.main(["--port", "1"]) == 0
    assert started[-1].state.served is CLINICAL
    with pytest.raises(SystemExit):
        server.main(["--port", "1", "--env", "nope"])
    assert "Unknown environment 'nope'" in capsys.readouterr().err and len(started) == 2


# ------------------------------------------------------------------------------------------------------------
# the toy environment in-process


def test_toy_routes_and_documents():
    c = toy_client()
    root = c.get("/").json()
    assert (root["name"], root["tasks"], root["server"]) == ("toy-walk", ["near", "far"], "recruit_trl")
    assert c.get("/tasks").json() == {task: {"target": target, "days": DAYS} for task, target in TARGETS.items()}
    schema = c.get("/schema").json()
    assert schema["action"]["properties"]["kind"]["enum"] == list(KINDS)
    meta = c.get("/metadata").json()
    assert (meta["name"], meta["readme_content"], meta["author"]) == ("toy-walk", None, "recruit_trl")
    assert c.get("/openapi.json").json()["info"]["title"] == "Toy walk"
    r = c.post("/reset", params={"task_id": "nowhere"})
    assert (r.status_code, r.json()) == (400, {"detail": "Unknown task: nowhere. Available: ['near', 'far']"})
    r = c.post("/reset", params={"seed": 3})  # no task: the default one
    local = Walk("near")
    assert {k: v for k, v in r.json().items() if k not in ("done", "reward", "metadata")} == local.reset(seed=3)[0]
    assert r.json()["metadata"]["info"] == {}
    r = c.post("/step", json={"kind": "jump"})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "kind"]
    assert r.json()["detail"][0]["type"] == "literal_error"
    r = c.post("/step", json={"kind": "left", "speed": 2})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "speed"]
    assert c.post("/step", json=["left"]).json()["detail"][0]["loc"] == ["body"]
    assert c.post("/step", data={"kind": "left"}).status_code == 422  # not JSON
    assert c.get("/state").json()["step_count"] == 0  # nothing was applied
    metas = [c.post("/step", json={"kind": "wait"}).json()["metadata"] for _ in range(5)]
    assert ["replay_warning" in m for m in metas] == [False] * 4 + [True]
    assert all(set(m) >= {"info", "terminated", "truncated"} for m in metas)
    state = c.get("/state").json()
    assert state == {**local_state(5), "episode_id": state["episode_id"]}


def local_state(days: int) -> dict:
    """``GET /state`` after ``days`` waits from ``reset(seed=3)`` on ``near``, in-process."""
    walk = Walk("near")
    walk.reset(seed=3)
    for _ in range(days):
        walk.step({"kind": "wait"})
    return {"task": "near", "day": walk.day, "position": walk.position, "target": walk.target, "step_count": days}


def test_toy_episodes_over_http_match_in_process():
    with toy_client() as http:
        env = RemoteEnv("http://127.0.0.1", http_client=http, env=TOY)
        assert env.task == "near"
        ends = {play_both(env, task, seed) for task in TARGETS for seed in range(4)}
        assert ends == {(True, False), (False, True)}
        with pytest.raises(RuntimeError, match="Episode is done"):
            env.step({"kind": "left"})
        env.reset(seed=0)
        with pytest.raises(ValueError, match="kind"):
            env.step({"kind": "jump"})
        assert env.step({"kind": "left"})[0]["day"] == 1  # the refused action consumed nothing
        with pytest.raises(ValueError, match="Unknown task"):
            env.reset(options={"task": "nowhere"})
        env.close()


def test_toy_websocket_protocol():
    c = toy_client()
    with c.websocket_connect(WS_URL) as ws:
        ws.send_json({"type": "step", "data": {"kind": "left"}})
        assert ws.receive_json()["data"]["code"] == "EXECUTION_ERROR"
        ws.send_json({"type": "reset", "data": {"task_id": "far", "seed": 1, "episode_id": "w-1"}})
        reply = ws.receive_json()["data"]
        local = Walk("far")
        assert reply["observation"] == local.reset(seed=1)[0] and reply["metadata"]["episode_id"] == "w-1"
        ws.send_json({"type": "step", "data": {"kind": "jump"}})
        err = ws.receive_json()["data"]
        assert err["code"] == "VALIDATION_ERROR" and err["errors"][0]["loc"] == ["body", "kind"]
        assert "action field 'kind'" in err["message"]
        ws.send_json({"type": "reset", "data": {"task_id": "nowhere"}})
        assert ws.receive_json()["data"]["message"].startswith("Unknown task: nowhere")
        for day in range(1, DAYS + 1):
            ws.send_json({"type": "step", "data": {"kind": "right"}})
            data = ws.receive_json()["data"]
            obs, reward, terminated, truncated, info = local.step({"kind": "right"})
            assert (data["observation"], data["reward"], data["done"]) == (obs, reward, terminated or truncated)
            assert obs["day"] == day
            assert data["metadata"]["info"] == info
            assert (data["metadata"]["terminated"], data["metadata"]["truncated"]) == (terminated, truncated)
        assert truncated and not terminated
        ws.send_json({"type": "step", "data": {"kind": "right"}})
        assert ws.receive_json()["data"]["message"] == "Episode is done. Call reset() first."
        ws.send_json({"type": "state"})
        state = ws.receive_json()["data"]
        assert (state["day"], state["step_count"], state["episode_id"]) == (DAYS, DAYS, "w-1")


def test_toy_sessions_share_the_limits():
    c = toy_client(max_sessions=1)
    with c.websocket_connect(WS_URL) as ws:
        ws.send_json({"type": "reset"})
        assert ws.receive_json()["data"]["observation"]["task"] == "near"
        r = c.post("/reset")
        assert r.status_code == 503 and r.json()["detail"].startswith("Session limit reached (1)")
    assert c.post("/reset").status_code == 200


# ------------------------------------------------------------------------------------------------------------
# the toy environment behind a real server process


@pytest.fixture(scope="module")
def toy_server():
    port = free_port()
    proc, url = start_server(env_server_cmd(port, "--env", TOY_NAME), port)
    yield url
    stop_server(proc)


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_toy_server_process_plays_like_in_process(toy_server, transport, importable):
    with RemoteEnv(toy_server, transport=transport, env=TOY_NAME) as env:
        ends = {play_both(env, task, seed) for task in TARGETS for seed in range(4)}
        assert ends == {(True, False), (False, True)}
        assert env.server_info()["name"] == "toy-walk" and list(env.tasks()) == list(TARGETS)
        if transport == "ws":  # the WebSocket session outlives the episode
            assert env.state()["step_count"] == env.state()["day"]
    with httpx.Client(base_url=toy_server, trust_env=False) as c:
        assert c.post("/step", json={"kind": "left"}).json() == {"detail": "No active session. Call /reset first."}

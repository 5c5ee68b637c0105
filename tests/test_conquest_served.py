"""conquest served by env.server (``--env conquest``, :data:`env.conquest.served.CONQUEST`): its descriptor, its three
step payload forms, its errors and session limits in-process (FastAPI TestClient), and full games played through
``RemoteEnv`` against a real server process over HTTP and WebSocket, equal step by step to the same games
in-process."""

from __future__ import annotations

import importlib.metadata
import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
pytest.importorskip("websockets")

from fastapi.testclient import TestClient  # noqa: E402
from servers import env_server_cmd, free_port, start_server, stop_server  # noqa: E402

from env.client import RemoteEnv  # noqa: E402
from env.conquest import TASKS, ConquestEnv, teacher_index  # noqa: E402
from env.conquest.actions import TYPE_NAMES  # noqa: E402
from env.conquest.served import CONQUEST, OBSERVATION_FIELDS, parse_action  # noqa: E402
from env.server import ActionError, ServerSettings, create_app, find_served  # noqa: E402

WS_URL = "ws://127.0.0.1/ws"  # TestClient's WebSocket host would be "testserver", which the server refuses


def client(**settings) -> TestClient:
    return TestClient(create_app(ServerSettings(**settings), "conquest"), base_url="http://127.0.0.1")


def flat_obs(reply: dict) -> dict:
    """The observation of a flat HTTP reply (its own ``done`` is the reply's)."""
    return {k: v for k, v in reply.items() if k not in ("reward", "metadata")}


# ------------------------------------------------------------------------------------------------------------
# the descriptor


def test_conquest_is_served_by_name():
    entry_points = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="recruit_trl.served_envs")}
    assert entry_points["conquest"] == "env.conquest.served:CONQUEST"
    assert find_served("conquest") is CONQUEST
    assert CONQUEST.default_task == "classic3" and list(CONQUEST.tasks) == list(TASKS)


def test_descriptor_matches_the_environment():
    obs, _ = ConquestEnv("classic6").reset(seed=1)
    assert tuple(obs) == OBSERVATION_FIELDS == tuple(CONQUEST.observation_schema["properties"])
    assert not set(OBSERVATION_FIELDS) & {"reward", "metadata"}  # a flat reply would overwrite them
    raw_titles = [form["title"] for form in CONQUEST.action_schema["anyOf"][2:]]
    assert raw_titles == [f"raw {name}" for name in TYPE_NAMES]
    for tid, doc in CONQUEST.tasks.items():
        assert (doc["players"], doc["opponents"], doc["max_rounds"]) == (
            TASKS[tid].players,
            list(TASKS[tid].bots),
            TASKS[tid].max_rounds,
        )


@pytest.mark.parametrize(
    "payload",
    [
        {"action_index": 3},
        {"action_index": "3"},  # a bad index is the env's business (fallback), not a malformed payload
        {"reply": '{"action_index": 1}'},
        {"reply": 7},
        {"type": "end_turn"},
        {"type": "jump", "from": 3},
    ],
)
def test_payload_forms_are_passed_through(payload):
    assert parse_action(payload) is payload


@pytest.mark.parametrize(
    ("payload", "kind", "loc"),
    [
        ([0], "dict_type", []),
        ('{"action_index": 0}', "dict_type", []),
        (b"\x00", "dict_type", []),
        ({}, "missing", []),
        ({"action": {"type": "end_turn"}}, "missing", []),
        ({"type": "end_turn", "action_index": 0}, "extra_forbidden", ["action_index"]),
        ({"action_index": 0, "reply": "x"}, "extra_forbidden", ["reply"]),
        ({"action_index": 0, "why": "x"}, "extra_forbidden", ["why"]),
        ({"reply": "x", "why": "x"}, "extra_forbidden", ["why"]),
    ],
)
def test_malformed_payloads_are_refused(payload, kind, loc):
    with pytest.raises(ActionError) as exc:
        parse_action(payload)
    assert [(e["type"], e["loc"]) for e in exc.value.errors] == [(kind, loc)]


# ------------------------------------------------------------------------------------------------------------
# in-process


def test_routes_and_documents():
    c = client()
    root = c.get("/").json()
    assert (root["name"], root["tasks"]) == ("conquest", list(TASKS))
    assert c.get("/tasks").json() == CONQUEST.tasks
    schema = c.get("/schema").json()
    assert schema == {"action": CONQUEST.action_schema, "observation": CONQUEST.observation_schema,
                      "state": CONQUEST.state_schema}  # fmt: skip
    assert c.get("/metadata").json()["name"] == "conquest"
    assert c.get("/openapi.json").json()["info"]["title"] == "Conquest"


def test_reset_refuses_what_the_env_refuses():
    c = client()
    r = c.post("/reset", params={"task_id": "classic4"})
    assert r.status_code == 400 and r.json()["detail"].startswith("Unknown task: classic4")
    r = c.post("/reset", params={"seed": -1})
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "greater_than_equal"
    r = c.post("/reset", json={"seed": -5})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "seed"]
    r = c.post("/reset")  # no task, no seed: classic3 with seed 0
    assert r.status_code == 200
    assert flat_obs(r.json()) == ConquestEnv().reset(seed=0)[0]
    with c.websocket_connect(WS_URL) as ws:
        ws.send_json({"type": "reset", "data": {"task_id": "duel", "seed": -1}})
        err = ws.receive_json()["data"]
        assert err["code"] == "VALIDATION_ERROR" and err["errors"][0]["loc"] == ["data", "seed"]
        ws.send_json({"type": "reset", "data": {"task_id": "duel", "seed": 2}})
        assert ws.receive_json()["data"]["observation"] == ConquestEnv("duel").reset(seed=2)[0]


def test_steps_over_http_fall_back_like_in_process():
    c = client()
    local = ConquestEnv("duel")
    local.reset(seed=4)
    c.post("/reset", params={"task_id": "duel", "seed": 4})
    for body in ([0], {"action": 0}, {"action_index": 0, "reply": "x"}):
        r = c.post("/step", json=body)
        assert r.status_code == 422, body
    assert c.post("/step", content=b"{", headers={"content-type": "application/json"}).status_code == 422
    assert c.get("/state").json()["step_count"] == 0  # nothing was applied
    blitz = {"type": "blitz", "from": "nowhere", "to": "peru"}
    payloads = [  # (body, the in-process call, its argument, the fallback reason)
        ({"action_index": 99}, "step_index", 99, "out_of_range"),
        ({"action_index": True}, "step_index", True, "bad_type"),
        ({"reply": "```json\n{}```"}, "step_text", "```json\n{}```", "invalid_json"),
        ({"reply": '{"action_index": 0, "x": 1}'}, "step_text", '{"action_index": 0, "x": 1}', "extra_keys"),
        (blitz, "step", blitz, "illegal"),
        ({"reply": '{"action_index": 1}'}, "step_text", '{"action_index": 1}', None),
    ]
    for body, method, arg, reason in payloads:
        reply = c.post("/step", json=body).json()
        obs, reward, terminated, truncated, info = getattr(local, method)(arg)
        assert (flat_obs(reply), reply["reward"], reply["metadata"]["info"]) == (obs, reward, info)
        assert (reply["metadata"]["terminated"], reply["metadata"]["truncated"]) == (terminated, truncated)
        assert info["fallback_reason"] == reason and info["fallback"] == (reason is not None)
        assert info["reward_components"]["invalid"] == (-0.05 if reason else 0.0)
    state = c.get("/state").json()
    assert state["step_count"] == state["agent_steps"] == len(payloads)
    assert state["render_text"] == local.render_text()
    assert state["candidate_lines"] == local.render_candidates()
    assert set(state) == set(CONQUEST.state_schema["properties"])


def test_websocket_errors_keep_the_episode():
    c = client()
    local = ConquestEnv("easy3")
    local.reset(seed=1)
    with c.websocket_connect(WS_URL) as ws:
        ws.send_json({"type": "reset", "data": {"task_id": "easy3", "seed": 1}})
        ws.receive_json()
        ws.send_json({"type": "step", "data": {"index": 0}})
        err = ws.receive_json()["data"]
        assert err["code"] == "VALIDATION_ERROR" and err["errors"][0]["type"] == "missing"
        ws.send_json({"type": "step", "data": {"action_index": -1}})
        data = ws.receive_json()["data"]
        obs, reward, terminated, truncated, info = local.step_index(-1)
        assert (data["observation"], data["reward"], data["metadata"]["info"]) == (obs, reward, info)
        assert info["fallback_reason"] == "out_of_range"
        ws.send_json({"type": "state"})
        assert ws.receive_json()["data"]["step_count"] == 1


def test_sessions_share_the_limits():
    c = client(max_sessions=1)
    with c.websocket_connect(WS_URL) as ws:
        ws.send_json({"type": "reset", "data": {"task_id": "duel"}})
        assert ws.receive_json()["data"]["observation"]["task"] == "duel"
        r = c.post("/reset")
        assert r.status_code == 503 and r.json()["detail"].startswith("Session limit reached (1)")
        with c.websocket_connect(WS_URL) as second:
            assert second.receive_json()["data"]["code"] == "CAPACITY_REACHED"
    assert c.post("/reset").status_code == 200


# ------------------------------------------------------------------------------------------------------------
# a real server process


@pytest.fixture(scope="module")
def conquest_server():
    port = free_port()
    proc, url = start_server(env_server_cmd(port, "--env", "conquest"), port)
    yield url
    stop_server(proc)


def play_both(remote: RemoteEnv, task: str, seed: int) -> tuple[int, str]:
    """One game with the teacher's answers, remotely and in-process side by side: every reset and step must be
    equal. The answer goes as an index, a reply text or the raw action in turn, once as a bad index (fallback)
    and once as a malformed payload (refused, nothing applied). Returns the steps and the outcome."""
    local = ConquestEnv(task)
    assert remote.reset(seed=seed, options={"task": task}) == local.reset(seed=seed)
    with pytest.raises(ValueError, match="Exactly one of"):
        remote.step({"action_index": 0, "reply": "{}"})
    steps = 0
    while True:
        k = teacher_index(local)
        form = steps % 3
        if steps == 5:
            got, expected = remote.step({"action_index": 12}), local.step_index(12)
            assert expected[4]["fallback_reason"] == "out_of_range"
        elif form == 0:
            got, expected = remote.step({"action_index": k}), local.step_index(k)
        elif form == 1:
            reply = json.dumps({"action_index": k})
            got, expected = remote.step({"reply": reply}), local.step_text(reply)
        else:
            action = local.candidates()[k]
            got, expected = remote.step(action), local.step(action)
        assert got == expected, (task, seed, steps)
        steps += 1
        _, _, terminated, truncated, info = got
        if terminated or truncated:
            assert info["final_score"] == local.final_score() and remote.done
            return steps, info["outcome"]


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_server_process_plays_like_in_process(conquest_server, transport):
    with RemoteEnv(conquest_server, task="duel", transport=transport, env="conquest") as env:
        assert env.server_info()["name"] == "conquest" and list(env.tasks()) == list(TASKS)
        games = [play_both(env, "duel", seed) for seed in (0, 1)]
        assert all(steps > 10 for steps, _ in games)
        if transport == "ws":  # the WebSocket session outlives the episode: the final state
            state = env.state()
            assert state["done"] and state["outcome"] == games[-1][1] and state["candidate_lines"] == []
        steps, outcome = play_both(env, "classic3", 0)
        assert outcome in ("win", "loss", "timeout")
    with httpx.Client(base_url=conquest_server, trust_env=False) as c:
        assert c.post("/step", json={"action_index": 0}).json() == {"detail": "No active session. Call /reset first."}

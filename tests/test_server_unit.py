"""In-process checks of env.server (FastAPI TestClient) and env.client: settings, expiry, rate limit, schemas,
WebSocket errors, RemoteEnv against a stand-in for the reference server (flat replies, no seed), hostile input
(lone surrogates, huge numbers, non-object reset data), the per-client session cap and the access checks (Host,
Origin, token) and the server's log filters (token redaction, one warning line for an invalid-UTF-8 frame)."""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
import warnings

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi import FastAPI, HTTPException, Request  # noqa: E402
from fastapi.responses import JSONResponse  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from env.client import RemoteEnv, SessionLostError  # noqa: E402
from env.clinical import Action, ClinicalRecruitmentEnv, heuristic_policy, random_policy  # noqa: E402
from env.clinical.served import OBSERVATION_FIELDS, split_done  # noqa: E402
from env.server import ServerSettings, SessionStore, create_app  # noqa: E402

SCREEN = {"action_type": "screen_patient", "patient_id": "P-1149", "hypothesis": "noise_dominant", "confidence": 0.7}
WS_URL = "ws://127.0.0.1/ws"  # TestClient's WebSocket host would be "testserver", which the server refuses


def client(**settings) -> TestClient:
    """A client of a fresh app; its Host is a loopback address, as the server requires by default."""
    return TestClient(create_app(ServerSettings(**settings)), base_url="http://127.0.0.1")


def test_observation_fields_match_the_env():
    obs, _ = ClinicalRecruitmentEnv("medium_bench").reset(seed=0)
    assert tuple(obs) == OBSERVATION_FIELDS


def test_settings_are_validated():
    with pytest.raises(ValueError):
        ServerSettings(max_sessions=0)
    with pytest.raises(ValueError):
        ServerSettings(rate_limit=-1)


@pytest.mark.parametrize("fast_path", [True, False])
def test_episode_through_route_and_fast_path_is_exact(fast_path):
    c = client(step_fast_path=fast_path)
    env = ClinicalRecruitmentEnv("hard_bench_stage_30")
    local_obs, local_info = env.reset(seed=5)
    r = c.post("/reset", params={"task_id": "hard_bench_stage_30", "seed": 5})
    assert r.status_code == 200
    data = r.json()
    assert {k: data[k] for k in OBSERVATION_FIELDS} == local_obs
    assert data["done"] is False and data["reward"] == 0.0
    assert data["metadata"]["info"] == local_info and data["metadata"]["seed"] == 5
    while True:
        action = heuristic_policy(local_obs)
        local_obs, reward, terminated, truncated, info = env.step(action)
        r = c.post("/step", json=action)
        assert r.status_code == 200
        data = r.json()
        assert {k: data[k] for k in OBSERVATION_FIELDS} == local_obs
        assert data["reward"] == reward and data["done"] == (terminated or truncated)
        assert data["metadata"]["info"] == info and data["metadata"]["reward_breakdown"] == info["reward_breakdown"]
        if data["done"]:
            assert "Max-Age=0" in r.headers["set-cookie"]
            break
    assert c.get("/state").json() == {"detail": "No active session. Call /reset first."}  # the cookie was cleared


def test_session_ttl_expires_inline():
    c = client(session_ttl=1.0)  # long enough for a reset and a step on a loaded machine
    assert c.post("/reset").status_code == 200
    assert c.post("/step", json=SCREEN).status_code == 200
    time.sleep(2.2)
    r = c.post("/step", json=SCREEN)
    assert r.status_code == 400 and r.json() == {"detail": "Session expired or missing. Call /reset first."}
    assert c.get("/").json()["active_sessions"] == 0


def test_reaper_and_limit_never_evict_live_sessions():
    now = [0.0]
    store = SessionStore(max_sessions=2, ttl=10.0, clock=lambda: now[0])
    a = store.create("http")
    now[0] = 5.0
    b = store.create("http")
    with pytest.raises(Exception, match=r"Session limit reached \(2\)"):
        store.create("http")
    now[0] = 12.0  # a expired (idle 12 s), b is live (idle 7 s)
    c = store.create("http")  # reaps a to make room
    assert store.get(a.sid) is None and store.get(b.sid) is b and store.get(c.sid) is c
    now[0] = 30.0
    assert store.reap() == 2 and len(store) == 0


def test_rate_limit_is_off_by_default_and_optional():
    c = client()
    c.post("/reset")
    assert all(c.post("/step", json=SCREEN).status_code == 200 for _ in range(30))
    c = client(rate_limit=3)
    c.post("/reset")
    assert [c.post("/step", json=SCREEN).status_code for _ in range(5)] == [200, 200, 200, 429, 429]
    r = c.post("/step", json=SCREEN)
    assert r.status_code == 429 and r.headers["retry-after"] == "1" and "Rate limit exceeded" in r.json()["detail"]
    time.sleep(1.05)  # rejected calls did not count: the window is free again
    assert c.post("/step", json=SCREEN).status_code == 200
    assert c.get("/state").json()["step"] == 4


@pytest.mark.parametrize("fast_path", [True, False])
def test_422_shapes_match_fastapi(fast_path):
    c = client(step_fast_path=fast_path)
    c.post("/reset")
    r = c.post("/step", json={**SCREEN, "confidence": 1.5})
    assert r.status_code == 422
    assert r.json()["detail"] == [
        {
            "type": "less_than_equal",
            "loc": ["body", "confidence"],
            "msg": "Input should be less than or equal to 1",
            "input": 1.5,
            "ctx": {"le": 1.0},
        }
    ]
    r = c.post("/step", json={"action": SCREEN})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "action_type"]
    assert r.json()["detail"][0]["type"] == "missing"
    r = c.post("/step", json={"action_type": "teleport"})
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "literal_error"
    r = c.post("/step", content=b'{"action_type": ', headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
    r = c.post("/step", content=b'{"action_type": "stop_recruitment", "confidence": NaN}')
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
    r = c.post("/step", data={"action_type": "screen_patient"})
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "model_attributes_type"
    r = c.post("/step", json=[SCREEN])
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body"]
    r = c.post("/step", content=b"", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "missing"
    r = c.post("/step", content=b"[" * 30000 + b"]" * 30000, headers={"content-type": "application/json"})
    assert r.status_code == 422
    # none of this touched the episode
    assert c.get("/state").json()["step"] == 0
    assert c.post("/step", json=SCREEN).status_code == 200


def test_body_limit_413_streaming_and_declared():
    c = client(max_body_bytes=2048)
    c.post("/reset")
    big = {**SCREEN, "plan_summary": "x" * 4000}
    assert c.post("/step", json=big).status_code == 413

    def chunks():
        yield b'{"action_type": "screen_patient", "plan_summary": "'
        for _ in range(10):
            yield b"x" * 500
        yield b'"}'

    r = c.post("/step", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "too large" in r.json()["detail"]
    assert c.post("/reset", content=b"{" + b" " * 5000 + b"}").status_code == 413
    assert c.get("/state").json()["step"] == 0


def test_schema_and_metadata():
    c = client()
    schema = c.get("/schema").json()
    assert schema["action"] == Action.model_json_schema()
    assert set(schema["observation"]["properties"]) == set(OBSERVATION_FIELDS)
    c.post("/reset")
    state = c.get("/state").json()
    assert set(schema["state"]["properties"]) == set(state)
    meta = c.get("/metadata").json()
    assert set(meta) == {"name", "description", "readme_content", "version", "author", "documentation_url"}
    assert meta["name"] == "adaptive-clinical-recruitment"


def test_websocket_protocol_errors_keep_the_episode():
    c = client()
    with c.websocket_connect(WS_URL) as ws:
        ws.send_json({"type": "step", "data": SCREEN})
        assert ws.receive_json() == {
            "type": "error",
            "data": {"message": "No active episode. Call reset first.", "code": "EXECUTION_ERROR"},
        }
        ws.send_json({"type": "reset", "data": {"task_id": "medium_bench", "seed": 2, "episode_id": "ep-1"}})
        reply = ws.receive_json()
        assert reply["type"] == "observation" and reply["data"]["done"] is False
        assert reply["data"]["observation"] == ClinicalRecruitmentEnv("medium_bench").reset(seed=2)[0]
        assert reply["data"]["metadata"]["episode_id"] == "ep-1"
        ws.send_text("{not json")
        assert ws.receive_json()["data"]["code"] == "INVALID_JSON"
        ws.send_json({"type": "teleport"})
        assert ws.receive_json()["data"]["code"] == "UNKNOWN_TYPE"
        ws.send_json({"type": "step", "data": {**SCREEN, "confidence": 2}})
        err = ws.receive_json()["data"]
        assert err["code"] == "VALIDATION_ERROR" and "confidence" in err["message"]
        assert err["errors"][0]["loc"] == ["body", "confidence"]
        ws.send_json({"type": "reset", "data": {"task_id": "nope"}})
        err = ws.receive_json()["data"]
        assert err["code"] == "VALIDATION_ERROR" and err["message"].startswith("Unknown task: nope")
        ws.send_json({"type": "reset", "data": {"seed": "abc"}})
        assert ws.receive_json()["data"]["code"] == "VALIDATION_ERROR"
        ws.send_json({"type": "state"})
        state = ws.receive_json()
        assert state["type"] == "state"
        assert state["data"]["task"] == "medium_bench" and state["data"]["step_count"] == 0
        assert state["data"]["episode_id"] == "ep-1"
        ws.send_json({"type": "step", "data": {**SCREEN, "patient_id": "nobody"}})
        reply = ws.receive_json()["data"]
        assert reply["metadata"]["info"]["last_action_error"] == "patient_not_found"
        assert reply["metadata"]["reward_breakdown"] == reply["metadata"]["info"]["reward_breakdown"]
        ws.send_json({"type": "close"})


def test_websocket_capacity_and_shared_limit():
    c = client(max_sessions=1)
    with c.websocket_connect(WS_URL) as ws:
        ws.send_json({"type": "reset"})
        assert ws.receive_json()["type"] == "observation"
        r = c.post("/reset")
        assert r.status_code == 503
        assert r.json() == {"detail": "Session limit reached (1). Retry later or raise --max_sessions."}
        with c.websocket_connect(WS_URL) as ws2:
            err = ws2.receive_json()
            assert err["type"] == "error" and err["data"]["code"] == "CAPACITY_REACHED"
    assert c.post("/reset").status_code == 200  # the WebSocket session was released


def test_split_done_matches_the_env():
    seen = set()
    for task, seed in [("easy_bench", 0), ("hard_bench_stage_30", 1), ("medium_bench_stage_30", 2)]:
        env = ClinicalRecruitmentEnv(task)
        rng = random.Random(seed)
        for episode in range(6):
            obs, _ = env.reset(seed=episode)
            done = False
            while not done:
                if episode % 2 and rng.random() < 0.02:
                    action = {"action_type": "stop_recruitment", "confidence": 0.5}
                else:
                    action = random_policy(obs, rng)
                obs, _, terminated, truncated, _ = env.step(action)
                done = terminated or truncated
                assert split_done(obs, done, action["action_type"]) == (terminated, truncated)
            seen.add((terminated, truncated))
    assert seen == {(True, False), (False, True)}
    base = {"timestamp": 180, "max_steps": 180, "budget_remaining": 0.0, "enrolled_so_far": 3, "target_enrollment": 80}
    assert split_done(base, True, "screen_patient") == (True, False)  # budget exhausted on the last day
    assert split_done({**base, "budget_remaining": 5.0, "enrolled_so_far": 80}, True, "recontact") == (True, False)


# ------------------------------------------------------------------------------------------------------------
# RemoteEnv against a stand-in for the reference server


def reference_like_app() -> FastAPI:
    """The reference server's HTTP behaviour (spec 13.1) in a few lines: flat replies, ``metadata.info``, no seed
    (every episode uses the task's default seed), the session deleted and the cookie cleared at the end."""
    app = FastAPI()
    sessions: dict[str, ClinicalRecruitmentEnv] = {}

    @app.post("/reset")
    def reset(task_id: str = "easy_bench") -> JSONResponse:
        try:
            env = ClinicalRecruitmentEnv(task_id)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from None
        obs, info = env.reset()
        sid = uuid.uuid4().hex
        sessions[sid] = env
        response = JSONResponse({**obs, "done": False, "reward": 0.0, "metadata": {"info": info}})
        response.set_cookie("acr_session_id", sid, httponly=True, samesite="lax")
        return response

    @app.post("/step")
    def step(action: Action, request: Request) -> JSONResponse:
        sid = request.cookies.get("acr_session_id")
        if not sid:
            raise HTTPException(400, "No active session. Call /reset first.")
        env = sessions.get(sid)
        if env is None:
            raise HTTPException(400, "Session expired or missing. Call /reset first.")
        obs, reward, terminated, truncated, info = env.step(action.model_dump())
        done = terminated or truncated
        meta = {"info": info, "reward_breakdown": info["reward_breakdown"]}
        response = JSONResponse({**obs, "done": done, "reward": reward, "metadata": meta})
        if done:
            del sessions[sid]
            response.delete_cookie("acr_session_id")
        return response

    return app


def test_remote_env_against_reference_like_server():
    with TestClient(reference_like_app()) as http:
        env = RemoteEnv("http://testserver", task="hard_bench_stage_30", http_client=http)
        local = ClinicalRecruitmentEnv("hard_bench_stage_30")
        with pytest.warns(RuntimeWarning, match="ignored seed=7"):
            obs, info = env.reset(seed=7)
        assert env.seed_honored is False
        local_obs, local_info = local.reset(seed=None)  # what the reference really played
        assert (obs, info) == (local_obs, local_info)
        with pytest.raises(ValueError, match="confidence"):
            env.step({**SCREEN, "confidence": 3})
        done = False
        while not done:
            action = heuristic_policy(obs)
            remote = env.step(action)
            assert remote == local.step(action)
            obs, done = remote[0], remote[2] or remote[3]
        assert "final_score" in remote[4]
        with pytest.raises(RuntimeError, match="Episode is done"):
            env.step(SCREEN)
        with pytest.raises(RuntimeError, match="state"):
            env.state()
        with pytest.raises(ValueError, match="Unknown task"):
            env.reset(options={"task": "bogus"})
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            env.reset()  # no seed requested: no warning
        env.close()


def test_remote_env_session_lost_is_an_error_not_a_restart():
    with TestClient(create_app(ServerSettings(session_ttl=0.05)), base_url="http://127.0.0.1") as http:
        env = RemoteEnv("http://127.0.0.1", task="easy_bench", http_client=http)
        with pytest.raises(RuntimeError, match="reset"):
            env.step(SCREEN)
        obs, _ = env.reset(seed=1)
        assert env.seed_honored is True
        env.step(heuristic_policy(obs))
        time.sleep(0.12)
        with pytest.raises(SessionLostError, match="Session expired or missing"):
            env.step(SCREEN)
        with pytest.raises(RuntimeError, match="reset"):
            env.step(SCREEN)  # still no silent restart
        env.reset(seed=1)
        assert env.state()["step"] == 0
        env.close()


def test_cors_covers_every_route_when_enabled():
    c = client(cors_origins=("*",))
    headers = {"origin": "http://example.org"}
    assert c.post("/reset", headers=headers).headers["access-control-allow-origin"] == "*"
    assert c.post("/step", json=SCREEN, headers=headers).headers["access-control-allow-origin"] == "*"
    assert "access-control-allow-origin" not in client().get("/", headers=headers).headers


# ------------------------------------------------------------------------------------------------------------
# hostile input and exposure


def local_client(**settings) -> TestClient:
    """A client whose errors come back as replies (a 500 stays a 500) and whose Host is a loopback address."""
    app = create_app(ServerSettings(**settings))
    return TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False)


def raw_json(text: str) -> dict:
    return {"content": text.encode(), "headers": {"content-type": "application/json"}}


MEMORY_QUERY = '{"action_type": "retrieve_relevant_history", "memory_query": "\\ud800"}'


@pytest.mark.parametrize("fast_path", [True, False])
def test_lone_surrogates_are_422_and_nothing_leaks(fast_path):
    c = local_client(max_sessions=2, step_fast_path=fast_path)
    for _ in range(3):  # refused before a session exists: no slot is taken
        r = c.post("/reset", **raw_json('{"task_id": "easy_bench", "episode_id": "x\\ud800"}'))
        assert r.status_code == 422, r.text
        assert r.json()["detail"][0]["loc"] == ["body", "episode_id"]
        assert "set-cookie" not in r.headers
    assert c.get("/").json()["active_sessions"] == 0
    assert c.post("/reset", params={"seed": 0}).status_code == 200
    r = c.post("/step", **raw_json(MEMORY_QUERY))  # refused, not applied (the env would echo the query)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "memory_query"]
    r = c.post("/step", **raw_json('{"action_type": "\\udfff"}'))  # echoed by a validation error
    assert r.status_code == 422
    r = c.post("/step", **raw_json('{"action_type": "stop_recruitment", "\\ud800": 1}'))  # in a key
    assert r.status_code == 422
    state = c.get("/state")
    assert state.status_code == 200 and state.json()["step"] == 0
    assert c.post("/step", json=SCREEN).status_code == 200


def test_replies_always_encode():
    from env.server import dumps, dumps_text

    value = {"episode_id": "a\ud800b", "x": "é"}
    assert json.loads(dumps(value)) == value and json.loads(dumps_text(value).encode()) == value


BIG = "1" + "0" * 400


@pytest.mark.parametrize("fast_path", [True, False])
def test_huge_numbers_are_422_and_keep_the_session(fast_path):
    c = local_client(step_fast_path=fast_path)
    c.post("/reset", params={"seed": 0})
    for body, loc in [
        (f'{{"action_type": "stop_recruitment", "confidence": {BIG}}}', ["body", "confidence"]),
        (f'{{"action_type": "stop_recruitment", "confidence": -{BIG}}}', ["body", "confidence"]),
        (f'{{"action_type": "stop_recruitment", "token_cost": {BIG}}}', ["body", "token_cost"]),
    ]:
        r = c.post("/step", **raw_json(body))
        assert r.status_code == 422, (body[:60], r.status_code, r.text[:200])
        assert r.json()["detail"][0]["loc"] == loc
    for body in [
        '{"action_type": "stop_recruitment", "confidence": 1e400}',
        '{"action_type": "stop_recruitment", "confidence": ' + "1" * 5000 + "}",
    ]:
        r = c.post("/step", **raw_json(body))
        assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid", r.text[:200]
    assert c.get("/state").json()["step"] == 0
    assert c.post("/reset", params={"seed": "9" * 5000}).status_code == 422
    assert c.post("/reset", **raw_json('{"seed": ' + "9" * 5000 + "}")).status_code == 422
    assert c.post("/reset", **raw_json('{"episode_id": ' + "9" * 4000 + "}")).status_code == 200


def test_websocket_hostile_messages_keep_the_episode():
    c = local_client()
    with c.websocket_connect(WS_URL) as ws:
        ws.send_json({"type": "reset", "data": [1]})  # not an object: an error, not a reset with defaults
        err = ws.receive_json()
        assert err["type"] == "error" and err["data"]["code"] == "VALIDATION_ERROR", err
        ws.send_json({"type": "reset", "data": "medium_bench"})
        assert ws.receive_json()["data"]["code"] == "VALIDATION_ERROR"
        ws.send_json({"type": "reset", "data": {"task_id": "medium_bench", "seed": 2}})
        assert ws.receive_json()["type"] == "observation"
        ws.send_text(f'{{"type": "step", "data": {{"action_type": "stop_recruitment", "confidence": {BIG}}}}}')
        err = ws.receive_json()["data"]
        assert err["code"] == "VALIDATION_ERROR" and err["errors"][0]["loc"] == ["body", "confidence"], err
        ws.send_text('{"type": "step", "data": ' + MEMORY_QUERY + "}")
        err = ws.receive_json()["data"]
        assert err["code"] == "VALIDATION_ERROR" and err["errors"][0]["loc"] == ["data", "memory_query"], err
        ws.send_text('{"type": "reset", "data": {"episode_id": "\\ud800"}}')
        assert ws.receive_json()["data"]["code"] == "VALIDATION_ERROR"
        ws.send_json({"type": "state"})
        state = ws.receive_json()["data"]
        assert (state["task"], state["step"]) == ("medium_bench", 0)


def test_sessions_are_capped_per_client():
    app = create_app(ServerSettings(max_sessions=4))
    a, b, c = (TestClient(app, base_url="http://127.0.0.1") for _ in range(3))
    assert a.post("/reset").status_code == 200 and b.post("/reset").status_code == 200
    r = c.post("/reset")  # every client is "testclient": 2 of its 4 slots are the default cap
    assert r.status_code == 503 and "per client (2)" in r.json()["detail"], r.text
    with c.websocket_connect(WS_URL) as ws:
        assert ws.receive_json()["data"]["code"] == "CAPACITY_REACHED"
    assert a.post("/reset").status_code == 200  # a client holding a session can always start over
    other = TestClient(app, base_url="http://127.0.0.1", client=("10.0.0.9", 4000))
    assert other.post("/reset").status_code == 200
    assert b.delete("/session").json() == {"closed": True}
    assert c.post("/reset").status_code == 200
    wide = create_app(ServerSettings(max_sessions=4, max_sessions_per_client=4))
    assert all(TestClient(wide, base_url="http://127.0.0.1").post("/reset").status_code == 200 for _ in range(4))
    with pytest.raises(ValueError):
        ServerSettings(max_sessions_per_client=0)


def test_foreign_origins_and_hosts_are_refused():
    from starlette.testclient import WebSocketDenialResponse
    from starlette.websockets import WebSocketDisconnect

    c = local_client()
    evil = {"origin": "http://evil.example"}
    assert c.post("/reset", headers=evil).status_code == 403
    assert c.post("/step", json=SCREEN, headers=evil).status_code == 403
    assert c.get("/", headers={"origin": "http://127.0.0.1:3000"}).status_code == 403  # another local page
    assert c.get("/", headers={"host": "rebound.example:8000"}).status_code == 400  # DNS rebinding
    with pytest.raises((WebSocketDenialResponse, WebSocketDisconnect)):
        with c.websocket_connect(WS_URL, headers=evil) as ws:
            ws.receive_json()
    assert c.get("/").json()["active_sessions"] == 0
    assert c.post("/reset", headers={"origin": "http://127.0.0.1"}).status_code == 200  # same origin
    for host in ("localhost:8000", "127.0.0.1", "[::1]:8000", "10.1.2.3:8000"):
        assert c.get("/health", headers={"host": host}).status_code == 200, host
    c = local_client(allowed_origins=("http://app.example",), allowed_hosts=("envbox.lan",))
    assert c.get("/", headers={"origin": "http://app.example", "host": "envbox.lan:8000"}).status_code == 200
    assert c.get("/", headers={"origin": "http://evil.example"}).status_code == 403
    assert local_client(allowed_hosts=("*",)).get("/", headers={"host": "any.example"}).status_code == 200


def test_token_is_required_on_every_route():
    from starlette.testclient import WebSocketDenialResponse
    from starlette.websockets import WebSocketDisconnect

    c = local_client(token="s3cret")
    good = {"authorization": "Bearer s3cret"}
    for method, path in [("GET", "/"), ("GET", "/health"), ("POST", "/reset"), ("POST", "/step"), ("GET", "/state")]:
        r = c.request(method, path)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer", (path, r.status_code)
        assert c.request(method, path, headers={"authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/", headers=good).status_code == 200
    assert c.post("/reset", headers=good).status_code == 200
    assert c.post("/step", json=SCREEN, headers=good).status_code == 200
    with pytest.raises((WebSocketDenialResponse, WebSocketDisconnect)):
        with c.websocket_connect(WS_URL) as ws:
            ws.receive_json()
    for kwargs in ({"headers": good}, {}):
        path = WS_URL if kwargs else WS_URL + "?token=s3cret"
        with c.websocket_connect(path, **kwargs) as ws:
            ws.send_json({"type": "reset"})
            assert ws.receive_json()["type"] == "observation"
    app = create_app(ServerSettings(token="s3cret"))
    with TestClient(app, base_url="http://127.0.0.1") as http:
        with pytest.raises(RuntimeError, match="401"):
            RemoteEnv("http://127.0.0.1", http_client=http, retries=0, token="").reset()
        env = RemoteEnv("http://127.0.0.1", task="hard_bench_stage_30", http_client=http, token="s3cret")
        obs, _ = env.reset(seed=0)
        assert env.step(heuristic_policy(obs))[4]["step"] == 1
        env.close()


def test_serve_refuses_a_non_loopback_bind_without_token(monkeypatch, capsys):
    import uvicorn

    from env import server

    started = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: started.append((app, kw)))
    monkeypatch.delenv("RECRUIT_TRL_TOKEN", raising=False)
    with pytest.raises(SystemExit):
        server.main(["--host", "0.0.0.0", "--port", "1"])
    assert "--token" in capsys.readouterr().err and not started
    monkeypatch.setenv("RECRUIT_TRL_TOKEN", "from-env")
    assert server.main(["--host", "0.0.0.0", "--port", "1"]) == 0
    ((app, kw),) = started
    assert app.state.settings.token == "from-env" and kw["ws_max_size"] > app.state.settings.max_body_bytes
    assert server.main(["--host", "127.0.0.1", "--port", "1", "--token", "t"]) == 0
    assert started[-1][0].state.settings.token == "t"


class _Collect(logging.Handler):
    """Keeps the records it receives, formatted as one text (traceback included, if any)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def text(self) -> str:
        return "\n".join(self.format(r) for r in self.records)


@pytest.fixture()
def uvicorn_logs():
    """uvicorn's two loggers with the server's filters installed, at level INFO, into a :class:`_Collect`; all
    put back afterwards."""
    from env.server.logs import install_log_filters

    loggers = [logging.getLogger(name) for name in ("uvicorn.access", "uvicorn.error")]
    saved = [(lg, list(lg.filters), lg.level) for lg in loggers]
    collect = _Collect()
    install_log_filters()
    install_log_filters()  # idempotent
    for lg in loggers:
        lg.addHandler(collect)
        lg.setLevel(logging.INFO)
    try:
        yield collect
    finally:
        for lg, filters, level in saved:
            lg.removeHandler(collect)
            lg.filters[:] = filters
            lg.setLevel(level)


def test_token_is_redacted_from_access_log_records(uvicorn_logs):
    """``?token=`` values never reach a log line: uvicorn's access record (HTTP) and WebSocket handshake record;
    the other query parameters, and the record's arguments as uvicorn's access formatter unpacks them, stay."""
    from uvicorn.logging import AccessFormatter

    from env.server.logs import RedactTokenFilter, redact_token

    path = "/ws?seed=3&token=SECRET&task_id=easy_bench"
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", path, "1.1", 200),
        None,
    )
    assert RedactTokenFilter().filter(record)
    formatter = AccessFormatter('%(client_addr)s - "%(request_line)s" %(status_code)s', use_colors=False)
    assert formatter.format(record) == '127.0.0.1:5000 - "GET /ws?seed=3&token=***&task_id=easy_bench HTTP/1.1" 200 OK'

    access = logging.getLogger("uvicorn.access")
    access.info('%s - "%s %s HTTP/%s" %d', "127.0.0.1:5000", "POST", "/reset?token=SECRET&seed=1", "1.1", 200)
    logging.getLogger("uvicorn.error").info('%s - "WebSocket %s" [accepted]', "127.0.0.1:5001", "/ws?token=SECRET")
    assert [r.getMessage() for r in uvicorn_logs.records] == [
        '127.0.0.1:5000 - "POST /reset?token=***&seed=1 HTTP/1.1" 200',
        '127.0.0.1:5001 - "WebSocket /ws?token=***" [accepted]',
    ]
    assert "SECRET" not in uvicorn_logs.text()
    assert redact_token("/ws?%74oken=SECRET&tokens=1") == "/ws?%74oken=***&tokens=1"  # as parse_qs reads names
    assert redact_token("/reset?seed=1") == "/reset?seed=1" and redact_token("/health") == "/health"


def test_invalid_utf8_frame_is_one_warning_line_without_traceback(uvicorn_logs):
    """uvicorn reports a text frame that is not UTF-8 with ``logger.exception`` (a traceback): the filter makes it
    one warning line. Other errors keep their traceback."""
    from env.server.logs import INVALID_UTF8_MESSAGE

    error = logging.getLogger("uvicorn.error")
    try:
        b'{"type": "state", "x": "\xff\xfe"}'.decode()
    except UnicodeDecodeError:
        error.exception(INVALID_UTF8_MESSAGE)  # what uvicorn's WebSocket protocol does
    (record,) = uvicorn_logs.records
    assert record.levelno == logging.WARNING and record.exc_info is None
    text = uvicorn_logs.text()
    assert "Traceback" not in text and len(text.splitlines()) == 1, text
    assert text.startswith("WARNING uvicorn.error Invalid UTF-8"), text
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        error.exception("Exception in ASGI application")
    assert uvicorn_logs.records[-1].levelno == logging.ERROR and "Traceback" in uvicorn_logs.text()

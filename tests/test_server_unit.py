"""In-process checks of env.server (FastAPI TestClient) and env.client: settings, expiry, rate limit, schemas,
WebSocket errors, and RemoteEnv against a stand-in for the reference server (flat replies, no seed)."""

from __future__ import annotations

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

from env import Action, ClinicalRecruitmentEnv, heuristic_policy, random_policy  # noqa: E402
from env.client import OBSERVATION_FIELDS, RemoteEnv, SessionLostError, split_done  # noqa: E402
from env.server import ServerSettings, SessionStore, create_app  # noqa: E402

SCREEN = {"action_type": "screen_patient", "patient_id": "P-1149", "hypothesis": "noise_dominant", "confidence": 0.7}


def client(**settings) -> TestClient:
    return TestClient(create_app(ServerSettings(**settings)))


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
    c = client(session_ttl=0.05)
    assert c.post("/reset").status_code == 200
    assert c.post("/step", json=SCREEN).status_code == 200
    time.sleep(0.12)
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
    with c.websocket_connect("/ws") as ws:
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
    with c.websocket_connect("/ws") as ws:
        ws.send_json({"type": "reset"})
        assert ws.receive_json()["type"] == "observation"
        r = c.post("/reset")
        assert r.status_code == 503
        assert r.json() == {"detail": "Session limit reached (1). Retry later or raise --max-sessions."}
        with c.websocket_connect("/ws") as ws2:
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
    with TestClient(create_app(ServerSettings(session_ttl=0.05))) as http:
        env = RemoteEnv("http://testserver", task="easy_bench", http_client=http)
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

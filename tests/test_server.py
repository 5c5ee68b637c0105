"""End-to-end checks of env.server through a real server process (``python -m env.server``) on 127.0.0.1, over
real HTTP and WebSocket: exact episodes through RemoteEnv on both transports, every HTTP error case of the
reference API, session isolation under concurrency, the session limit, a small load-test run, and what only a real
transport shows: lone surrogates and oversized frames over WebSocket, and a server started with a token."""

from __future__ import annotations

import concurrent.futures
import json
import re
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
pytest.importorskip("websockets")

from servers import env_server_cmd, free_port, start_server, stop_server  # noqa: E402

from env.client import RemoteEnv, SessionLostError  # noqa: E402
from env.clinical import TASKS, ClinicalRecruitmentEnv, heuristic_policy  # noqa: E402
from env.clinical.served import OBSERVATION_FIELDS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NO_SESSION = {"detail": "No active session. Call /reset first."}
SESSION_LOST = {"detail": "Session expired or missing. Call /reset first."}
SCREEN = {"action_type": "screen_patient", "patient_id": "P-1149", "hypothesis": "noise_dominant", "confidence": 0.7}


def _serve(*extra: str):
    port = free_port()
    return start_server(env_server_cmd(port, *extra), port)


@pytest.fixture(scope="session")
def server():
    proc, url = _serve()
    yield url
    stop_server(proc)


@pytest.fixture(scope="session")
def small_server():
    proc, url = _serve("--max_sessions", "2", "--max_sessions_per_client", "2")  # every test client is 127.0.0.1
    yield url
    stop_server(proc)


@pytest.fixture()
def http(server):
    with httpx.Client(base_url=server, trust_env=False, timeout=30) as c:
        yield c


def _play_both(remote, task: str, seed: int | None):
    """Play the heuristic policy on ``remote`` and in-process side by side; everything must be equal."""
    local = ClinicalRecruitmentEnv(task)
    obs, info = remote.reset(seed=seed, options={"task": task})
    assert (obs, info) == local.reset(seed=seed)
    assert list(obs) == list(OBSERVATION_FIELDS)
    steps = 0
    while True:
        action = heuristic_policy(obs)
        got = remote.step(action)
        want = local.step(action)
        assert got == want, f"step {steps}"
        steps += 1
        obs, _, terminated, truncated, info = got
        if terminated or truncated:
            return steps, info["final_score"]


# ------------------------------------------------------------------------------------------------------------
# exactness through RemoteEnv


@pytest.mark.parametrize("transport", ["http", "ws"])
@pytest.mark.parametrize("task", ["easy_bench", "medium_bench", "hard_bench", "hard_bench_stage_30"])
def test_remote_episodes_reproduce_in_process(server, transport, task):
    with RemoteEnv(server, task=task, transport=transport) as env:
        for seed in (0, 1):
            steps, score = _play_both(env, task, seed)
            assert steps == ClinicalRecruitmentEnv(task).task.max_steps or score is not None
        with pytest.raises(RuntimeError, match="Episode is done"):
            env.step(SCREEN)
        with pytest.raises(ValueError, match="confidence"):
            env.reset(seed=0)
            env.step({**SCREEN, "confidence": 1.5})
        assert env.step(SCREEN)[4]["step"] == 1  # the rejected action consumed nothing


def test_concurrent_sessions_stay_isolated(server):
    def play(k: int):
        transport = "http" if k % 2 == 0 else "ws"
        task = ("easy_bench", "medium_bench", "hard_bench", "hard_bench_stage_30")[k % 4]
        with RemoteEnv(server, task=task, transport=transport) as env:
            return _play_both(env, task, 100 + k)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(play, range(8)))
    assert all(score is not None for _, score in results)


def test_ws_state_and_final_state(server):
    with RemoteEnv(server, task="hard_bench_stage_30", transport="ws") as env:
        local = ClinicalRecruitmentEnv("hard_bench_stage_30")
        obs, _ = env.reset(seed=3, options={"episode_id": "run-7"})
        local.reset(seed=3)
        done = False
        while not done:
            action = heuristic_policy(obs)
            obs, _, terminated, truncated, _ = env.step(action)
            local.step(action)
            done = terminated or truncated
        state = env.state()  # the WebSocket session outlives the episode
        assert state.pop("episode_id") == "run-7" and state.pop("step_count") == 30
        assert state == local.state()
        assert env.server_info()["seed_supported"] is True and list(env.tasks()) == list(TASKS)
    with RemoteEnv(server) as env:
        assert env.server_info()["active_sessions"] >= 0 and env.tasks()["easy_bench"]["difficulty"] == "easy"


# ------------------------------------------------------------------------------------------------------------
# HTTP API (the reference's routes and errors)


def test_root_health_tasks(http):
    root = http.get("/").json()
    assert root["name"] == "adaptive-clinical-recruitment" and root["status"] == "running"
    assert root["tasks"] == ["easy_bench", "medium_bench", "hard_bench"]
    assert root["max_sessions"] == 256 and isinstance(root["active_sessions"], int)
    assert (root["web_interface_enabled"], root["web_interface_path"], root["web_interface_error"]) == (
        False,
        None,
        None,
    )
    assert root["seed_supported"] is True
    assert http.get("/health").json() == {"status": "healthy"}
    tasks = http.get("/tasks").json()
    assert list(tasks) == ["easy_bench", "medium_bench", "hard_bench"]
    assert tasks["hard_bench"] == {
        "name": "Multi-Objective Pipeline Under Pressure",
        "description": tasks["hard_bench"]["description"],
        "difficulty": "hard",
        "max_steps": 180,
        "initial_budget": 100000.0,
        "target_enrollment": 150,
    }
    assert {t["difficulty"] for t in tasks.values()} == {"easy", "medium", "hard"}
    assert http.get("/reset").status_code == 405 and http.post("/state").status_code == 405
    assert set(http.get("/schema").json()) == {"action", "observation", "state"}


def test_reset_cookie_seed_and_state(http):
    r = http.post("/reset", params={"task_id": "medium_bench", "seed": 4})
    assert r.status_code == 200
    assert re.fullmatch(r"acr_session_id=[0-9a-f]{32}; HttpOnly; Path=/; SameSite=lax", r.headers["set-cookie"])
    data = r.json()
    local = ClinicalRecruitmentEnv("medium_bench")
    obs, info = local.reset(seed=4)
    assert {k: data[k] for k in OBSERVATION_FIELDS} == obs
    assert data["done"] is False and data["reward"] == 0.0 and data["metadata"]["info"] == info
    assert data["metadata"]["seed"] == 4
    action = heuristic_policy(obs)
    local.step(action)
    http.post("/step", json=action)
    state = http.get("/state").json()
    assert state.pop("step_count") == 1 and state.pop("episode_id") == data["metadata"]["episode_id"]
    assert state == local.state()
    # the seed may also come in a JSON body (task_id too); the query wins when both are given
    r = http.post("/reset", json={"task_id": "hard_bench", "seed": 9})
    assert r.json()["metadata"] == {"info": {"task": "hard_bench", "difficulty": 3}, "seed": 9, "episode_id": ANY}
    assert {k: r.json()[k] for k in OBSERVATION_FIELDS} == ClinicalRecruitmentEnv("hard_bench").reset(seed=9)[0]
    r = http.post("/reset", params={"task_id": "easy_bench"}, json={"task_id": "hard_bench", "seed": 2})
    assert r.json()["metadata"]["info"]["task"] == "easy_bench" and r.json()["metadata"]["seed"] == 2
    assert http.post("/reset", params={"seed": "x"}).status_code == 422
    assert http.post("/reset", json={"seed": "x"}).status_code == 422


class _Any:
    def __eq__(self, other):
        return True


ANY = _Any()


def test_session_errors(server):
    with httpx.Client(base_url=server, trust_env=False) as c:
        assert c.post("/step", json=SCREEN).json() == NO_SESSION
        assert c.post("/step", json=SCREEN).status_code == 400
        assert c.get("/state").json() == NO_SESSION
        c.cookies.set("acr_session_id", "0" * 32)
        r = c.post("/step", json=SCREEN)
        assert (r.status_code, r.json()) == (400, SESSION_LOST)
        assert c.get("/state").json() == SESSION_LOST


def test_schema_violations_are_422_and_harmless(http):
    http.post("/reset", params={"seed": 0})
    cases = [
        ({**SCREEN, "confidence": 1.5}, ["body", "confidence"]),
        ({"action": SCREEN}, ["body", "action_type"]),
        ({"action_type": "teleport"}, ["body", "action_type"]),
        ({**SCREEN, "token_cost": -1}, ["body", "token_cost"]),
    ]
    for body, loc in cases:
        r = http.post("/step", json=body)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == loc, body
    r = http.post("/step", data={"action_type": "screen_patient"})  # form-encoded
    assert r.status_code == 422 and isinstance(r.json()["detail"], list)
    r = http.post("/step", content=b"{oops", headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"
    assert http.get("/state").json()["step"] == 0
    r = http.post("/step", json=SCREEN)
    assert r.status_code == 200 and r.json()["metadata"]["info"]["step"] == 1


def test_big_body_is_413(http):
    http.post("/reset")
    r = http.post("/step", json={**SCREEN, "plan_summary": "x" * 70_000})
    assert r.status_code == 413
    assert http.post("/reset", json={"task_id": "easy_bench", "pad": "y" * 70_000}).status_code == 413
    assert http.get("/state").json()["step"] == 0


def test_unknown_task_keeps_the_existing_session(http):
    http.post("/reset", params={"task_id": "medium_bench", "seed": 1})
    http.post("/step", json=SCREEN)
    r = http.post("/reset", params={"task_id": "bogus_bench"})
    assert r.status_code == 400 and r.json()["detail"].startswith("Unknown task: bogus_bench")
    assert "set-cookie" not in r.headers
    state = http.get("/state").json()
    assert (state["task"], state["step"]) == ("medium_bench", 1)
    assert http.post("/step", json=SCREEN).status_code == 200


def test_episode_end_deletes_session_and_clears_cookie(http):
    r = http.post("/reset", params={"task_id": "easy_bench_stage_30", "seed": 0})
    sid = http.cookies["acr_session_id"]
    obs = r.json()
    for _ in range(30):
        r = http.post("/step", json=heuristic_policy(obs))
        obs = r.json()
    assert obs["done"] is True and 0.001 <= obs["metadata"]["info"]["final_score"] <= 0.999
    assert obs["metadata"]["info"]["grader_task"] == "easy_bench" and "hindsight_summary" in obs["metadata"]["info"]
    cookie = r.headers["set-cookie"]
    assert cookie.startswith('acr_session_id=""') and "Max-Age=0" in cookie
    assert "acr_session_id" not in http.cookies
    r = http.post("/step", json=SCREEN, headers={"cookie": f"acr_session_id={sid}"})
    assert (r.status_code, r.json()) == (400, SESSION_LOST)


def test_replay_warning(http):
    http.post("/reset")
    wait = {"action_type": "adjust_strategy", "strategy_change": "increase_outreach", "confidence": 0.5}
    metas = [http.post("/step", json=wait).json()["metadata"] for _ in range(6)]
    assert ["replay_warning" in m for m in metas] == [False, False, False, False, True, True]
    assert "info" in metas[-1] and "reward_breakdown" in metas[-1]
    assert "replay_warning" not in http.post("/step", json=SCREEN).json()["metadata"]


def test_session_lost_mid_episode_raises(server):
    with RemoteEnv(server, task="easy_bench") as env:
        obs, _ = env.reset(seed=0)
        env.step(heuristic_policy(obs))
        sid = env._t.sid
        with httpx.Client(base_url=server, trust_env=False) as other:  # someone ends our session
            assert other.delete("/session", headers={"cookie": f"acr_session_id={sid}"}).json() == {"closed": True}
        with pytest.raises(SessionLostError, match="Session expired or missing"):
            env.step(SCREEN)
        assert isinstance(SessionLostError("x"), RuntimeError)
        obs, _ = env.reset(seed=0)
        assert obs["timestamp"] == 0


def test_session_limit_503_without_eviction(small_server):
    clients = [httpx.Client(base_url=small_server, trust_env=False) for _ in range(3)]
    try:
        a, b, c = clients
        assert a.post("/reset").status_code == 200 and b.post("/reset").status_code == 200
        a.post("/step", json=SCREEN)
        r = c.post("/reset")
        assert r.status_code == 503
        assert r.json() == {"detail": "Session limit reached (2). Retry later or raise --max_sessions."}
        assert a.post("/reset").status_code == 200  # a client holding a session can always start over
        assert b.post("/step", json=SCREEN).status_code == 200  # nobody was evicted
        assert a.get("/state").json()["step"] == 0
        with RemoteEnv(small_server, transport="ws", retries=0) as ws_env:
            with pytest.raises(RuntimeError, match="Session limit reached"):
                ws_env.reset()
        assert b.delete("/session").json() == {"closed": True}
        assert c.post("/reset").status_code == 200
        assert httpx.get(small_server + "/", trust_env=False).json()["active_sessions"] == 2
    finally:
        for client in clients:
            client.delete("/session")
            client.close()


def test_loadtest_cli_smoke(server, tmp_path):
    from env import loadtest

    out = tmp_path / "lt.json"
    for transport in ("http", "ws"):
        argv = ["--url", server, "--sessions", "4", "--task", "hard_bench_stage_30", "--transport", transport]
        assert loadtest.main([*argv, "--max_seconds", "60", "--json", str(out)]) == 0
        result = json.loads(out.read_text())["result"]
        assert result["episodes_finished"] == 4 and result["errors"] == 0 and result["mismatches"] == 0
        assert result["steps"] == 120
    with pytest.raises(SystemExit, match="non-loopback"):
        loadtest.main(["--url", "http://10.1.2.3:8000", "--sessions", "1"])


class _FlakyTransport(httpx.HTTPTransport):
    """Fails chosen /step calls: ``connect`` before sending (safe to retry), ``read`` after the server got it."""

    def __init__(self, plan: dict[int, str]) -> None:
        super().__init__()
        self.plan = plan
        self.steps = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/step":
            self.steps += 1
            failure = self.plan.get(self.steps)
            if failure == "connect":
                raise httpx.ConnectError("refused (simulated)", request=request)
            if failure == "read":
                super().handle_request(request).close()  # the server applied the step, the reply is lost
                raise httpx.ReadError("connection reset (simulated)", request=request)
        return super().handle_request(request)


def test_step_retries_only_unsent_requests(server):
    flaky = _FlakyTransport({2: "connect", 5: "read"})
    with httpx.Client(transport=flaky, trust_env=False) as http_client:
        env = RemoteEnv(server, task="medium_bench", http_client=http_client)
        local = ClinicalRecruitmentEnv("medium_bench")
        obs, _ = env.reset(seed=2)
        local.reset(seed=2)
        for _ in range(3):  # the 2nd attempt fails before sending, is retried, and is applied exactly once
            action = heuristic_policy(obs)
            got = env.step(action)
            assert got == local.step(action)
            obs = got[0]
        with pytest.raises(SessionLostError, match="state is unknown"):
            env.step(heuristic_policy(obs))
        with pytest.raises(RuntimeError, match="reset"):
            env.step(SCREEN)
        env.close()


def test_unreachable_server_fails_fast_after_retries():
    port = free_port()
    start = time.monotonic()
    with RemoteEnv(f"http://127.0.0.1:{port}", retries=2, timeout=2) as env:
        with pytest.raises(RuntimeError, match="3 attempt"):
            env.reset()
    with RemoteEnv(f"http://127.0.0.1:{port}", transport="ws", retries=1, timeout=2) as env:
        with pytest.raises(RuntimeError, match="2 attempt"):
            env.reset()
    assert time.monotonic() - start < 5


def test_concurrent_requests_on_one_session_are_serialised(server):
    with httpx.Client(base_url=server, trust_env=False) as first:
        first.post("/reset", params={"seed": 0})
        cookie = {"cookie": f"acr_session_id={first.cookies['acr_session_id']}"}
    wait = {"action_type": "adjust_strategy", "strategy_change": "increase_outreach", "confidence": 0.5}

    def hammer(_):
        with httpx.Client(base_url=server, trust_env=False) as c:
            return [c.post("/step", json=wait, headers=cookie).json()["metadata"]["info"]["step"] for _ in range(10)]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        steps = sorted(s for batch in pool.map(hammer, range(4)) for s in batch)
    assert steps == list(range(1, 41))  # every step applied exactly once, none lost or doubled
    with httpx.Client(base_url=server, trust_env=False) as c:
        assert c.get("/state", headers=cookie).json()["step"] == 40
        c.delete("/session", headers=cookie)


# ------------------------------------------------------------------------------------------------------------
# hostile input and exposure over the real transports


def _ws_connect(url: str, **kwargs):
    from websockets.sync.client import connect

    return connect(url.replace("http://", "ws://") + "/ws", proxy=None, compression=None, open_timeout=10, **kwargs)


def test_ws_lone_surrogates_keep_the_connection(server):
    with _ws_connect(server) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "observation"
        memory_query = '{"action_type": "retrieve_relevant_history", "memory_query": "\\ud800"}'
        reset = '{"type": "reset", "data": {"episode_id": "\\udfff"}}'
        for text in ['{"type": "step", "data": ' + memory_query + "}", reset]:
            ws.send(text)  # an error reply, and the connection stays open
            err = json.loads(ws.recv(timeout=10))
            assert err["type"] == "error" and err["data"]["code"] == "VALIDATION_ERROR", err
        ws.send(json.dumps({"type": "state"}))
        assert json.loads(ws.recv(timeout=10))["data"]["step"] == 0
    with httpx.Client(base_url=server, trust_env=False) as c:
        body = {"content": b'{"episode_id": "\\ud800"}', "headers": {"content-type": "application/json"}}
        r = c.post("/reset", **body)
        assert r.status_code == 422 and "set-cookie" not in r.headers


def test_ws_oversized_frame_answers_message_too_large(server):
    with _ws_connect(server) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))
        assert json.loads(ws.recv(timeout=10))["type"] == "observation"
        ws.send(json.dumps({"type": "step", "data": {**SCREEN, "plan_summary": "x" * 70_000}}))
        err = json.loads(ws.recv(timeout=10))  # the transport's own limit is higher: the app answers
        assert err["data"]["code"] == "MESSAGE_TOO_LARGE", err
        ws.send(json.dumps({"type": "step", "data": SCREEN}))
        assert json.loads(ws.recv(timeout=10))["data"]["metadata"]["info"]["step"] == 1


@pytest.fixture(scope="module")
def token_server():
    port = free_port()
    auth = {"authorization": "Bearer s3cret"}
    proc, url = start_server(env_server_cmd(port, "--token", "s3cret"), port, headers=auth)
    yield url
    stop_server(proc)


@pytest.mark.parametrize("transport", ["http", "ws"])
def test_token_server_over_both_transports(token_server, transport, monkeypatch):
    monkeypatch.delenv("RECRUIT_TRL_TOKEN", raising=False)
    with RemoteEnv(token_server, task="hard_bench_stage_30", transport=transport, retries=0) as env:
        with pytest.raises(RuntimeError, match="401"):
            env.reset(seed=0)
    with RemoteEnv(token_server, task="hard_bench_stage_30", transport=transport, token="s3cret") as env:
        _play_both(env, "hard_bench_stage_30", 0)
        assert env.server_info()["server"] == "recruit_trl"
    monkeypatch.setenv("RECRUIT_TRL_TOKEN", "s3cret")
    with RemoteEnv(token_server, task="hard_bench_stage_30", transport=transport) as env:
        assert env.reset(seed=1)[0]["timestamp"] == 0
    assert httpx.get(token_server + "/", trust_env=False).status_code == 401
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    ws_url = token_server.replace("http://", "ws://") + "/ws"
    with pytest.raises(InvalidStatus, match="401"):
        connect(ws_url, proxy=None, open_timeout=10).close()
    with connect(ws_url + "?token=s3cret", proxy=None, open_timeout=10) as ws:  # for clients that cannot set headers
        ws.send(json.dumps({"type": "reset"}))
        assert json.loads(ws.recv(timeout=10))["type"] == "observation"


def test_loadtest_sends_the_token_and_checks_the_per_client_cap(token_server, small_server, tmp_path):
    from env import loadtest

    out = tmp_path / "lt.json"
    argv = ["--url", token_server, "--sessions", "2", "--task", "hard_bench_stage_30", "--json", str(out)]
    assert loadtest.main([*argv, "--token", "s3cret", "--transport", "ws"]) == 0
    assert json.loads(out.read_text())["result"]["errors"] == 0
    with pytest.raises(SystemExit, match="--max_sessions_per_client 4"):
        loadtest.main(["--url", small_server, "--sessions", "4", "--task", "hard_bench_stage_30"])


def test_server_log_has_one_warning_for_invalid_utf8_and_no_token(tmp_path):
    """A WebSocket text frame that is not UTF-8 closes that connection with 1007 and leaves one warning line in the
    server's log, no traceback; the server goes on. At log level info with the access log on, no ``?token=`` value
    reaches the log (HTTP access lines and WebSocket handshake lines), and the other query parameters do."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    secret = "SECRET-t0ken"
    port = free_port()
    cmd = env_server_cmd(port, "--token", secret, "--log_level", "info", "--access_log")
    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc, url = start_server(cmd, port, headers={"authorization": f"Bearer {secret}"}, log=out)
        try:
            query = f"?seed=7&token={secret}"
            ws_url = url.replace("http://", "ws://") + "/ws" + query  # a client that cannot set headers
            with connect(ws_url, proxy=None, compression=None, open_timeout=10) as ws:
                ws.send(b'{"type": "state", "x": "\xff\xfe"}', text=True)
                with pytest.raises(ConnectionClosed) as closed:
                    ws.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
            with _ws_connect(url, additional_headers={"authorization": f"Bearer {secret}"}) as ws:
                ws.send(json.dumps({"type": "reset", "data": {"seed": 0}}))  # the server goes on
                assert json.loads(ws.recv(timeout=10))["type"] == "observation"
            r = httpx.get(url + "/health" + query, headers={"authorization": f"Bearer {secret}"}, trust_env=False)
            assert r.status_code == 200
        finally:
            stop_server(proc)
    text = log.read_text()
    assert "Traceback" not in text and "UnicodeDecodeError" not in text, text
    utf8 = [line for line in text.splitlines() if "UTF-8" in line]
    assert len(utf8) == 1 and utf8[0].startswith("WARNING"), utf8
    assert secret not in text, text
    assert '"WebSocket /ws?seed=7&token=***"' in text, text  # the handshake line (logger uvicorn.error)
    assert '"GET /health?seed=7&token=*** HTTP/1.1" 200 OK' in text, text  # the access log (uvicorn.access)

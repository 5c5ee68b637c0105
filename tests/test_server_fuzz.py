"""Fuzz of env.server through a real server process on 127.0.0.1, over HTTP bodies and WebSocket frames: seeded
random JSON, wrong types, huge and out-of-range numbers, lone surrogates, deep nesting, non-JSON and invalid UTF-8
bytes, oversized bodies and frames, foreign Origin and Host headers.

Checked: no HTTP reply is a 5xx and every reply is JSON; every WebSocket frame gets one JSON reply that is not an
internal error, or the connection ends with a close frame; no session slot leaks; and two episodes (one per
transport) played alongside the fuzzing, in other sessions, match the same episodes in-process step for step,
final score included. Deterministic (one seed) and bounded in time.
"""

from __future__ import annotations

import json
import random
import time
from urllib.parse import quote

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")
pytest.importorskip("websockets")

from servers import env_server_cmd, free_port, start_server, stop_server  # noqa: E402
from websockets.exceptions import ConnectionClosed  # noqa: E402
from websockets.sync.client import connect  # noqa: E402

from env.client import RemoteEnv  # noqa: E402
from env.clinical import ClinicalRecruitmentEnv, heuristic_policy  # noqa: E402
from env.clinical.models import ACTION_TYPES, STRING_FIELDS  # noqa: E402

SEED = 35
ROUNDS = 500
FUZZ_SECONDS = 15.0  # the fuzzing stops here even if ROUNDS are not done (a loaded machine)
BODY_LIMIT = 2048  # small, so that oversized bodies and frames are cheap to send
WITNESS_TASK = "hard_bench_stage_30"

BIG_INT = "1" + "0" * 400  # a valid JSON integer, far beyond any float
HUGE_INT = "9" * 5000  # over Python's 4300-digit int conversion limit
RAW_FRAGMENTS = [
    BIG_INT,
    "-" + BIG_INT,
    HUGE_INT,
    "1e400",
    "-1e400",
    "NaN",
    "Infinity",
    '"\\ud800"',
    '"x\\udfffy"',
    '"\\ud83d"',
    '"\\ud83d\\ude00"',  # a valid pair: fine
    '"\\u0000"',
    '"é✓"',
    "[" * 40 + "]" * 40,
    "[" * 600 + "]" * 600,
    "{}",
    "[]",
    "null",
    "true",
    "0",
    "-1",
    "0.5",
    "1.0000001",
    '""',
    '"P-1149"',
    '"' + "x" * 300 + '"',
    "9223372036854775808",
    "-9223372036854775809",
]
KEYS = [
    "action_type",
    *STRING_FIELDS,
    "confidence",
    "token_cost",
    "task_id",
    "seed",
    "episode_id",
    "type",
    "data",
    "\\ud800",
    "",
]


def nasty_json(rng: random.Random, depth: int = 0) -> str:
    """A JSON text (valid or not) built from hostile fragments."""
    roll = rng.random()
    if depth > 2 or roll < 0.45:
        return rng.choice(RAW_FRAGMENTS)
    if roll < 0.75:
        items = [f'"{rng.choice(KEYS)}": {nasty_json(rng, depth + 1)}' for _ in range(rng.randrange(4))]
        return "{" + ", ".join(items) + "}"
    return "[" + ", ".join(nasty_json(rng, depth + 1) for _ in range(rng.randrange(3))) + "]"


def nasty_action(rng: random.Random, obs: dict | None) -> str:
    """A plausible action with up to three fields replaced by hostile values (so sometimes a valid one)."""
    base = (
        heuristic_policy(obs) if obs is not None and rng.random() < 0.5 else {"action_type": rng.choice(ACTION_TYPES)}
    )
    fields = {k: json.dumps(v) for k, v in base.items()}
    for _ in range(rng.randrange(4)):
        fields[rng.choice(KEYS[:13])] = nasty_json(rng)
    return "{" + ", ".join(f'"{k}": {v}' for k, v in fields.items()) + "}"


def random_bytes(rng: random.Random, n: int) -> bytes:
    return bytes(rng.randrange(256) for _ in range(n))


def http_body(rng: random.Random, obs: dict | None) -> tuple[bytes, dict[str, str]]:
    roll = rng.random()
    if roll < 0.55:
        body = nasty_action(rng, obs).encode()
    elif roll < 0.7:
        body = nasty_json(rng).encode()
    elif roll < 0.8:
        body = random_bytes(rng, rng.randrange(1, 200))
    elif roll < 0.87:
        body = b'{"episode_id": "\xed\xa0\x80", "memory_query": "\xed\xbf\xbf"}'  # surrogates as raw bytes
    elif roll < 0.94:
        body = b'{"action_type": "screen_patient", "plan_summary": "' + b"x" * (BODY_LIMIT + 100) + b'"}'
    else:
        body = nasty_action(rng, obs).encode()[: rng.randrange(1, 40)]  # truncated
    content_type = rng.choice(["application/json"] * 6 + ["text/plain", "application/x-www-form-urlencoded", None])
    headers = {"content-type": content_type} if content_type else {}
    roll = rng.random()
    if roll < 0.05:
        headers["origin"] = rng.choice(["http://evil.example", "null", "http://127.0.0.1:1", "\x7f"])
    elif roll < 0.08:
        headers["host"] = rng.choice(["rebound.example", "localhost:1", "[::1]", ""])
    return body, headers


def http_round(rng: random.Random, http: httpx.Client, state: dict) -> None:
    """One fuzzed HTTP request; ``state`` holds this fuzzer's session id and last observation."""
    roll = rng.random()
    cookie = {"cookie": f"acr_session_id={state['sid']}"} if state["sid"] else {}
    if rng.random() < 0.05:
        cookie = {"cookie": rng.choice(["acr_session_id=" + "0" * 32, "acr_session_id=\\ud800", "a=b; ;;="])}
    if state["sid"] is None and roll < 0.3:  # a plain reset now and then, so that most steps reach a live episode
        r = http.post(
            "/reset", params={"task_id": rng.choice(["easy_bench", "hard_bench_stage_30"]), "seed": rng.randrange(100)}
        )
    elif roll < 0.6:
        body, headers = http_body(rng, state["obs"])
        r = http.post("/step", content=body, headers={**headers, **cookie})
    elif roll < 0.85:
        query = {}
        if rng.random() < 0.5:
            query["task_id"] = rng.choice(["easy_bench", "hard_bench_stage_30", "bogus", "%ED%A0%80", "", "x" * 500])
        if rng.random() < 0.5:
            query["seed"] = rng.choice(["0", "-1", HUGE_INT, BIG_INT, "1e400", "1.5", "x", "9223372036854775808"])
        url = "/reset" + ("?" + "&".join(f"{k}={quote(v, safe='%')}" for k, v in query.items()) if query else "")
        body, headers = http_body(rng, state["obs"]) if rng.random() < 0.7 else (b"", {})
        r = http.post(url, content=body, headers={**headers, **cookie})
    elif roll < 0.93:
        r = http.get(rng.choice(["/state", "/", "/health", "/tasks", "/schema", "/metadata"]), headers=cookie)
    else:
        r = http.request(
            rng.choice(["DELETE", "PUT", "OPTIONS"]), rng.choice(["/session", "/step", "/ws"]), headers=cookie
        )
    assert r.status_code < 500, (r.request.method, r.request.url, r.request.content[:200], r.status_code, r.text)
    payload = r.json() if r.content else None  # every reply is JSON
    for header in r.headers.get_list("set-cookie"):
        value = header.split(";", 1)[0].partition("=")[2].strip('"')
        state["sid"] = value or None
        if value:  # a reset sent with another cookie leaves the previous session alive: remember them all
            state["issued"].add(value)
    if r.status_code == 200 and r.request.method == "POST" and isinstance(payload, dict) and "timestamp" in payload:
        state["obs"] = None if payload["done"] else payload
        state["resets"] += r.request.url.path == "/reset"


def ws_frame(rng: random.Random, obs: dict | None) -> tuple[str | bytes, bool]:
    """A fuzzed frame and whether it is sent as text."""
    roll = rng.random()
    kind = rng.choice(['"reset"', '"step"', '"step"', '"step"', '"state"', '"teleport"', "null", "[1]", '"\\ud800"'])
    if roll < 0.6:
        data = nasty_action(rng, obs) if kind == '"step"' else nasty_json(rng)
        return '{"type": ' + kind + ', "data": ' + data + "}", True
    if roll < 0.7:
        return nasty_json(rng), True
    if roll < 0.78:
        return random_bytes(rng, rng.randrange(1, 100)), False
    if roll < 0.83:
        return b'{"type": "reset", "data": {"episode_id": "\xed\xa0\x80"}}', False  # raw surrogate bytes
    if roll < 0.87:
        return b'{"type": "state", "x": "\xff\xfe"}', True  # invalid UTF-8 in a text frame: the transport closes
    if roll < 0.94:
        size = rng.choice([BODY_LIMIT + 500, 3 * BODY_LIMIT, 6 * BODY_LIMIT])  # some over the transport limit too
        return '{"type": "step", "data": {"plan_summary": "' + "x" * size + '"}}', True
    return '{"type": "close"}', True


def ws_round(rng: random.Random, ws_url: str, state: dict) -> None:
    """One fuzzed WebSocket frame; ``state`` holds the connection and its last observation."""
    if state["conn"] is None:
        # websockets >= 16 wants connect() used as a context manager; entering by hand keeps one per round
        state["conn"] = connect(ws_url, proxy=None, compression=None, open_timeout=10, max_size=2**22).__enter__()
        state["obs"] = None
    frame, text = ws_frame(rng, state["obs"])
    conn = state["conn"]
    try:
        conn.send(frame, text=text)
        raw = conn.recv(timeout=10)
    except ConnectionClosed as exc:
        state["conn"] = None
        assert exc.rcvd is not None, f"dropped without a close frame after {frame[:200]!r}: {exc!r}"
        state["closes"] += 1
        return
    reply = json.loads(raw)
    assert reply["type"] in ("observation", "state", "error"), reply
    if reply["type"] == "error":
        assert "Internal error" not in reply["data"]["message"], (frame[:200], reply)
        state["errors"] += 1
    elif reply["type"] == "observation":
        state["obs"] = None if reply["data"]["done"] else reply["data"]["observation"]


def witness(remote: RemoteEnv, seed: int):
    """Play the heuristic policy remotely and in-process, one step per ``next()``; returns the final score."""
    local = ClinicalRecruitmentEnv(WITNESS_TASK)
    obs, info = remote.reset(seed=seed)
    assert (obs, info) == local.reset(seed=seed)
    while True:
        yield
        action = heuristic_policy(obs)
        got = remote.step(action)
        assert got == local.step(action), f"witness over {remote.transport} differs at step {got[4].get('step')}"
        obs, _, terminated, truncated, info = got
        if terminated or truncated:
            return info["final_score"]


def test_fuzzed_server_never_fails_and_keeps_other_episodes_exact():
    port = free_port()
    proc, url = start_server(env_server_cmd(port, "--max_sessions", "16", "--max_body_bytes", str(BODY_LIMIT)), port)
    rng = random.Random(SEED)
    ws_url = url.replace("http://", "ws://") + "/ws"
    http_state = {"sid": None, "obs": None, "resets": 0, "issued": set()}
    ws_state = {"conn": None, "obs": None, "errors": 0, "closes": 0}
    witnesses = {}
    try:
        with httpx.Client(base_url=url, trust_env=False, timeout=10) as http:
            remotes = [RemoteEnv(url, task=WITNESS_TASK, transport=t, retries=0) for t in ("http", "ws")]
            witnesses = {r.transport: (r, witness(r, seed)) for r, seed in zip(remotes, (11, 12), strict=True)}
            scores = {}
            deadline = time.monotonic() + FUZZ_SECONDS
            rounds = 0
            while rounds < ROUNDS and time.monotonic() < deadline:
                if rng.random() < 0.5:
                    http_round(rng, http, http_state)
                else:
                    ws_round(rng, ws_url, ws_state)
                rounds += 1
                if rounds % 8 == 0:  # the witnesses advance between fuzzed requests
                    for transport, (_, play) in witnesses.items():
                        if transport not in scores:
                            try:
                                next(play)
                            except StopIteration as stop:
                                scores[transport] = stop.value
            for transport, (_, play) in witnesses.items():
                while transport not in scores:
                    try:
                        next(play)
                    except StopIteration as stop:
                        scores[transport] = stop.value
            assert rounds >= 100, f"only {rounds} fuzz rounds ran"
            assert http_state["resets"] > 0 and ws_state["errors"] > 0 and ws_state["closes"] > 0, (
                http_state,
                ws_state,
            )
            for transport, seed in (("http", 11), ("ws", 12)):
                local = ClinicalRecruitmentEnv(WITNESS_TASK)
                obs, _ = local.reset(seed=seed)
                done = False
                while not done:
                    obs, _, terminated, truncated, info = local.step(heuristic_policy(obs))
                    done = terminated or truncated
                assert scores[transport] == info["final_score"], transport

            # every slot comes back: the fuzzer's own session, its WebSocket and the witnesses
            for sid in http_state["issued"]:
                assert http.delete("/session", headers={"cookie": f"acr_session_id={sid}"}).is_success
            if ws_state["conn"] is not None:
                ws_state["conn"].close()
            for remote, _ in witnesses.values():
                remote.close()
            end = time.monotonic() + 5
            while http.get("/").json()["active_sessions"] and time.monotonic() < end:
                time.sleep(0.05)
            assert http.get("/").json()["active_sessions"] == 0
    finally:
        for remote, _ in witnesses.values():
            remote.close()
        stop_server(proc)

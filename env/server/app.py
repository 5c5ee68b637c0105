"""HTTP + WebSocket server for the clinical recruitment environment (FastAPI + uvicorn).

Run: ``python -m env.server --host 127.0.0.1 --port 8000`` (or ``recruit-trl serve``). ``create_app(settings)``
builds the ASGI app for embedding or tests.

Contract (the reference's routes and shapes, so its clients work unchanged; spec section 13):

* ``GET /`` -> ``{name, version, status, tasks, active_sessions, max_sessions, web_interface_enabled: false,
  web_interface_path: null, web_interface_error: null}`` plus our additions ``seed_supported: true``,
  ``server: "recruit_trl"``, ``websocket_path: "/ws"`` (clients use them to recognise this server) and
  ``max_sessions_per_client``.
* ``GET /health`` -> ``{"status": "healthy"}``; ``GET /tasks`` -> the 3 public tasks.
* ``POST /reset?task_id=...&seed=...`` (or a JSON body ``{"task_id", "seed", "episode_id"}``; query parameters
  win) -> the flat observation (every observation field at the top level) plus ``done: false``, ``reward: 0.0``
  and ``metadata: {info: {task, difficulty}, seed, episode_id}``. Sets the cookie
  ``acr_session_id=<uuid4 hex>; HttpOnly; Path=/; SameSite=lax``. A reset replaces the caller's session.
* ``POST /step`` (body: the flat action JSON) -> flat observation + ``reward``, ``done`` and
  ``metadata: {info: {step, reward_breakdown, last_action_error, [hindsight_summary, final_score, grader_task]},
  reward_breakdown, [replay_warning]}``. ``replay_warning`` appears when the last 5 canonicalised actions of the
  session are identical. When ``done`` is true the session is deleted and the cookie cleared (``Max-Age=0``).
* ``GET /state`` -> the env's ``state()`` + ``episode_id`` + ``step_count``.
* ``DELETE /session`` (our addition) -> ends the caller's session early and clears the cookie.
* ``GET /schema`` -> ``{action, observation, state}`` JSON schemas; ``GET /metadata`` -> ``{name, description,
  readme_content, version, author, documentation_url}``.
* ``WS /ws``: the OpenEnv session protocol, one episode per connection. Messages
  ``{"type": "reset"|"step"|"state"|"close", "data": {...}}``; replies
  ``{"type": "observation", "data": {"observation", "reward", "done", "metadata"}}``,
  ``{"type": "state", "data": {...}}`` or ``{"type": "error", "data": {"message", "code"[, "errors"]}}`` with
  codes ``INVALID_JSON``, ``UNKNOWN_TYPE``, ``VALIDATION_ERROR`` (bad action, task, seed or reset data: the
  episode is unchanged), ``EXECUTION_ERROR`` (no episode yet, episode already done), ``RATE_LIMITED``,
  ``MESSAGE_TOO_LARGE`` (over ``max_body_bytes``; the transport accepts frames up to about twice that so that the
  app can answer, and closes the connection with 1009 above it) and ``CAPACITY_REACHED`` (sent before the server
  closes the connection with code 1013). Unlike the reference, ``metadata`` (info, reward breakdown, final score)
  is kept on WebSocket observations.

Errors (HTTP): 400 ``{"detail": "No active session. Call /reset first."}`` without a cookie; 400
``{"detail": "Session expired or missing. Call /reset first."}`` for an unknown or expired cookie; 400
``{"detail": "Unknown task: ..."}`` (the caller's existing session is kept); 422 with FastAPI's ``detail`` list
for schema violations (``confidence`` > 1, unknown ``action_type``, a wrapped ``{"action": {...}}`` body, invalid
JSON, NaN, numbers beyond a float, integers over 4300 digits, a ``token_cost`` of 2**63 or more, a string with a
lone surrogate such as ``"\\ud800"``, a non-JSON content type); 413 for bodies over ``max_body_bytes``; 429 when
the optional per-session rate limit is exceeded (rejected calls do not count); 503 ``{"detail": "Session limit
reached (N). Retry later or raise --max-sessions."}`` when every session slot is taken by a live session (expired
ones are reaped first; a running episode is never evicted), or the caller's address holds its
``max_sessions_per_client``. Semantic action errors are not HTTP errors: 200 with
``metadata.info.last_action_error``, exactly like the in-process env. Replies always encode (a lone surrogate
would be written as its ``\\u`` escape).

Access (:class:`AccessGuard`, every route, both transports): 400 for a ``Host`` header naming a host other than
``localhost``, an IP address or ``allowed_hosts`` (DNS rebinding); 403 for an ``Origin`` header (a browser page)
other than the server's own origin, ``allowed_origins`` or ``cors_origins``; 401 without
``Authorization: Bearer <token>`` when ``token`` is set (``--token`` or ``$RECRUIT_TRL_TOKEN``; a WebSocket may
send ``?token=``). The command line refuses a non-loopback ``--host`` without a token.

Sessions: isolated per client, idle expiry after ``session_ttl`` seconds (checked on every request and by a
periodic reaper), at most ``max_sessions`` (WebSocket connections included) and ``max_sessions_per_client`` per
remote address (default: half of ``max_sessions``), each with its own lock so that concurrent requests on one
session are serialised. A WebSocket session lives as long as its connection (an idle one is closed after
``session_ttl``). Seeds are integers with ``|seed| < 2**63``.

Speed: environment steps run on the event loop (a step takes tens of microseconds, less than a thread hand-off);
replies are serialised straight from the env's plain dicts (no pydantic models on the hot path; orjson if
installed); ``POST /step`` is served by a small ASGI fast path (:class:`StepFastPath`) that shares its code with the
FastAPI route. Differences from the reference, all deliberate: a seed over HTTP, no 10 steps/s cap by default, no
destruction of the caller's session on an unknown task, no silent eviction, metadata kept over WebSocket, NaN
rejected with 422 instead of a 500, ``DELETE /session``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import inspect
import ipaddress
import json
import logging
import math
import os
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.requests import cookie_parser
from starlette.websockets import WebSocketDisconnect, WebSocketState

from env.client import TOKEN_ENV, is_loopback
from env.core import ClinicalRecruitmentEnv
from env.models import Action, validate_action
from env.tasks import PUBLIC_TASK_IDS, TASKS, get_task

logger = logging.getLogger("env.server")

APP_NAME = "adaptive-clinical-recruitment"
COOKIE_NAME = "acr_session_id"
NO_SESSION = "No active session. Call /reset first."
SESSION_LOST = "Session expired or missing. Call /reset first."
REPLAY_WINDOW = 5

try:  # optional, never required: same values (shortest round-trip floats), faster
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
# A lone surrogate has no UTF-8 form, but its \uXXXX escape is valid JSON in plain ASCII.
_ASCII_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes (the float text is Python's shortest round-trip repr, as in the reference).

    Always encodable: a string with a lone surrogate is written as a ``\\uXXXX`` escape instead of failing.
    """
    if _orjson is not None:
        try:
            return _orjson.dumps(obj)
        except TypeError:  # orjson.JSONEncodeError, e.g. a lone surrogate: the encoders below handle it
            pass
    try:
        return _ENCODER.encode(obj).encode()
    except UnicodeEncodeError:
        return _ASCII_ENCODER.encode(obj).encode()


def dumps_text(obj: Any) -> str:
    """:func:`dumps` as text (WebSocket text frames); always encodable as UTF-8 by the transport."""
    return dumps(obj).decode()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses as inf, which no JSON reply could carry
        raise ValueError(f"number out of range: {text[:40]}")
    return value


def loads(data: bytes | str) -> Any:
    """Strict JSON: NaN/Infinity and out-of-range numbers are rejected (they cannot be sent back in a JSON error),
    and so are integers over Python's 4300-digit conversion limit (``ValueError``)."""
    return json.loads(data, parse_constant=_reject_constant, parse_float=_finite_float)


def find_lone_surrogate(value: Any) -> tuple[list, str] | None:
    """``(path, string)`` of a string, or object key, holding a lone surrogate in parsed JSON; else None.

    Such strings come from ``\\ud800``-style escapes. They cannot be encoded as UTF-8, so a reply echoing one
    would fail; they are refused at input instead.
    """
    stack: list[tuple[list, Any]] = [([], value)]
    while stack:  # iterative: the parser accepts deeper nesting than a recursive walk would
        path, item = stack.pop()
        if isinstance(item, str):
            if _has_surrogate(item):
                return path, item
        elif isinstance(item, dict):
            for key, child in item.items():
                if _has_surrogate(key):
                    return [*path, _printable(key)], key
                stack.append(([*path, key], child))
        elif isinstance(item, list):
            stack.extend(([*path, i], child) for i, child in enumerate(item))
    return None


def _has_surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def _printable(text: str) -> str:
    return text.encode("utf-8", "replace").decode()


def check_surrogates(value: Any, raw: bytes | str, prefix: tuple) -> None:
    """Raise ApiError(422, VALIDATION_ERROR) if the parsed JSON ``value`` (parsed from ``raw``) holds a lone
    surrogate. Only an escape, or a non-ASCII byte (bytes are decoded with ``surrogatepass``), can produce one, so
    the usual ASCII document without escapes is not walked."""
    if isinstance(raw, str):
        suspect = "\\u" in raw or not raw.isascii()
    else:
        suspect = b"\\u" in raw or not raw.isascii()
    found = find_lone_surrogate(value) if suspect else None
    if found is None:
        return
    path, text = found
    detail = {
        "type": "string_unicode",
        "loc": [*prefix, *path],
        "msg": "Input should be a valid string: lone surrogates (\\ud800-\\udfff) are not valid Unicode",
        "input": _printable(text),
    }
    raise ApiError(422, [detail], "VALIDATION_ERROR")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("recruit-trl")
    except Exception:  # noqa: BLE001 - not installed (e.g. a source checkout on sys.path)
        return "0.1.0"


# ---------------------------------------------------------------------------------------------------------------
# settings and sessions


@dataclass
class ServerSettings:
    """Server knobs. Defaults are safe for a shared loopback server used by RL trainers."""

    max_sessions: int = 256  # live sessions (HTTP and WebSocket); the next one gets 503 / CAPACITY_REACHED
    session_ttl: float = 1800.0  # seconds of inactivity before a session expires
    reaper_interval: float = 60.0  # seconds between background sweeps of expired sessions
    rate_limit: float = 0.0  # max steps per second per session (sliding 1 s window); 0 = no limit
    max_body_bytes: int = 64 * 1024  # larger request bodies / WebSocket messages are refused (413)
    cookie_secure: bool = False  # add "Secure" to the session cookie (behind HTTPS)
    cors_origins: tuple[str, ...] = ()  # e.g. ("*",); empty = no CORS headers
    step_fast_path: bool = True  # serve POST /step without FastAPI's routing layer (same code, less overhead)
    # Live sessions per client address; None = half of max_sessions (at least 1). Behind a proxy every client
    # shares the proxy's address.
    max_sessions_per_client: int | None = None
    # Browser pages whose Origin may call the server (besides same-origin ones and the CORS origins); "*" = any.
    allowed_origins: tuple[str, ...] = ()
    # Host names accepted in the Host header besides "localhost" and IP literals (DNS rebinding); "*" = any.
    allowed_hosts: tuple[str, ...] = ()
    token: str | None = None  # bearer token required on every route; None = no authentication

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        if self.max_sessions_per_client is None:
            self.max_sessions_per_client = max(1, self.max_sessions // 2)
        if self.max_sessions_per_client < 1:
            raise ValueError("max_sessions_per_client must be >= 1")
        if self.token is not None and not self.token:
            raise ValueError("token must not be empty")
        if self.session_ttl <= 0 or self.reaper_interval <= 0:
            raise ValueError("session_ttl and reaper_interval must be > 0")
        if self.rate_limit < 0:
            raise ValueError("rate_limit must be >= 0")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be >= 1024")


class SessionLimitError(Exception):
    """Every session slot, or every slot this client may hold, is taken by a live session."""


class Session:
    """One client's episode: its own env, lock, replay window and (optional) rate-limit window."""

    __slots__ = ("sid", "kind", "client", "env", "lock", "last_used", "episode_id", "recent", "stamps", "closer")

    def __init__(self, sid: str, kind: str, now: float, client: str = "") -> None:
        self.sid = sid
        self.kind = kind  # "http" or "ws"
        self.client = client  # the remote address, for the per-client cap
        self.env: ClinicalRecruitmentEnv | None = None
        self.lock = asyncio.Lock()
        self.last_used = now
        self.episode_id: str | None = None
        self.recent: deque[tuple] = deque(maxlen=REPLAY_WINDOW)
        self.stamps: deque[float] = deque()
        self.closer: Callable[[], None] | None = None  # WebSocket: close the connection on expiry

    def new_episode(self, episode_id: str | None) -> None:
        self.episode_id = episode_id or str(uuid.uuid4())
        self.recent.clear()
        self.stamps.clear()


class SessionStore:
    """In-memory sessions with idle expiry, a hard cap and a cap per client address. Never evicts a live session."""

    def __init__(
        self,
        max_sessions: int,
        ttl: float,
        clock: Callable[[], float] = time.monotonic,
        max_per_client: int | None = None,
    ) -> None:
        self.max_sessions = max_sessions
        self.max_per_client = max_per_client or max_sessions
        self.ttl = ttl
        self.clock = clock
        self._sessions: dict[str, Session] = {}
        self._per_client: dict[str, int] = {}
        self._mutex = threading.Lock()  # the app runs on one event loop; this guards embedders using threads

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, kind: str, client: str = "") -> Session:
        """A new session for the remote address ``client``; SessionLimitError if the server or the client is full."""
        now = self.clock()
        with self._mutex:
            if len(self._sessions) >= self.max_sessions or self._per_client.get(client, 0) >= self.max_per_client:
                self._reap_locked(now)
            if len(self._sessions) >= self.max_sessions:
                raise SessionLimitError(
                    f"Session limit reached ({self.max_sessions}). Retry later or raise --max-sessions."
                )
            if self._per_client.get(client, 0) >= self.max_per_client:
                raise SessionLimitError(
                    f"Session limit per client ({self.max_per_client}) reached for {client or 'this client'}. "
                    "Close a session, retry later or raise --max-sessions-per-client."
                )
            sid = uuid.uuid4().hex
            session = self._sessions[sid] = Session(sid, kind, now, client)
            self._per_client[client] = self._per_client.get(client, 0) + 1
            return session

    def get(self, sid: str, kind: str = "http") -> Session | None:
        """The live session ``sid`` (touching it), or None if unknown or expired (an expired one is deleted)."""
        session = self._sessions.get(sid)
        if session is None or session.kind != kind:
            return None
        now = self.clock()
        if now - session.last_used > self.ttl:
            self.delete(sid)
            return None
        session.last_used = now
        return session

    def delete(self, sid: str) -> Session | None:
        with self._mutex:
            session = self._sessions.pop(sid, None)
            if session is not None:
                self._release_locked(session)
            return session

    def _release_locked(self, session: Session) -> None:
        left = self._per_client[session.client] - 1
        if left:
            self._per_client[session.client] = left
        else:
            del self._per_client[session.client]

    def reap(self) -> int:
        """Delete every expired session; returns how many."""
        with self._mutex:
            return self._reap_locked(self.clock())

    def _reap_locked(self, now: float) -> int:
        expired = [s for s in self._sessions.values() if now - s.last_used > self.ttl]
        for session in expired:
            del self._sessions[session.sid]
            self._release_locked(session)
            if session.closer is not None:
                session.closer()
        return len(expired)


# ---------------------------------------------------------------------------------------------------------------
# transport-independent episode operations


class ApiError(Exception):
    """An error with an HTTP status, a WebSocket code and a JSON-able detail."""

    def __init__(self, status: int, detail: Any, code: str = "EXECUTION_ERROR", headers: dict | None = None):
        super().__init__(detail if isinstance(detail, str) else "validation error")
        self.status = status
        self.detail = detail
        self.code = code
        self.headers = headers

    @property
    def message(self) -> str:
        """The detail as one line; validation errors read like the in-process env's ``ValueError``."""
        if isinstance(self.detail, str):
            return self.detail
        parts = []
        for err in self.detail:
            loc = [str(p) for p in err.get("loc", ())]
            if loc[:1] == ["body"]:  # an action field, named as the in-process env names it
                what = "action field '" + (".".join(loc[1:]) or "action") + "'"
            else:
                what = "field '" + ".".join(loc) + "'"
            parts.append(f"invalid {what}: {err.get('msg')} (got {err.get('input')!r})")
        return "; ".join(parts)


def _validation_errors(exc: ValidationError, prefix: tuple = ("body",)) -> list[dict[str, Any]]:
    out = []
    for err in exc.errors(include_url=False):
        item = {"type": err["type"], "loc": [*prefix, *err["loc"]], "msg": err["msg"], "input": err.get("input")}
        if "ctx" in err:
            item["ctx"] = {
                k: v if isinstance(v, int | float | str | bool | None) else str(v) for k, v in err["ctx"].items()
            }
        out.append(_jsonable(item))
    return out


ECHO_DEPTH = 16  # echoed inputs are cut below this depth: deeper ones would overflow the recursion of the encoders


def _jsonable(value: Any, depth: int = 0) -> Any:
    """Make an error item JSON-safe (bytes -> text, unknown objects -> str, nesting cut at ``ECHO_DEPTH``)."""
    if isinstance(value, dict | list | tuple) and depth >= ECHO_DEPTH:
        return "..."
    if isinstance(value, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v, depth + 1) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float) and value != value:  # NaN
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


INT64_LIMIT = 2**63


def check_action(payload: Any) -> dict[str, Any]:
    """Validate an action payload; raise ApiError(422) with FastAPI's ``detail`` list on a schema violation.

    Beyond the schema, ``token_cost`` must be below ``2**63``: the env adds it up and converts the total to a float,
    which overflows for integers of a few hundred digits.
    """
    action = None
    if isinstance(payload, dict):
        try:
            action = validate_action(payload)
        except (ValueError, OverflowError):  # OverflowError: an integer confidence too large for a float
            pass
    if action is None:
        try:
            action = Action.model_validate(payload, from_attributes=True).model_dump()
        except ValidationError as exc:
            raise ApiError(422, _validation_errors(exc), "VALIDATION_ERROR") from None
    token_cost = action["token_cost"]
    if token_cost is not None and token_cost >= INT64_LIMIT:
        msg = "Input should be less than 2**63 (a 64-bit integer)"
        detail = {"type": "less_than", "loc": ["body", "token_cost"], "msg": msg, "input": token_cost}
        raise ApiError(422, [detail], "VALIDATION_ERROR")
    return action


def check_task(task_id: Any, loc: tuple = ("body", "task_id")) -> str:
    """The task id (``None`` -> ``easy_bench``; stage ids accepted); 400 with the env's message if unknown, 422 if
    not a string."""
    if task_id is not None and not isinstance(task_id, str):
        raise ApiError(422, [_string_type_error(task_id, loc)], "VALIDATION_ERROR")
    try:
        return get_task(task_id).task_id
    except ValueError as exc:
        raise ApiError(400, str(exc), "VALIDATION_ERROR") from None


def check_episode_id(episode_id: Any, loc: tuple) -> str | None:
    """``None``, a string, or a number or boolean as text; 422 for objects and arrays."""
    if episode_id is None or isinstance(episode_id, str):
        return episode_id
    if isinstance(episode_id, int | float):  # bool included
        return str(episode_id)
    raise ApiError(422, [_string_type_error(episode_id, loc)], "VALIDATION_ERROR")


def _string_type_error(value: Any, loc: tuple) -> dict[str, Any]:
    return _jsonable(
        {"type": "string_type", "loc": list(loc), "msg": "Input should be a valid string", "input": value}
    )


SEED_LIMIT = INT64_LIMIT


def check_seed(seed: Any, loc: tuple) -> int | None:
    """``None`` or an int with ``|seed| < 2**63``; 422 otherwise."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int):
        detail = [{"type": "int_type", "loc": list(loc), "msg": "Input should be a valid integer", "input": seed}]
        raise ApiError(422, _jsonable(detail), "VALIDATION_ERROR")
    if not -SEED_LIMIT < seed < SEED_LIMIT:
        detail = [{"type": "int_range", "loc": list(loc), "msg": "Seed must be a 64-bit integer", "input": str(seed)}]
        raise ApiError(422, detail, "VALIDATION_ERROR")
    return seed


def do_reset(session: Session, task_id: str, seed: int | None, episode_id: str | None) -> tuple[dict, dict]:
    """Reset ``session``'s env (task already validated); returns (observation, metadata)."""
    env = session.env
    if env is None:
        env = session.env = ClinicalRecruitmentEnv(task_id)
    obs, info = env.reset(seed=seed, options={"task": task_id})
    session.new_episode(episode_id)
    return obs, {"info": info, "seed": seed, "episode_id": session.episode_id}


def do_step(session: Session, payload: Any, rate_limit: float) -> tuple[dict, float, bool, dict]:
    """Validate and apply one action; returns (observation, reward, done, metadata)."""
    env = session.env
    if env is None or env.s is None:
        raise ApiError(400, "No active episode. Call reset first.")
    if env.done:
        raise ApiError(400, "Episode is done. Call reset() first.")
    action = check_action(payload)
    if rate_limit:
        now = time.monotonic()
        stamps = session.stamps
        while stamps and now - stamps[0] >= 1.0:
            stamps.popleft()
        if len(stamps) >= rate_limit:
            raise ApiError(
                429,
                f"Rate limit exceeded: more than {rate_limit:g} steps/second for this session.",
                "RATE_LIMITED",
                {"Retry-After": "1"},
            )
        stamps.append(now)
    obs, reward, terminated, truncated, info = env.step(action)
    metadata: dict[str, Any] = {"info": info, "reward_breakdown": info["reward_breakdown"]}
    recent = session.recent
    recent.append(tuple(action.values()))
    if len(recent) == REPLAY_WINDOW and recent.count(recent[0]) == REPLAY_WINDOW:
        metadata["replay_warning"] = (
            f"Replay warning: the last {REPLAY_WINDOW} actions were identical (all fields). This is a warning "
            "only; the reward is unchanged."
        )
    return obs, reward, terminated or truncated, metadata


def state_payload(session: Session) -> dict[str, Any]:
    env = session.env
    if env is None or env.s is None:
        raise ApiError(400, "No active episode. Call reset first.")
    state = env.state()
    state["episode_id"] = session.episode_id
    state["step_count"] = state["step"]
    return state


# ---------------------------------------------------------------------------------------------------------------
# schemas and static payloads


def _obj(props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), **extra}


_INT, _NUM, _STR, _BOOL = {"type": "integer"}, {"type": "number"}, {"type": "string"}, {"type": "boolean"}
_NULL_INT = {"anyOf": [_INT, {"type": "null"}]}
_UNIT = {"type": "number", "minimum": 0, "maximum": 1}
_COUNT = {"type": "integer", "minimum": 0}


def observation_schema() -> dict[str, Any]:
    """JSON schema of the observation (spec section 8)."""
    patient = _obj({"id": _STR, "age": _INT, "eligibility_score": _NUM, "dropout_risk": _NUM})
    recontact = _obj(
        {
            "id": _STR,
            "age": _INT,
            "eligible": _BOOL,
            "consented": _BOOL,
            "dropout_risk": _NUM,
            "followup_due_day": _NULL_INT,
        }
    )
    allocation = _obj({"id": _STR, "age": _INT, "dropout_risk": _NUM, "followup_due_day": _NULL_INT})
    site = _obj({"conversion_rate": _NUM, "avg_wait_days": _NUM, "capacity_remaining": _NUM, "retention_rate": _NUM})
    counts = {"type": "object", "additionalProperties": _INT}
    props = {
        "timestamp": _COUNT,
        "budget_remaining": _NUM,
        "time_to_deadline_days": _COUNT,
        "enrolled_so_far": _COUNT,
        "target_enrollment": _INT,
        "task_id": _STR,
        "max_steps": _INT,
        "initial_budget": _NUM,
        "current_funnel": counts,
        "available_patients": {"type": "array", "items": patient, "maxItems": 5},
        "recontact_candidates": {"type": "array", "items": recontact, "maxItems": 5},
        "allocation_candidates": {"type": "array", "items": allocation, "maxItems": 5},
        "site_performance": {"type": "object", "additionalProperties": site},
        "recent_events": {"type": "array", "items": _STR, "maxItems": 5},
        "uncertainty_level": _UNIT,
        "difficulty": {"type": "integer", "enum": [1, 2, 3]},
        "dropout_rate_7d": _UNIT,
        "screening_backlog": _COUNT,
        "causal_insight": _STR,
        "hypothesis_accuracy": _UNIT,
        "world_type": _STR,
        "milestones": {"type": "object", "additionalProperties": _BOOL},
        "active_constraints": {"type": "object"},
        "delayed_effects_pending": _COUNT,
        "uncertainty_components": {"type": "object", "additionalProperties": _NUM},
        "patient_memory_summary": counts,
        "counterfactual_hint": _STR,
        "current_plan": {"type": "object"},
        "indexed_memory_summary": counts,
        "retrieved_memory_context": _STR,
        "milestone_potential": _UNIT,
        "active_milestone": _STR,
        "hindsight_available": _BOOL,
        "token_budget_remaining": _COUNT,
        "token_usage_so_far": _COUNT,
        "token_efficiency_score": _UNIT,
        "counterfactual_rollout": {"type": "object", "additionalProperties": _NUM},
    }
    return _obj(props, title="Observation")


def state_schema() -> dict[str, Any]:
    """JSON schema of ``GET /state`` (spec section 10.5 + the adapter's episode_id and step_count)."""
    props = {
        "task": _STR,
        "step": _COUNT,
        "max_steps": _INT,
        "time_to_deadline_days": _COUNT,
        "done": _BOOL,
        "enrolled_so_far": _COUNT,
        "target_enrollment": _INT,
        "initial_budget": _NUM,
        "budget_remaining": _NUM,
        "total_reward": _NUM,
        "history": {"type": "array", "items": {"type": "object"}, "maxItems": 10},
        "milestones": {"type": "object", "additionalProperties": _BOOL},
        "active_constraints": {"type": "object"},
        "delayed_effects_pending": _COUNT,
        "uncertainty_components": {"type": "object", "additionalProperties": _NUM},
        "current_plan": {"type": "object"},
        "indexed_memory_summary": {"type": "object", "additionalProperties": _INT},
        "retrieved_memory_context": _STR,
        "milestone_potential": _UNIT,
        "active_milestone": _STR,
        "hindsight_summary": {"type": "object"},
        "token_budget_remaining": _COUNT,
        "token_usage_so_far": _COUNT,
        "token_efficiency_score": _UNIT,
        "episode_id": {"anyOf": [_STR, {"type": "null"}]},
        "step_count": _COUNT,
    }
    return _obj(props, title="State")


def _readme() -> str | None:
    for path in (Path(__file__).resolve().parent.parent / "README.md",):
        with contextlib.suppress(OSError):
            return path.read_text(encoding="utf-8")
    return None


# ---------------------------------------------------------------------------------------------------------------
# ASGI plumbing


class BodyLimitMiddleware:
    """Refuse HTTP request bodies over ``limit`` bytes with 413, by Content-Length or while streaming."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit
        for name, value in scope["headers"]:
            if name == b"content-length":
                try:
                    too_big = int(value) > limit
                except ValueError:
                    too_big = False
                if too_big:
                    await _send_json(send, 413, {"detail": f"Request body too large (limit {limit} bytes)."})
                    return
                break
        received = 0
        started = False

        async def limited_receive() -> dict:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _BodyTooLarge
            return message

        async def tracking_send(message: dict) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await _send_json(send, 413, {"detail": f"Request body too large (limit {limit} bytes)."})


class _BodyTooLarge(Exception):
    pass


async def _send_json(send: Callable, status: int, content: Any, headers: dict[str, str] | None = None) -> None:
    body = dumps(content)
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw_headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


class AccessGuard:
    """Refuse, before any route runs (HTTP and WebSocket), requests that should not reach the server:

    * 400 for a ``Host`` header naming a host other than ``localhost`` or one of ``allowed_hosts``. IP literals
      pass: DNS rebinding (a hostile page whose own name is re-pointed at this machine) needs a host name.
    * 403 for an ``Origin`` header (a page in a browser) that is not this server's own origin, one of
      ``allowed_origins`` or one of the CORS origins. Scripts and trainers send no Origin and pass.
    * 401 without ``Authorization: Bearer <token>`` when a token is set; a WebSocket may pass ``?token=<token>``
      instead, for clients that cannot set headers on it.

    A refused WebSocket gets the HTTP error as its handshake reply where the server supports it, else close 1008.
    """

    def __init__(self, app: Any, settings: ServerSettings) -> None:
        self.app = app
        self.any_host = "*" in settings.allowed_hosts
        self.hosts = {"localhost", *(h.lower() for h in settings.allowed_hosts)}
        origins = (*settings.allowed_origins, *settings.cors_origins)
        self.any_origin = "*" in origins
        self.origins = {o.rstrip("/").lower() for o in origins}
        self.token = settings.token.encode() if settings.token else None

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        host = origin = auth = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value.decode("latin-1")
            elif name == b"origin":
                origin = value.decode("latin-1")
            elif name == b"authorization":
                auth = value
        refusal = self.refusal(scope, host, origin, auth)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, detail = refusal
        headers = {"www-authenticate": "Bearer"} if status == 401 else None
        if scope["type"] == "http":
            await _send_json(send, status, {"detail": detail}, headers)
        else:
            await _deny_websocket(scope, receive, send, status, {"detail": detail}, headers)

    def refusal(self, scope: dict, host: str | None, origin: str | None, auth: bytes | None) -> tuple[int, str] | None:
        """``(status, detail)`` if the request must be refused, else None."""
        if host is not None and not self.any_host and not self._host_ok(host):
            return 400, f"Host not allowed: {host!r}. Use localhost or an IP address, or start with --allowed-hosts."
        if origin is not None and not self.any_origin and not self._origin_ok(origin, host):
            return 403, f"Origin not allowed: {origin!r}. Start the server with --allowed-origins to allow it."
        if self.token is not None and not self._token_ok(scope, auth):
            return 401, "Missing or invalid token: send the header 'Authorization: Bearer <token>'."
        return None

    def _host_ok(self, host: str) -> bool:
        value = host.strip().lower()
        if value.startswith("["):  # [IPv6]:port
            name = value[1:].partition("]")[0]
        else:
            name = value.rpartition(":")[0] if ":" in value else value
        name = name.rstrip(".")
        if name in self.hosts:
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True

    def _origin_ok(self, origin: str, host: str | None) -> bool:
        value = origin.strip().rstrip("/").lower()
        if value in self.origins:
            return True
        netloc = urlsplit(value).netloc if "://" in value else ""
        return bool(netloc) and host is not None and netloc == host.strip().lower()  # a page served by us

    def _token_ok(self, scope: dict, auth: bytes | None) -> bool:
        token = self.token
        if auth is not None:
            scheme, _, value = auth.strip().partition(b" ")
            if scheme.lower() == b"bearer" and hmac.compare_digest(value.strip(), token):
                return True
        if scope["type"] == "websocket":
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            return any(hmac.compare_digest(value.encode(), token) for value in query.get("token", ()))
        return False


async def _deny_websocket(
    scope: dict, receive: Callable, send: Callable, status: int, content: Any, headers: dict[str, str] | None
) -> None:
    await receive()  # websocket.connect
    if "websocket.http.response" in (scope.get("extensions") or {}):
        body = dumps(content)
        raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        raw_headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
        await send({"type": "websocket.http.response.start", "status": status, "headers": raw_headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})


def _json_response(content: Any, status: int = 200, headers: dict | None = None) -> Response:
    return Response(dumps(content), status_code=status, headers=headers, media_type="application/json")


def _error_response(exc: ApiError) -> Response:
    return _json_response({"detail": exc.detail}, exc.status, exc.headers)


def _is_json_content_type(value: str | None) -> bool:
    if value is None:
        return True
    main = value.split(";", 1)[0].strip().lower()
    return main == "application/json" or (main.startswith("application/") and main.endswith("+json"))


def parse_json_body(body: bytes, content_type: str | None) -> Any:
    """A request body parsed like FastAPI does for a JSON body parameter; ``None`` if empty."""
    if not body:
        return None
    if not _is_json_content_type(content_type):
        return body  # validated as the action -> 422 model_attributes_type, like FastAPI
    try:
        value = loads(body)
    except json.JSONDecodeError as exc:
        detail = {"type": "json_invalid", "loc": ["body", exc.pos], "msg": "JSON decode error", "input": {}}
        detail["ctx"] = {"error": exc.msg}
        raise ApiError(422, [detail], "INVALID_JSON") from None
    except (ValueError, RecursionError) as exc:
        detail = {"type": "json_invalid", "loc": ["body", 0], "msg": "JSON decode error", "input": {}}
        detail["ctx"] = {"error": str(exc) or type(exc).__name__}
        raise ApiError(422, [detail], "INVALID_JSON") from None
    check_surrogates(value, body, ("body",))
    return value


async def _json_body(request: Request) -> Any:
    return parse_json_body(await request.body(), request.headers.get("content-type"))


def _cookie_header(sid: str | None, secure: bool) -> str:
    """``Set-Cookie`` value: the session cookie, or its deletion (``Max-Age=0``) when ``sid`` is None."""
    suffix = "; HttpOnly; Path=/; SameSite=lax" + ("; Secure" if secure else "")
    if sid is None:
        return f'{COOKIE_NAME}=""; expires=Thu, 01 Jan 1970 00:00:00 GMT; Max-Age=0{suffix}'
    return f"{COOKIE_NAME}={sid}{suffix}"


async def step_reply(
    store: SessionStore, settings: ServerSettings, sid: str | None, body: bytes, content_type: str | None
) -> tuple[int, bytes, dict[str, str]]:
    """``POST /step`` for the session ``sid``: returns (status, JSON body, extra headers). Used by the route and by
    :class:`StepFastPath`."""
    try:
        if not sid:
            raise ApiError(400, NO_SESSION)
        session = store.get(sid)
        if session is None:
            raise ApiError(400, SESSION_LOST)
        payload = parse_json_body(body, content_type)
        if payload is None:
            raise ApiError(422, [{"type": "missing", "loc": ["body"], "msg": "Field required", "input": None}])
        async with session.lock:
            if store.get(sid) is not session:  # deleted while we waited for the lock
                raise ApiError(400, SESSION_LOST)
            try:
                obs, reward, done, meta = do_step(session, payload, settings.rate_limit)
            except ApiError:
                raise
            except Exception:
                store.delete(sid)
                logger.exception("step failed; session %s deleted", sid)
                return 500, b'{"detail":"Internal error while stepping; the session was closed."}', {}
            if done:
                store.delete(sid)
    except ApiError as exc:
        return exc.status, dumps({"detail": exc.detail}), exc.headers or {}
    obs["reward"] = reward
    obs["done"] = done
    obs["metadata"] = meta
    return 200, dumps(obs), {"set-cookie": _cookie_header(None, settings.cookie_secure)} if done else {}


class StepFastPath:
    """Serve ``POST /step`` straight from the ASGI scope with :func:`step_reply` (the same code as the FastAPI
    route), skipping routing, dependency resolution and the Request/Response objects: the hot path of RL rollouts.
    Sits inside :class:`BodyLimitMiddleware` (and CORS when enabled)."""

    def __init__(self, app: Any, store: SessionStore, settings: ServerSettings) -> None:
        self.app = app
        self.store = store
        self.settings = settings

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["path"] != "/step" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        cookies: list[str] = []
        content_type = None
        for name, value in scope["headers"]:
            if name == b"cookie":
                cookies.append(value.decode("latin-1"))
            elif name == b"content-type":
                content_type = value.decode("latin-1")
        chunks = []
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        sid = cookie_parser("; ".join(cookies)).get(COOKIE_NAME) if cookies else None
        status, payload, extra = await step_reply(self.store, self.settings, sid, body, content_type)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def _set_cookie(response: Response, sid: str | None, secure: bool) -> None:
    response.headers.append("set-cookie", _cookie_header(sid, secure))


def _fastapi_kwargs() -> dict[str, Any]:
    """Turn off FastAPI's native telemetry where this FastAPI version has it (a per-request cost)."""
    params = inspect.signature(FastAPI.__init__).parameters
    if "telemetry" in params:
        return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    return {}


# ---------------------------------------------------------------------------------------------------------------
# the app


def create_app(settings: ServerSettings | None = None) -> FastAPI:
    """Build the FastAPI app. Each app has its own session store (``app.state.sessions``)."""
    settings = settings or ServerSettings()
    store = SessionStore(settings.max_sessions, settings.session_ttl, max_per_client=settings.max_sessions_per_client)
    version = _version()
    secure = settings.cookie_secure

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def reaper() -> None:
            while True:
                await asyncio.sleep(settings.reaper_interval)
                n = store.reap()
                if n:
                    logger.info("reaped %d expired session(s); %d active", n, len(store))

        task = asyncio.create_task(reaper())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app = FastAPI(
        title="Adaptive Clinical Trial Recruitment",
        version=version,
        description="Reference-compatible HTTP API and OpenEnv WebSocket protocol for the clinical recruitment env.",
        lifespan=lifespan,
        **_fastapi_kwargs(),
    )
    app.state.settings = settings
    app.state.sessions = store
    # add_middleware wraps: the last one added is the outermost. CORS must also cover the /step fast path and the
    # guard's refusals (so a page can read them), and answers preflights, which carry no token, itself.
    if settings.step_fast_path:
        app.add_middleware(StepFastPath, store=store, settings=settings)
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
    app.add_middleware(AccessGuard, settings=settings)
    if settings.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        origins = list(settings.cors_origins)
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_credentials="*" not in origins,
            allow_methods=["*"],
            allow_headers=["*"],
        )

    action_schema = Action.model_json_schema()
    schema_payload = dumps({"action": action_schema, "observation": observation_schema(), "state": state_schema()})
    tasks_payload = dumps(
        {
            tid: {
                "name": spec.name,
                "description": spec.description,
                "difficulty": spec.difficulty_label,
                "max_steps": spec.max_steps,
                "initial_budget": float(spec.budget),
                "target_enrollment": spec.target,
            }
            for tid, spec in TASKS.items()
        }
    )
    metadata_payload = dumps(
        {
            "name": APP_NAME,
            "description": "Adaptive clinical trial recruitment: screen, recontact and allocate patients over 180 "
            "simulated days under budget, site capacity, dropout and regulatory pressure.",
            "readme_content": _readme(),
            "version": version,
            "author": "recruit_trl",
            "documentation_url": "/docs",
        }
    )

    def _session_or_error(request: Request) -> Session:
        sid = request.cookies.get(COOKIE_NAME)
        if not sid:
            raise ApiError(400, NO_SESSION)
        session = store.get(sid)
        if session is None:
            raise ApiError(400, SESSION_LOST)
        return session

    @app.get("/")
    async def root() -> Response:
        return _json_response(
            {
                "name": APP_NAME,
                "version": version,
                "status": "running",
                "tasks": list(PUBLIC_TASK_IDS),
                "active_sessions": len(store),
                "max_sessions": settings.max_sessions,
                "max_sessions_per_client": settings.max_sessions_per_client,
                "web_interface_enabled": False,
                "web_interface_path": None,
                "web_interface_error": None,
                "seed_supported": True,
                "server": "recruit_trl",
                "websocket_path": "/ws",
            }
        )

    @app.get("/health")
    async def health() -> Response:
        return Response(b'{"status":"healthy"}', media_type="application/json")

    @app.get("/tasks")
    async def tasks() -> Response:
        return Response(tasks_payload, media_type="application/json")

    @app.get("/schema")
    async def schema() -> Response:
        return Response(schema_payload, media_type="application/json")

    @app.get("/metadata")
    async def metadata() -> Response:
        return Response(metadata_payload, media_type="application/json")

    @app.post("/reset")
    async def reset(request: Request, task_id: str | None = None, seed: int | None = None) -> Response:
        """Start an episode. ``task_id`` / ``seed`` from the query, else from an optional JSON body."""
        try:
            episode_id = None
            seed = check_seed(seed, ("query", "seed"))
            body = await _json_body(request)
            if isinstance(body, dict):
                if task_id is None:
                    task_id = body.get("task_id")
                if seed is None:
                    seed = check_seed(body.get("seed"), ("body", "seed"))
                episode_id = check_episode_id(body.get("episode_id"), ("body", "episode_id"))
            task = check_task(task_id)  # before touching any session: an unknown task keeps the old one alive
            old_sid = request.cookies.get(COOKIE_NAME)
            old = store.get(old_sid) if old_sid else None
            if old is not None:  # replace the caller's session (a new id, like the reference)
                async with old.lock:
                    store.delete(old.sid)
            session = store.create("http", _client_address(request.scope))
        except ApiError as exc:
            return _error_response(exc)
        except SessionLimitError as exc:
            return _json_response({"detail": str(exc)}, 503, {"Retry-After": "1"})
        try:
            async with session.lock:
                obs, meta = do_reset(session, task, seed, episode_id)
            obs["done"] = False
            obs["reward"] = 0.0
            obs["metadata"] = meta
            response = _json_response(obs)
        except BaseException:  # no cookie goes out, so nobody could ever use or free this slot
            store.delete(session.sid)
            raise
        _set_cookie(response, session.sid, secure)
        return response

    step_body = {"required": True, "content": {"application/json": {"schema": action_schema}}}

    @app.post("/step", openapi_extra={"requestBody": step_body})
    async def step(request: Request) -> Response:
        """Apply one action (the flat action JSON) to the caller's episode."""
        sid = request.cookies.get(COOKIE_NAME)
        body = await request.body()
        status, payload, headers = await step_reply(store, settings, sid, body, request.headers.get("content-type"))
        return Response(payload, status_code=status, headers=headers, media_type="application/json")

    @app.get("/state")
    async def get_state(request: Request) -> Response:
        """The caller's episode state (``state()`` + ``episode_id`` + ``step_count``)."""
        try:
            session = _session_or_error(request)
            async with session.lock:
                return _json_response(state_payload(session))
        except ApiError as exc:
            return _error_response(exc)

    @app.delete("/session")
    async def close_session(request: Request) -> Response:
        """End the caller's session now (frees its slot). Idempotent."""
        sid = request.cookies.get(COOKIE_NAME)
        session = store.get(sid) if sid else None
        if session is not None:
            async with session.lock:
                store.delete(session.sid)
        response = _json_response({"closed": session is not None})
        _set_cookie(response, None, secure)
        return response

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            session = store.create("ws", _client_address(websocket.scope))
        except SessionLimitError as exc:
            await websocket.send_text(_ws_error(str(exc), "CAPACITY_REACHED"))
            await websocket.close(code=1013, reason=str(exc)[:120])
            return
        loop = asyncio.get_running_loop()

        def expire() -> None:
            if websocket.client_state == WebSocketState.CONNECTED:
                loop.create_task(_quiet_close(websocket, 1001))

        session.closer = expire
        try:
            await _ws_loop(websocket, session, store, settings)
        except WebSocketDisconnect:
            pass
        finally:
            store.delete(session.sid)

    return app


def _client_address(scope: dict) -> str:
    """The remote address the per-client session cap counts by."""
    client = scope.get("client")
    return str(client[0]) if client else ""


def _ws_error(message: str, code: str, errors: Any = None) -> str:
    data: dict[str, Any] = {"message": message, "code": code}
    if errors is not None:
        data["errors"] = errors
    return dumps_text({"type": "error", "data": data})


async def _quiet_close(websocket: WebSocket, code: int) -> None:
    with contextlib.suppress(Exception):
        await websocket.close(code=code)


async def _ws_loop(websocket: WebSocket, session: Session, store: SessionStore, settings: ServerSettings) -> None:
    limit = settings.max_body_bytes
    rate_limit = settings.rate_limit
    send = websocket.send_text
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        session.last_used = store.clock()
        raw = message.get("text")
        if raw is None:
            raw = message.get("bytes") or b""
        if len(raw) > limit:
            await send(_ws_error(f"Message too large (limit {limit} bytes).", "MESSAGE_TOO_LARGE"))
            continue
        try:
            msg = loads(raw)
        except (ValueError, RecursionError) as exc:
            await send(_ws_error(f"Invalid JSON: {exc}", "INVALID_JSON"))
            continue
        if not isinstance(msg, dict):
            await send(_ws_error("A message must be a JSON object with a 'type'.", "INVALID_JSON"))
            continue
        kind = msg.get("type")
        data = msg.get("data")
        try:
            check_surrogates(msg, raw, ())
            if kind == "step":
                async with session.lock:
                    obs, reward, done, meta = do_step(session, data if data is not None else {}, rate_limit)
                reply = {
                    "type": "observation",
                    "data": {"observation": obs, "reward": reward, "done": done, "metadata": meta},
                }
            elif kind == "reset":
                if data is None:
                    data = {}
                if not isinstance(data, dict):
                    raise ApiError(
                        422,
                        f"Reset data must be a JSON object (task_id, seed, episode_id), got {type(data).__name__}.",
                        "VALIDATION_ERROR",
                    )
                task = check_task(data.get("task_id", data.get("task")), ("data", "task_id"))
                seed = check_seed(data.get("seed"), ("data", "seed"))
                episode_id = check_episode_id(data.get("episode_id"), ("data", "episode_id"))
                async with session.lock:
                    obs, meta = do_reset(session, task, seed, episode_id)
                reply = {
                    "type": "observation",
                    "data": {"observation": obs, "reward": 0.0, "done": False, "metadata": meta},
                }
            elif kind == "state":
                async with session.lock:
                    reply = {"type": "state", "data": state_payload(session)}
            elif kind == "close":
                await websocket.close(code=1000)
                return
            else:
                await send(
                    _ws_error(f"Unknown message type: {kind!r}. Expected reset, step, state or close.", "UNKNOWN_TYPE")
                )
                continue
        except ApiError as exc:
            errors = None if isinstance(exc.detail, str) else exc.detail
            await send(_ws_error(exc.message, exc.code, errors))
            continue
        except Exception as exc:  # noqa: BLE001 - a bug must not kill the server; this connection's env is reset
            logger.exception("WebSocket message failed")
            session.env = None
            await send(
                _ws_error(f"Internal error: {type(exc).__name__}. Send reset to start again.", "EXECUTION_ERROR")
            )
            continue
        await send(dumps_text(reply))


# ---------------------------------------------------------------------------------------------------------------
# command line


def build_arg_parser() -> argparse.ArgumentParser:
    d = ServerSettings()
    p = argparse.ArgumentParser(
        prog="python -m env.server",
        description="Serve the clinical recruitment environment over HTTP (reference routes) and WebSocket (/ws).",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; others need a token)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--token",
        default=None,
        help=f"bearer token required on every route (default: ${TOKEN_ENV}; required for a non-loopback --host)",
    )
    p.add_argument("--max-sessions", type=int, default=d.max_sessions, help="live sessions, HTTP + WebSocket")
    p.add_argument(
        "--max-sessions-per-client",
        type=int,
        default=None,
        help="live sessions per client address (default: half of --max-sessions)",
    )
    p.add_argument("--session-ttl", type=float, default=d.session_ttl, help="idle seconds before a session expires")
    p.add_argument("--reaper-interval", type=float, default=d.reaper_interval, help="seconds between expiry sweeps")
    p.add_argument("--rate-limit", type=float, default=d.rate_limit, help="steps/s per session; 0 (default) = none")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="request body / WS message limit")
    p.add_argument("--cors-origins", default="", help="comma-separated allowed origins (e.g. '*'); default none")
    p.add_argument(
        "--allowed-origins",
        default="",
        help="comma-separated browser origins allowed to call the server (default: none; '*' = any)",
    )
    p.add_argument(
        "--allowed-hosts",
        default="",
        help="comma-separated host names accepted in the Host header besides localhost, IP addresses and --host",
    )
    p.add_argument(
        "--keep-alive", type=float, default=75.0, help="idle seconds before closing a keep-alive connection"
    )
    p.add_argument("--ws-compression", action="store_true", help="offer permessage-deflate on /ws (CPU for bandwidth)")
    p.add_argument("--cookie-secure", action="store_true", help="mark the session cookie Secure (HTTPS)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--access-log", action="store_true", help="log every request (slow)")
    return p


def _csv(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def ws_transport_limit(max_body_bytes: int) -> int:
    """The WebSocket frame limit of the transport: above the app's own limit, so that a message between the two gets
    a MESSAGE_TOO_LARGE reply and the connection lives on; larger frames close the connection (1009)."""
    return 2 * max_body_bytes + 4096


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = build_arg_parser()
    args = parser.parse_args(argv)
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    try:
        settings = ServerSettings(
            max_sessions=args.max_sessions,
            max_sessions_per_client=args.max_sessions_per_client,
            session_ttl=args.session_ttl,
            reaper_interval=args.reaper_interval,
            rate_limit=args.rate_limit,
            max_body_bytes=args.max_body_bytes,
            cookie_secure=args.cookie_secure,
            cors_origins=_csv(args.cors_origins),
            allowed_origins=_csv(args.allowed_origins),
            allowed_hosts=(args.host, *_csv(args.allowed_hosts)),
            token=token,
        )
    except ValueError as exc:
        parser.error(str(exc))
    if not is_loopback(args.host):
        if token is None:
            parser.error(
                f"--host {args.host} accepts connections from other machines: pass --token (or set {TOKEN_ENV}) "
                "so that only clients holding the token can use the server"
            )
        print(f"warning: binding {args.host}: plain HTTP, the token crosses the network in clear", file=sys.stderr)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s:%(name)s: %(message)s")
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
        ws_max_size=ws_transport_limit(settings.max_body_bytes),
        ws_per_message_deflate=args.ws_compression,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=args.keep_alive,
        backlog=2048,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

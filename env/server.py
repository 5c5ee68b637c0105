"""HTTP + WebSocket server for the clinical recruitment environment (FastAPI + uvicorn).

Run: ``python -m env.server --host 127.0.0.1 --port 8000`` (or ``recruit-trl serve``). ``create_app(settings)``
builds the ASGI app for embedding or tests.

Contract (the reference's routes and shapes, so its clients work unchanged; spec section 13):

* ``GET /`` -> ``{name, version, status, tasks, active_sessions, max_sessions, web_interface_enabled: false,
  web_interface_path: null, web_interface_error: null}`` plus our additions ``seed_supported: true``,
  ``server: "recruit_trl"``, ``websocket_path: "/ws"`` (clients use them to recognise this server).
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
  codes ``INVALID_JSON``, ``UNKNOWN_TYPE``, ``VALIDATION_ERROR`` (bad action, task or seed: the episode is
  unchanged), ``EXECUTION_ERROR`` (no episode yet, episode already done), ``RATE_LIMITED``, ``MESSAGE_TOO_LARGE``
  and ``CAPACITY_REACHED`` (sent before the server closes the connection with code 1013). Unlike the reference,
  ``metadata`` (info, reward breakdown, final score) is kept on WebSocket observations.

Errors (HTTP): 400 ``{"detail": "No active session. Call /reset first."}`` without a cookie; 400
``{"detail": "Session expired or missing. Call /reset first."}`` for an unknown or expired cookie; 400
``{"detail": "Unknown task: ..."}`` (the caller's existing session is kept); 422 with FastAPI's ``detail`` list
for schema violations (``confidence`` > 1, unknown ``action_type``, a wrapped ``{"action": {...}}`` body, invalid
JSON, NaN, a non-JSON content type); 413 for bodies over ``max_body_bytes``; 429 when the optional per-session
rate limit is exceeded (rejected calls do not count); 503 ``{"detail": "Session limit reached (N). Retry later or
raise --max-sessions."}`` when every session slot is taken by a live session (expired ones are reaped first; a
running episode is never evicted). Semantic action errors are not HTTP errors: 200 with
``metadata.info.last_action_error``, exactly like the in-process env.

Sessions: isolated per client, idle expiry after ``session_ttl`` seconds (checked on every request and by a
periodic reaper), at most ``max_sessions`` (WebSocket connections included), each with its own lock so that
concurrent requests on one session are serialised. A WebSocket session lives as long as its connection (an idle
one is closed after ``session_ttl``). Seeds are integers with ``|seed| < 2**63``.

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
import inspect
import ipaddress
import json
import logging
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.requests import cookie_parser
from starlette.websockets import WebSocketDisconnect, WebSocketState

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


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes (the float text is Python's shortest round-trip repr, as in the reference)."""
    if _orjson is not None:
        return _orjson.dumps(obj)
    return _ENCODER.encode(obj).encode()


def dumps_text(obj: Any) -> str:
    """:func:`dumps` as text (WebSocket text frames)."""
    if _orjson is not None:
        return _orjson.dumps(obj).decode()
    return _ENCODER.encode(obj)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def loads(data: bytes | str) -> Any:
    """Strict JSON: NaN/Infinity are rejected (they cannot be sent back in a JSON error)."""
    return json.loads(data, parse_constant=_reject_constant)


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

    def __post_init__(self) -> None:
        if self.max_sessions < 1:
            raise ValueError("max_sessions must be >= 1")
        if self.session_ttl <= 0 or self.reaper_interval <= 0:
            raise ValueError("session_ttl and reaper_interval must be > 0")
        if self.rate_limit < 0:
            raise ValueError("rate_limit must be >= 0")
        if self.max_body_bytes < 1024:
            raise ValueError("max_body_bytes must be >= 1024")


class SessionLimitError(Exception):
    pass


class Session:
    """One client's episode: its own env, lock, replay window and (optional) rate-limit window."""

    __slots__ = ("sid", "kind", "env", "lock", "last_used", "episode_id", "recent", "stamps", "closer")

    def __init__(self, sid: str, kind: str, now: float) -> None:
        self.sid = sid
        self.kind = kind  # "http" or "ws"
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
    """In-memory sessions with idle expiry and a hard cap. Never evicts a live session."""

    def __init__(self, max_sessions: int, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_sessions = max_sessions
        self.ttl = ttl
        self.clock = clock
        self._sessions: dict[str, Session] = {}
        self._mutex = threading.Lock()  # the app runs on one event loop; this guards embedders using threads

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, kind: str) -> Session:
        now = self.clock()
        with self._mutex:
            if len(self._sessions) >= self.max_sessions:
                self._reap_locked(now)
            if len(self._sessions) >= self.max_sessions:
                raise SessionLimitError(
                    f"Session limit reached ({self.max_sessions}). Retry later or raise --max-sessions."
                )
            sid = uuid.uuid4().hex
            session = self._sessions[sid] = Session(sid, kind, now)
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
            return self._sessions.pop(sid, None)

    def reap(self) -> int:
        """Delete every expired session; returns how many."""
        with self._mutex:
            return self._reap_locked(self.clock())

    def _reap_locked(self, now: float) -> int:
        expired = [s for s in self._sessions.values() if now - s.last_used > self.ttl]
        for session in expired:
            del self._sessions[session.sid]
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
            field = ".".join(str(p) for p in err.get("loc", ())[1:]) or "action"
            parts.append(f"invalid action field '{field}': {err.get('msg')} (got {err.get('input')!r})")
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


def _jsonable(value: Any) -> Any:
    """Make an error item JSON-safe (bytes -> text, unknown objects -> str)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float) and value != value:  # NaN
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def check_action(payload: Any) -> dict[str, Any]:
    """Validate an action payload; raise ApiError(422) with FastAPI's ``detail`` list on a schema violation."""
    if isinstance(payload, dict):
        try:
            return validate_action(payload)
        except ValueError:
            pass
    try:
        return Action.model_validate(payload, from_attributes=True).model_dump()
    except ValidationError as exc:
        raise ApiError(422, _validation_errors(exc), "VALIDATION_ERROR") from None


def check_task(task_id: Any) -> str:
    """The task id (``None`` -> ``easy_bench``; stage ids accepted); 400 with the env's message if unknown."""
    try:
        return get_task(task_id).task_id
    except ValueError as exc:
        raise ApiError(400, str(exc), "VALIDATION_ERROR") from None


SEED_LIMIT = 2**63


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


async def _send_json(send: Callable, status: int, content: Any) -> None:
    body = dumps(content)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


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
        return loads(body)
    except json.JSONDecodeError as exc:
        detail = {"type": "json_invalid", "loc": ["body", exc.pos], "msg": "JSON decode error", "input": {}}
        detail["ctx"] = {"error": exc.msg}
        raise ApiError(422, [detail], "INVALID_JSON") from None
    except (ValueError, RecursionError) as exc:
        detail = {"type": "json_invalid", "loc": ["body", 0], "msg": "JSON decode error", "input": {}}
        detail["ctx"] = {"error": str(exc) or type(exc).__name__}
        raise ApiError(422, [detail], "INVALID_JSON") from None


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
    store = SessionStore(settings.max_sessions, settings.session_ttl)
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
    # add_middleware wraps: the last one added is the outermost (CORS must also cover the /step fast path)
    if settings.step_fast_path:
        app.add_middleware(StepFastPath, store=store, settings=settings)
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes)
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
                episode_id = body.get("episode_id")
                if episode_id is not None and not isinstance(episode_id, str):
                    episode_id = str(episode_id)
            task = check_task(task_id)  # before touching any session: an unknown task keeps the old one alive
            old_sid = request.cookies.get(COOKIE_NAME)
            old = store.get(old_sid) if old_sid else None
            if old is not None:  # replace the caller's session (a new id, like the reference)
                async with old.lock:
                    store.delete(old.sid)
            session = store.create("http")
            async with session.lock:
                obs, meta = do_reset(session, task, seed, episode_id)
        except ApiError as exc:
            return _error_response(exc)
        except SessionLimitError as exc:
            return _json_response({"detail": str(exc)}, 503, {"Retry-After": "1"})
        obs["done"] = False
        obs["reward"] = 0.0
        obs["metadata"] = meta
        response = _json_response(obs)
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
            session = store.create("ws")
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
            if kind == "step":
                async with session.lock:
                    obs, reward, done, meta = do_step(session, data if data is not None else {}, rate_limit)
                reply = {
                    "type": "observation",
                    "data": {"observation": obs, "reward": reward, "done": done, "metadata": meta},
                }
            elif kind == "reset":
                data = data if isinstance(data, dict) else {}
                task = check_task(data.get("task_id", data.get("task")))
                seed = check_seed(data.get("seed"), ("data", "seed"))
                episode_id = data.get("episode_id")
                async with session.lock:
                    obs, meta = do_reset(session, task, seed, None if episode_id is None else str(episode_id))
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
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; the server has no auth)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-sessions", type=int, default=d.max_sessions, help="live sessions, HTTP + WebSocket")
    p.add_argument("--session-ttl", type=float, default=d.session_ttl, help="idle seconds before a session expires")
    p.add_argument("--reaper-interval", type=float, default=d.reaper_interval, help="seconds between expiry sweeps")
    p.add_argument("--rate-limit", type=float, default=d.rate_limit, help="steps/s per session; 0 (default) = none")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes, help="request body / WS message limit")
    p.add_argument("--cors-origins", default="", help="comma-separated allowed origins (e.g. '*'); default none")
    p.add_argument(
        "--keep-alive", type=float, default=75.0, help="idle seconds before closing a keep-alive connection"
    )
    p.add_argument("--ws-compression", action="store_true", help="offer permessage-deflate on /ws (CPU for bandwidth)")
    p.add_argument("--cookie-secure", action="store_true", help="mark the session cookie Secure (HTTPS)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--access-log", action="store_true", help="log every request (slow)")
    return p


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = build_arg_parser()
    args = parser.parse_args(argv)
    try:
        settings = ServerSettings(
            max_sessions=args.max_sessions,
            session_ttl=args.session_ttl,
            reaper_interval=args.reaper_interval,
            rate_limit=args.rate_limit,
            max_body_bytes=args.max_body_bytes,
            cookie_secure=args.cookie_secure,
            cors_origins=tuple(o.strip() for o in args.cors_origins.split(",") if o.strip()),
        )
    except ValueError as exc:
        parser.error(str(exc))
    with contextlib.suppress(ValueError):
        if not ipaddress.ip_address(args.host).is_loopback:
            print(f"warning: binding {args.host}: the server has no authentication", file=sys.stderr)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s:%(name)s: %(message)s")
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
        ws_max_size=settings.max_body_bytes,
        ws_per_message_deflate=args.ws_compression,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=args.keep_alive,
        backlog=2048,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""HTTP + WebSocket server for any registered environment (FastAPI + uvicorn); the clinical one by default.

Run: ``python -m env.server --host 127.0.0.1 --port 8000 [--env NAME]`` (or ``recruit-trl serve``).
``create_app(settings, served)`` builds the ASGI app for embedding or tests. An environment is served through its
:class:`~env.server.served.ServedEnv` (``--env`` takes a name of the ``recruit_trl.served_envs`` entry points or
``package.module:attribute``; see :mod:`env.server.served`), which supplies the tasks, the action parser and the
documents; routes, sessions, limits and errors are the same for every environment.

Contract (the reference's routes and shapes, so its clients work unchanged; spec section 13). Shown for the clinical
environment; another environment has its own names, tasks, fields and schemas, and its step ``metadata`` carries
``terminated`` and ``truncated`` (the clinical replies keep the reference's shape, from which clients derive them):

* ``GET /`` -> ``{name, version, status, tasks, active_sessions, max_sessions, web_interface_enabled: false,
  web_interface_path: null, web_interface_error: null}`` plus our additions ``seed_supported: true``,
  ``server: "recruit_trl"``, ``websocket_path: "/ws"`` (clients use them to recognise this server) and
  ``max_sessions_per_client``.
* ``GET /health`` -> ``{"status": "healthy"}``; ``GET /tasks`` -> the 3 public tasks (``ServedEnv.tasks``).
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
reached (N). Retry later or raise --max_sessions."}`` when every session slot is taken by a live session (expired
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
``session_ttl``). Seeds are integers with ``|seed| < 2**63`` (and at least the environment's ``min_seed``,
if it has one).

Speed: environment steps run on the event loop (a step takes tens of microseconds, less than a thread hand-off);
replies are serialised straight from the env's plain dicts (no pydantic models on the hot path; orjson if
installed); ``POST /step`` is served by a small ASGI fast path (:class:`StepFastPath`) that shares its code with the
FastAPI route. Differences from the reference, all deliberate: a seed over HTTP, no 10 steps/s cap by default, no
destruction of the caller's session on an unknown task, no silent eviction, metadata kept over WebSocket, NaN
rejected with 422 instead of a 500, ``DELETE /session``.

Modules: :mod:`~env.server.codec` (JSON encoding and strict parsing), :mod:`~env.server.settings`
(:class:`ServerSettings`), :mod:`~env.server.sessions` (the session store), :mod:`~env.server.protocol` (names,
errors and request validation), :mod:`~env.server.episodes` (reset/step/state on a session),
:mod:`~env.server.schemas` (the static documents), :mod:`~env.server.served` (:class:`ServedEnv`, the
environments by name), :mod:`~env.server.access` (Host/Origin/token and body-size
middleware), :mod:`~env.server.app` (:func:`create_app`, the HTTP routes), :mod:`~env.server.ws` (``/ws``) and
:mod:`~env.server.cli` (:func:`main`), which installs the log filters of :mod:`~env.server.logs` (``?token=`` values
redacted, an invalid-UTF-8 WebSocket frame logged as one warning line).

The names below are imported on first use, so that :mod:`env.server.served` (which environments build their
descriptor with) and the client need neither FastAPI nor uvicorn.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "env.server.access": ("AccessGuard", "BodyLimitMiddleware"),
    "env.server.app": ("StepFastPath", "create_app", "step_reply"),
    "env.server.cli": ("build_arg_parser", "main", "ws_transport_limit"),
    "env.server.codec": ("dumps", "dumps_text", "find_lone_surrogate", "loads"),
    "env.server.episodes": ("do_reset", "do_step", "state_payload"),
    "env.server.logs": ("QuietInvalidUtf8Filter", "RedactTokenFilter", "install_log_filters", "redact_token"),
    "env.server.protocol": (
        "COOKIE_NAME", "ECHO_DEPTH", "INT64_LIMIT", "NO_SESSION", "SEED_LIMIT", "SESSION_LOST", "ApiError",
        "check_action", "check_episode_id", "check_seed", "check_surrogates", "check_task", "parse_json_body",
    ),
    "env.server.served": ("ActionError", "ServedEnv", "find_served"),
    "env.server.sessions": ("REPLAY_WINDOW", "Session", "SessionLimitError", "SessionStore"),
    "env.server.settings": ("ServerSettings",),
}  # fmt: skip
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'env.server' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})

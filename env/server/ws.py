"""The OpenEnv WebSocket protocol on ``/ws``: one session per connection, one JSON message per frame.

Messages ``{"type": "reset"|"step"|"state"|"close", "data": {...}}`` are answered with ``observation``, ``state``
or ``error`` messages; an error leaves the connection, and the episode, as they were.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from env.server.codec import dumps_text, loads
from env.server.episodes import do_reset, do_step, state_payload
from env.server.protocol import ApiError, check_episode_id, check_seed, check_surrogates, check_task
from env.server.served import ServedEnv
from env.server.sessions import Session, SessionLimitError, SessionStore, client_address
from env.server.settings import ServerSettings

logger = logging.getLogger("env.server")


async def serve_websocket(
    websocket: WebSocket, served: ServedEnv, store: SessionStore, settings: ServerSettings
) -> None:
    """``WS /ws``: one session for the life of the connection (closed with 1001 when it expires), or
    ``CAPACITY_REACHED`` and close 1013 when no session slot is free."""
    await websocket.accept()
    try:
        session = store.create("ws", client_address(websocket.scope))
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
        await _ws_loop(websocket, served, session, store, settings)
    except WebSocketDisconnect:
        pass
    finally:
        store.delete(session.sid)


def _ws_error(message: str, code: str, errors: Any = None) -> str:
    data: dict[str, Any] = {"message": message, "code": code}
    if errors is not None:
        data["errors"] = errors
    return dumps_text({"type": "error", "data": data})


async def _quiet_close(websocket: WebSocket, code: int) -> None:
    with contextlib.suppress(Exception):
        await websocket.close(code=code)


async def _ws_loop(
    websocket: WebSocket, served: ServedEnv, session: Session, store: SessionStore, settings: ServerSettings
) -> None:
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
                    obs, reward, done, meta = do_step(served, session, data if data is not None else {}, rate_limit)
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
                task = check_task(served, data.get("task_id", data.get("task")), ("data", "task_id"))
                seed = check_seed(data.get("seed"), ("data", "seed"), served.min_seed)
                episode_id = check_episode_id(data.get("episode_id"), ("data", "episode_id"))
                async with session.lock:
                    obs, meta = do_reset(served, session, task, seed, episode_id)
                reply = {
                    "type": "observation",
                    "data": {"observation": obs, "reward": 0.0, "done": False, "metadata": meta},
                }
            elif kind == "state":
                async with session.lock:
                    reply = {"type": "state", "data": state_payload(served, session)}
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

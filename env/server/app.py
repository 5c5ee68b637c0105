"""The FastAPI app: :func:`create_app` with the reference-compatible HTTP routes, ``/ws`` and the ``POST /step``
fast path, for any served environment (:class:`~env.server.served.ServedEnv`; the clinical one by default).

The routes, their replies and errors are described in :mod:`env.server`; the request checks live in
:mod:`env.server.protocol`, the episode operations in :mod:`env.server.episodes` and the WebSocket protocol in
:mod:`env.server.ws`.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import Response
from starlette.requests import cookie_parser

from env.server.access import AccessGuard, BodyLimitMiddleware
from env.server.codec import dumps
from env.server.episodes import do_reset, do_step, state_payload
from env.server.protocol import (
    COOKIE_NAME,
    NO_SESSION,
    SESSION_LOST,
    ApiError,
    check_episode_id,
    check_seed,
    check_task,
    parse_json_body,
)
from env.server.schemas import metadata_document, schema_document, tasks_document
from env.server.served import DEFAULT_ENV, ServedEnv, find_served
from env.server.sessions import Session, SessionLimitError, SessionStore, client_address
from env.server.settings import ServerSettings
from env.server.ws import serve_websocket

logger = logging.getLogger("env.server")


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("recruit-trl")
    except Exception:  # noqa: BLE001 - not installed (e.g. a source checkout on sys.path)
        return "0.1.0"


def _fastapi_kwargs() -> dict[str, Any]:
    """Turn off FastAPI's native telemetry where this FastAPI version has it (a per-request cost)."""
    params = inspect.signature(FastAPI.__init__).parameters
    if "telemetry" in params:
        return {"telemetry": {"tracing": False, "metrics": False, "logs": False}}
    return {}


def _json_response(content: Any, status: int = 200, headers: dict | None = None) -> Response:
    return Response(dumps(content), status_code=status, headers=headers, media_type="application/json")


def _error_response(exc: ApiError) -> Response:
    return _json_response({"detail": exc.detail}, exc.status, exc.headers)


async def _json_body(request: Request) -> Any:
    return parse_json_body(await request.body(), request.headers.get("content-type"))


def _cookie_header(sid: str | None, secure: bool) -> str:
    """``Set-Cookie`` value: the session cookie, or its deletion (``Max-Age=0``) when ``sid`` is None."""
    suffix = "; HttpOnly; Path=/; SameSite=lax" + ("; Secure" if secure else "")
    if sid is None:
        return f'{COOKIE_NAME}=""; expires=Thu, 01 Jan 1970 00:00:00 GMT; Max-Age=0{suffix}'
    return f"{COOKIE_NAME}={sid}{suffix}"


async def step_reply(
    served: ServedEnv,
    store: SessionStore,
    settings: ServerSettings,
    sid: str | None,
    body: bytes,
    content_type: str | None,
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
                obs, reward, done, meta = do_step(served, session, payload, settings.rate_limit)
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

    def __init__(self, app: Any, served: ServedEnv, store: SessionStore, settings: ServerSettings) -> None:
        self.app = app
        self.served = served
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
        status, payload, extra = await step_reply(self.served, self.store, self.settings, sid, body, content_type)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
        headers += [(k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})


def _set_cookie(response: Response, sid: str | None, secure: bool) -> None:
    response.headers.append("set-cookie", _cookie_header(sid, secure))


def create_app(settings: ServerSettings | None = None, served: ServedEnv | str = DEFAULT_ENV) -> FastAPI:
    """Build the FastAPI app serving ``served`` (a :class:`ServedEnv` or a name for
    :func:`~env.server.served.find_served`; default the clinical environment). Each app has its own session store
    (``app.state.sessions``); ``app.state.served`` is the environment.

    Raises:
        ValueError: ``served`` names no environment.
    """
    settings = settings or ServerSettings()
    served = find_served(served)
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
        title=served.title,
        version=version,
        description=served.api_description or f"HTTP API and OpenEnv WebSocket protocol for {served.app_name}.",
        lifespan=lifespan,
        **_fastapi_kwargs(),
    )
    app.state.settings = settings
    app.state.sessions = store
    app.state.served = served
    # add_middleware wraps: the last one added is the outermost. CORS must also cover the /step fast path and the
    # guard's refusals (so a page can read them), and answers preflights, which carry no token, itself.
    if settings.step_fast_path:
        app.add_middleware(StepFastPath, served=served, store=store, settings=settings)
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

    action_schema = dict(served.action_schema)
    schema_payload = dumps(schema_document(served))
    tasks_payload = dumps(tasks_document(served))
    metadata_payload = dumps(metadata_document(served, version))
    task_ids = list(served.tasks)

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
                "name": served.app_name,
                "version": version,
                "status": "running",
                "tasks": task_ids,
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
            seed = check_seed(seed, ("query", "seed"), served.min_seed)
            body = await _json_body(request)
            if isinstance(body, dict):
                if task_id is None:
                    task_id = body.get("task_id")
                if seed is None:
                    seed = check_seed(body.get("seed"), ("body", "seed"), served.min_seed)
                episode_id = check_episode_id(body.get("episode_id"), ("body", "episode_id"))
            task = check_task(served, task_id)  # before touching any session: an unknown task keeps the old one alive
            old_sid = request.cookies.get(COOKIE_NAME)
            old = store.get(old_sid) if old_sid else None
            if old is not None:  # replace the caller's session (a new id, like the reference)
                async with old.lock:
                    store.delete(old.sid)
            session = store.create("http", client_address(request.scope))
        except ApiError as exc:
            return _error_response(exc)
        except SessionLimitError as exc:
            return _json_response({"detail": str(exc)}, 503, {"Retry-After": "1"})
        try:
            async with session.lock:
                obs, meta = do_reset(served, session, task, seed, episode_id)
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
        content_type = request.headers.get("content-type")
        status, payload, headers = await step_reply(served, store, settings, sid, body, content_type)
        return Response(payload, status_code=status, headers=headers, media_type="application/json")

    @app.get("/state")
    async def get_state(request: Request) -> Response:
        """The caller's episode state (``state()`` + ``episode_id`` + ``step_count``)."""
        try:
            session = _session_or_error(request)
            async with session.lock:
                return _json_response(state_payload(served, session))
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
        await serve_websocket(websocket, served, store, settings)

    return app

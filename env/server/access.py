"""ASGI middleware that refuses requests before any route runs, on both transports.

:class:`AccessGuard` checks who may call (``Host``, ``Origin``, bearer token) and :class:`BodyLimitMiddleware`
how much they may send.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, urlsplit

from env.server.codec import dumps
from env.server.settings import ServerSettings


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
            return 400, f"Host not allowed: {host!r}. Use localhost or an IP address, or start with --allowed_hosts."
        if origin is not None and not self.any_origin and not self._origin_ok(origin, host):
            return 403, f"Origin not allowed: {origin!r}. Start the server with --allowed_origins to allow it."
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

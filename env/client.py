"""``RemoteEnv``: a served environment's local API over HTTP or WebSocket (our server or the reference's).

    with RemoteEnv("http://127.0.0.1:8000", task="easy_bench", transport="http") as env:
        obs, info = env.reset(seed=0)
        obs, reward, terminated, truncated, info = env.step({"action_type": "screen_patient", "patient_id": "P-1149"})

The client works with any environment that :mod:`env.server` serves: ``env=`` names its
:class:`~env.server.served.ServedEnv` (default ``"clinical"``), which says how to read the replies back (the
observation's fields, the ``info`` keys the server moves to ``metadata``, how ``terminated`` / ``truncated`` are
told apart). ``RemoteEnv(url, task=..., env="myenv")`` reaches ``recruit-trl serve --env myenv``.

Contract (same as the local env, e.g. :class:`env.clinical.core.ClinicalRecruitmentEnv`):

* ``reset(seed=None, options=None) -> (obs, info)``; ``options={"task": id}`` switches task (``"episode_id"`` is
  passed through). ``obs`` is the observation (exactly the environment's observation fields when it lists them);
  ``info`` is the local env's reset ``info``.
* ``step(action) -> (obs, reward, terminated, truncated, info)``; ``action`` is a dict or a pydantic model (sent as
  its ``model_dump()``). The server's reply is split back into the observation and ``info``, exactly the local env's
  ``info``; the raw ``metadata`` of the last reply (e.g. the server's ``replay_warning``) is kept in
  ``env.last_metadata``. ``terminated`` and ``truncated`` come from the reply's ``metadata`` when the server reports
  them, else from the environment's ``split_done``: for the clinical environment (whose replies keep the
  reference's shape) ``truncated`` when the episode ended because ``timestamp >= max_steps``, the action was not a
  stop, the budget is not 0 and the target is not reached; ``terminated`` otherwise.
* ``state() -> dict``; ``close()``; usable as a context manager.

Errors: a schema violation (server 422 / WS ``VALIDATION_ERROR``) raises ``ValueError`` with the server's message,
as the local env does; an unknown task raises ``ValueError``; a step after the episode ended raises
``RuntimeError`` (no request is sent). If the server lost the session mid-episode (400 "Session expired or
missing", a dropped WebSocket, or a connection failure during a step, after which the server's state is unknown)
``SessionLostError`` (a ``RuntimeError``) is raised and the env must be ``reset()``: there is no silent restart.
Other server failures raise ``RemoteEnvError`` (a ``RuntimeError``).

Transport: ``transport="http"`` keeps the session in the ``acr_session_id`` cookie (sent explicitly, so several
``RemoteEnv`` may share one ``httpx.Client``); ``transport="ws"`` (or a ``ws://`` URL) speaks the OpenEnv
WebSocket protocol on ``/ws``, one connection per env. Every call has a ``timeout``; connection failures are
retried ``retries`` times with exponential backoff only for idempotent calls (``GET``s and ``reset``, which also
retries a 503 "session limit reached"). A step is retried only when the connection could not even be opened (the
request was never sent); once sent, a failure is a ``SessionLostError``. For a server started with ``--token``,
``token=`` (default: ``$RECRUIT_TRL_TOKEN``) is sent as ``Authorization: Bearer <token>`` on every request of both
transports; a refusal (401, 403) raises ``RemoteEnvError`` without retrying.

Seeds: our server echoes the seed in ``metadata.seed`` of the reset reply (and ``GET /`` says
``"seed_supported": true``). The reference server has no seed over HTTP: when a seed is given and the reply does
not acknowledge it, ``reset`` warns (``warnings.warn``) that the seed was ignored and the task's default seed was
used. Over WebSocket the seed is part of the OpenEnv protocol and is trusted. Over HTTP the server deletes the
session at the end of an episode (reference behaviour), so ``state()`` is unavailable after ``done`` there.
"""

from __future__ import annotations

import http.cookiejar
import ipaddress
import json
import os
import time
import warnings
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from env.server.served import DEFAULT_ENV, ENVELOPE_KEYS, ServedEnv, find_served

__all__ = ["TOKEN_ENV", "RemoteEnv", "RemoteEnvError", "SessionLostError", "is_loopback"]

COOKIE_NAME = "acr_session_id"
TOKEN_ENV = "RECRUIT_TRL_TOKEN"  # the bearer token when none is given explicitly (client and server)
_SESSION_LOST_MARKERS = ("Session expired or missing", "No active session")
# Transport errors raised before a request was sent (safe to retry even for a step).
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class RemoteEnvError(RuntimeError):
    """The server failed or answered something this client does not understand."""


class SessionLostError(RemoteEnvError):
    """The server no longer has this env's episode (expired, deleted, connection lost); call ``reset()``."""


def is_loopback(host: str | None) -> bool:
    if not host:
        return False
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _extract_obs(payload: Any, fields: tuple[str, ...] | None, flat: bool) -> dict[str, Any]:
    """The observation in a reply: ``fields`` of ``payload`` when given (every one required), else all of it (of a
    ``flat`` HTTP reply, all but the envelope keys ``done``, ``reward`` and ``metadata``)."""
    if not isinstance(payload, dict):
        raise RemoteEnvError(f"the server's observation is not a JSON object: {payload!r:.200}")
    if fields is None:
        return {k: v for k, v in payload.items() if k not in ENVELOPE_KEYS} if flat else payload
    try:
        return {name: payload[name] for name in fields}
    except KeyError as exc:
        raise RemoteEnvError(f"server reply lacks the observation field {exc.args[0]!r}") from None


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail", response.text)
    except (ValueError, AttributeError):
        return response.text
    if isinstance(detail, list):  # FastAPI validation errors
        parts = []
        for err in detail:
            if isinstance(err, dict):
                loc = ".".join(str(p) for p in err.get("loc", ()) if p != "body") or "action"
                parts.append(f"invalid action field '{loc}': {err.get('msg')} (got {err.get('input')!r})")
            else:
                parts.append(str(err))
        return "; ".join(parts)
    return str(detail)


def _auth_headers(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


class _HttpTransport:
    def __init__(
        self,
        base: str,
        timeout: float,
        retries: int,
        client: httpx.Client | None,
        token: str | None = None,
        fields: tuple[str, ...] | None = None,
    ) -> None:
        self.base = base.rstrip("/")
        self.fields = fields
        self.auth = _auth_headers(token)
        self.retries = retries
        self.owned = client is None
        if client is None:
            no_cookies = http.cookiejar.CookieJar(policy=http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))
            client = httpx.Client(
                timeout=timeout, cookies=no_cookies, trust_env=not is_loopback(urlsplit(base).hostname)
            )
        self.client = client
        self.timeout = timeout
        self.sid: str | None = None

    def _headers(self) -> dict[str, str]:
        return {"cookie": f"{COOKIE_NAME}={self.sid}", **self.auth} if self.sid else self.auth

    def _retrying(self, method: str, path: str, retry_503: bool = False, **kwargs: Any) -> httpx.Response:
        delay = 0.1
        for attempt in range(self.retries + 1):
            try:
                response = self.client.request(method, self.base + path, **kwargs)
            except httpx.TransportError as exc:
                if attempt >= self.retries:
                    raise RemoteEnvError(f"{method} {path} failed after {attempt + 1} attempt(s): {exc!r}") from exc
            else:
                if not (retry_503 and response.status_code == 503 and attempt < self.retries):
                    return response
            time.sleep(delay)
            delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")

    def reset(self, task: str, seed: int | None, episode_id: str | None) -> tuple[dict, dict]:
        params: dict[str, Any] = {"task_id": task}
        if seed is not None:
            params["seed"] = seed
        body = {"episode_id": episode_id} if episode_id is not None else None
        response = self._retrying("POST", "/reset", retry_503=True, params=params, headers=self._headers(), json=body)
        if response.status_code != 200:
            detail = _detail(response)
            if response.status_code in (400, 422) and ("Unknown task" in detail or response.status_code == 422):
                raise ValueError(detail)
            raise RemoteEnvError(f"reset failed: HTTP {response.status_code}: {detail}")
        sid = None
        for header in response.headers.get_list("set-cookie"):
            name, _, rest = header.partition("=")
            if name.strip() == COOKIE_NAME:
                sid = rest.split(";", 1)[0].strip().strip('"')
        if not sid:
            raise RemoteEnvError("reset reply did not set the session cookie")
        self.sid = sid
        payload = response.json()
        return _extract_obs(payload, self.fields, True), payload.get("metadata") or {}

    def step(self, action: dict[str, Any]) -> tuple[dict, float, bool, dict]:
        try:
            content = json.dumps(action, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"action is not JSON-serialisable: {exc}") from None
        headers = {"content-type": "application/json", **self._headers()}
        delay = 0.1
        for attempt in range(self.retries + 1):
            try:
                response = self.client.post(self.base + "/step", content=content, headers=headers)
                break
            except _NOT_SENT as exc:  # the request never reached the server: retrying cannot apply it twice
                if attempt >= self.retries:
                    raise RemoteEnvError(f"step: cannot reach the server ({exc!r}); the episode is unchanged") from exc
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
            except httpx.TransportError as exc:  # sent, but no reply: the step may or may not have been applied
                self.sid = None
                raise SessionLostError(
                    f"step failed on the connection ({exc!r}); the server's episode state is unknown. Call reset()."
                ) from exc
        status = response.status_code
        if status == 200:
            try:
                payload = response.json()
            except ValueError as exc:
                raise RemoteEnvError(f"step: the server's reply is not JSON: {response.text[:200]!r}") from exc
            done = bool(payload["done"])
            if done:
                self.sid = None  # the server deleted the session
            return _extract_obs(payload, self.fields, True), payload["reward"], done, payload.get("metadata") or {}
        detail = _detail(response)
        if status == 422:
            raise ValueError(detail)
        if status == 413:
            raise ValueError(f"action too large: {detail}")
        if status == 400 and any(m in detail for m in _SESSION_LOST_MARKERS):
            self.sid = None
            raise SessionLostError(f"the server lost this episode's session ({detail}); call reset()")
        raise RemoteEnvError(f"step failed: HTTP {status}: {detail}")

    def state(self) -> dict[str, Any]:
        response = self._retrying("GET", "/state", headers=self._headers())
        if response.status_code == 200:
            return response.json()
        detail = _detail(response)
        if response.status_code == 400 and any(m in detail for m in _SESSION_LOST_MARKERS):
            self.sid = None
            raise SessionLostError(f"the server lost this episode's session ({detail}); call reset()")
        raise RemoteEnvError(f"state failed: HTTP {response.status_code}: {detail}")

    def get(self, path: str) -> Any:
        response = self._retrying("GET", path, headers=self.auth)
        response.raise_for_status()
        return response.json()

    def close(self) -> None:
        if self.sid:
            try:  # our server frees the slot; the reference answers 404/405, which is fine
                self.client.delete(self.base + "/session", headers=self._headers())
            except httpx.HTTPError:
                pass
            self.sid = None
        if self.owned:
            self.client.close()


class _WsTransport:
    def __init__(
        self, url: str, timeout: float, retries: int, token: str | None = None, fields: tuple[str, ...] | None = None
    ) -> None:
        self.url = url
        self.fields = fields
        self.timeout = timeout
        self.retries = retries
        self.auth = _auth_headers(token)
        self.conn: Any = None

    def _connect(self) -> None:
        from websockets.sync.client import connect

        kwargs: dict[str, Any] = {
            "open_timeout": self.timeout,
            "close_timeout": 2.0,
            "max_size": 2**24,
            "compression": None,  # observations are small; deflate would cost more CPU than it saves on a LAN
        }
        if self.auth:
            kwargs["additional_headers"] = self.auth
        if is_loopback(urlsplit(self.url).hostname):
            kwargs["proxy"] = None
        try:
            cm = connect(self.url, **kwargs)
        except TypeError:  # websockets < 15 has no proxy argument
            kwargs.pop("proxy", None)
            cm = connect(self.url, **kwargs)
        # websockets >= 16 wants connect() used as a context manager; older versions return the connection, whose
        # __enter__ returns itself. Entering by hand works with both.
        self.conn = cm.__enter__()
        self._cm = cm

    def _exchange(self, message: dict[str, Any]) -> dict[str, Any]:
        try:
            text = json.dumps(message, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"message is not JSON-serialisable: {exc}") from None
        self.conn.send(text)
        reply = json.loads(self.conn.recv(timeout=self.timeout))
        if not isinstance(reply, dict):
            raise RemoteEnvError(f"unexpected WebSocket reply: {reply!r}")
        return reply

    @staticmethod
    def _raise(reply: dict[str, Any], what: str) -> None:
        data = reply.get("data") or {}
        code, message = data.get("code"), data.get("message", "")
        if code == "VALIDATION_ERROR":
            raise ValueError(message)
        if code == "CAPACITY_REACHED":
            raise RemoteEnvError(message)
        raise RemoteEnvError(f"{what} failed ({code}): {message}")

    def reset(self, task: str, seed: int | None, episode_id: str | None) -> tuple[dict, dict]:
        from websockets.exceptions import InvalidStatus, WebSocketException

        data: dict[str, Any] = {"task_id": task}
        if seed is not None:
            data["seed"] = seed
        if episode_id is not None:
            data["episode_id"] = episode_id
        delay = 0.1
        for attempt in range(self.retries + 1):
            try:
                if self.conn is None:
                    self._connect()
                reply = self._exchange({"type": "reset", "data": data})
                if reply.get("type") == "error" and (reply.get("data") or {}).get("code") == "CAPACITY_REACHED":
                    self._drop()
                    if attempt < self.retries:
                        time.sleep(delay)
                        delay = min(delay * 2, 2.0)
                        continue
                break
            except (OSError, TimeoutError, WebSocketException) as exc:
                self._drop()
                if isinstance(exc, InvalidStatus) and exc.response.status_code in (400, 401, 403):
                    # refused by the server's access checks (token, Origin, Host): retrying cannot help
                    body = exc.response.body.decode("utf-8", "replace") if exc.response.body else ""
                    raise RemoteEnvError(
                        f"WebSocket connection refused: HTTP {exc.response.status_code}: {body}"
                    ) from exc
                rcvd = getattr(exc, "rcvd", None)
                if rcvd is not None and rcvd.code == 1013 and attempt >= self.retries:  # server full
                    raise RemoteEnvError(rcvd.reason or "the server's session limit is reached") from exc
                if attempt >= self.retries:
                    raise RemoteEnvError(f"WebSocket reset failed after {attempt + 1} attempt(s): {exc!r}") from exc
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
        if reply.get("type") != "observation":
            self._raise(reply, "reset")
        body = reply["data"]
        return _extract_obs(body["observation"], self.fields, False), body.get("metadata") or {}

    def step(self, action: dict[str, Any]) -> tuple[dict, float, bool, dict]:
        from websockets.exceptions import WebSocketException

        if self.conn is None:
            raise SessionLostError("the WebSocket connection is closed; call reset()")
        try:
            reply = self._exchange({"type": "step", "data": action})
        except (OSError, TimeoutError, WebSocketException) as exc:
            self._drop()
            raise SessionLostError(
                f"the WebSocket connection failed during a step ({exc!r}); the episode is lost. Call reset()."
            ) from exc
        if reply.get("type") != "observation":
            self._raise(reply, "step")
        body = reply["data"]
        obs = _extract_obs(body["observation"], self.fields, False)
        return obs, body["reward"], bool(body["done"]), body.get("metadata") or {}

    def state(self) -> dict[str, Any]:
        from websockets.exceptions import WebSocketException

        if self.conn is None:
            raise SessionLostError("the WebSocket connection is closed; call reset()")
        try:
            reply = self._exchange({"type": "state"})
        except (OSError, TimeoutError, WebSocketException) as exc:
            self._drop()
            raise SessionLostError(f"the WebSocket connection failed ({exc!r}); call reset()") from exc
        if reply.get("type") != "state":
            self._raise(reply, "state")
        return reply["data"]

    def get(self, path: str) -> Any:
        parts = urlsplit(self.url)
        scheme = "https" if parts.scheme == "wss" else "http"
        prefix = parts.path[: -len("/ws")] if parts.path.endswith("/ws") else parts.path
        base = urlunsplit((scheme, parts.netloc, prefix.rstrip("/"), "", ""))
        with httpx.Client(timeout=self.timeout, trust_env=not is_loopback(parts.hostname)) as client:
            response = client.get(base + path, headers=self.auth)
            response.raise_for_status()
            return response.json()

    def _drop(self) -> None:
        if self.conn is not None:
            try:
                self._cm.__exit__(None, None, None)
            except Exception:  # noqa: BLE001 - already broken
                pass
            self.conn = None

    def close(self) -> None:
        if self.conn is not None:
            try:
                self.conn.send(json.dumps({"type": "close"}))
            except Exception:  # noqa: BLE001 - closing anyway
                pass
            self._drop()


class RemoteEnv:
    """The local env's API against a remote server. See the module docstring for the contract.

    Args:
        url: ``http(s)://host:port`` (a path prefix is kept), or ``ws(s)://host:port[/ws]``.
        task: the task of the next ``reset()`` (``options={"task": ...}`` changes it, as with the local env);
            default: the environment's default task.
        transport: ``"http"`` (reference routes, cookie session) or ``"ws"`` (OpenEnv protocol on ``/ws``).
        timeout: seconds per request (connect, read and write).
        retries: extra attempts for idempotent calls (GETs and reset) after connection errors.
        http_client: an ``httpx.Client`` to use, with its own timeout (not closed by ``close()``); default: one of
            our own with ``timeout``.
        token: the bearer token of a server started with ``--token`` (sent as ``Authorization: Bearer ...`` on
            every request, both transports); default: the ``RECRUIT_TRL_TOKEN`` environment variable; ``""`` sends
            none.
        env: the served environment: a :class:`~env.server.served.ServedEnv` or its name
            (:func:`~env.server.served.find_served`); default ``"clinical"``.

    Raises:
        ValueError: a bad ``transport``, URL, ``timeout`` or ``retries``, or an unknown ``env``.
    """

    def __init__(
        self,
        url: str,
        task: str | None = None,
        transport: str | None = None,
        timeout: float = 30.0,
        retries: int = 3,
        http_client: httpx.Client | None = None,
        token: str | None = None,
        env: str | ServedEnv = DEFAULT_ENV,
    ) -> None:
        served = self.served = find_served(env)
        fields = served.observation_fields
        parts = urlsplit(url)
        if token is None:
            token = os.environ.get(TOKEN_ENV)
        if transport is None:
            transport = "ws" if parts.scheme in ("ws", "wss") else "http"
        if transport not in ("http", "ws"):
            raise ValueError(f"transport must be 'http' or 'ws', got {transport!r}")
        if retries < 0 or timeout <= 0:
            raise ValueError("retries must be >= 0 and timeout > 0")
        self.url = url
        self.task = task or served.default_task
        self.transport = transport
        if transport == "http":
            if parts.scheme not in ("http", "https"):
                raise ValueError(f"an HTTP transport needs an http(s):// URL, got {url!r}")
            self._t: _HttpTransport | _WsTransport = _HttpTransport(url, timeout, retries, http_client, token, fields)
        else:
            scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
            if scheme not in ("ws", "wss"):
                raise ValueError(f"a WebSocket transport needs an http(s):// or ws(s):// URL, got {url!r}")
            path = parts.path.rstrip("/")
            if not path.endswith("/ws"):
                path += "/ws"
            ws_url = urlunsplit((scheme, parts.netloc, path, parts.query, ""))
            self._t = _WsTransport(ws_url, timeout, retries, token, fields)
        self._active = False  # an episode is running
        self._done = False
        self.seed_honored: bool | None = None  # after reset(seed=...): did the server acknowledge the seed?
        self.last_metadata: dict[str, Any] = {}

    # ------------------------------------------------------------------ public API
    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        options = options or {}
        task = options.get("task") or options.get("task_id") or self.task
        obs, metadata = self._t.reset(task, seed, options.get("episode_id"))
        self.task = task
        self._active, self._done = True, False
        self.last_metadata = metadata
        self.episode_id = metadata.get("episode_id")
        if seed is None:
            self.seed_honored = None
        elif "seed" in metadata:
            self.seed_honored = metadata["seed"] == seed
        else:
            self.seed_honored = self.transport == "ws"  # part of the OpenEnv reset message
        if seed is not None and not self.seed_honored:
            warnings.warn(
                f"the server at {self.url} ignored seed={seed} (the reference server has no seed over HTTP); "
                f"this episode uses the task's default seed",
                RuntimeWarning,
                stacklevel=2,
            )
        info = metadata.get("info")
        if not isinstance(info, dict):
            info = self.served.reset_info(obs) if self.served.reset_info else {}
        return obs, dict(info)

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        if not self._active:
            if self._done:
                raise RuntimeError("Episode is done. Call reset() first.")
            raise RuntimeError("Call reset() before step().")
        if hasattr(action, "model_dump"):
            action = action.model_dump()
        if not isinstance(action, dict):
            raise ValueError(f"action must be a dict or a pydantic model, got {type(action).__name__}")
        try:
            obs, reward, done, metadata = self._t.step(action)
        except SessionLostError:
            self._active = False
            raise
        self.last_metadata = metadata
        info = metadata.get("info")
        info = dict(info) if isinstance(info, dict) else {}
        for key in self.served.metadata_keys:  # a server that sends them only at the top of the metadata
            if key not in info and key in metadata:
                info[key] = metadata[key]
        if done:
            self._active, self._done = False, True
        if "terminated" in metadata and "truncated" in metadata:
            terminated, truncated = bool(metadata["terminated"]), bool(metadata["truncated"])
        elif self.served.split_done is not None:
            terminated, truncated = self.served.split_done(obs, done, action)
        else:
            terminated, truncated = done, False
        return obs, reward, terminated, truncated, info

    def state(self) -> dict[str, Any]:
        if not self._active:
            if self._done and self.transport == "http":
                raise RuntimeError(
                    "the server deletes the session when an episode ends (reference behaviour), so state() is not "
                    "available after done over HTTP; use transport='ws' to inspect final states"
                )
            if not self._done:
                raise RuntimeError("Call reset() before state().")
        try:
            return self._t.state()
        except SessionLostError:
            self._active = False
            raise

    def server_info(self) -> dict[str, Any]:
        """``GET /`` of the server (name, version, tasks, sessions, ``seed_supported`` on our server)."""
        return self._t.get("/")

    def tasks(self) -> dict[str, Any]:
        """``GET /tasks``."""
        return self._t.get("/tasks")

    @property
    def done(self) -> bool:
        return self._done

    def close(self) -> None:
        self._t.close()
        self._active = False

    def __enter__(self) -> RemoteEnv:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"RemoteEnv({self.url!r}, task={self.task!r}, transport={self.transport!r}, env={self.served.name!r})"

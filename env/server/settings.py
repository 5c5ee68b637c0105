"""The server's knobs (:class:`ServerSettings`), shared by the app, its middleware and the command line."""

from __future__ import annotations

from dataclasses import dataclass


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

"""Sessions: one environment per client, idle expiry, a hard cap and a cap per client address.

A session is never evicted while it is live: when every slot is taken the store reaps the expired ones, and if
none is expired the new session is refused (:class:`SessionLimitError`, a 503 or ``CAPACITY_REACHED``).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from typing import Any

REPLAY_WINDOW = 5  # identical actions in a row that earn a replay warning


class SessionLimitError(Exception):
    """Every session slot, or every slot this client may hold, is taken by a live session."""


class Session:
    """One client's episode: its own env, lock, replay window and (optional) rate-limit window."""

    __slots__ = (
        "sid", "kind", "client", "env", "task", "lock", "last_used", "episode_id", "done", "steps", "recent", "stamps",
        "closer",
    )  # fmt: skip

    def __init__(self, sid: str, kind: str, now: float, client: str = "") -> None:
        self.sid = sid
        self.kind = kind  # "http" or "ws"
        self.client = client  # the remote address, for the per-client cap
        self.env: Any = None  # built by the served environment's make_env on the first reset
        self.task: str | None = None  # the task ``env`` was built for
        self.lock = asyncio.Lock()
        self.last_used = now
        self.episode_id: str | None = None  # None until the first reset: no episode yet
        self.done = False  # the episode has ended
        self.steps = 0  # steps applied in the episode
        self.recent: deque[tuple] = deque(maxlen=REPLAY_WINDOW)
        self.stamps: deque[float] = deque()
        self.closer: Callable[[], None] | None = None  # WebSocket: close the connection on expiry

    def new_episode(self, episode_id: str | None) -> None:
        self.episode_id = episode_id or str(uuid.uuid4())
        self.done = False
        self.steps = 0
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
                    f"Session limit reached ({self.max_sessions}). Retry later or raise --max_sessions."
                )
            if self._per_client.get(client, 0) >= self.max_per_client:
                raise SessionLimitError(
                    f"Session limit per client ({self.max_per_client}) reached for {client or 'this client'}. "
                    "Close a session, retry later or raise --max_sessions_per_client."
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


def client_address(scope: dict) -> str:
    """The remote address the per-client session cap counts by."""
    client = scope.get("client")
    return str(client[0]) if client else ""

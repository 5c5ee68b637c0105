"""Real environment-server processes for tests: start one on a free loopback port, wait until it is healthy."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_server_cmd(port: int, *extra: str) -> list[str]:
    """``python -m env.server`` on 127.0.0.1:``port``."""
    return [sys.executable, "-m", "env.server", "--host", "127.0.0.1", "--port", str(port), "--log_level", "warning",
            *extra]  # fmt: skip


# Generous: a healthy server answers within seconds, but on a small machine shared with other jobs its imports alone
# (the tests run it at nice 19) have been seen to take over 30 s.
START_TIMEOUT = 120.0


def start_server(
    cmd: list[str],
    port: int,
    timeout: float = START_TIMEOUT,
    headers: dict[str, str] | None = None,
    log: IO[str] | None = None,
) -> tuple[subprocess.Popen, str]:
    """Run ``cmd`` (a server listening on ``port``) and return ``(process, url)`` once ``/health`` answers 200.

    ``headers`` go with the health checks (e.g. the ``Authorization`` of a server started with ``--token``).
    ``log``, an open file, receives the server's stdout and stderr, where uvicorn writes its logs (default: this
    process's).

    Raises:
        RuntimeError: the process exited or did not become healthy within ``timeout`` seconds (it is killed).
    """
    import httpx

    # a token in the caller's environment would lock the server (and the tests' plain requests) behind it
    env = {k: v for k, v in os.environ.items() if k != "RECRUIT_TRL_TOKEN"}
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", headers=headers, timeout=1, trust_env=False).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("server did not become healthy")
        time.sleep(0.05)


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

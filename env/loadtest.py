"""Load benchmark for :mod:`env.server`: N concurrent clients playing full episodes over HTTP or WebSocket.

Usage::

    python -m env.loadtest --sessions 64 --episodes_per_session 1 --task easy_bench --transport http
    python -m env.loadtest --url http://127.0.0.1:8000 --transport ws --json out.json

Without ``--url`` it starts its own server (``python -m env.server``) on a free loopback port and stops it at the
end. Each of the ``--sessions`` clients (asyncio tasks, one keep-alive connection each) plays
``--episodes_per_session`` full episodes with the heuristic policy, seed = ``--seed_base`` + episode index. The
run is bounded in count and in time (``--max_seconds``: no new request starts after it, unfinished episodes are
reported as ``incomplete``). Only loopback URLs are accepted unless ``--allow_remote``.

Every client connects from the same address, so its own server allows one client address every session
(``--max_sessions_per_client``), and a ``--url`` server is first checked to allow ``--sessions`` per client.
``--token`` (default ``$RECRUIT_TRL_TOKEN``) is sent to a server started with one.

HTTP clients: ``--client raw`` (default) is a minimal HTTP/1.1 keep-alive client on asyncio streams, so that the
load generator costs little CPU next to the server on a small machine; ``--client httpx`` uses
``httpx.AsyncClient`` instead. WebSocket clients use the ``websockets`` asyncio client.

Reported: requests/s (resets + steps), steps/s, client-side latency p50/p95/p99/max, errors (non-200 replies,
protocol errors, exceptions: must be 0), and the exactness check: every finished episode is replayed in-process
with the same seed and actions, and every reward and the final score must be equal (``mismatches`` must be 0).
When it started the server it also reports the server's CPU seconds. Prints a table and the JSON document
(``--json FILE`` writes it too). Exit status 0 only with 0 errors, 0 mismatches and at least one finished episode.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from env.cli_flags import refuse_kebab_spellings
from env.client import TOKEN_ENV, is_loopback
from env.clinical.core import ClinicalRecruitmentEnv
from env.clinical.policies import heuristic_policy

# The reference server's published figures (its machine, not this one): 143-203 requests/s over 24 sessions, p50 ~5 ms.
REFERENCE_P50_MS = 5.0


@dataclass
class Episode:
    session: int
    seed: int
    actions: list[dict[str, Any]] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    final_score: float | None = None
    done: bool = False


@dataclass
class Stats:
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    resets: int = 0
    steps: int = 0


# ---------------------------------------------------------------------------------------------------------------
# clients (each one connection; ``request`` returns the parsed reply)


class RawHttp:
    """Minimal HTTP/1.1 keep-alive JSON client (Content-Length framing, one request at a time)."""

    def __init__(self, host: str, port: int, token: str | None = None) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.cookie = b""
        self.auth = f"authorization: Bearer {token}\r\n".encode() if token else b""

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
        head = f"{method} {path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n".encode() + self.auth
        if body:
            head += b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body)
        elif method == "POST":
            head += b"content-length: 0\r\n"
        if self.cookie:
            head += b"cookie: " + self.cookie + b"\r\n"
        self.writer.write(head + b"\r\n" + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        length = None
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                length = int(value)
            elif name == b"set-cookie" and value.strip().startswith(b"acr_session_id="):
                self.cookie = value.strip().split(b";", 1)[0]
                if b"max-age=0" in value.lower():
                    self.cookie = b""
        if length is None:
            raise RuntimeError("reply without content-length")
        payload = await self.reader.readexactly(length)
        return status, json.loads(payload)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass


class HttpxHttp:
    def __init__(self, base: str, token: str | None = None) -> None:
        import httpx

        headers = {"authorization": f"Bearer {token}"} if token else None
        self.client = httpx.AsyncClient(base_url=base, timeout=60.0, trust_env=False, headers=headers)
        self.cookie = ""

    async def connect(self) -> None:
        pass

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
        headers = {"content-type": "application/json"} if body else {}
        if self.cookie:
            headers["cookie"] = self.cookie
        response = await self.client.request(method, path, content=body or None, headers=headers)
        for header in response.headers.get_list("set-cookie"):
            if header.startswith("acr_session_id="):
                self.cookie = "" if "max-age=0" in header.lower() else header.split(";", 1)[0]
        return response.status_code, response.json()

    async def close(self) -> None:
        await self.client.aclose()


def _encode(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


async def http_episode(conn: Any, task: str, ep: Episode, stats: Stats, deadline: float) -> None:
    t0 = time.perf_counter()
    status, data = await conn.request("POST", f"/reset?task_id={task}&seed={ep.seed}")
    stats.latencies.append(time.perf_counter() - t0)
    stats.resets += 1
    if status != 200:
        raise RuntimeError(f"reset: HTTP {status}: {data}")
    if data.get("metadata", {}).get("seed") != ep.seed:
        raise RuntimeError("reset: the server did not acknowledge the seed")
    obs = data
    while time.perf_counter() < deadline:
        action = heuristic_policy(obs)
        body = _encode(action)
        t0 = time.perf_counter()
        status, data = await conn.request("POST", "/step", body)
        stats.latencies.append(time.perf_counter() - t0)
        stats.steps += 1
        if status != 200:
            raise RuntimeError(f"step: HTTP {status}: {data}")
        ep.actions.append(action)
        ep.rewards.append(data["reward"])
        obs = data
        if data["done"]:
            ep.final_score = data["metadata"]["info"]["final_score"]
            ep.done = True
            return


async def ws_episode(conn: Any, task: str, ep: Episode, stats: Stats, deadline: float) -> None:
    t0 = time.perf_counter()
    await conn.send(_encode({"type": "reset", "data": {"task_id": task, "seed": ep.seed}}).decode())
    reply = json.loads(await conn.recv())
    stats.latencies.append(time.perf_counter() - t0)
    stats.resets += 1
    if reply.get("type") != "observation":
        raise RuntimeError(f"reset: {reply}")
    obs = reply["data"]["observation"]
    while time.perf_counter() < deadline:
        action = heuristic_policy(obs)
        message = _encode({"type": "step", "data": action}).decode()
        t0 = time.perf_counter()
        await conn.send(message)
        reply = json.loads(await conn.recv())
        stats.latencies.append(time.perf_counter() - t0)
        stats.steps += 1
        if reply.get("type") != "observation":
            raise RuntimeError(f"step: {reply}")
        data = reply["data"]
        ep.actions.append(action)
        ep.rewards.append(data["reward"])
        obs = data["observation"]
        if data["done"]:
            ep.final_score = data["metadata"]["info"]["final_score"]
            ep.done = True
            return


async def client_session(idx: int, args: argparse.Namespace, base: str, stats: Stats, deadline: float) -> None:
    parts = urlsplit(base)
    try:
        if args.transport == "ws":
            from websockets.asyncio.client import connect

            scheme = "wss" if parts.scheme == "https" else "ws"
            headers = {"authorization": f"Bearer {args.token}"} if args.token else None
            conn = await connect(
                f"{scheme}://{parts.netloc}/ws",
                max_size=2**24,
                proxy=None,
                compression=None,
                additional_headers=headers,
            )
        elif args.client == "raw":
            conn = RawHttp(parts.hostname, parts.port or 80, args.token)
            await conn.connect()
        else:
            conn = HttpxHttp(base, args.token)
    except Exception as exc:  # noqa: BLE001 - counted and reported
        stats.errors.append(f"session {idx}: connect: {exc!r}")
        return
    try:
        for k in range(args.episodes_per_session):
            if time.perf_counter() >= deadline:
                break
            ep = Episode(session=idx, seed=args.seed_base + idx * args.episodes_per_session + k)
            stats.episodes.append(ep)
            try:
                if args.transport == "ws":
                    await ws_episode(conn, args.task, ep, stats, deadline)
                else:
                    await http_episode(conn, args.task, ep, stats, deadline)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                stats.errors.append(f"session {idx} seed {ep.seed}: {exc!r}")
                return
    finally:
        try:
            await conn.close()
        except Exception:  # noqa: BLE001 - closing
            pass


# ---------------------------------------------------------------------------------------------------------------
# server process, verification, report


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(
    url: str, timeout: float = 30.0, proc: subprocess.Popen | None = None, token: str | None = None
) -> None:
    import httpx

    headers = {"authorization": f"Bearer {token}"} if token else None
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        try:
            if httpx.get(url + "/health", headers=headers, timeout=1.0, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"server at {url} not healthy after {timeout} s")


def start_server(max_sessions: int, extra: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "env.server", "--host", "127.0.0.1", "--port", str(port), "--log_level", "warning"]
    # every client of the load test connects from 127.0.0.1: one client address may hold every session
    cmd += ["--max_sessions", str(max_sessions), "--max_sessions_per_client", str(max_sessions), *(extra or [])]
    env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}  # a loopback server of our own needs no token
    proc = subprocess.Popen(cmd, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc=proc)
    except Exception:
        proc.terminate()
        proc.wait(10)
        raise
    return proc, url


def check_room(url: str, args: argparse.Namespace) -> None:
    """Exit with a clear message if the server's per-client session cap cannot hold ``--sessions`` clients."""
    import httpx

    headers = {"authorization": f"Bearer {args.token}"} if args.token else None
    info = httpx.get(url + "/", headers=headers, timeout=10.0, trust_env=False).json()
    cap = info.get("max_sessions_per_client")
    if isinstance(cap, int) and cap < args.sessions:
        raise SystemExit(
            f"the server at {url} allows {cap} sessions per client and every load-test client comes from one "
            f"address: start it with --max_sessions_per_client {args.sessions} (or more), or lower --sessions"
        )


def cpu_seconds(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def verify(task: str, episodes: list[Episode]) -> list[str]:
    """Replay each finished episode in-process; return a description of every difference."""
    env = ClinicalRecruitmentEnv(task)
    problems = []
    for ep in episodes:
        if not ep.done:
            continue
        env.reset(seed=ep.seed)
        info: dict[str, Any] = {}
        for k, (action, reward) in enumerate(zip(ep.actions, ep.rewards, strict=True)):
            _, local_reward, terminated, truncated, info = env.step(action)
            if local_reward != reward:
                problems.append(f"seed {ep.seed} step {k}: reward {reward} != in-process {local_reward}")
                break
            if (terminated or truncated) != (k == len(ep.actions) - 1):
                problems.append(f"seed {ep.seed} step {k}: episode end differs from in-process")
                break
        else:
            if info.get("final_score") != ep.final_score:
                problems.append(
                    f"seed {ep.seed}: final score {ep.final_score} != in-process {info.get('final_score')}"
                )
    return problems


def percentile_ms(sorted_values: list[float], q: float) -> float | None:
    """The ``q``-th percentile (nearest rank) in milliseconds, 3 dp; None without samples."""
    if not sorted_values:
        return None
    k = min(len(sorted_values) - 1, max(0, round(q / 100 * (len(sorted_values) - 1))))
    return round(sorted_values[k] * 1e3, 3)


def run(args: argparse.Namespace) -> dict[str, Any]:
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(max(256, 2 * args.sessions))
    else:
        host = urlsplit(url).hostname
        if not is_loopback(host) and not args.allow_remote:
            raise SystemExit(f"refusing non-loopback URL {url!r} (pass --allow_remote to load a remote server)")
        wait_healthy(url.rstrip("/"), timeout=10.0, token=args.token)
        check_room(url.rstrip("/"), args)
    url = url.rstrip("/")
    stats = Stats()
    server_cpu0 = cpu_seconds(proc.pid) if proc else None
    try:

        async def main() -> float:
            start = time.perf_counter()
            deadline = start + args.max_seconds
            await asyncio.gather(*(client_session(i, args, url, stats, deadline) for i in range(args.sessions)))
            return time.perf_counter() - start

        client_cpu0 = time.process_time()
        elapsed = asyncio.run(main())
        client_cpu = time.process_time() - client_cpu0
        server_cpu = cpu_seconds(proc.pid) - server_cpu0 if proc and server_cpu0 is not None else None
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
    mismatches = verify(args.task, stats.episodes)
    lat = sorted(stats.latencies)
    requests = stats.resets + stats.steps
    finished = sum(ep.done for ep in stats.episodes)
    result = {
        "transport": args.transport,
        "client": args.client if args.transport == "http" else "websockets",
        "task": args.task,
        "sessions": args.sessions,
        "episodes_per_session": args.episodes_per_session,
        "episodes_finished": finished,
        "episodes_incomplete": len(stats.episodes) - finished,
        "steps": stats.steps,
        "requests": requests,
        "seconds": round(elapsed, 3),
        "requests_per_s": round(requests / elapsed, 1) if elapsed else 0.0,
        "steps_per_s": round(stats.steps / elapsed, 1) if elapsed else 0.0,
        "latency_ms": {
            "p50": percentile_ms(lat, 50),
            "p95": percentile_ms(lat, 95),
            "p99": percentile_ms(lat, 99),
            "max": percentile_ms(lat, 100),
            "mean": round(statistics.fmean(lat) * 1e3, 3) if lat else None,
        },
        "errors": len(stats.errors),
        "error_samples": stats.errors[:5],
        "mismatches": len(mismatches),
        "mismatch_samples": mismatches[:5],
        "final_scores_match_in_process": finished > 0 and not mismatches,
        "server_cpu_s": round(server_cpu, 2) if server_cpu is not None else None,
        "client_cpu_s": round(client_cpu, 2),
    }
    return {
        "result": result,
        "config": {
            "url": url if args.url else "own server on a free loopback port",
            "max_seconds": args.max_seconds,
            "seed_base": args.seed_base,
            "policy": "heuristic",
            "reference_published": {"requests_per_s": "143-203 over 24 sessions", "p50_ms": REFERENCE_P50_MS},
        },
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
    }


def format_table(r: dict[str, Any]) -> str:
    lat = r["latency_ms"]
    headers = ["transport", "sessions", "episodes", "steps", "seconds", "req/s", "steps/s", "p50 ms", "p95 ms"]
    headers += ["p99 ms", "errors", "mismatches"]
    row = [
        f"{r['transport']} ({r['client']})",
        r["sessions"],
        f"{r['episodes_finished']}/{r['episodes_finished'] + r['episodes_incomplete']}",
        r["steps"],
        r["seconds"],
        r["requests_per_s"],
        r["steps_per_s"],
        lat["p50"],
        lat["p95"],
        lat["p99"],
        r["errors"],
        r["mismatches"],
    ]
    cells = [str(c) for c in row]
    widths = [max(len(h), len(c)) for h, c in zip(headers, cells, strict=True)]
    return "\n".join(
        [
            "  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)),
            "  ".join("-" * w for w in widths),
            "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)),
        ]
    )


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m env.loadtest", description=__doc__.split("\n\n")[0])
    p.add_argument("--sessions", type=int, default=64, help="concurrent clients (default 64)")
    p.add_argument("--episodes_per_session", type=int, default=1)
    p.add_argument("--task", default="easy_bench")
    p.add_argument("--url", default=None, help="server to load (default: start one on a free loopback port)")
    p.add_argument("--transport", choices=["http", "ws"], default="http")
    p.add_argument("--client", choices=["raw", "httpx"], default="raw", help="HTTP client implementation")
    p.add_argument("--max_seconds", type=float, default=120.0, help="stop starting requests after this long")
    p.add_argument("--seed_base", type=int, default=0)
    p.add_argument("--json", default=None, metavar="FILE", help="also write the JSON report here")
    p.add_argument("--allow_remote", action="store_true", help="allow a non-loopback --url")
    p.add_argument("--token", default=None, help=f"bearer token of a --url server (default: ${TOKEN_ENV})")
    return refuse_kebab_spellings(p)


def main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    if args.token is None:
        args.token = os.environ.get(TOKEN_ENV) or None
    if not 1 <= args.sessions <= 4096 or not 1 <= args.episodes_per_session <= 1000 or args.max_seconds <= 0:
        raise SystemExit("--sessions must be in 1..4096, --episodes_per_session in 1..1000, --max_seconds > 0")
    from env.clinical.tasks import get_task

    get_task(args.task)
    report = run(args)
    r = report["result"]
    print(format_table(r))
    if r["errors"]:
        print("errors:", *r["error_samples"], sep="\n  ")
    if r["mismatches"]:
        print("mismatches:", *r["mismatch_samples"], sep="\n  ")
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    ok = r["errors"] == 0 and r["mismatches"] == 0 and r["episodes_finished"] > 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

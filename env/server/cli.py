"""Command line of the server: ``python -m env.server`` and ``recruit-trl serve``."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from env.cli_flags import refuse_kebab_spellings
from env.client import TOKEN_ENV, is_loopback
from env.server.app import create_app
from env.server.logs import install_log_filters
from env.server.served import DEFAULT_ENV, ENTRY_POINT_GROUP, find_served
from env.server.settings import ServerSettings


def build_arg_parser() -> argparse.ArgumentParser:
    """The options of ``python -m env.server`` / ``recruit-trl serve``; defaults come from :class:`ServerSettings`."""
    d = ServerSettings()
    p = argparse.ArgumentParser(
        prog="python -m env.server",
        description="Serve an environment over HTTP (the reference's routes) and WebSocket (/ws).",
    )
    p.add_argument(
        "--env",
        default=DEFAULT_ENV,
        help=f"environment to serve: a name of the {ENTRY_POINT_GROUP} entry points or package.module:attribute "
        f"(default {DEFAULT_ENV})",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; others need a token)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--token",
        default=None,
        help=f"bearer token required on every route (default: ${TOKEN_ENV}; required for a non-loopback --host)",
    )
    p.add_argument("--max_sessions", type=int, default=d.max_sessions, help="live sessions, HTTP + WebSocket")
    p.add_argument(
        "--max_sessions_per_client",
        type=int,
        default=None,
        help="live sessions per client address (default: half of --max_sessions)",
    )
    p.add_argument("--session_ttl", type=float, default=d.session_ttl, help="idle seconds before a session expires")
    p.add_argument("--reaper_interval", type=float, default=d.reaper_interval, help="seconds between expiry sweeps")
    p.add_argument("--rate_limit", type=float, default=d.rate_limit, help="steps/s per session; 0 (default) = none")
    p.add_argument("--max_body_bytes", type=int, default=d.max_body_bytes, help="request body / WS message limit")
    p.add_argument("--cors_origins", default="", help="comma-separated allowed origins (e.g. '*'); default none")
    p.add_argument(
        "--allowed_origins",
        default="",
        help="comma-separated browser origins allowed to call the server (default: none; '*' = any)",
    )
    p.add_argument(
        "--allowed_hosts",
        default="",
        help="comma-separated host names accepted in the Host header besides localhost, IP addresses and --host",
    )
    p.add_argument(
        "--keep_alive", type=float, default=75.0, help="idle seconds before closing a keep-alive connection"
    )
    p.add_argument("--ws_compression", action="store_true", help="offer permessage-deflate on /ws (CPU for bandwidth)")
    p.add_argument("--cookie_secure", action="store_true", help="mark the session cookie Secure (HTTPS)")
    p.add_argument("--log_level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.add_argument("--access_log", action="store_true", help="log every request (slow)")
    return refuse_kebab_spellings(p)


def _csv(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def ws_transport_limit(max_body_bytes: int) -> int:
    """The WebSocket frame limit of the transport: above the app's own limit, so that a message between the two gets
    a MESSAGE_TOO_LARGE reply and the connection lives on; larger frames close the connection (1009)."""
    return 2 * max_body_bytes + 4096


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, check that a non-loopback bind has a token, install the log filters of
    :mod:`env.server.logs` and serve until stopped; returns 0."""
    import uvicorn

    parser = build_arg_parser()
    args = parser.parse_args(argv)
    token = args.token if args.token is not None else os.environ.get(TOKEN_ENV) or None
    try:
        settings = ServerSettings(
            max_sessions=args.max_sessions,
            max_sessions_per_client=args.max_sessions_per_client,
            session_ttl=args.session_ttl,
            reaper_interval=args.reaper_interval,
            rate_limit=args.rate_limit,
            max_body_bytes=args.max_body_bytes,
            cookie_secure=args.cookie_secure,
            cors_origins=_csv(args.cors_origins),
            allowed_origins=_csv(args.allowed_origins),
            allowed_hosts=(args.host, *_csv(args.allowed_hosts)),
            token=token,
        )
        served = find_served(args.env)
    except ValueError as exc:
        parser.error(str(exc))
    if not is_loopback(args.host):
        if token is None:
            parser.error(
                f"--host {args.host} accepts connections from other machines: pass --token (or set {TOKEN_ENV}) "
                "so that only clients holding the token can use the server"
            )
        print(f"warning: binding {args.host}: plain HTTP, the token crosses the network in clear", file=sys.stderr)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s:%(name)s: %(message)s")
    install_log_filters()  # no ?token= value in the logs; one warning line for an invalid-UTF-8 WebSocket frame
    uvicorn.run(
        create_app(settings, served),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        access_log=args.access_log,
        ws_max_size=ws_transport_limit(settings.max_body_bytes),
        ws_per_message_deflate=args.ws_compression,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=args.keep_alive,
        backlog=2048,
    )
    return 0

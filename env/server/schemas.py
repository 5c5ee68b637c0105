"""The static documents the server serves, from the environment's :class:`~env.server.served.ServedEnv`: JSON
schemas (``GET /schema``), tasks (``GET /tasks``) and metadata (``GET /metadata``)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from env.server.served import ServedEnv


def schema_document(served: ServedEnv) -> dict[str, Any]:
    """``GET /schema``: the action, observation and state JSON schemas."""
    return {"action": served.action_schema, "observation": served.observation_schema, "state": served.state_schema}


def tasks_document(served: ServedEnv) -> dict[str, Any]:
    """``GET /tasks``: every task by id with its description."""
    return dict(served.tasks)


def metadata_document(served: ServedEnv, version: str) -> dict[str, Any]:
    """``GET /metadata``: the environment card (the reference's fields), with the readme as ``readme_content``."""
    return {
        "name": served.app_name,
        "description": served.description,
        "readme_content": _read(served.readme),
        "version": version,
        "author": served.author,
        "documentation_url": "/docs",
    }


def _read(path: Path | None) -> str | None:
    if path is not None:
        with contextlib.suppress(OSError):
            return path.read_text(encoding="utf-8")
    return None

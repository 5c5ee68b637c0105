"""Files that later runs trust: atomic writes, tolerant reads of JSON markers, and content digests.

A re-run in the same output folder reads back what an earlier run wrote (evaluation caches, reports, the marker
files that say a step is finished) and skips the work they vouch for. So every such file is written atomically:
:func:`write_bytes_atomic` writes a temporary file in the same folder, flushes and fsyncs it, then renames it into
place with ``os.replace``, and a kill at any moment leaves either the old file or the new one, never half of one.
A marker is written after the data it vouches for. :func:`read_json` reads a marker back and treats one that does
not parse (damaged, or torn by a writer that was not atomic) as absent, with a warning: the step runs again and
overwrites it.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import uuid
import warnings
from pathlib import Path
from typing import Any

# file_sha256 results by (path, inode, size, mtime_ns): a file is read once per process until it changes.
_DIGESTS: dict[tuple[str, int, int, int], str] = {}


def write_bytes_atomic(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file beside it, fsync, ``os.replace``); returns ``path``.

    The temporary file is removed when the write fails; a killed process may leave one behind (a hidden
    ``.<name>.<random>.tmp`` file), never a partial ``path``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "xb") as fh:  # not mkstemp: that makes the file private, and os.replace would keep it so
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())  # the bytes are on disk before the name points at them
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """:func:`write_bytes_atomic` for text (UTF-8)."""
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: str | Path, data: Any) -> Path:
    """:func:`write_bytes_atomic` for JSON (indented; values JSON does not know are written as strings)."""
    return write_text_atomic(path, json.dumps(data, indent=2, default=str) + "\n")


def save_figure_atomic(fig: Any, path: str | Path, dpi: int) -> Path:
    """Save the matplotlib figure ``fig`` to ``path`` atomically, in the format its suffix names (e.g. PNG)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=Path(path).suffix.lstrip(".") or "png", dpi=dpi)
    return write_bytes_atomic(path, buffer.getvalue())


def read_json(path: str | Path) -> Any | None:
    """The JSON in ``path``, or ``None`` when there is no such file or it does not parse.

    A file that does not parse is reported with a warning naming it and treated as absent, so the caller redoes
    the step that writes it (and overwrites the file) instead of failing on every re-run until someone deletes it.
    """
    path = Path(path)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        warnings.warn(
            f"{path} is not valid JSON ({exc}): treating it as absent and redoing what it records", stacklevel=2
        )
        return None


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of the file's bytes (hex), read once per process while its size and modification time stay."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_ino, stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        with open(path, "rb") as fh:
            _DIGESTS[key] = hashlib.file_digest(fh, "sha256").hexdigest()
    return _DIGESTS[key]

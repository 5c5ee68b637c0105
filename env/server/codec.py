"""JSON for the server: compact, always-encodable replies and strict parsing of requests.

Replies use orjson when it is installed (same values, faster) and fall back to the standard library. Requests are
parsed strictly: NaN, Infinity, numbers beyond a float and integers over Python's 4300-digit limit are refused, and
:func:`find_lone_surrogate` finds the strings that no UTF-8 reply could echo.
"""

from __future__ import annotations

import json
import math
from typing import Any

try:  # optional, never required: same values (shortest round-trip floats), faster
    import orjson as _orjson
except ImportError:  # pragma: no cover - depends on the environment
    _orjson = None

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
# A lone surrogate has no UTF-8 form, but its \uXXXX escape is valid JSON in plain ASCII.
_ASCII_ENCODER = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False)


def dumps(obj: Any) -> bytes:
    """Compact JSON bytes (the float text is Python's shortest round-trip repr, as in the reference).

    Always encodable: a string with a lone surrogate is written as a ``\\uXXXX`` escape instead of failing.
    """
    if _orjson is not None:
        try:
            return _orjson.dumps(obj)
        except TypeError:  # orjson.JSONEncodeError, e.g. a lone surrogate: the encoders below handle it
            pass
    try:
        return _ENCODER.encode(obj).encode()
    except UnicodeEncodeError:
        return _ASCII_ENCODER.encode(obj).encode()


def dumps_text(obj: Any) -> str:
    """:func:`dumps` as text (WebSocket text frames); always encodable as UTF-8 by the transport."""
    return dumps(obj).decode()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses as inf, which no JSON reply could carry
        raise ValueError(f"number out of range: {text[:40]}")
    return value


def loads(data: bytes | str) -> Any:
    """Strict JSON: NaN/Infinity and out-of-range numbers are rejected (they cannot be sent back in a JSON error),
    and so are integers over Python's 4300-digit conversion limit (``ValueError``)."""
    return json.loads(data, parse_constant=_reject_constant, parse_float=_finite_float)


def find_lone_surrogate(value: Any) -> tuple[list, str] | None:
    """``(path, string)`` of a string, or object key, holding a lone surrogate in parsed JSON; else None.

    Such strings come from ``\\ud800``-style escapes. They cannot be encoded as UTF-8, so a reply echoing one
    would fail; they are refused at input instead.
    """
    stack: list[tuple[list, Any]] = [([], value)]
    while stack:  # iterative: the parser accepts deeper nesting than a recursive walk would
        path, item = stack.pop()
        if isinstance(item, str):
            if _has_surrogate(item):
                return path, item
        elif isinstance(item, dict):
            for key, child in item.items():
                if _has_surrogate(key):
                    return [*path, printable(key)], key
                stack.append(([*path, key], child))
        elif isinstance(item, list):
            stack.extend(([*path, i], child) for i, child in enumerate(item))
    return None


def _has_surrogate(text: str) -> bool:
    if text.isascii():
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def printable(text: str) -> str:
    """``text`` with every character UTF-8 cannot encode (a lone surrogate) replaced by ``?``."""
    return text.encode("utf-8", "replace").decode()

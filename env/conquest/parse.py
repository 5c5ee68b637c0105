"""The answer contract of spec section 7.4: a model reply -> candidate index, or the reason it is refused.

A reply is valid iff, after stripping surrounding whitespace, ``json.loads`` yields an object with exactly one key
``"action_index"`` whose value is an ``int`` (not ``bool``) in ``[0, n)``. The checks run in the order of the
reasons: ``invalid_json``, ``not_object``, ``missing_key``, ``extra_keys``, ``bad_type``, ``out_of_range`` (an
object lacking ``action_index`` is ``missing_key`` whatever else it holds). ``illegal`` is decided by the caller,
which maps the index to an action. Nothing here raises: non-string replies, lone surrogates, numbers too long for
``int`` and pathological nesting are all ``invalid_json``.
"""

from __future__ import annotations

import json
from typing import Any

KEY = "action_index"
REASONS = ("invalid_json", "not_object", "missing_key", "extra_keys", "bad_type", "out_of_range", "illegal")


def check_index(k: Any, n: int) -> tuple[int | None, str | None]:
    """``(k, None)`` if ``k`` is an int (not bool) in ``[0, n)``, else ``(None, "bad_type" | "out_of_range")``."""
    if type(k) is not int:
        return None, "bad_type"
    if not 0 <= k < n:
        return None, "out_of_range"
    return k, None


def parse_reply(reply: Any, n: int) -> tuple[int | None, str | None]:
    """``(index, None)`` for a valid reply to a list of ``n`` candidates, else ``(None, reason)``."""
    if not isinstance(reply, str):
        return None, "invalid_json"
    try:
        value = json.loads(reply.strip())
    except (ValueError, RecursionError, UnicodeError, TypeError):
        return None, "invalid_json"
    if not isinstance(value, dict):
        return None, "not_object"
    if KEY not in value:
        return None, "missing_key"
    if len(value) != 1:
        return None, "extra_keys"
    return check_index(value[KEY], n)

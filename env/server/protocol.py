"""The wire contract both transports share: names, the error type and its codes, and request validation.

Every refusal is an :class:`ApiError` carrying an HTTP status, a WebSocket error code (``VALIDATION_ERROR``,
``INVALID_JSON``, ``EXECUTION_ERROR``, ``RATE_LIMITED``) and a ``detail`` that is either a message or a list of
FastAPI-style validation errors, so that both transports report the same thing.
"""

from __future__ import annotations

import json
from typing import Any

from env.server.codec import find_lone_surrogate, loads, printable
from env.server.served import ActionError, ServedEnv

COOKIE_NAME = "acr_session_id"
NO_SESSION = "No active session. Call /reset first."
SESSION_LOST = "Session expired or missing. Call /reset first."


class ApiError(Exception):
    """An error with an HTTP status, a WebSocket code and a JSON-able detail."""

    def __init__(self, status: int, detail: Any, code: str = "EXECUTION_ERROR", headers: dict | None = None):
        super().__init__(detail if isinstance(detail, str) else "validation error")
        self.status = status
        self.detail = detail
        self.code = code
        self.headers = headers

    @property
    def message(self) -> str:
        """The detail as one line; validation errors read like the in-process env's ``ValueError``."""
        if isinstance(self.detail, str):
            return self.detail
        parts = []
        for err in self.detail:
            loc = [str(p) for p in err.get("loc", ())]
            if loc[:1] == ["body"]:  # an action field, named as the in-process env names it
                what = "action field '" + (".".join(loc[1:]) or "action") + "'"
            else:
                what = "field '" + ".".join(loc) + "'"
            parts.append(f"invalid {what}: {err.get('msg')} (got {err.get('input')!r})")
        return "; ".join(parts)


ECHO_DEPTH = 16  # echoed inputs are cut below this depth: deeper ones would overflow the recursion of the encoders


def _jsonable(value: Any, depth: int = 0) -> Any:
    """Make an error item JSON-safe (bytes -> text, unknown objects -> str, nesting cut at ``ECHO_DEPTH``)."""
    if isinstance(value, dict | list | tuple) and depth >= ECHO_DEPTH:
        return "..."
    if isinstance(value, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v, depth + 1) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, float) and value != value:  # NaN
        return None
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


INT64_LIMIT = 2**63


def check_action(served: ServedEnv, payload: Any) -> dict[str, Any]:
    """The action of a step payload (``served.parse_action``); raise ApiError(422) with FastAPI's ``detail`` list
    (each ``loc`` under ``"body"``) on a schema violation."""
    try:
        return served.parse_action(payload)
    except ActionError as exc:
        detail = [_jsonable({**err, "loc": ["body", *err["loc"]]}) for err in exc.errors]
        raise ApiError(422, detail, "VALIDATION_ERROR") from None


def check_task(served: ServedEnv, task_id: Any, loc: tuple = ("body", "task_id")) -> str:
    """The canonical task id: ``None`` -> ``served.default_task``, an id of ``served.tasks`` as it is, any other
    through ``served.resolve_task``; 400 with the message ``Unknown task: ...`` if unknown, 422 if not a string."""
    if task_id is not None and not isinstance(task_id, str):
        raise ApiError(422, [_string_type_error(task_id, loc)], "VALIDATION_ERROR")
    if task_id is None:
        return served.default_task
    if task_id in served.tasks:
        return task_id
    if served.resolve_task is None:
        raise ApiError(400, f"Unknown task: {task_id}. Available: {list(served.tasks)}", "VALIDATION_ERROR")
    try:
        return served.resolve_task(task_id)
    except ValueError as exc:
        raise ApiError(400, str(exc), "VALIDATION_ERROR") from None


def check_episode_id(episode_id: Any, loc: tuple) -> str | None:
    """``None``, a string, or a number or boolean as text; 422 for objects and arrays."""
    if episode_id is None or isinstance(episode_id, str):
        return episode_id
    if isinstance(episode_id, int | float):  # bool included
        return str(episode_id)
    raise ApiError(422, [_string_type_error(episode_id, loc)], "VALIDATION_ERROR")


def _string_type_error(value: Any, loc: tuple) -> dict[str, Any]:
    return _jsonable(
        {"type": "string_type", "loc": list(loc), "msg": "Input should be a valid string", "input": value}
    )


SEED_LIMIT = INT64_LIMIT


def check_seed(seed: Any, loc: tuple, minimum: int | None = None) -> int | None:
    """``None`` or an int with ``|seed| < 2**63`` and, when ``minimum`` is given (the environment's
    ``ServedEnv.min_seed``), ``seed >= minimum``; 422 otherwise."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, int):
        detail = [{"type": "int_type", "loc": list(loc), "msg": "Input should be a valid integer", "input": seed}]
        raise ApiError(422, _jsonable(detail), "VALIDATION_ERROR")
    if not -SEED_LIMIT < seed < SEED_LIMIT:
        detail = [{"type": "int_range", "loc": list(loc), "msg": "Seed must be a 64-bit integer", "input": str(seed)}]
        raise ApiError(422, detail, "VALIDATION_ERROR")
    if minimum is not None and seed < minimum:
        msg = f"Input should be greater than or equal to {minimum}"
        detail = [{"type": "greater_than_equal", "loc": list(loc), "msg": msg, "input": seed, "ctx": {"ge": minimum}}]
        raise ApiError(422, detail, "VALIDATION_ERROR")
    return seed


def check_surrogates(value: Any, raw: bytes | str, prefix: tuple) -> None:
    """Raise ApiError(422, VALIDATION_ERROR) if the parsed JSON ``value`` (parsed from ``raw``) holds a lone
    surrogate. Only an escape, or a non-ASCII byte (bytes are decoded with ``surrogatepass``), can produce one, so
    the usual ASCII document without escapes is not walked."""
    if isinstance(raw, str):
        suspect = "\\u" in raw or not raw.isascii()
    else:
        suspect = b"\\u" in raw or not raw.isascii()
    found = find_lone_surrogate(value) if suspect else None
    if found is None:
        return
    path, text = found
    detail = {
        "type": "string_unicode",
        "loc": [*prefix, *path],
        "msg": "Input should be a valid string: lone surrogates (\\ud800-\\udfff) are not valid Unicode",
        "input": printable(text),
    }
    raise ApiError(422, [detail], "VALIDATION_ERROR")


def _is_json_content_type(value: str | None) -> bool:
    if value is None:
        return True
    main = value.split(";", 1)[0].strip().lower()
    return main == "application/json" or (main.startswith("application/") and main.endswith("+json"))


def parse_json_body(body: bytes, content_type: str | None) -> Any:
    """A request body parsed like FastAPI does for a JSON body parameter; ``None`` if empty."""
    if not body:
        return None
    if not _is_json_content_type(content_type):
        return body  # validated as the action -> 422 model_attributes_type, like FastAPI
    try:
        value = loads(body)
    except json.JSONDecodeError as exc:
        detail = {"type": "json_invalid", "loc": ["body", exc.pos], "msg": "JSON decode error", "input": {}}
        detail["ctx"] = {"error": exc.msg}
        raise ApiError(422, [detail], "INVALID_JSON") from None
    except (ValueError, RecursionError) as exc:
        detail = {"type": "json_invalid", "loc": ["body", 0], "msg": "JSON decode error", "input": {}}
        detail["ctx"] = {"error": str(exc) or type(exc).__name__}
        raise ApiError(422, [detail], "INVALID_JSON") from None
    check_surrogates(value, body, ("body",))
    return value

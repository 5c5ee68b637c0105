"""Logging filters of the server, installed on uvicorn's loggers by :func:`install_log_filters` when it starts.

* :class:`RedactTokenFilter` replaces the value of a ``token`` query parameter with ``***`` in log lines. uvicorn
  prints request paths with their query string: the access log (``uvicorn.access``, HTTP requests) and the
  WebSocket handshake lines (``"WebSocket /ws?token=..." [accepted]``, on ``uvicorn.error``), and a WebSocket
  client may authenticate with ``?token=`` (:class:`~env.server.access.AccessGuard`).
* :class:`QuietInvalidUtf8Filter` turns uvicorn's report of a WebSocket text frame that is not valid UTF-8 (an
  error with the full traceback of the ``UnicodeDecodeError``) into one warning line. What the client gets is
  unchanged: uvicorn closes that connection with 1007, and the server goes on.
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus

TOKEN_PARAM = "token"
REDACTED = "***"
# uvicorn's message (uvicorn.protocols.websockets.websockets_sansio_impl) for a text frame that does not decode.
INVALID_UTF8_MESSAGE = "Invalid UTF-8 sequence received from client."
_QUERY_END = re.compile(r'[\s"]')


def redact_token(text: str) -> str:
    """``text`` with the value of every ``token`` parameter of its query string replaced by ``***``.

    The query runs from the first ``?`` to the next space or double quote (or the end); its ``&``-separated pairs are
    compared by their decoded name (as :func:`urllib.parse.parse_qs` reads them, so ``%74oken=`` is a token too).
    Every other pair, and the text around the query, is kept as written.
    """
    path, sep, rest = text.partition("?")
    if not sep:
        return text
    query = _QUERY_END.split(rest, maxsplit=1)[0]
    pairs = query.split("&")
    for i, pair in enumerate(pairs):
        name, eq, _ = pair.partition("=")
        if eq and unquote_plus(name) == TOKEN_PARAM:
            pairs[i] = f"{name}={REDACTED}"
    return f"{path}?{'&'.join(pairs)}{rest[len(query) :]}"


class RedactTokenFilter(logging.Filter):
    """Redact ``token`` query values (:func:`redact_token`) in the string arguments of a record, and in its message
    when it has no arguments. The arguments keep their number and order, as uvicorn's access formatter needs."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and record.args:
            record.args = tuple(redact_token(a) if isinstance(a, str) else a for a in record.args)
        elif not record.args and isinstance(record.msg, str):
            record.msg = redact_token(record.msg)
        return True


class QuietInvalidUtf8Filter(logging.Filter):
    """Log uvicorn's invalid-UTF-8 WebSocket frame error as one warning line: no traceback, level WARNING."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == INVALID_UTF8_MESSAGE:
            record.msg = "Invalid UTF-8 in a WebSocket text frame: connection closed with 1007."
            record.args = ()
            record.levelno = logging.WARNING
            record.levelname = logging.getLevelName(logging.WARNING)
            record.exc_info = None
            record.exc_text = None
            record.stack_info = None
        return True


def install_log_filters() -> None:
    """Add the filters to uvicorn's loggers: token redaction on ``uvicorn.access`` and ``uvicorn.error``, the quiet
    invalid-UTF-8 report on ``uvicorn.error``. Idempotent. Logger filters survive uvicorn's own logging setup
    (``logging.config.dictConfig`` replaces handlers, not filters), so this may run before ``uvicorn.run``."""
    wanted = {
        "uvicorn.access": (RedactTokenFilter,),
        "uvicorn.error": (RedactTokenFilter, QuietInvalidUtf8Filter),
    }
    for name, kinds in wanted.items():
        logger = logging.getLogger(name)
        for kind in kinds:
            if not any(type(f) is kind for f in logger.filters):
                logger.addFilter(kind())

"""The versions of Python and of the packages that decide a result, recorded next to it."""

from __future__ import annotations

import platform


def versions() -> dict[str, str]:
    """``{"python": ..., "recruit_trl": ..., "torch": ..., "transformers": ..., "trl": ..., "peft": ...}``, leaving
    out the packages that are not installed."""
    out = {"python": platform.python_version()}
    for name in ("recruit_trl", "torch", "transformers", "trl", "peft"):
        try:
            module = __import__(name)
            out[name] = getattr(module, "__version__", "?")
        except ImportError:
            continue
    return out

"""The versions of Python and of the packages that decide a result, recorded next to it."""

from __future__ import annotations

import importlib.metadata
import platform

from recruit_trl import __version__


def versions() -> dict[str, str]:
    """``{"python": ..., "recruit_trl": ..., "torch": ..., "transformers": ..., "trl": ..., "peft": ...}``, leaving
    out the packages that are not installed.

    Read from the installed packages' metadata, not by importing them: an evaluation of environment policies needs
    none of them, and importing PEFT imports bitsandbytes, which has a line of its own to say on a CPU.
    """
    out = {"python": platform.python_version(), "recruit_trl": __version__}
    for name in ("torch", "transformers", "trl", "peft"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out

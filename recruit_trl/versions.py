"""The versions of Python and of the packages that decide a result, and the commit of the code, recorded next to it."""

from __future__ import annotations

import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Any

from recruit_trl import __version__

# The folder above the package: the repository's top in a git checkout or an editable install.
CODE_ROOT = Path(__file__).resolve().parents[1]


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


def code_commit(root: str | Path = CODE_ROOT) -> dict[str, Any]:
    """The commit of the code that runs: ``{"commit": HEAD's hash, "dirty": whether the working tree has changes}``.

    Read from the git checkout whose top is ``root`` (by default the folder above this package) with ``git
    rev-parse --show-toplevel HEAD`` and ``git status --porcelain``: dirty when the status lists anything, a changed,
    staged or untracked file (an untracked module or recipe may be what runs; ignored files do not count). Both are
    ``None`` when ``root`` is not the top of a checkout (an installed package: its site-packages may lie inside some
    other repository, a virtual environment in a checkout), when git is missing or when it fails.
    """
    unknown = {"commit": None, "dirty": None}

    def git(*args: str) -> str | None:
        # --no-optional-locks: reading the status does not rewrite the index (another git command may be running).
        try:
            proc = subprocess.run(["git", "--no-optional-locks", *args], cwd=root, capture_output=True, text=True,
                                  timeout=60, stdin=subprocess.DEVNULL)  # fmt: skip
        except (OSError, subprocess.SubprocessError):  # no git, no such folder, a hung git
            return None
        return proc.stdout if proc.returncode == 0 else None

    found = git("rev-parse", "--show-toplevel", "HEAD")
    lines = found.splitlines() if found else []
    if len(lines) != 2 or Path(lines[0]).resolve() != Path(root).resolve():
        return unknown
    status = git("status", "--porcelain")
    if status is None:
        return unknown
    return {"commit": lines[1], "dirty": bool(status.strip())}

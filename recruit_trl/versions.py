"""The versions of Python and of the packages that decide a result, and the commit of the code, recorded next to it."""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import subprocess
from pathlib import Path
from typing import Any

from recruit_trl import __version__

# The folder above the package: the repository's top in a git checkout or an editable install.
CODE_ROOT = Path(__file__).resolve().parents[1]
# What runs when a recipe runs, below CODE_ROOT: the plugin, the environments, the rewards, the recipes and their
# configs, and the test environment learning checks run on (tests/toy_env.py); docs and other tests do not run.
CODE_FOLDERS = ("recruit_trl", "env", "rewards", "recipes")
CODE_FILES = ("tests/toy_env.py",)
CODE_SUFFIXES = (".py", ".yaml", ".json")


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


def code_hash(root: str | Path = CODE_ROOT) -> str | None:
    """A hash of the code that runs: every ``.py``, ``.yaml`` and ``.json`` file of :data:`CODE_FOLDERS` below
    ``root`` and :data:`CODE_FILES`, by path and content (tracked by git or not: an untracked module there may be what
    runs). The first 16 hex digits of a sha256; ``None`` when ``root`` holds no ``recruit_trl`` folder (an installed
    package)."""
    root = Path(root)
    if not (root / "recruit_trl").is_dir():
        return None
    paths = [path for folder in CODE_FOLDERS if (root / folder).is_dir() for path in (root / folder).rglob("*")]
    paths += [root / name for name in CODE_FILES]
    digest = hashlib.sha256()
    for path in sorted(p for p in paths if p.is_file() and p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]

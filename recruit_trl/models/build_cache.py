"""The cache of models built or unpacked locally: one folder per build, built once, never left half-written.

Layout
    ``<root>/models/<folder name>/`` where ``<root>`` is ``cache_dir``, else ``$RECRUIT_TRL_CACHE``, else
    ``~/.cache/recruit_trl``. A folder is complete when it holds :data:`METADATA_FILE` (written last by every
    build). Builds go to a temporary ``.<folder name>.tmp-*`` sibling that is renamed into place at the end, under
    an ``fcntl`` lock ``.<folder name>.lock``, so an interrupted build never leaves a broken cache and two processes
    (two ranks of ``accelerate launch``) never build twice: the second waits, then loads.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

try:  # POSIX only; without it builds are still atomic, only the "build once" guarantee is lost
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]


METADATA_FILE = "recruit_trl_model.json"


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir``, else ``$RECRUIT_TRL_CACHE``, else ``~/.cache/recruit_trl``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("RECRUIT_TRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "recruit_trl"


def is_complete(folder: str | Path) -> bool:
    """True when ``folder`` holds a finished build (its metadata file is written last)."""
    folder = Path(folder)
    return (folder / METADATA_FILE).is_file() and (folder / "config.json").is_file()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        if fcntl is not None:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def cached_build(folder: Path, build: Callable[[Path], None]) -> Path:
    """Return ``folder`` if complete, else build it once (locked, into a temp sibling, renamed at the end).

    Args:
        folder: the cache folder of the build.
        build: writes the model into the empty folder it is given, :data:`METADATA_FILE` last.

    Raises:
        RuntimeError: when ``build`` returns without writing :data:`METADATA_FILE`.
    """
    if is_complete(folder):
        return folder
    parent = folder.parent
    with _file_lock(parent / f".{folder.name}.lock"):
        if is_complete(folder):  # another process built it while we waited
            return folder
        # We hold the lock: temp folders of this name are left over from killed builds.
        for stale in parent.glob(f".{folder.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=parent))
        try:
            build(tmp)
            if not is_complete(tmp):
                raise RuntimeError(f"model build into {tmp} finished without writing {METADATA_FILE}")
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; a cache folder is as readable as any
            if folder.exists():  # incomplete leftover (not written by this module's atomic path)
                shutil.rmtree(folder)
            os.rename(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return folder


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

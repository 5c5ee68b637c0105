"""The cache of models built or unpacked locally: one folder per build, built once, never left half-written.

Layout
    ``<root>/models/<folder name>/`` where ``<root>`` is ``cache_dir``, else ``$RECRUIT_TRL_CACHE``, else
    ``~/.cache/recruit_trl``. A folder is complete when it holds :data:`METADATA_FILE` (written last by every
    build). Builds go to a temporary ``.<folder name>.tmp-*`` sibling that is renamed into place at the end, under
    an ``fcntl`` lock ``.<folder name>.lock``, so an interrupted build never leaves a broken cache and two processes
    (two ranks of ``accelerate launch``) never build twice: the second waits, then loads.

In a distributed job (``accelerate launch``, ``torchrun``, DeepSpeed)
    :func:`main_process_first` lets rank 0 build while the other ranks wait at a barrier and then read the finished
    folder. The build itself is a single-process job (:func:`run_alone`): transformers' ``save_pretrained`` writes
    nothing on a rank other than 0 of an initialised ``torch.distributed`` group, so inside such a group a build runs
    in a fresh Python process, outside the group, and writes every file whatever rank started it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

try:  # POSIX only; without it builds are still atomic, only the "build once" guarantee is lost
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]


METADATA_FILE = "recruit_trl_model.json"

# Environment variables through which launchers (torchrun, MPI, accelerate launch) make a process one rank of a job;
# every ``ACCELERATE_*`` variable as well (:func:`is_launcher_variable`).
LAUNCHER_ENV = frozenset(
    {"LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE"}
)


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
        RuntimeError: when ``build`` returns without writing :data:`METADATA_FILE` and ``config.json``.
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
                missing = [name for name in (METADATA_FILE, "config.json") if not (tmp / name).is_file()]
                raise RuntimeError(f"model build into {tmp} finished without writing {' and '.join(missing)}")
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; a cache folder is as readable as any
            if folder.exists():  # incomplete leftover (not written by this module's atomic path)
                shutil.rmtree(folder)
            os.rename(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return folder


def is_launcher_variable(name: str) -> bool:
    """Whether the environment variable ``name`` is one through which a launcher configures a rank of a job."""
    return name in LAUNCHER_ENV or name.startswith("ACCELERATE_")


def _process_group():
    """``torch.distributed`` when this process belongs to an initialised process group, else ``None``.

    Without torch imported there is no group: the check never imports torch itself.
    """
    dist = sys.modules.get("torch.distributed")
    return dist if dist is not None and dist.is_available() and dist.is_initialized() else None


@contextlib.contextmanager
def main_process_first() -> Iterator[None]:
    """Run the block on rank 0 of a distributed job first and on the other ranks after it; alone, just run it.

    Rank 0 builds what the block caches while the others wait at a barrier, then they find it built and only read it.
    Every rank of the job must enter the block. Should rank 0 fail, it still passes the barrier: the other ranks try
    the block themselves and fail with the same error instead of waiting forever. (Not accelerate's
    ``PartialState().main_process_first()``: creating accelerate's state here would fix its device and ranks before
    the training arguments do.)
    """
    dist = _process_group()
    if dist is None or dist.get_world_size() == 1:
        yield
        return
    if dist.get_rank() != 0:
        dist.barrier()  # until rank 0 has left the block
    try:
        yield
    finally:
        if dist.get_rank() == 0:
            dist.barrier()  # lets the other ranks in


# Run in the fresh process of run_alone: the parent's import path first (so ``fn`` unpickles from where the parent
# found it), then the job.
_ALONE = (
    "import pickle, sys\n"
    "path, job = pickle.load(sys.stdin.buffer)\n"
    "sys.path[:] = path\n"
    "fn, args = pickle.loads(job)\n"
    "fn(*args)\n"
)


def run_alone(fn: Callable[..., Any], *args: Any) -> None:
    """Run ``fn(*args)`` as a single-process job: here, or in a fresh Python process when this one is a rank of a job.

    A rank belongs to the job's ``torch.distributed`` group (accelerate initialises it when the training arguments
    are parsed), and in such a group transformers' ``save_pretrained`` writes nothing on any rank but 0: a build run
    by rank 1 would leave a folder without its config and weights. The fresh process belongs to no group and sees none
    of the launcher's variables (:func:`is_launcher_variable`), so a build writes every file whatever rank runs it,
    and its Trainer runs alone. Outside a group the build runs here, without the cost of a second Python.

    ``fn`` must be a module-level function, and ``fn`` and ``args`` must pickle.

    Raises:
        RuntimeError: when the fresh process fails (its traceback is on the same stderr, above).
    """
    if _process_group() is None:
        fn(*args)
        return
    env = {name: value for name, value in os.environ.items() if not is_launcher_variable(name)}
    job = pickle.dumps((sys.path, pickle.dumps((fn, args))))
    returncode = subprocess.run([sys.executable, "-c", _ALONE], input=job, env=env, check=False).returncode
    if returncode:
        raise RuntimeError(f"{fn.__module__}.{fn.__qualname__} failed in its own process (exit code {returncode})")


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask

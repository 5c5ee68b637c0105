"""Golden replay, shared by the environments' ``python -m env.<name>.golden FILE ...`` commands.

Each environment loads its own golden format and replays one episode; this module runs the episodes of several files,
prints a ``FAIL`` line per failing episode (every episode with ``verbose``) and ends with ``N passed, M failed``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

Episode = dict[str, Any]


def replay_files(
    files: Iterable[str],
    load: Callable[[str], list[Episode]],
    replay: Callable[[Episode], list[str]],
    label: Callable[[Episode], str],
    verbose: bool = False,
) -> int:
    """Replay every episode of ``files``; the exit status: 0 when every episode passed, else 1.

    Args:
        files: golden files.
        load: a file's episodes.
        replay: one episode's problems (none: it passed).
        label: how an episode is named in the output, after ``FILE#k``.
        verbose: print passing episodes too.
    """
    passed = failed = 0
    for path in files:
        for k, episode in enumerate(load(path)):
            name = f"{path}#{k} {label(episode)}".rstrip()
            try:
                problems = replay(episode)
            except Exception as exc:  # a crash fails this episode, not the whole run
                problems = [f"crashed: {type(exc).__name__}: {exc}"]
            if problems:
                failed += 1
                print(f"FAIL {name}: {problems[0]}")
            else:
                passed += 1
                if verbose:
                    print(f"ok   {name}")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1

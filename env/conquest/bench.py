"""conquest throughput benchmark: agent decisions/s, bot-only games/s and snapshot+restore/s per task.

Usage: ``python -m env.conquest.bench [--tasks duel easy3 classic3 classic6] [--games 20] [--repeats 5]
[--json FILE]``.

* **agent decisions/s**: full games on seeds ``0 .. games-1`` through the agent interface, the teacher answering
  (``env.step_index(teacher_index(env))``); the time covers ``reset``, the teacher, the step (bot turns included)
  and the observation, candidate list and ``info`` of every decision.
* **bot-only games/s**: the same seeds played by the engine alone, the agent's seat by the ``balanced`` bot (the
  teacher's policy), with no observation, candidate list or reward: what a game costs without the agent
  interface, e.g. inside a lookahead. A game ends as the env's does: the agent's seat wins or is eliminated, or
  the round limit passes. Design target: a ``classic3`` game in tens of milliseconds.
* **snapshot+restore/s**: ``env.restore(env.snapshot())`` pairs on a mid-game state (seed 0 after
  :data:`SNAPSHOT_AFTER` teacher decisions). Design target: >= 20,000/s.

Every measurement is timed twice: wall clock (the headline figures, as ``python -m env.clinical.bench`` reports)
and the CPU time of this process (the ``cpu`` figures). On an idle machine the two agree; on a machine shared with
other jobs the wall-clock figures drop with the share of a core the benchmark gets (``cpu_share``, CPU / wall),
while the CPU-time figures measure the environment alone, so the design targets are judged on them. Each figure is
the median over ``--repeats`` runs. The table goes to stdout; ``--json FILE`` writes the report atomically, with
the machine's load average.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from env.conquest.bots import BOTS
from env.conquest.core import ConquestEnv
from env.conquest.policies import teacher_index
from env.conquest.rules import apply, auto_event, forced_action, new_game
from env.conquest.state import Game
from env.conquest.tasks import TASKS, resolve_options

DEFAULT_TASKS = tuple(TASKS)
AGENT_BOT = "balanced"  # plays the agent's seat in bot-only games (the teacher's policy)
SNAPSHOT_AFTER = 30  # teacher decisions before the snapshot+restore measurement
SNAPSHOTS_PER_RUN = 5000
SNAPSHOT_TARGET_PER_S = 20_000
BOT_GAME_TARGET_MS = {"classic3": 100.0}  # "tens of milliseconds"


# ---------------------------------------------------------------------------------------------- measurements
@dataclasses.dataclass(frozen=True)
class Timing:
    """``count`` operations in ``wall`` seconds of wall clock and ``cpu`` seconds of this process's CPU time."""

    count: int
    wall: float
    cpu: float

    @property
    def per_s(self) -> float:
        return self.count / self.wall

    @property
    def per_cpu_s(self) -> float:
        return self.count / max(self.cpu, 1e-9)


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def _since(count: int, start: tuple[float, float]) -> Timing:
    wall, cpu = _clocks()
    return Timing(count, wall - start[0], cpu - start[1])


def bench_decisions(task: str, games: int) -> Timing:
    """Agent decisions of ``games`` teacher games (seeds 0, 1, ...), resets included."""
    env = ConquestEnv(task)
    decisions = 0
    start = _clocks()
    for seed in range(games):
        env.reset(seed=seed)
        done = env.done
        while not done:
            _, _, terminated, truncated, _ = env.step_index(teacher_index(env))
            done = terminated or truncated
            decisions += 1
    return _since(decisions, start)


def play_bot_game(task: str, seed: int) -> Game:
    """One game of ``task`` played by the engine alone, the agent's seat by :data:`AGENT_BOT`, to the env's end (the
    agent's seat wins or is eliminated, or the round limit); returns the final state."""
    opts = resolve_options({"task": task, "seed": seed})
    opts = dataclasses.replace(opts, bots=tuple(AGENT_BOT if b is None else b for b in opts.bots))
    g = new_game(opts, seed)
    bots = opts.bots
    while not g.done:
        a = forced_action(g)
        if a is not None:
            auto_event(g, a)
        else:
            a = BOTS[bots[g.cur]](g)
        apply(g, a)
    return g


def bench_bot_games(task: str, games: int) -> Timing:
    """Bot-only games on seeds ``0 .. games-1``."""
    start = _clocks()
    for seed in range(games):
        play_bot_game(task, seed)
    return _since(games, start)


def bench_snapshots(task: str, n: int) -> Timing:
    """``n`` snapshot + restore pairs on a mid-game state."""
    env = ConquestEnv(task)
    env.reset(seed=0)
    for _ in range(SNAPSHOT_AFTER):
        if env.done:
            break
        env.step_index(teacher_index(env))
    start = _clocks()
    for _ in range(n):
        env.restore(env.snapshot())
    return _since(n, start)


# ---------------------------------------------------------------------------------------------- the report
def _figures(decisions: list[float], games: list[float], snaps: list[float]) -> dict[str, Any]:
    games_per_s = statistics.median(games)
    return {
        "decisions_per_s": round(statistics.median(decisions)),
        "bot_games_per_s": round(games_per_s, 2),
        "bot_game_ms": round(1000 / games_per_s, 2),
        "snapshot_restore_per_s": round(statistics.median(snaps)),
    }


def run(tasks: list[str], games: int, repeats: int) -> dict[str, Any]:
    """Measure every task ``repeats`` times and return the report dict (medians)."""
    unknown = [task for task in tasks if task not in TASKS]
    if unknown:
        raise ValueError(f"Unknown tasks {unknown}; known: {list(TASKS)}")
    if games < 1 or repeats < 1:
        raise ValueError("games and repeats must be >= 1")
    load_before = os.getloadavg()[0]
    results = {}
    for task in tasks:
        timings: list[tuple[Timing, Timing, Timing]] = []
        for _ in range(repeats):
            timings.append(
                (bench_decisions(task, games), bench_bot_games(task, games), bench_snapshots(task, SNAPSHOTS_PER_RUN))
            )
        wall = _figures(*([t[i].per_s for t in timings] for i in range(3)))
        cpu = _figures(*([t[i].per_cpu_s for t in timings] for i in range(3)))
        share = statistics.median(sum(t.cpu for t in row) / sum(t.wall for t in row) for row in timings)
        results[task] = {
            **wall,
            "decisions_per_game": round(timings[0][0].count / games, 1),
            "cpu": cpu,
            "cpu_share": round(share, 3),
        }
    targets = {
        "snapshot_restore_per_s": {
            task: r["cpu"]["snapshot_restore_per_s"] >= SNAPSHOT_TARGET_PER_S for task, r in results.items()
        },
        "bot_game_ms": {
            task: results[task]["cpu"]["bot_game_ms"] <= limit
            for task, limit in BOT_GAME_TARGET_MS.items()
            if task in results
        },
    }
    return {
        "results": results,
        "targets_met": targets,
        "config": {
            "games": games,
            "repeats": repeats,
            "seeds": f"0-{games - 1}",
            "agent_policy": "teacher (step_index)",
            "bot_only_agent_seat": AGENT_BOT,
            "snapshot_after_decisions": SNAPSHOT_AFTER,
            "snapshots_per_run": SNAPSHOTS_PER_RUN,
            "targets": {
                "judged_on": "cpu",
                "snapshot_restore_per_s_min": SNAPSHOT_TARGET_PER_S,
                "bot_game_ms_max": BOT_GAME_TARGET_MS,
            },
        },
        "machine": {
            "python": platform.python_version(),
            "processor": platform.machine(),
            "cpus": os.cpu_count(),
            "load_avg_1m": {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2)},
        },
    }


def format_table(report: dict[str, Any]) -> str:
    """The report as text: wall-clock and CPU-time figures per task, then whether the design targets are met."""
    header = (
        f"{'task':<10}{'clock':<6}{'decisions/s':>13}{'dec/game':>10}{'bot games/s':>13}{'ms/game':>9}"
        f"{'snap+restore/s':>16}{'cpu share':>11}"
    )
    lines = [header, "-" * len(header)]
    for task, r in report["results"].items():
        for clock, f in (("wall", r), ("cpu", r["cpu"])):
            share = f"{r['cpu_share']:>11.2f}" if clock == "wall" else ""
            lines.append(
                f"{task:<10}{clock:<6}{f['decisions_per_s']:>13,}{r['decisions_per_game']:>10}"
                f"{f['bot_games_per_s']:>13,}{f['bot_game_ms']:>9}{f['snapshot_restore_per_s']:>16,}{share}"
            )
    met = report["targets_met"]
    snaps = "yes" if all(met["snapshot_restore_per_s"].values()) else "NO"
    lines += ["", f"target (cpu): snapshot+restore >= {SNAPSHOT_TARGET_PER_S:,}/s on every task: {snaps}"]
    for task, ok in met["bot_game_ms"].items():
        lines.append(f"target (cpu): bot-only {task} game <= {BOT_GAME_TARGET_MS[task]:g} ms: {'yes' if ok else 'NO'}")
    load = report["machine"]["load_avg_1m"]
    lines.append(f"load average (1 min): {load['before']} before, {load['after']} after")
    return "\n".join(lines)


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write ``data`` as JSON so that readers see either the old file or the whole new one (a temporary file in
    the same folder, then ``os.replace``)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "x") as fh:
            fh.write(json.dumps(data, indent=2) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m env.conquest.bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--tasks", nargs="+", default=list(DEFAULT_TASKS), choices=list(TASKS), help="tasks to measure"
    )
    parser.add_argument("--games", type=int, default=20, help="games (seeds 0..games-1) per measurement")
    parser.add_argument("--repeats", type=int, default=5, help="measurements per figure (the median is kept)")
    parser.add_argument("--json", help="also write the report to this JSON file")
    args = parser.parse_args(argv)
    if args.games < 1 or args.repeats < 1:
        parser.error("--games and --repeats must be >= 1")
    report = run(args.tasks, args.games, args.repeats)
    print(format_table(report))
    if args.json:
        write_json_atomic(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

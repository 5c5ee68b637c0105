"""Environment throughput benchmark: steps/s per task and action style, against another commit in the same run.

Usage: ``python -m env.clinical.bench [--tasks easy_bench medium_bench hard_bench] [--episodes 20] [--repeats 5]
[--against REV [--cache_dir DIR]] [--json FILE]``.

Steps/s plays full episodes of the README quick-start policy on seeds ``0 .. episodes-1``, timing ``reset``,
``env.step`` and the policy, in two action styles: ``complete`` (the quick-start's dicts, with ``hypothesis``
and ``confidence``) and ``minimal`` (the same decisions as an LLM's JSON contract writes them: ``action_type``
and its arguments, every optional field left out). Resets/s and snapshot+restore/s are measured too.

``--against REV`` measures the environment of commit ``REV`` as well, from a ``git worktree`` kept in a cache
folder (``$XDG_CACHE_HOME/recruit_trl/env-bench``, else ``~/.cache/...``; reused across runs). Each tree is
imported by its own worker process (its own ``sys.path``, so the two ``env`` packages never meet), and both run
the policy code of this file. The measurements of the two trees alternate (A B, then B A, ...) so that load from
other jobs on the machine hits both alike; each figure is the median over ``--repeats`` runs, and the ratio is
the median of the per-round ratios. The table goes to stdout, then the report as JSON.

Only the standard library is imported at module level: the workers load this file as a script before they put
the measured tree on ``sys.path``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

ACTION_STYLES = ("complete", "minimal")
DEFAULT_TASKS = ("easy_bench", "medium_bench", "hard_bench")
THIS_TREE = Path(__file__).resolve().parents[2]
RESETS_PER_RUN = 200
SNAPSHOTS_PER_RUN = 2000


# ---------------------------------------------------------------------------------------------- the policy
def quickstart_action(obs: dict[str, Any]) -> dict[str, Any]:
    """The README quick-start policy (:func:`env.clinical.policies.heuristic_policy`), the same code for every tree."""
    sites = list(obs["site_performance"])
    if obs["allocation_candidates"] and sites:
        patient = obs["allocation_candidates"][0]["id"]
        return {"action_type": "allocate_to_site", "patient_id": patient, "site_id": sites[0], "confidence": 0.5}
    if obs["recontact_candidates"]:
        return {"action_type": "recontact", "patient_id": obs["recontact_candidates"][0]["id"], "confidence": 0.5}
    if obs["available_patients"]:
        return {
            "action_type": "screen_patient",
            "patient_id": obs["available_patients"][0]["id"],
            "hypothesis": "noise_dominant",
            "confidence": 0.7,
        }
    return {"action_type": "adjust_strategy", "strategy_change": "increase_outreach", "confidence": 0.5}


def minimal_action(obs: dict[str, Any]) -> dict[str, Any]:
    """The quick-start's decision without the optional annotations, as an LLM's JSON contract writes it."""
    action = quickstart_action(obs)
    del action["confidence"]
    action.pop("hypothesis", None)
    return action


POLICIES = {"complete": quickstart_action, "minimal": minimal_action}


# ---------------------------------------------------------------------------------------------- measurements
def bench_steps(env_cls: type, task: str, episodes: int, style: str) -> float:
    """Steps per second over ``episodes`` full episodes (seeds 0, 1, ...), resets included."""
    env = env_cls(task)
    policy = POLICIES[style]
    steps = 0
    start = time.perf_counter()
    for seed in range(episodes):
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            obs, _, terminated, truncated, _ = env.step(policy(obs))
            done = terminated or truncated
            steps += 1
    return steps / (time.perf_counter() - start)


def bench_resets(env_cls: type, task: str, n: int) -> float:
    env = env_cls(task)
    start = time.perf_counter()
    for seed in range(n):
        env.reset(seed=seed)
    return n / (time.perf_counter() - start)


def bench_snapshots(env_cls: type, task: str, n: int, day: int = 90) -> float:
    """Snapshot + restore pairs per second, on a mid-episode state (``day`` steps of the quick-start policy)."""
    env = env_cls(task)
    obs, _ = env.reset(seed=0)
    for _ in range(min(day, env.task.max_steps // 2)):
        obs, *_ = env.step(quickstart_action(obs))
    start = time.perf_counter()
    for _ in range(n):
        env.restore(env.snapshot())
    return n / (time.perf_counter() - start)


def measure(env_cls: type, job: dict[str, Any]) -> float:
    """Run one measurement job (``{"measure": "steps" | "resets" | "snapshots", "task": ..., ...}``)."""
    if job["measure"] == "steps":
        return bench_steps(env_cls, job["task"], job["episodes"], job["style"])
    if job["measure"] == "resets":
        return bench_resets(env_cls, job["task"], job["n"])
    if job["measure"] == "snapshots":
        return bench_snapshots(env_cls, job["task"], job["n"])
    raise ValueError(f"unknown measurement {job['measure']!r}")


# ---------------------------------------------------------------------------------------------- worker processes
def worker_main(root: str) -> int:
    """Serve measurement jobs for the tree at ``root``: one JSON job per stdin line, one JSON result per line."""
    sys.path.insert(0, root)
    import inspect

    # ``env`` exports the class in every tree, before and after the environment moved to env/clinical/.
    from env.clinical import ClinicalRecruitmentEnv

    print(json.dumps({"env_file": inspect.getfile(ClinicalRecruitmentEnv)}), flush=True)
    for line in sys.stdin:
        print(json.dumps({"value": measure(ClinicalRecruitmentEnv, json.loads(line))}), flush=True)
    return 0


class Worker:
    """A process that imports the environment of one source tree and runs measurement jobs on request."""

    def __init__(self, root: Path) -> None:
        # -P: the script's folder (env/clinical/) must not shadow the measured tree on sys.path.
        self.proc = subprocess.Popen(
            [sys.executable, "-P", str(Path(__file__).resolve()), "--worker", str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        env_file = Path(self._read()["env_file"]).resolve()
        if root.resolve() not in env_file.parents:
            self.close()
            raise RuntimeError(f"the worker for {root} imported {env_file}")

    def run(self, job: dict[str, Any]) -> float:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return self._read()["value"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"benchmark worker exited with status {self.proc.wait()}")
        return json.loads(line)


# ---------------------------------------------------------------------------------------------- git worktrees
def _git(*args: str, cwd: Path = THIS_TREE) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "recruit_trl" / "env-bench"


def worktree_of(rev: str, cache_dir: Path) -> tuple[Path, str]:
    """A clean checkout of commit ``rev`` under ``cache_dir`` (reused when present); returns it and the commit."""
    commit = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    path = cache_dir / commit
    if path.is_dir():
        try:
            clean = _git("rev-parse", "HEAD", cwd=path) == commit and not _git("status", "--porcelain", cwd=path)
        except subprocess.CalledProcessError:
            clean = False
        if clean:
            return path, commit
        shutil.rmtree(path)
    cache_dir.mkdir(parents=True, exist_ok=True)
    _git("worktree", "prune")  # forget worktrees whose folders are gone, so the path can be registered again
    _git("worktree", "add", "--detach", str(path), commit)
    return path, commit


# ---------------------------------------------------------------------------------------------- the report
def run(
    tasks: list[str], episodes: int, repeats: int, against: str | None = None, cache_dir: Path | None = None
) -> dict[str, Any]:
    """Measure this tree (and commit ``against``, interleaved) and return the report dict."""
    base_root, commit = worktree_of(against, cache_dir or default_cache_dir()) if against else (None, None)
    this = Worker(THIS_TREE)
    base = None
    try:
        if base_root is not None:
            base = Worker(base_root)
        results = {}
        for task in tasks:
            steps: dict[str, list[float]] = {style: [] for style in ACTION_STYLES}
            base_steps: dict[str, list[float]] = {style: [] for style in ACTION_STYLES}
            ratios: dict[str, list[float]] = {style: [] for style in ACTION_STYLES}
            for r in range(repeats):
                for style in ACTION_STYLES:
                    job = {"measure": "steps", "task": task, "episodes": episodes, "style": style}
                    if base is None:
                        steps[style].append(this.run(job))
                        continue
                    # Alternate which tree goes first, so a slow drift of the machine favours neither.
                    if r % 2 == 0:
                        mine, theirs = this.run(job), base.run(job)
                    else:
                        theirs, mine = base.run(job), this.run(job)
                    steps[style].append(mine)
                    base_steps[style].append(theirs)
                    ratios[style].append(mine / theirs)
            resets = statistics.median(
                this.run({"measure": "resets", "task": task, "n": RESETS_PER_RUN}) for _ in range(repeats)
            )
            snaps = statistics.median(
                this.run({"measure": "snapshots", "task": task, "n": SNAPSHOTS_PER_RUN}) for _ in range(repeats)
            )
            entry: dict[str, Any] = {
                "steps_per_s": {style: round(statistics.median(v)) for style, v in steps.items()},
                "resets_per_s": round(resets),
                "reset_ms": round(1000 / resets, 3),
                "snapshot_restore_per_s": round(snaps),
            }
            if base is not None:
                entry["against_steps_per_s"] = {style: round(statistics.median(v)) for style, v in base_steps.items()}
                entry["steps_ratio"] = {style: round(statistics.median(v), 2) for style, v in ratios.items()}
            results[task] = entry
    finally:
        this.close()
        if base is not None:
            base.close()
    config: dict[str, Any] = {
        "episodes": episodes,
        "repeats": repeats,
        "policy": "README quick-start",
        "action_styles": list(ACTION_STYLES),
    }
    if against is not None:
        config["against"] = {"rev": against, "commit": commit}
    return {
        "results": results,
        "config": config,
        "machine": {"python": platform.python_version(), "processor": platform.machine(), "cpus": os.cpu_count()},
    }


def format_table(report: dict[str, Any]) -> str:
    against = report["config"].get("against")
    base_label = against["rev"][:12] if against else ""
    header = f"{'task':<24}{'actions':<10}{'steps/s':>10}"
    if against:
        header += f"{base_label:>14}{'ratio':>8}"
    lines = [header, "-" * len(header)]
    for task, r in report["results"].items():
        for style in ACTION_STYLES:
            line = f"{task:<24}{style:<10}{r['steps_per_s'][style]:>10,}"
            if against:
                line += f"{r['against_steps_per_s'][style]:>14,}{r['steps_ratio'][style]:>7.2f}x"
            lines.append(line)
    header = f"{'task':<24}{'resets/s':>10}{'reset ms':>10}{'snap+restore/s':>16}"
    lines += ["", header, "-" * len(header)]
    for task, r in report["results"].items():
        lines.append(f"{task:<24}{r['resets_per_s']:>10,}{r['reset_ms']:>10.3f}{r['snapshot_restore_per_s']:>16,}")
    return "\n".join(lines)


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write ``data`` as JSON so that readers see either the old file or the whole new one (a temporary file in
    the same folder, then ``os.replace``)."""
    path = Path(path)
    text = json.dumps(data, indent=2) + "\n"
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "x") as fh:  # not mkstemp: its file is private, and os.replace would keep it so
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return worker_main(argv[1])
    from env.cli_flags import refuse_kebab_spellings  # here: a worker imports the standard library only

    parser = argparse.ArgumentParser(prog="python -m env.clinical.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(DEFAULT_TASKS), help="task ids to benchmark")
    parser.add_argument("--episodes", type=int, default=20, help="full episodes per steps/s measurement")
    parser.add_argument("--repeats", type=int, default=5, help="measurements per figure (the median is kept)")
    parser.add_argument("--against", metavar="REV", help="also measure the environment of this git commit")
    parser.add_argument("--cache_dir", type=Path, help="where --against keeps its worktrees")
    parser.add_argument("--json", help="also write the report to this JSON file")
    args = refuse_kebab_spellings(parser).parse_args(argv)
    report = run(args.tasks, args.episodes, args.repeats, args.against, args.cache_dir)
    print(format_table(report))
    print(json.dumps(report, indent=2))
    if args.json:
        write_json_atomic(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())

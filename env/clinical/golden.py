"""Replay golden-format episode files against this environment and report exact mismatches.

Usage: ``python -m env.clinical.golden FILE [FILE ...] [--verbose]``. A golden file is a JSON list of episodes, each
``{task, seed, final_score, total_reward, enrolled, funnel, steps: [{action, reward, done, enrolled, budget,
error, uncertainty, milestone_potential}, ...]}`` recorded on the reference. Every recorded value must be
reproduced exactly (floats with ``==``). The last line is ``N passed, M failed``; exit status 0 only when
every episode passes.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from env.clinical.core import ClinicalRecruitmentEnv
from env.golden_replay import replay_files

STEP_FIELDS = ("reward", "done", "enrolled", "budget", "error", "uncertainty", "milestone_potential")


def replay_episode(episode: dict[str, Any]) -> list[str]:
    """Replay one golden episode; return a list of human-readable mismatches (empty when exact)."""
    env = ClinicalRecruitmentEnv(task=episode["task"])
    env.reset(seed=episode.get("seed"))
    problems: list[str] = []
    info: dict[str, Any] = {}
    obs: dict[str, Any] = {}
    total = 0.0
    for n, expected in enumerate(episode["steps"]):
        if env.done:
            problems.append(f"step {n}: episode already ended but the golden file has more steps")
            break
        try:
            obs, reward, terminated, truncated, info = env.step(expected["action"])
        except ValueError as exc:
            if "rejected" in expected or expected.get("error") == "validation_error":
                continue
            problems.append(f"step {n}: action rejected: {exc}")
            break
        total += reward
        got = {
            "reward": reward,
            "done": terminated or truncated,
            "enrolled": obs["enrolled_so_far"],
            "budget": obs["budget_remaining"],
            "error": info["last_action_error"],
            "uncertainty": obs["uncertainty_level"],
            "milestone_potential": obs["milestone_potential"],
        }
        for field in STEP_FIELDS:
            if field in expected and got[field] != expected[field]:
                kind = expected["action"].get("action_type")
                problems.append(f"step {n} ({kind}): {field} {got[field]!r} != {expected[field]!r}")
        if problems:
            break
    if not problems:
        if "final_score" in episode and info.get("final_score") != episode["final_score"]:
            problems.append(f"final_score {info.get('final_score')!r} != {episode['final_score']!r}")
        if "enrolled" in episode and obs.get("enrolled_so_far") != episode["enrolled"]:
            problems.append(f"enrolled {obs.get('enrolled_so_far')!r} != {episode['enrolled']!r}")
        if "funnel" in episode and obs.get("current_funnel") != episode["funnel"]:
            problems.append(f"funnel {obs.get('current_funnel')!r} != {episode['funnel']!r}")
        if "total_reward" in episode and round(env.s.total_reward, 4) != episode["total_reward"]:
            problems.append(f"total_reward {env.s.total_reward!r} != {episode['total_reward']!r}")
    return problems


def load_episodes(path: str) -> list[dict[str, Any]]:
    """A golden file's episodes (a list, or one episode, or ``{"episodes": [...]}``)."""
    with open(path) as fh:
        episodes = json.load(fh)
    if isinstance(episodes, dict):
        episodes = episodes.get("episodes", [episodes])
    return episodes


def episode_label(episode: dict[str, Any]) -> str:
    return f"{episode.get('task')} seed={episode.get('seed')} {episode.get('policy', '')}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m env.clinical.golden", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="golden-format JSON files")
    parser.add_argument("--verbose", "-v", action="store_true", help="print every episode, not only failures")
    args = parser.parse_args(argv)
    return replay_files(args.files, load_episodes, replay_episode, episode_label, args.verbose)


if __name__ == "__main__":
    sys.exit(main())

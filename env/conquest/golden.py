"""Record and replay golden conquest games: per-step hashes of everything the agent sees (spec §10.3).

Usage: ``python -m env.conquest.golden FILE [FILE ...] [--verbose]`` replays golden files and ends with the line
``N passed, M failed`` (exit status 0 iff M == 0). ``python -m env.conquest.golden --record FILE [--tasks ...]
[--seeds ...] [--answerers ...]`` plays the games on this implementation and writes FILE atomically.

A golden file is ``{"format": "conquest-golden", "version": 1, "episodes": [...]}``; an episode is
``{task, seed, options, answerer, answers, reset_hash, hashes, steps, final_score, terminated, truncated}``.
``answers`` holds one entry per agent step: an int ``k`` is sent as the reply ``{"action_index": k}``, a string
is sent verbatim; both go through ``step_text``. ``hashes[i]`` is the sha256 of the canonical JSON
(``sort_keys=True, separators=(",", ":")``) of the step record: ``obs``, the candidate lines, the reward
components, the reward and the flags (terminated, truncated, fallback, fallback_reason). ``reset_hash`` hashes
the same record for the reset (no reward, no flags).

Answerers (§10.3): ``zero`` always answers 0; ``teacher`` answers the index of the balanced action;
``random`` answers ``k = b.randrange(len(list))`` with ``b = random.Random(seed + 424242)``; ``malformed`` cycles
through ``MALFORMED_REPLIES`` (mostly invalid replies, some valid ones so that games still move).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

from env.conquest import TASKS, ConquestEnv, teacher_index
from env.golden_replay import replay_files

ANSWERERS = ("zero", "teacher", "random", "malformed")
FORMAT = "conquest-golden"
VERSION = 1

# Each reason of §7.4 appears at least once; the valid replies keep games from being pure fallback play.
MALFORMED_REPLIES = (
    "",
    "I attack Kamchatka!",
    '{"action_index": 1',
    "[1]",
    '"action_index"',
    "{}",
    '{"index": 1}',
    '{"action_index": 1, "why": "x"}',
    '{"action_index": "1"}',
    '{"action_index": 1.0}',
    '{"action_index": true}',
    '{"action_index": null}',
    '{"action_index": [1]}',
    '{"action_index": -1}',
    '{"action_index": 99999999999999999999999}',
    '```json\n{"action_index": 1}\n```',
    '  \n\t{"action_index": 1}\n  ',
    '{"action_index": 1}',
    "NaN",
    '{"action_index": NaN}',
)


def canonical(value: Any) -> str:
    """Canonical JSON text: sorted keys, no spaces; fails on non-JSON types instead of coercing them."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def sha256(value: Any) -> str:
    return hashlib.sha256(canonical(value).encode()).hexdigest()


def record_of(env: ConquestEnv, obs: dict, info: dict, step: tuple | None = None) -> dict[str, Any]:
    """What one golden hash covers: the observation, candidate lines, reward components and flags."""
    record: dict[str, Any] = {"obs": obs, "candidates": env.render_candidates()}
    if step is not None:
        reward, terminated, truncated = step
        record.update(
            reward=reward,
            reward_components=info["reward_components"],
            terminated=terminated,
            truncated=truncated,
            fallback=info["fallback"],
            fallback_reason=info["fallback_reason"],
        )
    return record


def make_env(task: str, seed: int, options: dict[str, Any] | None = None) -> tuple[ConquestEnv, dict, dict]:
    """A fresh environment for `task` with `options`, reset with `seed`; returns (env, obs, info)."""
    env = ConquestEnv(task=task, **(options or {}))
    obs, info = env.reset(seed=seed)
    return env, obs, info


def answerer(name: str, seed: int) -> Callable[[ConquestEnv, int], int | str]:
    """The answer function of §10.3 answerer `name` for a game with `seed`: (env, step number) -> answer."""
    if name == "zero":
        return lambda env, n: 0
    if name == "teacher":
        return lambda env, n: teacher_index(env)
    if name == "random":
        rng = random.Random(seed + 424242)
        return lambda env, n: rng.randrange(len(env.candidates()))
    if name == "malformed":
        return lambda env, n: MALFORMED_REPLIES[n % len(MALFORMED_REPLIES)]
    raise ValueError(f"unknown answerer {name!r}; expected one of {ANSWERERS}")


def reply_text(answer: int | str) -> str:
    """The reply sent to step_text for a recorded answer."""
    return answer if isinstance(answer, str) else json.dumps({"action_index": answer})


def play(
    task: str,
    seed: int,
    answerer_name: str,
    options: dict[str, Any] | None = None,
    answers: list[int | str] | None = None,
) -> dict[str, Any]:
    """Play one game and return its golden episode; replays `answers` verbatim when given.

    A replayed game stops when the answers run out or the episode ends, whichever comes first, so a divergence in
    episode length shows up as a hash or step-count mismatch rather than an exception.
    """
    env, obs, info = make_env(task, seed, options)
    choose = answerer(answerer_name, seed) if answers is None else None
    episode: dict[str, Any] = {
        "task": task,
        "seed": seed,
        "options": dict(options or {}),
        "answerer": answerer_name,
        "answers": [],
        "reset_hash": sha256(record_of(env, obs, info)),
        "hashes": [],
    }
    terminated = truncated = False
    n = 0
    while not (terminated or truncated):
        if answers is not None:
            if n >= len(answers):
                break
            answer = answers[n]
        else:
            answer = choose(env, n)
        obs, reward, terminated, truncated, info = env.step_text(reply_text(answer))
        episode["answers"].append(answer)
        episode["hashes"].append(sha256(record_of(env, obs, info, (reward, terminated, truncated))))
        n += 1
    episode.update(
        steps=n,
        final_score=info.get("final_score") if (terminated or truncated) else None,
        terminated=terminated,
        truncated=truncated,
    )
    return episode


def replay_episode(episode: dict[str, Any]) -> list[str]:
    """Replay one golden episode; return human-readable mismatches (empty when every hash and score matches)."""
    got = play(episode["task"], episode["seed"], episode["answerer"], episode.get("options"), episode["answers"])
    problems: list[str] = []
    if got["reset_hash"] != episode["reset_hash"]:
        problems.append("reset: observation hash differs")
    for n, (a, b) in enumerate(zip(got["hashes"], episode["hashes"], strict=False)):
        if a != b:
            problems.append(f"step {n}: hash differs (answer {episode['answers'][n]!r})")
            break
    for key in ("steps", "final_score", "terminated", "truncated"):
        if got[key] != episode[key]:
            problems.append(f"{key} {got[key]!r} != {episode[key]!r}")
    return problems


def record(
    path: str,
    tasks: Iterable[str],
    seeds: Iterable[int],
    answerers: Iterable[str] = ANSWERERS,
    options: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Play every (task, seed, answerer) game and write the golden file atomically (temp file + os.replace)."""
    episodes = [play(t, s, a, options) for t in tasks for s in seeds for a in answerers]
    payload = {"format": FORMAT, "version": VERSION, "episodes": episodes}
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".golden-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(payload, separators=(",", ":")))
            fh.write("\n")
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; a data file is meant to be read by everyone
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return episodes


def load_episodes(path: str) -> list[dict[str, Any]]:
    with open(path) as fh:
        payload = json.load(fh)
    if payload.get("format") != FORMAT:
        raise ValueError(f"{path}: not a {FORMAT} file")
    return payload["episodes"]


def episode_label(episode: dict[str, Any]) -> str:
    return f"{episode['task']} seed={episode['seed']} {episode['answerer']} ({episode['steps']} steps)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m env.conquest.golden", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="golden files to replay")
    parser.add_argument("--verbose", "-v", action="store_true", help="print every episode, not only failures")
    parser.add_argument("--record", metavar="FILE", help="play the games here and write them to FILE")
    parser.add_argument("--tasks", nargs="+", default=sorted(TASKS), help="tasks to record")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1], help="seeds to record")
    parser.add_argument("--answerers", nargs="+", default=list(ANSWERERS), choices=ANSWERERS)
    args = parser.parse_args(argv)
    if args.record:
        episodes = record(args.record, args.tasks, args.seeds, args.answerers)
        print(f"recorded {len(episodes)} episodes, {sum(e['steps'] for e in episodes)} steps -> {args.record}")
        return 0
    if not args.files:
        parser.error("give golden files to replay, or --record FILE")
    return replay_files(args.files, load_episodes, replay_episode, episode_label, args.verbose)


if __name__ == "__main__":
    sys.exit(main())

"""Teacher traces: episodes played by a policy, rendered exactly as the rollouts render prompts.

Each row is ``{"messages": [system, user], "completion": text, "task", "seed", "day", "action_type",
"candidate_types"}`` (the listed candidates' action types, in order) where
``completion`` is the answer under the action contract that takes the teacher's action. The same rows
warm up the tiny offline model and feed the SFT warm start, so the model sees the RL prompt format from
its first step.

The teacher's action must be one of the listed candidates (the ``index`` contract). A teacher that
speaks in free actions is matched to the candidate that does the same thing (the interface's action key, e.g.
type and arguments without free-text annotations); a step without a match is played but not recorded (counted
in ``skipped``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from recruit_trl.contracts import build_messages, completion_text, digest
from recruit_trl.protocol import Action, EnvInterface, Observation, policy_action

# A candidate teacher picks an index into the interface's candidate list (obs, candidates, rng) -> int.
CandidateTeacher = Callable[[Observation, Sequence[Action], random.Random], int]


def first_candidate(obs: Observation, candidates: Sequence[Action], rng: random.Random) -> int:
    """The first listed candidate (a candidate teacher)."""
    return 0


def fallback_teacher(interface: EnvInterface) -> CandidateTeacher:
    """The safe agent as a candidate teacher: the interface's fallback action."""

    def pick(obs: Observation, candidates: Sequence[Action], rng: random.Random) -> int:
        k = match_candidate(interface, interface.fallback_action(obs), candidates)
        return 0 if k is None else k

    return pick


def same_action(interface: EnvInterface, a: Action, b: Action) -> bool:
    """Whether two actions do the same thing: equal :func:`recruit_trl.protocol.action_key`."""
    return interface.action_key(a) == interface.action_key(b)


def match_candidate(interface: EnvInterface, action: Action, candidates: Sequence[Action]) -> int | None:
    """Index of the candidate taking the same action as ``action`` (see :func:`same_action`), else ``None``."""
    key = interface.action_key(action)
    for k, cand in enumerate(candidates):
        if interface.action_key(cand) == key:
            return k
    return None


def trace_row(
    interface: EnvInterface,
    messages: list[dict[str, str]],
    candidates: Sequence[Action],
    action: Action,
    contract: str,
    task: str,
    seed: int,
    day: int,
) -> dict[str, Any]:
    """One trace row: the prompt ``messages`` and the answer that takes ``action`` under ``contract`` (``action``
    must be one of ``candidates``, e.g. ``candidates[match_candidate(...)]``)."""
    return {
        "messages": messages,
        "completion": completion_text(action, contract, candidates),
        "task": task,
        "seed": seed,
        "day": day,
        "action_type": interface.action_type(action),
        "candidate_types": [interface.action_type(c) for c in candidates],
    }


@dataclass
class TraceStats:
    episodes: int = 0
    steps: int = 0
    recorded: int = 0
    skipped: int = 0
    action_types: dict[str, int] = field(default_factory=dict)


def collect_traces(
    interface: EnvInterface,
    tasks: Sequence[str],
    seeds: Iterable[int],
    *,
    teacher: str | Callable | None = None,
    candidate_teacher: CandidateTeacher | None = None,
    contract: str = "index",
    recent_k: int = 2,
    epsilon: float = 0.0,
    relabel: bool = True,
    max_days: int | None = None,
    rng_seed: int = 0,
    stats: TraceStats | None = None,
) -> list[dict[str, Any]]:
    """Play full episodes and record one row per decision.

    Args:
        interface: the environment interface.
        tasks, seeds: episodes to play (every task x seed).
        teacher: a policy name registered by the environment (or a ``policy(obs, rng)`` callable) that
            speaks in free actions; ``None`` uses ``candidate_teacher``.
        candidate_teacher: picks a candidate index (default :func:`fallback_teacher`, the safe agent).
        contract: the action contract (``"index"``, :data:`recruit_trl.contracts.CONTRACTS`).
        recent_k: recent actions in the prompt's digest (as in the rollouts).
        epsilon: with this probability a uniformly random (non-terminal) candidate is played instead, which
            widens the state distribution: the policy then also sees states off the teacher's path.
        relabel: record the teacher's action on every row, also where a random candidate was played (states
            off the teacher's path labelled with how to recover, as in DART / DAgger); ``False`` records the
            played action (widens the action prior, as the tiny model's warm-up corpus wants).
        max_days: stop each episode after this many days.
        rng_seed: seeds the teacher's and epsilon's RNG.
        stats: filled with counts when given.
    """
    stats = stats if stats is not None else TraceStats()
    rng = random.Random(rng_seed)
    policy = interface.get_policy(teacher) if isinstance(teacher, str) else teacher
    pick = candidate_teacher or fallback_teacher(interface)
    rows: list[dict[str, Any]] = []
    for task in tasks:
        env = interface.make_env(task)
        for seed in seeds:
            obs, _ = env.reset(seed=seed)
            recent: list[str] = []
            day = 0
            done = False
            stats.episodes += 1
            while not done and (max_days is None or day < max_days):
                candidates = interface.candidate_actions(obs)
                explorable = [
                    i
                    for i, c in enumerate(candidates)
                    if interface.action_type(c) not in interface.terminal_action_types
                ]
                explore = bool(epsilon and explorable and rng.random() < epsilon)
                if policy is not None:
                    action = policy_action(policy, env, obs, rng)
                    k: int | None = match_candidate(interface, action, candidates)
                else:
                    k = pick(obs, candidates, rng)
                    action = candidates[k]
                played = candidates[rng.choice(explorable)] if explore else action
                if explore and not relabel:
                    action = played
                    k = candidates.index(played)
                if k is not None:
                    shown = recent[len(recent) - recent_k :] if recent_k > 0 else []
                    messages = build_messages(interface, obs, shown, contract, candidates)
                    rows.append(trace_row(interface, messages, candidates, candidates[k], contract, task, seed, day))
                    stats.recorded += 1
                    kind = interface.action_type(action)
                    stats.action_types[kind] = stats.action_types.get(kind, 0) + 1
                else:
                    stats.skipped += 1
                obs, _, terminated, truncated, info = env.step(played)
                recent.append(digest(interface, day, played, info))
                day += 1
                stats.steps += 1
                done = terminated or truncated
    return rows

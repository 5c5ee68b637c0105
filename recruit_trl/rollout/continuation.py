"""Playing on from an anchor's snapshot: the seeds of common random numbers, the sampled action, the continuation.

Every row of a group starts from the same snapshot and meets the same randomness on the same simulated day: the
step RNG is re-seeded every day from (group seed, day), where the group seed mixes the anchor, the optimizer step and
the rollout seed (:func:`group_seed`, :func:`day_seed`). An action's outcome is then a function of (anchor, step,
action) alone, however much randomness other actions drew and however TRL splits the group across processes.
"""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass, field
from typing import Any

from recruit_trl.contracts import ParsedAction
from recruit_trl.protocol import EnvInterface, policy_action
from recruit_trl.rollout.anchors import Anchor, AnchorCache, AnchorState
from recruit_trl.rollout.config import RolloutConfig


def last(items: list, k: int) -> list:
    """The last ``k`` items (``k == 0`` gives none, unlike ``items[-0:]``)."""
    return items[len(items) - k :] if k > 0 else []


def group_seed(anchor: Anchor, step: int, seed: int) -> int:
    """Environment seed shared by every row of one group (same anchor, same optimizer step)."""
    digest_ = hashlib.sha256(f"{anchor.key()}|{step}|{seed}".encode()).digest()
    return int.from_bytes(digest_[:8], "little")


def day_seed(seed: int, day: int) -> int:
    """The step RNG's seed on simulated ``day`` (counted from the anchor) of a continuation seeded ``seed``."""
    return (seed * 1_000_003 + day * 7_919 + 1) & 0xFFFFFFFFFFFFFFFF


def add_components(totals: dict[str, float], components: dict[str, float]) -> None:
    """Add one step's reward components into ``totals``."""
    for key, value in components.items():
        totals[key] = totals.get(key, 0.0) + value


class Scorer:
    """Plays sampled actions from anchor snapshots and sums the interface's reward components."""

    def __init__(self, interface: EnvInterface, config: RolloutConfig, cache: AnchorCache) -> None:
        self.interface = interface
        self.config = config
        self.cache = cache
        self.continuation = interface.get_policy(config.continuation_policy)
        self.env_seconds = 0.0
        self.env_steps = 0

    def start(self, anchor: Anchor, state: AnchorState, seed: int, env=None):
        """``env`` (default: the pooled one) restored to the anchor, its RNG seeded for simulated day 0."""
        env = env if env is not None else self.cache.env(anchor.task)
        env.restore(state.snapshot)
        env.reseed(day_seed(seed, 0))
        return env

    def apply(self, env, obs: dict, parsed: ParsedAction) -> tuple[ParsedAction, tuple]:
        """Step the parsed action; an action the environment rejects is replaced by the fallback (invalid)."""
        t0 = time.perf_counter()
        try:
            result = env.step(parsed.action)
        except ValueError as exc:
            parsed = ParsedAction(self.interface.fallback_action(obs), False, f"env_rejected: {exc}"[:80])
            result = env.step(parsed.action)
        self.env_seconds += time.perf_counter() - t0
        self.env_steps += 1
        return parsed, result

    def continue_(
        self, env, obs: dict, totals: dict[str, float], seed: int, days: int, first_day: int = 1
    ) -> tuple[int, dict, dict]:
        """Play ``days`` days with the continuation policy, re-seeding the step RNG every day (simulated days
        ``first_day``, ``first_day + 1``, ...); returns (steps played, last info, last observation)."""
        t0 = time.perf_counter()
        rng = random.Random(seed)
        info: dict = {}
        played = 0
        for k in range(days):
            env.reseed(day_seed(seed, first_day + k))
            action = policy_action(self.continuation, env, obs, rng)  # a planner reads the live env
            new_obs, reward, terminated, truncated, info = env.step(action)
            add_components(totals, self.interface.step_components(obs, action, new_obs, reward, info))
            obs = new_obs
            played += 1
            if terminated or truncated:
                break
        self.env_seconds += time.perf_counter() - t0
        self.env_steps += played
        return played, info, obs


@dataclass
class Branch:
    """One continuation of a sampled action in its own environment (see ``BranchRollout``)."""

    env: Any
    obs: dict
    seed: int
    totals: dict[str, float]
    info: dict
    applied: ParsedAction | None = None
    error: str | None = None
    done: bool = False
    played: int = 1
    recent: list[str] = field(default_factory=list)
    day: int = 0
    start: dict = field(default_factory=dict)  # the anchor's observation (the potential's change is from it)

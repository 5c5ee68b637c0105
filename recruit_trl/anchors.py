"""Anchors: the states that training samples start from, and their deterministic reconstruction.

An anchor names a state: task, reset seed, day ``t`` and the policy (plus its RNG seed) that played days
``0..t-1``. TRL hands only prompts to a ``rollout_func``, so an anchor travels *as its prompt*: a compact,
canonical JSON key (``Anchor.key()``). :class:`AnchorCache` rebuilds the state by replaying the prefix
(deterministic: same task, seed, policy and policy seed give the same state) and caches the resulting
snapshot, observation and digest of recent actions, so every later visit costs one ``restore``.
"""

from __future__ import annotations

import json
import random
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from recruit_trl.contracts import digest
from recruit_trl.protocol import EnvInterface, Observation


@dataclass(frozen=True)
class Anchor:
    """A reproducible state: ``policy`` (seeded with ``policy_seed``) played ``day`` days of ``task``/``seed``."""

    task: str
    seed: int
    day: int
    policy: str = "heuristic"
    policy_seed: int = 0

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_key(cls, key: str) -> Anchor:
        """Parse :meth:`key` output. Raises ValueError on anything else (a prompt that is not an anchor)."""
        try:
            data = json.loads(key)
            return cls(**data)
        except (TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not an anchor key: {key[:80]!r} ({exc})") from None


def anchor_from_prompt(prompt: Any) -> Anchor:
    """Recover the anchor from a TRL prompt: the key string itself, or the last message's content."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        prompt = prompt[-1].get("content", "")
    if not isinstance(prompt, str):
        raise ValueError(f"prompt of type {type(prompt).__name__} does not carry an anchor key")
    return Anchor.from_key(prompt)


@dataclass(frozen=True)
class AnchorState:
    """A rebuilt anchor: the environment snapshot, its observation, the recent-action digest, and whether the
    prefix already ended the episode (then ``day`` is where it ended)."""

    snapshot: Any
    obs: Observation
    recent: tuple[str, ...]
    done: bool
    day: int


class AnchorCache:
    """Rebuilds anchors by replay and keeps the most recent ``max_items`` in memory (LRU).

    Args:
        interface: the environment interface (makes environments, resolves policies, describes actions).
        recent_k: how many recent actions the digest keeps.
        max_items: cache size.
    """

    def __init__(self, interface: EnvInterface, recent_k: int = 2, max_items: int = 4096) -> None:
        self.interface = interface
        self.recent_k = recent_k
        self.max_items = max_items
        self._items: OrderedDict[str, AnchorState] = OrderedDict()
        self._envs: dict[str, Any] = {}
        self.hits = self.misses = 0

    def env(self, task: str):
        """A pooled environment for ``task`` (callers restore a snapshot before using it)."""
        if task not in self._envs:
            self._envs[task] = self.interface.make_env(task)
        return self._envs[task]

    def get(self, anchor: Anchor) -> AnchorState:
        key = anchor.key()
        item = self._items.get(key)
        if item is not None:
            self.hits += 1
            self._items.move_to_end(key)
            return item
        self.misses += 1
        item = self._replay(anchor)
        self._items[key] = item
        if len(self._items) > self.max_items:
            self._items.popitem(last=False)
        return item

    def _replay(self, anchor: Anchor) -> AnchorState:
        env = self.env(anchor.task)
        policy = self.interface.get_policy(anchor.policy)
        act = getattr(policy, "act", None)  # planners look ahead from the live environment
        rng = random.Random(anchor.policy_seed)
        obs, _ = env.reset(seed=anchor.seed)
        recent: list[str] = []
        done = False
        day = 0
        while day < anchor.day:
            action = act(env, obs=obs, rng=rng) if act is not None else policy(obs, rng)
            obs, _, terminated, truncated, info = env.step(action)
            recent.append(digest(self.interface, day, action, info))
            day += 1
            if terminated or truncated:
                done = True
                break
        kept = recent[len(recent) - self.recent_k :] if self.recent_k > 0 else []
        return AnchorState(env.snapshot(), obs, tuple(kept), done, day)


def build_anchors(
    interface: EnvInterface,
    tasks: Sequence[str],
    seeds: Iterable[int],
    days: Iterable[int],
    policy: str = "heuristic",
    policy_seed: int = 0,
    cache: AnchorCache | None = None,
) -> list[Anchor]:
    """Every (task, seed, day) anchor whose prefix does not end the episode, in a deterministic order."""
    cache = cache or AnchorCache(interface)
    days = list(days)
    out = []
    for task in tasks:
        for seed in seeds:
            for day in days:
                anchor = Anchor(task, seed, day, policy, policy_seed)
                if not cache.get(anchor).done:
                    out.append(anchor)
    return out


def anchor_dataset(anchors: Sequence[Anchor]):
    """A ``datasets.Dataset`` with the anchor key as ``prompt`` plus readable columns (task, seed, day, policy)."""
    from datasets import Dataset

    return Dataset.from_dict(
        {
            "prompt": [a.key() for a in anchors],
            "task": [a.task for a in anchors],
            "seed": [a.seed for a in anchors],
            "day": [a.day for a in anchors],
            "policy": [a.policy for a in anchors],
        }
    )

"""Anchors: the states that training samples start from, and their deterministic reconstruction.

An anchor names a state: task, reset seed, day ``t`` and the policy (plus its RNG seed) that played days
``0..t-1``. TRL hands only prompts to a ``rollout_func``, so an anchor travels *as its prompt*: a compact,
canonical JSON key (``Anchor.key()``). :class:`AnchorCache` rebuilds the state by replaying the prefix
(deterministic: same task, seed, policy and policy seed give the same state) and caches the resulting
snapshot, observation and digest of recent actions, so every later visit costs one ``restore``.

A language model's states cannot be replayed inside a rollout (that would mean generating the whole prefix
again). :func:`record_anchors` plays the model once, in lock-step over the episodes, and keeps the states
on the anchor days; :meth:`AnchorCache.pin` makes them available to the rollout, and :func:`save_states` /
:func:`load_states` keep them on disk (re-runs and the other processes of a distributed run read them).
These are *on-policy* anchors: the states the trained policy itself reaches, where its mistakes happen.
"""

from __future__ import annotations

import json
import pickle
import random
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recruit_trl.contracts import digest
from recruit_trl.protocol import EnvInterface, Observation, policy_action

MODEL_PREFIX = "model:"  # Anchor.policy of states a language model reached (recorded, not replayed)


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
        self._pinned: dict[str, AnchorState] = {}
        self._envs: dict[str, Any] = {}
        self.hits = self.misses = 0

    def pin(self, states: Mapping[Anchor, AnchorState]) -> None:
        """Keep these states for good (never evicted, never replayed): e.g. :func:`record_anchors` output."""
        self._pinned.update({anchor.key(): state for anchor, state in states.items()})

    def env(self, task: str):
        """A pooled environment for ``task`` (callers restore a snapshot before using it)."""
        if task not in self._envs:
            self._envs[task] = self.interface.make_env(task)
        return self._envs[task]

    def get(self, anchor: Anchor) -> AnchorState:
        key = anchor.key()
        item = self._pinned.get(key) or self._items.get(key)
        if item is not None:
            self.hits += 1
            if key in self._items:
                self._items.move_to_end(key)
            return item
        self.misses += 1
        item = self._replay(anchor)
        self._items[key] = item
        if len(self._items) > self.max_items:
            self._items.popitem(last=False)
        return item

    def _replay(self, anchor: Anchor) -> AnchorState:
        if anchor.policy.startswith(MODEL_PREFIX):
            raise ValueError(
                f"anchor {anchor.key()} was reached by a model, which cannot be replayed here: record its states "
                "with recruit_trl.anchors.record_anchors and pin them (AnchorCache.pin)"
            )
        env = self.env(anchor.task)
        policy = self.interface.get_policy(anchor.policy)
        rng = random.Random(anchor.policy_seed)
        obs, _ = env.reset(seed=anchor.seed)
        recent: list[str] = []
        done = False
        day = 0
        while day < anchor.day:
            action = policy_action(policy, env, obs, rng)  # a planner looks ahead from the live environment
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


def record_anchors(
    interface: EnvInterface,
    model_path: str,
    tasks: Sequence[str],
    seeds: Iterable[int],
    days: Iterable[int],
    *,
    label: str = "model:student",
    contract: str = "index",
    recent_k: int = 2,
    temperature: float = 1.0,
    top_p: float = 1.0,
    policy_seed: int = 0,
    model_loading: dict | None = None,
    progress: bool = True,
) -> dict[Anchor, AnchorState]:
    """Play ``model_path`` (sampled at ``temperature`` / ``top_p``, seeded by ``policy_seed``) on every task x seed
    and keep the states on ``days`` (those the episode reaches), keyed by anchors whose policy is ``label``.

    Deterministic for the same arguments on the same machine (the evaluator's seeded lock-step sampling).
    """
    from recruit_trl.evaluate import EvalConfig, Evaluator

    if not label.startswith(MODEL_PREFIX):
        raise ValueError(f"a recorded anchor's label starts with {MODEL_PREFIX!r} (got {label!r})")
    config = EvalConfig(
        tasks=tuple(tasks),
        seeds=tuple(seeds),
        contract=contract,
        recent_k=recent_k,
        temperature=temperature,
        top_p=top_p,
        policy_seed=policy_seed,
        model_loading=dict(model_loading or {}),  # loaded as trained (recruit_trl.models.loading_config)
    )
    evaluator = Evaluator(config, interface)
    evaluator.capture_days = set(days)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(config.tasks) * len(config.seeds), desc="recording anchors", unit="episode")
    evaluator.run_model(model_path, progress=bar.update if bar else None)
    if bar:
        bar.close()
    return {
        Anchor(task, seed, day, label, policy_seed): state
        for (task, seed, day), state in sorted(evaluator.captured.items())
    }


def save_states(path: str | Path, states: Mapping[Anchor, AnchorState], meta: Mapping[str, Any]) -> None:
    """Write recorded anchor states and what produced them (``meta``) to ``path`` (pickle)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": dict(meta), "states": {a.key(): s for a, s in states.items()}}
    tmp = Path(f"{path}.tmp")
    tmp.write_bytes(pickle.dumps(payload))
    tmp.replace(path)  # a reader never sees half a file


def load_states(path: str | Path, meta: Mapping[str, Any]) -> dict[Anchor, AnchorState] | None:
    """The states :func:`save_states` wrote to ``path`` when they were produced by the same ``meta``, else
    ``None`` (also for a file this version cannot read: the caller records the states again). Only read files
    this project wrote: they are pickles."""
    if not Path(path).is_file():
        return None
    try:
        payload = pickle.loads(Path(path).read_bytes())
    except Exception:  # an older layout of the snapshot classes, or not our file: record again
        return None
    if not isinstance(payload, dict) or payload.get("meta") != dict(meta):
        return None
    return {Anchor.from_key(key): state for key, state in payload["states"].items()}

"""Anchors: the states that training samples start from, and their deterministic reconstruction.

An anchor names a state: task, reset seed, day ``t`` and the policy (plus its RNG seed) that played days
``0..t-1``. TRL hands only prompts to a ``rollout_func``, so an anchor travels *as its prompt*: a compact,
canonical JSON key (``Anchor.key()``). :class:`AnchorCache` rebuilds the state by replaying the prefix
(deterministic: same task, seed, policy and policy seed give the same state) and caches the resulting
snapshot, observation and digest of recent actions, so every later visit costs one ``restore``.

A language model's states cannot be replayed inside a rollout (that would mean generating the whole prefix
again). :func:`record_anchors` plays the model once, in lock-step over the episodes, and keeps the states
on the anchor days with the actions that reached them; :meth:`AnchorCache.pin` makes them available to the
rollout, and :func:`save_states` / :func:`load_states` keep them on disk as JSON (the recorded actions, replayed
on load: data, never code to unpickle) for re-runs and the other processes of a distributed run. These are
*on-policy* anchors: the states the trained policy itself reaches, where its mistakes happen.
"""

from __future__ import annotations

import hashlib
import json
import random
import warnings
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from recruit_trl.contracts import digest
from recruit_trl.files import write_text_atomic
from recruit_trl.protocol import Action, EnvInterface, Observation, policy_action

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
    """A rebuilt anchor: the environment snapshot, its observation, the recent-action digest, whether the prefix
    already ended the episode (then ``day`` is where it ended), and for a state recorded from a model
    (:func:`record_anchors`) the actions played from the reset (what :func:`save_states` keeps)."""

    snapshot: Any
    obs: Observation
    recent: tuple[str, ...]
    done: bool
    day: int
    actions: tuple[Action, ...] | None = None


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
                "with recruit_trl.workflow.evaluation.evaluate.record_anchors and pin them (AnchorCache.pin)"
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


def anchor_dataset(anchors: Sequence[Anchor], min_rows: int = 0):
    """A ``datasets.Dataset`` with the anchor key as ``prompt`` plus readable columns (task, seed, day, policy).

    With ``min_rows``, the anchors are repeated in turn up to at least that many rows: TRL's sampler draws each
    generation batch's prompts (over every process) from distinct rows, and yields no batch from fewer; episode
    mode plays few starts (anchors) many times.
    """
    from datasets import Dataset

    anchors = list(anchors)
    if anchors and len(anchors) < min_rows:
        anchors = [anchors[i % len(anchors)] for i in range(min_rows)]
    return Dataset.from_dict(
        {
            "prompt": [a.key() for a in anchors],
            "task": [a.task for a in anchors],
            "seed": [a.seed for a in anchors],
            "day": [a.day for a in anchors],
            "policy": [a.policy for a in anchors],
        }
    )


STATES_FORMAT = "recruit_trl.anchor_states"  # the "format" field of a states file
STATES_VERSION = 1  # bumped when its layout changes: files of another version are recorded again


def save_states(path: str | Path, states: Mapping[Anchor, AnchorState], meta: Mapping[str, Any]) -> None:
    """Write recorded anchor states and what produced them (``meta``, JSON values) to ``path``, as JSON.

    An environment snapshot is an opaque in-memory object (the protocol does not ask environments to serialise
    one), so the file keeps how each state was reached instead: per episode (task, reset seed, anchor policy) the
    actions played from the reset up to its last anchor day, and per anchor its day, how many recent actions its
    digest keeps and a digest of its observation. :func:`load_states` replays those actions, which rebuilds the
    states exactly: the environment is deterministic given its reset seed and the actions played (what
    :class:`AnchorCache` relies on too). Written atomically, so a reader never sees half a file.

    Raises:
        ValueError: for a state without recorded actions (one that :func:`record_anchors` did not produce).
    """
    episodes: dict[tuple[str, int, str, int], dict[str, Any]] = {}
    for anchor, state in states.items():
        if state.actions is None:
            raise ValueError(f"anchor {anchor.key()} has no recorded actions: only record_anchors states are saved")
        episode = episodes.setdefault(
            (anchor.task, anchor.seed, anchor.policy, anchor.policy_seed),
            {"task": anchor.task, "seed": anchor.seed, "policy": anchor.policy, "policy_seed": anchor.policy_seed,
             "actions": [], "anchors": []},
        )  # fmt: skip
        if len(state.actions) > len(episode["actions"]):  # every anchor's actions begin the longest ones
            episode["actions"] = list(state.actions)
        episode["anchors"].append(
            {"day": anchor.day, "recent": len(state.recent), "obs_sha256": _obs_digest(state.obs)}
        )
    payload = {
        "format": STATES_FORMAT,
        "version": STATES_VERSION,
        "meta": dict(meta),
        "episodes": list(episodes.values()),
    }
    write_text_atomic(path, json.dumps(payload, default=str))


def load_states(
    path: str | Path, meta: Mapping[str, Any], interface: EnvInterface
) -> dict[Anchor, AnchorState] | None:
    """The states :func:`save_states` wrote to ``path``, rebuilt by replaying the recorded actions in ``interface``'s
    environments, when they were produced by the same ``meta``; else ``None`` (no file, other settings, another
    layout version, or an environment that no longer reaches the recorded observations, with a warning: the caller
    records the states again and overwrites the file). Nothing in the file is executed: it is plain JSON data.

    Raises:
        ValueError: naming the file, when it is not a states file this code can read (not JSON, another format, a
            damaged layout); deleting it records the anchors again.
    """
    path = Path(path)
    if not path.is_file():
        return None
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _unreadable(path, f"not JSON: {exc}") from None
    if not isinstance(payload, dict) or payload.get("format") != STATES_FORMAT:
        raise _unreadable(path, f"not a {STATES_FORMAT} file")
    if payload.get("version") != STATES_VERSION or payload.get("meta") != json.loads(json.dumps(meta, default=str)):
        return None
    try:
        episodes = [_stored_episode(episode) for episode in payload["episodes"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise _unreadable(path, f"damaged layout: {type(exc).__name__}: {exc}") from None
    out: dict[Anchor, AnchorState] = {}
    for episode in episodes:
        replayed = _replay_actions(interface, episode)
        if replayed is None:
            warnings.warn(
                f"{path}: the environment no longer reaches the recorded states of {episode['task']} seed "
                f"{episode['seed']} (changed since they were recorded?); recording the anchors again",
                stacklevel=2,
            )
            return None
        out.update(replayed)
    return dict(sorted(out.items(), key=lambda item: (item[0].task, item[0].seed, item[0].day)))


def _unreadable(path: Path, problem: str) -> ValueError:
    return ValueError(
        f"{path} cannot be read as recorded anchor states ({problem}); delete it to record the anchors again"
    )


def _stored_episode(episode: Any) -> dict[str, Any]:
    """One episode of a states file with its types checked.

    Raises:
        KeyError, TypeError, ValueError: for a field that is missing or of the wrong kind.
    """
    actions = list(episode["actions"])
    if not all(isinstance(action, dict) for action in actions):
        raise TypeError("an action is not a JSON object")
    anchors = [(int(a["day"]), int(a["recent"]), str(a["obs_sha256"])) for a in episode["anchors"]]
    if not anchors or not all(0 <= day <= len(actions) for day, _, _ in anchors):
        raise ValueError("anchor days outside the recorded actions")
    return {
        "task": str(episode["task"]), "seed": int(episode["seed"]), "policy": str(episode["policy"]),
        "policy_seed": int(episode["policy_seed"]), "actions": actions, "anchors": anchors,
    }  # fmt: skip


def _replay_actions(interface: EnvInterface, episode: Mapping[str, Any]) -> dict[Anchor, AnchorState] | None:
    """The states on a stored episode's anchor days, by replaying its actions from the reset; ``None`` when an
    observation there differs from the recorded one, or the episode ends before an anchor day."""
    actions = episode["actions"]
    anchors = {day: (recent_kept, obs_sha256) for day, recent_kept, obs_sha256 in episode["anchors"]}
    last = max(anchors)
    env = interface.make_env(episode["task"])
    try:
        obs, _ = env.reset(seed=episode["seed"])
        recent: list[str] = []
        states = {}
        for day in range(last + 1):
            if day in anchors:
                kept, expected = anchors[day]
                if _obs_digest(obs) != expected:
                    return None
                anchor = Anchor(episode["task"], episode["seed"], day, episode["policy"], episode["policy_seed"])
                shown = tuple(recent[len(recent) - kept :] if kept else ())
                states[anchor] = AnchorState(env.snapshot(), obs, shown, False, day, tuple(actions[:day]))
            if day < last:
                obs, _, terminated, truncated, info = env.step(actions[day])
                recent.append(digest(interface, day, actions[day], info))
                if terminated or truncated:
                    return None
        return states
    finally:
        if hasattr(env, "close"):
            env.close()


def _obs_digest(obs: Observation) -> str:
    return hashlib.sha256(json.dumps(obs, sort_keys=True, default=str).encode()).hexdigest()

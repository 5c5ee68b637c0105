"""Teacher decision sets on disk: every agent decision of teacher-played games, stratified and split by game seed.

:func:`build_teacher_sets` plays the teacher on every task x seed of three disjoint seed ranges and records, per
agent decision whose teacher action is a listed candidate, the prompt rendered as the rollouts and the SFT rows
render it (:func:`recruit_trl.contracts.build_messages`, the ``recent_k`` last digests), the teacher's answer under
the ``index`` contract (``{"action_index": k}``), the task, the game seed, the decision number, a stratum (the
interface's optional ``decision_phase(obs, action)``, else the teacher action's type), the teacher action's type and
the listed candidates' types. Each split keeps a sample in
which no stratum holds more than ``max_share`` of the rows (:func:`stratified_sample`): ``train`` (every row the cap
allows), ``fixed`` and ``heldout`` (a given number of rows). The sets are saved as a ``datasets.DatasetDict``
(:func:`save_teacher_sets`) beside ``metadata.json`` (seeds, counts per stratum, environment, tasks, teacher).

The rows hold no observation: :func:`set_decisions` replays the games (the environments and the teacher are
deterministic for a seed) to rebuild each row as a :class:`recruit_trl.workflow.decisions.decision_set.Decision` and to
ask other environment policies in the live state; :mod:`recruit_trl.workflow.decisions.benchmark` scores policies on
the sets.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recruit_trl.contracts import build_messages, completion_text, digest
from recruit_trl.files import read_json, write_json_atomic
from recruit_trl.protocol import Action, EnvInterface, Observation, policy_action
from recruit_trl.rollout.anchors import Anchor, AnchorState
from recruit_trl.traces import match_candidate
from recruit_trl.workflow.decisions.decision_set import Decision

SPLITS = ("train", "fixed", "heldout")
METADATA = "metadata.json"
CONTRACT = "index"


@dataclass(frozen=True)
class SetConfig:
    """What a set of teacher decision sets is built from (also the key under which it is reused).

    Attributes:
        env: the environment interface's name.
        tasks: the tasks played (every task x seed of each split).
        teacher: the policy (registered by the environment) that plays the games and answers every decision.
        train_seeds, fixed_seeds, heldout_seeds: the game seeds of each split (disjoint).
        fixed_size, heldout_size: rows kept in the ``fixed`` and ``heldout`` sets (fewer if the cap allows fewer).
        train_size: rows kept in ``train``; ``None`` keeps every row the cap allows.
        max_share: the largest share of a split's rows one stratum may hold.
        recent_k: recent actions in the prompt's digest (as in the rollouts).
        seed: the sampling seed.
    """

    env: str
    tasks: tuple[str, ...]
    teacher: str
    train_seeds: tuple[int, ...]
    fixed_seeds: tuple[int, ...]
    heldout_seeds: tuple[int, ...]
    fixed_size: int = 100
    heldout_size: int = 1000
    train_size: int | None = None
    max_share: float = 0.25
    recent_k: int = 2
    seed: int = 0
    contract: str = field(default=CONTRACT, init=False)
    row_format: int = field(default=2, init=False)  # part of the key: sets saved with other columns are rebuilt

    def __post_init__(self) -> None:
        split_seeds = [set(self.train_seeds), set(self.fixed_seeds), set(self.heldout_seeds)]
        for i, a in enumerate(split_seeds):
            for b in split_seeds[i + 1 :]:
                if a & b:
                    raise ValueError(f"a game seed is in two splits: {sorted(a & b)[:5]}")
        if not 0 < self.max_share <= 1:
            raise ValueError(f"max_share must be in (0, 1], got {self.max_share}")

    def split_seeds(self, split: str) -> tuple[int, ...]:
        return {"train": self.train_seeds, "fixed": self.fixed_seeds, "heldout": self.heldout_seeds}[split]

    def split_size(self, split: str) -> int | None:
        return {"train": self.train_size, "fixed": self.fixed_size, "heldout": self.heldout_size}[split]

    def key(self) -> str:
        """A short digest of the settings: the name of the sets' folder under a data root."""
        text = json.dumps(asdict(self), sort_keys=True)
        return f"{self.env}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


@dataclass
class Step:
    """One agent decision of a teacher-played game, in the live state (valid until the game moves on)."""

    decision: int
    env: Any
    obs: Observation
    recent: tuple[str, ...]
    candidates: list[Action]
    action: Action
    index: int | None


def decision_stratum(interface: EnvInterface, obs: Observation, action: Action) -> str:
    """The stratum of a decision: the interface's ``decision_phase(obs, action)`` (``action`` is the teacher's)."""
    return str(interface.decision_phase(obs, action))


def teacher_game(interface: EnvInterface, teacher: str, task: str, seed: int, recent_k: int = 2) -> Iterator[Step]:
    """Play one game with the teacher and yield every agent decision before its action is played.

    The teacher's RNG is ``random.Random(seed)``, so a game replays identically. ``recent`` holds the prompt's
    digest (the last ``recent_k`` actions), as :func:`recruit_trl.traces.collect_traces` shows it.
    """
    env = interface.make_env(task)
    policy = interface.get_policy(teacher)
    rng = random.Random(seed)
    obs, _ = env.reset(seed=seed)
    history: list[str] = []
    decision = 0
    done = False
    while not done:
        candidates = interface.candidate_actions(obs)
        action = policy_action(policy, env, obs, rng)
        shown = tuple(history[len(history) - recent_k :]) if recent_k > 0 else ()
        yield Step(decision, env, obs, shown, candidates, action, match_candidate(interface, action, candidates))
        obs, _, terminated, truncated, info = env.step(action)
        history.append(digest(interface, decision, action, info))
        decision += 1
        done = terminated or truncated


def stratified_sample(strata: Sequence[str], size: int | None, max_share: float, seed: int) -> list[int]:
    """Indices of a sample of the rows (``strata[i]`` is row i's stratum) in which no stratum dominates.

    Each stratum holds at most ``floor(max_share * n)`` of the ``n`` kept rows (at least one); the rows go one at a
    time to every stratum that has more, round-robin, until ``size`` is reached or every stratum is spent or capped.
    With ``size=None``, ``n`` is the largest size the cap allows. Rows are drawn at random with ``seed`` inside a
    stratum and returned in their original order. Deterministic for the same arguments.
    """
    by_stratum: dict[str, list[int]] = {}
    for i, s in enumerate(strata):
        by_stratum.setdefault(s, []).append(i)

    def reachable(n: int) -> int:
        cap = max(1, int(max_share * n))
        return sum(min(len(rows), cap) for rows in by_stratum.values())

    if size is None:
        size = next((n for n in range(len(strata), 0, -1) if reachable(n) >= n), 0)
    size = min(size, len(strata))
    cap = max(1, int(max_share * size))
    quotas = dict.fromkeys(sorted(by_stratum), 0)
    left = size
    while left:
        grown = False
        for s in quotas:
            if left and quotas[s] < min(cap, len(by_stratum[s])):
                quotas[s] += 1
                left -= 1
                grown = True
        if not grown:
            break
    rng = random.Random(seed)
    kept = [i for s, count in quotas.items() for i in rng.sample(by_stratum[s], count)]
    return sorted(kept)


def _split_rows(interface: EnvInterface, config: SetConfig, split: str) -> list[dict[str, Any]]:
    """The kept rows of one split: play every game, sample by stratum, then replay to render the kept prompts."""
    index: list[tuple[str, int, int]] = []
    strata: list[str] = []
    for task in config.tasks:
        for seed in config.split_seeds(split):
            for step in teacher_game(interface, config.teacher, task, seed, config.recent_k):
                if step.index is not None:
                    index.append((task, seed, step.decision))
                    strata.append(decision_stratum(interface, step.obs, step.action))
    kept = stratified_sample(strata, config.split_size(split), config.max_share, config.seed)
    wanted: dict[tuple[str, int], dict[int, str]] = {}
    for i in kept:
        task, seed, decision = index[i]
        wanted.setdefault((task, seed), {})[decision] = strata[i]
    rows = []
    for (task, seed), decisions in wanted.items():
        for step in teacher_game(interface, config.teacher, task, seed, config.recent_k):
            if step.decision in decisions:
                rows.append(_row(interface, step, task, seed, decisions[step.decision]))
            if step.decision >= max(decisions):
                break
    return rows


def _row(interface: EnvInterface, step: Step, task: str, seed: int, stratum: str) -> dict[str, Any]:
    candidate = step.candidates[step.index]
    return {
        "messages": build_messages(interface, step.obs, step.recent, CONTRACT, step.candidates),
        "completion": completion_text(candidate, CONTRACT, step.candidates),
        "task": task,
        "seed": seed,
        "decision": step.decision,
        "stratum": stratum,
        "action_type": interface.action_type(step.action),
        "candidate_types": [interface.action_type(c) for c in step.candidates],
    }


def build_teacher_sets(interface: EnvInterface, config: SetConfig) -> tuple[dict[str, list[dict]], dict[str, Any]]:
    """The rows of every split and the metadata (:class:`SetConfig` fields, rows and counts per stratum)."""
    splits = {split: _split_rows(interface, config, split) for split in SPLITS}
    metadata = {
        **asdict(config),
        "key": config.key(),
        "rows": {split: len(rows) for split, rows in splits.items()},
        "strata": {split: dict(sorted(Counter(r["stratum"] for r in rows).items())) for split, rows in splits.items()},
    }
    return splits, metadata


def save_teacher_sets(splits: Mapping[str, list[dict]], metadata: Mapping[str, Any], path: str | Path) -> Path:
    """Save the splits with ``datasets.DatasetDict.save_to_disk`` and ``metadata.json`` (written last) atomically:
    into a temporary folder beside ``path``, renamed into place (an existing ``path`` is replaced)."""
    from datasets import Dataset, DatasetDict

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        DatasetDict({split: Dataset.from_list(list(rows)) for split, rows in splits.items()}).save_to_disk(str(tmp))
        write_json_atomic(tmp / METADATA, dict(metadata))
        if path.exists():  # a stale or damaged copy (no valid metadata): replace it
            old = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.old")
            os.replace(path, old)
            shutil.rmtree(old)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def teacher_sets(interface: EnvInterface, config: SetConfig, root: str | Path, progress: bool = True):
    """The sets of ``config`` under ``root/<config.key()>``: loaded when a complete copy is there, else built and
    saved. Returns ``(DatasetDict, metadata)``."""
    from datasets import load_from_disk

    path = Path(root) / config.key()
    metadata = read_json(path / METADATA)
    if metadata is None or metadata.get("key") != config.key():
        if progress:
            print(f"building teacher decision sets in {path}")
        splits, metadata = build_teacher_sets(interface, config)
        with _progress_bars(progress):
            save_teacher_sets(splits, metadata, path)
        metadata = read_json(path / METADATA)  # as JSON stores it (lists), as a reuse reads it
    return load_from_disk(str(path)), metadata


@contextmanager
def _progress_bars(enabled: bool) -> Iterator[None]:
    """``datasets``' progress bars on or off inside the block (restored after it)."""
    from datasets.utils import logging as datasets_logging

    before = datasets_logging.is_progress_bar_enabled()
    if not enabled:
        datasets_logging.disable_progress_bar()
    try:
        yield
    finally:
        if before:
            datasets_logging.enable_progress_bar()


def set_decisions(
    interface: EnvInterface,
    rows: Sequence[Mapping[str, Any]],
    teacher: str,
    recent_k: int = 2,
    policies: Mapping[str, Any] | None = None,
) -> tuple[list[Decision], dict[str, list[Action]]]:
    """The rows rebuilt as decisions by replaying their games, and the actions of other ``policies`` there.

    Each row's game is replayed with the teacher up to its decision; the rebuilt prompt and answer must equal the
    stored ones (else the environment or the teacher is not deterministic, or the sets were built by other code).

    Args:
        rows: rows of a teacher set (``task``, ``seed``, ``decision``, ``messages``, ``completion``).
        teacher: the policy the sets were built with.
        policies: name -> environment policy, each asked in the live state of every row (its RNG seeded by the
            game seed and the decision number).

    Returns:
        The decisions in the rows' order, and per policy name its actions in the same order.

    Raises:
        ValueError: when a replayed decision differs from its row.
    """
    policies = dict(policies or {})
    wanted: dict[tuple[str, int], dict[int, int]] = {}
    for i, row in enumerate(rows):
        wanted.setdefault((row["task"], row["seed"]), {})[row["decision"]] = i
    decisions: list[Decision | None] = [None] * len(rows)
    actions: dict[str, list[Action | None]] = {name: [None] * len(rows) for name in policies}
    for (task, seed), by_decision in wanted.items():
        for step in teacher_game(interface, teacher, task, seed, recent_k):
            i = by_decision.get(step.decision)
            if i is not None:
                decisions[i] = _decision(interface, rows[i], step, task, seed, teacher)
                for name, policy in policies.items():
                    rng = random.Random(seed * 1_000_003 + step.decision)
                    actions[name][i] = policy_action(policy, step.env, step.obs, rng)
            if step.decision >= max(by_decision):
                break
    missing = [i for i, d in enumerate(decisions) if d is None]
    if missing:
        raise ValueError(f"{len(missing)} rows name a decision their game never reaches (first: {rows[missing[0]]})")
    return decisions, actions  # type: ignore[return-value]


def _decision(
    interface: EnvInterface, row: Mapping[str, Any], step: Step, task: str, seed: int, teacher: str
) -> Decision:
    messages = build_messages(interface, step.obs, step.recent, CONTRACT, step.candidates)
    answer = None if step.index is None else completion_text(step.candidates[step.index], CONTRACT, step.candidates)
    if messages != list(row["messages"]) or answer != row["completion"]:
        raise ValueError(f"replayed decision {task}/{seed}/{step.decision} differs from its row")
    state = AnchorState(step.env.snapshot(), step.obs, step.recent, False, step.decision)
    anchor = Anchor(task, seed, step.decision, policy=teacher)
    return Decision(anchor, state, CONTRACT, messages, step.candidates, step.action, answer, step.index)

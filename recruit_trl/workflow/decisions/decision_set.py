"""The held-out decision set of the decision-level report, for any environment (through its ``EnvInterface`` only).

A full episode of a real language model costs minutes on a CPU (SmolLM2-135M: about a second per decision, 180
decisions per episode), so models are compared decision by decision, on states of reset seeds never trained on. A
**decision set** (:func:`decision_set`) holds anchors over tasks x seeds x days, each reached by the teacher playing
the days before (:func:`recruit_trl.rollout.anchors.build_anchors`), with the prompt exactly as the rollouts render it,
the listed candidates, and the teacher's action and answer there; optionally a fixed-size subset, stratified over tasks
and the teacher's action types (:func:`sample_decisions`).

The rest of the report works on these rows: the answers of a model or policy
(:mod:`recruit_trl.workflow.decisions.answers`), the benchmark table of the answers
(:mod:`recruit_trl.workflow.decisions.table`), the state values of the actions
(:mod:`recruit_trl.workflow.decisions.values`), and both for a list of policies
(:mod:`recruit_trl.workflow.decisions.report`). :func:`scoring_rollout` and :func:`action_at_anchor` are the branch
rollout and the policy's action they all share.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from recruit_trl.contracts import build_messages, completion_text
from recruit_trl.protocol import FALLBACK_POLICY, Action, EnvInterface
from recruit_trl.rollout.anchors import Anchor, AnchorState, build_anchors
from recruit_trl.rollout.config import RolloutConfig
from recruit_trl.rollout.continuation import group_seed
from recruit_trl.rollout.rollout_funcs import BranchRollout
from recruit_trl.traces import match_candidate

# The continuation's horizon when none is given: longer than any episode, so every branch plays to the end.
TO_THE_END = 10**9


@dataclass
class Decision:
    """One held-out decision: a state reached by the teacher, its prompt, and the teacher's answer there.

    Attributes:
        anchor: the state's name (task, reset seed, day, the teacher that played the days before).
        state: the rebuilt state (snapshot, observation, recent-action digest).
        contract: the action contract the prompt asks for.
        messages: the chat prompt, rendered as the rollouts render it.
        candidates: the listed candidate actions (the ``index`` contract's list).
        teacher_action: the action the teacher plays in this state (its own, annotations included).
        teacher_answer: the text that takes the teacher's action under the contract.
        teacher_index: the listed candidate that does what the teacher does.
    """

    anchor: Anchor
    state: AnchorState
    contract: str
    messages: list[dict[str, str]]
    candidates: list[Action]
    teacher_action: Action
    teacher_answer: str
    teacher_index: int | None

    @property
    def task(self) -> str:
        return self.anchor.task

    @property
    def teacher(self) -> str:
        return self.anchor.policy


def scoring_rollout(
    interface: EnvInterface,
    *,
    recent_k: int = 2,
    continuation: str = FALLBACK_POLICY,
    horizon: int | None = None,
    continuation_seeds: int = 1,
    seed: int = 0,
) -> BranchRollout:
    """A branch rollout used only to rebuild anchors and score actions from them (no model, no trainer).

    Args:
        interface: the environment interface.
        recent_k: recent actions in the prompt's digest.
        continuation: the policy (registered by the environment) that plays after an action.
        horizon: days the continuation plays (``None``: to the end of the episode).
        continuation_seeds: continuations per action, averaged.
        seed: mixed into every continuation's seed.
    """
    config = RolloutConfig(
        env_name=interface.name,
        horizon=TO_THE_END if horizon is None else horizon,
        continuation_policy=continuation,
        continuation_seeds=continuation_seeds,
        recent_k=recent_k,
    )
    return BranchRollout(config, interface, seed)


def action_at_anchor(rollout: BranchRollout, policy, anchor: Anchor, state: AnchorState) -> Action:
    """``policy``'s action in the anchor's state. Its RNG and the environment it may look ahead from are seeded by
    the anchor alone (as the rollout's first step seeds them), so an action does not depend on the evaluation's
    continuation seed and the teacher's action is the one stored in the decision."""
    seed = group_seed(anchor, 0, 0)
    return rollout.teacher_action(rollout.scorer.start(anchor, state, seed), state.obs, seed, policy)


def decision_set(
    interface: EnvInterface,
    tasks: Sequence[str],
    seeds: Sequence[int],
    days: Sequence[int],
    *,
    teacher: str,
    contract: str = "index",
    recent_k: int = 2,
    size: int | None = None,
    seed: int = 0,
    progress: bool = True,
) -> list[Decision]:
    """The held-out decisions: every (task, seed, day) state the teacher reaches, with its prompt and answer.

    States come from :func:`recruit_trl.rollout.anchors.build_anchors` (the teacher replays days ``0..day-1``; a day
    after the episode's end is left out). A state whose teacher action is not a listed candidate is left out too
    (nothing the model could answer), as in :func:`recruit_trl.traces.collect_traces`. Deterministic for the same
    arguments.

    Args:
        interface: the environment interface.
        tasks, seeds, days: the anchors (every task x seed x day), seeds never trained on.
        teacher: the policy (registered by the environment) that plays the days before and answers each state.
        contract: the action contract (``"index"``, :data:`recruit_trl.contracts.CONTRACTS`).
        recent_k: recent actions in the prompt's digest (as in the rollouts).
        size: keep this many decisions (:func:`sample_decisions`), ``None`` for all.
        seed: the subsample's seed.
        progress: show a progress bar over the anchors.
    """
    from tqdm.auto import tqdm

    rollout = scoring_rollout(
        interface, continuation=teacher, recent_k=recent_k
    )  # rebuilds states: no continuation runs
    policy = interface.get_policy(teacher)
    anchors = build_anchors(interface, tasks, seeds, days, policy=teacher, cache=rollout.cache)
    out = []
    for anchor in tqdm(anchors, desc="decision set", unit="state", disable=not progress):
        state = rollout.cache.get(anchor)
        candidates = interface.candidate_actions(state.obs)
        action = action_at_anchor(rollout, policy, anchor, state)
        k = match_candidate(interface, action, candidates)
        if k is None:
            continue
        messages = build_messages(interface, state.obs, state.recent, contract, candidates)
        answer = completion_text(candidates[k], contract, candidates)
        out.append(Decision(anchor, state, contract, messages, candidates, action, answer, k))
    return out if size is None else sample_decisions(interface, out, size, seed=seed)


def sample_decisions(
    interface: EnvInterface, decisions: Sequence[Decision], size: int, *, seed: int = 0
) -> list[Decision]:
    """A fixed subset of ``size`` decisions, stratified over tasks and, inside a task, over the teacher's action types.

    Every task gets an equal share (the remainder to the first tasks; a task short of its share passes the rest on);
    inside a task each action type gets its share in proportion to its count (largest remainders first), drawn at
    random with ``seed``. The kept decisions stay in their original order. Deterministic for the same arguments.
    """
    rng = random.Random(seed)
    by_task: dict[str, list[int]] = {}
    for i, d in enumerate(decisions):
        by_task.setdefault(d.task, []).append(i)
    quotas = dict.fromkeys(by_task, 0)
    left = min(size, len(decisions))
    while left:  # one decision at a time to every task that has more, until the size is reached
        for task, rows in by_task.items():
            if left and quotas[task] < len(rows):
                quotas[task] += 1
                left -= 1
    kept: list[int] = []
    for task, rows in by_task.items():
        by_type: dict[str, list[int]] = {}
        for i in rows:
            by_type.setdefault(interface.action_type(decisions[i].teacher_action), []).append(i)
        shares = {kind: quotas[task] * len(idx) / len(rows) for kind, idx in by_type.items()}
        counts = {kind: int(share) for kind, share in shares.items()}
        by_remainder = sorted(shares, key=lambda kind: (-(shares[kind] - counts[kind]), kind))
        for kind in by_remainder[: quotas[task] - sum(counts.values())]:
            counts[kind] += 1
        for kind, idx in by_type.items():
            kept += rng.sample(idx, counts[kind])
    return [decisions[i] for i in sorted(kept)]

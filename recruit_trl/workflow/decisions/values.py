"""State values of the decision-level report: what each policy's action in a decision's state leads to.

The value of an action is the final score after it, with a continuation policy playing to the end of the episode, as
:class:`recruit_trl.rollout.rollout_funcs.BranchRollout` computes the GRPO reward's outcome. Every policy's branch from
one anchor meets the same environment randomness (the rollouts' common random numbers), so the paired difference to a
reference policy has far less noise than either mean (:func:`state_values`); :func:`format_state_values` prints them.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

from recruit_trl.protocol import Action, EnvInterface
from recruit_trl.rollout.config import RolloutConfig
from recruit_trl.workflow.decisions.decision_set import Decision, scoring_rollout
from recruit_trl.workflow.decisions.table import format_number, policy_label


def state_values(
    interface: EnvInterface,
    decisions: Sequence[Decision],
    actions_by_policy: dict[str, Sequence[Action]],
    *,
    reference: str | None = None,
    continuation: str = RolloutConfig.continuation_policy,
    horizon: int | None = None,
    continuation_seeds: int = 1,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """The value of each policy's action in each decision's state: the final score after the action, then the
    continuation policy to the end of the episode.

    The outcome is :class:`recruit_trl.rollout.rollout_funcs.BranchRollout`'s (the GRPO reward's): the snapshot is
    restored, the environment re-seeded every simulated day from (anchor, ``seed``, continuation, day), the action
    applied (one the environment rejects plays the fallback), then ``continuation`` plays. Every policy's branch from
    one anchor thus meets the same randomness (common random numbers) and the same action always gets the same value;
    an action shared by several policies is played once.

    Args:
        actions_by_policy: per policy, one action per decision (in order).
        reference: the policy the others are compared with in pairs (default: the first).
        continuation: the policy (registered by the environment) that plays after the action.
        horizon: days the continuation plays (``None``: to the end; the episode must end within it).
        continuation_seeds: continuations per action, each with its own randomness, averaged.
        seed: mixed into every continuation's seed.
        progress: show a progress bar over the continuations.

    Returns:
        ``{policy: {"mean", "se", "n", "by_task": {task: {"mean", "se", "n"}}, "values": [...], "vs_reference":
        {"reference", "mean", "se", "n", "better", "worse", "by_task"}}}`` (no ``vs_reference`` for the reference),
        plus ``"seconds_per_continuation"``.

    Raises:
        ValueError: when the horizon ends an episode before its final score.
    """
    from tqdm.auto import tqdm

    policies = list(actions_by_policy)
    reference = reference or policies[0]
    if reference not in actions_by_policy:
        raise ValueError(f"reference {reference!r} is not one of the policies {policies}")
    rollout = scoring_rollout(
        interface, continuation=continuation, horizon=horizon, continuation_seeds=continuation_seeds, seed=seed
    )
    jobs: dict[tuple[str, str], tuple[Decision, Action]] = {}
    for policy in policies:
        for d, action in zip(decisions, actions_by_policy[policy], strict=True):
            jobs.setdefault(_job_key(d, action), (d, action))
    scores: dict[tuple[str, str], float] = {}
    start = time.perf_counter()
    for key, (d, action) in tqdm(jobs.items(), desc="state values", unit="action", disable=not progress):
        # The rollout's own outcome: exactly the GRPO reward's computation, not a copy of it.
        score = rollout.outcome(d.anchor, d.state, action, 0)["final_score"]
        if score is None:
            raise ValueError(
                f"the continuation's horizon ({horizon} days) ended before the episode at {d.anchor.key()}: no final "
                "score to value the action by; use a longer horizon (None: to the end)"
            )
        scores[key] = score
    seconds = (time.perf_counter() - start) / max(1, len(jobs) * continuation_seeds)
    values = {
        p: [scores[_job_key(d, a)] for d, a in zip(decisions, actions_by_policy[p], strict=True)] for p in policies
    }
    out: dict[str, Any] = {}
    for policy in policies:
        row = _summary_by_task(decisions, values[policy])
        row["values"] = [round(v, 6) for v in values[policy]]
        if policy != reference:
            diffs = [v - r for v, r in zip(values[policy], values[reference], strict=True)]
            row["vs_reference"] = {
                "reference": reference,
                **_summary_by_task(decisions, diffs),
                "better": sum(x > 0 for x in diffs),
                "worse": sum(x < 0 for x in diffs),
            }
        out[policy] = row
    out["seconds_per_continuation"] = round(seconds, 4)
    return out


def format_state_values(values: Mapping[str, dict[str, Any]], reference: str) -> str:
    """State values (:func:`state_values`' result, keyed by policy) as aligned text, a row per policy: the value with
    its standard error and count, the mean per task, and the paired difference to ``reference``."""
    tasks = list(next(iter(values.values()))["by_task"])
    head = f"{'policy':<28}{'value ± se (n)':>24}" + "".join(f"{t[:14]:>16}" for t in tasks)
    head += f"{'minus ' + reference[:12]:>26}"
    lines = [head, "-" * len(head)]
    for policy, v in values.items():
        cells = "".join(f"{format_number(v['by_task'][t]['mean']):>16}" for t in tasks)
        diff = v.get("vs_reference")
        paired = f"{format_number(diff['mean'], '+.4f')} ± {format_number(diff['se'], '.4f')}" if diff else "-"
        value = f"{format_number(v['mean'])} ± {format_number(v['se'])} ({v['n']})"
        lines.append(f"{policy_label(policy):<28}{value:>24}{cells}{paired:>26}")
    return "\n".join(lines)


def _job_key(decision: Decision, action: Action) -> tuple[str, str]:
    # The whole action (annotations too): two actions that do the same thing can still be graded apart.
    return decision.anchor.key(), json.dumps(action, sort_keys=True, default=str)


def _summary(values: Sequence[float]) -> dict[str, Any]:
    """Mean, standard error of the mean (``None`` below two values) and count."""
    n = len(values)
    mean = statistics.fmean(values) if n else None
    se = statistics.stdev(values) / math.sqrt(n) if n > 1 else None
    return {"mean": _round(mean), "se": _round(se), "n": n}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 5)


def _summary_by_task(decisions: Sequence[Decision], values: Sequence[float]) -> dict[str, Any]:
    out = _summary(values)
    out["by_task"] = {
        task: _summary([v for d, v in zip(decisions, values, strict=True) if d.task == task])
        for task in dict.fromkeys(d.task for d in decisions)
    }
    return out

"""Evaluation metrics: what one episode records (:class:`EpisodeLog`) and the result rows they aggregate into.

Metrics per (policy, task): final score mean and sample sd, episode length, strict-JSON rate (model output is
exactly one JSON object), valid-action rate (the decision parsed under the contract and the environment reported no
error), fallback rate, teacher match (the fraction of decisions equal to a named teacher policy's on the same
observation), the action-type distribution, and the interface's episode metrics: for each, ``<name>_mean`` (its
value at the episode's end), and for its ``curve_metrics`` also ``<name>_at_mean`` (after the days of
``metric_days``), ``<name>_peak_mean`` and ``<name>_by_day_mean`` (the mean curve over the days); e.g. the clinical
environment's ``enrolled_*`` and ``budget_left_mean``. A 0/1 outcome among its ``rate_metrics`` gives ``<name>_rate``
instead (conquest's ``win_rate``).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# Row fields named like an episode metric's mean (``<name>_mean``) that are not one; and what a curve metric adds.
FIXED_MEANS = ("final_score_mean", "episode_length_mean", "score_terms_mean")
FIXED_RATES = ("strict_json_rate", "valid_action_rate", "fallback_rate", "own_answer_valid_rate")
CURVE_SUFFIXES = ("_at_mean", "_peak_mean", "_by_day_mean")


@dataclass
class EpisodeLog:
    """One episode of one policy on ``task`` from reset seed ``seed``: counts over its decisions and its outcome."""

    task: str
    seed: int
    final_score: float | None = None
    length: int = 0
    decisions: int = 0
    strict_json: int = 0
    valid: int = 0
    fallback: int = 0
    teacher_match: int = 0
    teacher_checked: int = 0
    action_types: Counter = field(default_factory=Counter)
    score_terms: dict[str, float] | None = None
    metrics: dict[str, list[float]] = field(default_factory=dict)  # each episode metric after every decision
    own_valid: int = 0  # decisions where the model's own answer was legal (free: it parsed; constrained: unchanged)
    own_checked: int = 0
    # A planner policy's scoring (recruit_trl.workflow.evaluation.planner): distinct candidates scored, their
    # environment steps and seconds, over the episode.
    planner_scored: int = 0
    planner_env_steps: int = 0
    planner_seconds: float = 0.0


def aggregate(
    policy: str,
    logs: Sequence[EpisodeLog],
    is_model: bool,
    curve_metrics: Sequence[str] = (),
    metric_days: Sequence[int] = (),
    rate_metrics: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """One result row per task (the JSON schema of ``recruit-trl eval --json``).

    Args:
        policy: the policy's name in the rows.
        logs: its episodes.
        is_model: whether it is a model (strict-JSON and fallback rates apply).
        curve_metrics: episode metrics whose course is reported too (``<name>_at_mean``, ``_peak_mean``,
            ``_by_day_mean``); see the module docstring.
        metric_days: the days of ``<name>_at_mean``.
        rate_metrics: episode metrics that are 0/1 outcomes (e.g. a win): the row carries ``<name>_rate``, the share
            of episodes that end with 1 (4 decimals), instead of ``<name>_mean``.

    Raises:
        ValueError: when an episode metric's field would overwrite another field of the row.
    """
    rows = []
    for task in dict.fromkeys(log.task for log in logs):
        group = [log for log in logs if log.task == task]
        scores = [log.final_score for log in group if log.final_score is not None]
        decisions = sum(log.decisions for log in group)
        types = Counter()
        for log in group:
            types.update(log.action_types)
        checked = sum(log.teacher_checked for log in group)
        terms = [log.score_terms for log in group]
        head = {
            "policy": policy,
            "task": task,
            "episodes": len(group),
            "final_score_mean": round(statistics.mean(scores), 4) if scores else None,
            "final_score_sd": round(statistics.stdev(scores), 4) if len(scores) > 1 else 0.0,
        }
        tail = {
            "episode_length_mean": round(statistics.mean(log.length for log in group), 2),
            "strict_json_rate": round(sum(log.strict_json for log in group) / decisions, 4) if is_model else None,
            "valid_action_rate": round(sum(log.valid for log in group) / max(1, decisions), 4),
            "fallback_rate": round(sum(log.fallback for log in group) / decisions, 4) if is_model else None,
            "teacher_match": round(sum(log.teacher_match for log in group) / checked, 4) if checked else None,
            # The model's own answers that were legal: free decoding, those that parsed; greedy constrained
            # decoding, those the constraint did not change (None for sampled constrained runs and policies).
            "own_answer_valid_rate": (
                round(sum(log.own_valid for log in group) / own, 4)
                if (own := sum(log.own_checked for log in group))
                else None
            ),
            "action_types": {k: round(v / max(1, decisions), 4) for k, v in sorted(types.items())},
            # Where the points come from: mean of each weighted part of the grade (when the interface says).
            "score_terms_mean": (
                {k: round(statistics.mean(t[k] for t in terms), 4) for k in terms[0]} if terms and all(terms) else None
            ),
            # Each episode's seed, final score and rate metrics (e.g. win), in seed order: two policies evaluated on
            # the same seeds are compared episode by episode (a paired difference).
            "per_episode": {
                "seed": [log.seed for log in group],
                "final_score": [log.final_score for log in group],
                **{
                    name: [log.metrics[name][-1] for log in group] for name in rate_metrics if name in group[0].metrics
                },
            },
        }
        metrics = _metric_fields(group, curve_metrics, metric_days, rate_metrics)
        clash = sorted(set(metrics) & (set(head) | set(tail)))
        if clash:
            raise ValueError(f"episode metrics {clash} would overwrite result fields of the same name: rename them")
        rows.append({**head, **metrics, **tail})
    return rows


def _metric_fields(
    group: Sequence[EpisodeLog], curve_metrics: Sequence[str], metric_days: Sequence[int], rate_metrics: Sequence[str]
) -> dict[str, Any]:
    """The episode metrics' fields of one result row (``group``: the episodes of one task), in the metrics' order.

    Raises:
        ValueError: when two metrics make the same field (e.g. ``x_peak`` next to the curve metric ``x``).
    """
    out: dict[str, Any] = {}

    def put(key: str, value: Any) -> None:
        if key in out:
            raise ValueError(f"two episode metrics make the result field {key!r}: rename one")
        out[key] = value

    for name in group[0].metrics:
        series = [log.metrics[name] for log in group]
        if name in rate_metrics:
            put(f"{name}_rate", round(statistics.mean(s[-1] for s in series), 4))
            continue
        put(f"{name}_mean", round(statistics.mean(s[-1] for s in series), 2))
        if name in curve_metrics:
            if metric_days:
                at = {str(d): round(statistics.mean(_value_at(s, d) for s in series), 2) for d in metric_days}
                put(f"{name}_at_mean", at)
            put(f"{name}_peak_mean", round(statistics.mean(max(s) for s in series), 2))
            put(f"{name}_by_day_mean", _mean_curve(series))
    return out


def _value_at(series: Sequence[float], day: int) -> float:
    """The value after ``day >= 1`` decisions (an episode that ended sooner keeps its last value)."""
    return series[min(day, len(series)) - 1]


def metric_names(row: Mapping[str, Any]) -> list[str]:
    """The episode metrics of a result row (its other ``<name>_mean`` fields), in the row's order."""
    derived = {f"{name}{suffix}" for name in curve_names(row) for suffix in CURVE_SUFFIXES}
    return [k[: -len("_mean")] for k in row if k.endswith("_mean") and k not in FIXED_MEANS and k not in derived]


def rate_names(row: Mapping[str, Any]) -> list[str]:
    """The rate metrics of a result row (its ``<name>_rate`` fields other than the fixed ones), in the row's order."""
    return [k[: -len("_rate")] for k in row if k.endswith("_rate") and k not in FIXED_RATES]


def curve_names(row: Mapping[str, Any]) -> list[str]:
    """The curve metrics of a result row (those with a ``<name>_by_day_mean`` curve), in the row's order."""
    return [k[: -len("_by_day_mean")] for k in row if k.endswith("_by_day_mean")]


def _mean_curve(curves: Sequence[Sequence[int]]) -> list[float]:
    """Day-by-day mean over episodes; an episode that ended sooner keeps its last value."""
    length = max((len(c) for c in curves), default=0)
    padded = [list(c) + [c[-1] if c else 0] * (length - len(c)) for c in curves]
    return [round(statistics.mean(column), 2) for column in zip(*padded, strict=True)] if padded else []

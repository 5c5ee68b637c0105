"""Shaped rewards as TRL reward functions, one function per component, selected by name (:func:`get_reward_funcs`).

Every function has TRL's reward-function signature ``f(completions, **kwargs) -> list[float | None]`` and
reads the extra per-row fields that the recruit_trl rollouts return (``recruit_trl.rollout.rollout_funcs``), so rewards
are computed from what happened in the environment, never by re-parsing completions. ``None`` marks a row the
component does not apply to (TRL ignores it in the weighted sum). Weights go through
``GRPOConfig.reward_weights`` (same order as ``reward_funcs``); TRL logs each component under the function's
name (``rewards/<name>/mean``).

The components for any environment are in :mod:`rewards.generic` (environment return, format, action shaping, final
score, the environment's potential, teacher match), each environment's in a module of its own: :mod:`rewards.clinical`
(enrolment, screening, dropouts, milestones, hypothesis accuracy) and :mod:`rewards.conquest` (territory, continent,
elimination, invalid answers, outcome, win); all are importable from here and named by :func:`get_reward_funcs`. A
reward function this package does not hold (a new environment's) is named as ``package.module:function``.

The same functions and weights define what is learnt in every mode: TRL sums them over a branch (branch and window
mode), episode mode over each decision's step row (:func:`weighted_rewards`, its step reward; their sum is the
episode's outcome), and TRL's tool loop over the rollout's step rows (``get_reward``). :data:`DEFAULT_REWARDS` with
:data:`DEFAULT_REWARD_WEIGHTS` are the plugin's defaults.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from recruit_trl.protocol import import_from_working_directory
from rewards.clinical import dropout_penalty, enrollment_reward, hypothesis_reward, milestone_reward, screening_reward
from rewards.conquest import (
    continent_reward,
    elimination_reward,
    invalid_penalty,
    outcome_reward,
    territory_reward,
    win_reward,
)
from rewards.generic import (
    action_shaping_reward,
    env_return_reward,
    final_score_reward,
    format_reward,
    potential_reward,
    teacher_match_reward,
)

RewardFunc = Callable[..., list[float | None]]
# The plugin's default rewards: the final grade when the scored steps end the episode, and a parsed answer.
DEFAULT_REWARDS = ("final_score_reward", "format_reward")
DEFAULT_REWARD_WEIGHTS = (1.0, 0.5)

REWARD_FUNCS: dict[str, RewardFunc] = {
    f.__name__: f
    for f in (
        env_return_reward,
        enrollment_reward,
        screening_reward,
        dropout_penalty,
        milestone_reward,
        hypothesis_reward,
        format_reward,
        action_shaping_reward,
        final_score_reward,
        potential_reward,
        teacher_match_reward,
        territory_reward,
        continent_reward,
        elimination_reward,
        invalid_penalty,
        outcome_reward,
        win_reward,
    )
}


def get_reward_funcs(names: Sequence[str]) -> list[RewardFunc]:
    """Reward functions by name (see :data:`REWARD_FUNCS`) or as ``package.module:function``.

    Raises:
        ValueError: naming an unknown name (with the ones that exist), a path that does not import, or a function
            without TRL's reward signature ``f(completions, **kwargs)``.
    """
    return [reward_func(name) for name in names]


def reward_func(name: str) -> RewardFunc:
    """One reward function: a name of :data:`REWARD_FUNCS`, or ``package.module:function`` imported (from the
    working directory too, as ``python -m`` would), its signature checked."""
    if name in REWARD_FUNCS:
        return REWARD_FUNCS[name]
    if ":" not in name:
        raise ValueError(
            f"Unknown reward function {name!r}; available: {sorted(REWARD_FUNCS)}, or 'package.module:function'"
        )
    module_name, attribute = name.split(":", 1)
    try:
        func = getattr(import_from_working_directory(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"Cannot import reward function {name!r}: {exc}") from None
    if not callable(func) or not _takes_completions_and_kwargs(func):
        raise ValueError(
            f"Reward function {name!r} must have TRL's signature f(completions, **kwargs) -> list[float | None]"
        )
    return func


def weighted_rewards(
    funcs: Sequence[RewardFunc],
    weights: Sequence[float] | None,
    fields: Mapping[str, Sequence[Any]],
    completions: Sequence[Any],
) -> tuple[list[float], dict[str, list[float | None]]]:
    """Each row's weighted reward, ``sum_i weights[i] * funcs[i](row)``, as TRL's ``GRPOTrainer`` sums them: a
    function's ``None`` counts 0. ``fields`` holds the rows' fields, one list per name, ``completions`` their texts.

    Returns:
        ``(totals, parts)``: per row the weighted sum, and per function (by ``__name__``) its unweighted values.

    Raises:
        ValueError: for a number of weights other than one per function, or a function that does not return one
            value per row.
    """
    weights = [1.0] * len(funcs) if weights is None else [float(w) for w in weights]
    if len(weights) != len(funcs):
        raise ValueError(f"reward weights {weights} must give one weight per reward function ({len(funcs)})")
    totals = [0.0] * len(completions)
    parts: dict[str, list[float | None]] = {}
    for func, weight in zip(funcs, weights, strict=True):
        values = list(func(completions=list(completions), **fields))
        name = getattr(func, "__name__", str(func))
        if len(values) != len(completions):
            raise ValueError(f"reward function {name} returned {len(values)} values for {len(completions)} rows")
        parts[name] = values
        for k, value in enumerate(values):
            if value is not None and not math.isnan(value):
                totals[k] += weight * float(value)
    return totals, parts


def _takes_completions_and_kwargs(func: Callable) -> bool:
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return False
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    takes_completions = any(p.name == "completions" or p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)
    return takes_kwargs and takes_completions


__all__ = [
    "DEFAULT_REWARDS",
    "DEFAULT_REWARD_WEIGHTS",
    "REWARD_FUNCS",
    "RewardFunc",
    "get_reward_funcs",
    "reward_func",
    "weighted_rewards",
    *REWARD_FUNCS,
]

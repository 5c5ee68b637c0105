"""Shaped rewards as TRL reward functions, one function per component, selected by name (:func:`get_reward_funcs`).

Every function has TRL's reward-function signature ``f(completions, **kwargs) -> list[float | None]`` and
reads the extra per-row fields that the recruit_trl rollouts return (``recruit_trl.rollout.rollout_funcs``), so rewards
are computed from what happened in the environment, never by re-parsing completions. ``None`` marks a row the
component does not apply to (TRL ignores it in the weighted sum). Weights go through
``GRPOConfig.reward_weights`` (same order as ``reward_funcs``); TRL logs each component under the function's
name (``rewards/<name>/mean``).

The components for any environment are in :mod:`rewards.generic` (environment return, format, action shaping, final
score, teacher match), the clinical environment's in :mod:`rewards.clinical` (enrolment, screening, dropouts,
milestones, hypothesis accuracy); all are importable from here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rewards.clinical import dropout_penalty, enrollment_reward, hypothesis_reward, milestone_reward, screening_reward
from rewards.generic import (
    action_shaping_reward,
    env_return_reward,
    final_score_reward,
    format_reward,
    teacher_match_reward,
)

RewardFunc = Callable[..., list[float | None]]

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
        teacher_match_reward,
    )
}


def get_reward_funcs(names: Sequence[str]) -> list[RewardFunc]:
    """Reward functions by name (see :data:`REWARD_FUNCS`); raises ValueError naming unknown ones."""
    unknown = [n for n in names if n not in REWARD_FUNCS]
    if unknown:
        raise ValueError(f"Unknown reward functions {unknown}; available: {sorted(REWARD_FUNCS)}")
    return [REWARD_FUNCS[n] for n in names]


__all__ = ["REWARD_FUNCS", "RewardFunc", "get_reward_funcs", *REWARD_FUNCS]

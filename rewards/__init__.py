"""Shaped rewards as TRL reward functions, one function per component.

Every function has TRL's reward-function signature ``f(completions, **kwargs) -> list[float | None]`` and
reads the extra per-row fields that the recruit_trl rollouts return (``recruit_trl.rollout``), so rewards are
computed from what happened in the environment, never by re-parsing completions. ``None`` marks a row the
component does not apply to (TRL ignores it in the weighted sum). Weights go through
``GRPOConfig.reward_weights`` (same order as ``reward_funcs``); TRL logs each component under the function's
name (``rewards/<name>/mean``).

Components (fields summed over the scored steps: the sampled action plus the continuation horizon):

* :func:`env_return_reward`: the environment's own shaped reward (``env_return``).
* :func:`enrollment_reward`: net patients enrolled (``enrollment_gain``).
* :func:`screening_reward`: eligible screens (``screen_success``).
* :func:`dropout_penalty`: minus the number of steps with a dropout (``dropout``).
* :func:`milestone_reward`: enrolment-milestone bonuses (``milestone_bonus``).
* :func:`hypothesis_reward`: mean hypothesis accuracy per scored step (``hypothesis_accuracy / scored_steps``).
* :func:`format_reward`: 1 when the model's text parsed under the action contract, else 0 (``valid``).
* :func:`action_shaping_reward`: the reference's shaping of the sampled action: +0.20 allocate, +0.15
  recontact, +0.10 screen, -0.10 adjust_strategy while a productive action was available
  (``action_shaping``; ``None`` for unparseable rows, which :func:`format_reward` already scores).
* :func:`final_score_reward`: the grader's final score when the episode ended inside the horizon
  (``final_score``; ``None`` otherwise).
* :func:`teacher_match_reward`: 1 when the sampled action does what the rollout's ``reward_teacher`` policy would do in
  the same state (window mode: the fraction of turns), else 0 (``teacher_match``): a dense, noise-free signal on
  the states the policy reaches, i.e. on-policy distillation of the teacher inside GRPO.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

RewardFunc = Callable[..., list[float | None]]


def _field(name: str, kwargs: dict[str, Any], func: str) -> Sequence[Any]:
    if name not in kwargs or kwargs[name] is None:
        raise ValueError(
            f"{func} needs the per-row field '{name}', which recruit_trl's rollout functions return; "
            "pass rollout_func=recruit_trl.rollout.make_rollout(...) to GRPOTrainer."
        )
    return kwargs[name]


def _as_float(values: Sequence[Any], sign: float = 1.0) -> list[float | None]:
    return [None if v is None else sign * float(v) for v in values]


def env_return_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """Sum of the environment's per-step rewards over the scored steps."""
    return _as_float(_field("env_return", kwargs, "env_return_reward"))


def enrollment_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """Net change in enrolled patients over the scored steps."""
    return _as_float(_field("enrollment_gain", kwargs, "enrollment_reward"))


def screening_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """Number of screens that found an eligible patient."""
    return _as_float(_field("screen_success", kwargs, "screening_reward"))


def dropout_penalty(completions: list, **kwargs: Any) -> list[float | None]:
    """Minus the number of scored steps on which a patient dropped out."""
    return _as_float(_field("dropout", kwargs, "dropout_penalty"), sign=-1.0)


def milestone_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """Milestone bonuses earned (0.02 / 0.03 / 0.04 / 0.06 at 25 / 50 / 75 / 100 % of the target)."""
    return _as_float(_field("milestone_bonus", kwargs, "milestone_reward"))


def hypothesis_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """Mean hypothesis accuracy over the scored steps (1 for the hypothesis matching the world type)."""
    totals = _field("hypothesis_accuracy", kwargs, "hypothesis_reward")
    steps = _field("scored_steps", kwargs, "hypothesis_reward")
    return [None if t is None else float(t) / max(1, int(n)) for t, n in zip(totals, steps, strict=True)]


def format_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """1.0 when the completion parsed under the action contract (window mode: the fraction of turns), else 0."""
    return _as_float(_field("valid", kwargs, "format_reward"))


def action_shaping_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """The reference's action shaping of the sampled action (``None`` when the output did not parse)."""
    return _as_float(_field("action_shaping", kwargs, "action_shaping_reward"))


def final_score_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """The grader's final score when the episode ended inside the scored horizon, else ``None``."""
    return _as_float(_field("final_score", kwargs, "final_score_reward"))


def teacher_match_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """1.0 when the sampled action is the rollout teacher's action in the same state, else 0."""
    values = _field("teacher_match", kwargs, "teacher_match_reward")
    if values and all(v is None for v in values):
        raise ValueError(
            "teacher_match_reward needs a rollout teacher: set RolloutConfig.reward_teacher (--reward_teacher)"
        )
    return _as_float(values)


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

"""Reward functions of the clinical recruitment environment: they read its per-step reward components.

Fields summed over the scored steps (the sampled action plus the continuation horizon):

* :func:`enrollment_reward`: net patients enrolled (``enrollment_gain``).
* :func:`screening_reward`: eligible screens (``screen_success``).
* :func:`dropout_penalty`: minus the number of steps with a dropout (``dropout``).
* :func:`milestone_reward`: enrolment-milestone bonuses (``milestone_bonus``).
* :func:`hypothesis_reward`: mean hypothesis accuracy per scored step (``hypothesis_accuracy / scored_steps``).
"""

from __future__ import annotations

from typing import Any

from rewards.generic import as_floats, row_field

__all__ = ["dropout_penalty", "enrollment_reward", "hypothesis_reward", "milestone_reward", "screening_reward"]


def enrollment_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """Net change in enrolled patients over the scored steps."""
    return as_floats(row_field("enrollment_gain", kwargs, "enrollment_reward"))


def screening_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """Number of screens that found an eligible patient."""
    return as_floats(row_field("screen_success", kwargs, "screening_reward"))


def dropout_penalty(completions: list, **kwargs: Any) -> list[float | None]:
    """Minus the number of scored steps on which a patient dropped out."""
    return as_floats(row_field("dropout", kwargs, "dropout_penalty"), sign=-1.0)


def milestone_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """Milestone bonuses earned (0.02 / 0.03 / 0.04 / 0.06 at 25 / 50 / 75 / 100 % of the target)."""
    return as_floats(row_field("milestone_bonus", kwargs, "milestone_reward"))


def hypothesis_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """Mean hypothesis accuracy over the scored steps (1 for the hypothesis matching the world type)."""
    totals = row_field("hypothesis_accuracy", kwargs, "hypothesis_reward")
    steps = row_field("scored_steps", kwargs, "hypothesis_reward")
    return [None if t is None else float(t) / max(1, int(n)) for t, n in zip(totals, steps, strict=True)]

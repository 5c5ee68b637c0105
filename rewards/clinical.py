"""Reward functions of the clinical recruitment environment: they read its per-step reward components.

Fields summed over the scored steps (the sampled action plus the continuation horizon):

* :func:`enrollment_reward`: net patients enrolled (``enrollment_gain``).
* :func:`screening_reward`: eligible screens (``screen_success``).
* :func:`dropout_penalty`: minus the number of steps with a dropout (``dropout``).
* :func:`milestone_reward`: enrolment-milestone bonuses (``milestone_bonus``).
* :func:`hypothesis_reward`: the hypothesis accuracy of each scored step's state (``hypothesis_accuracy``).

Every one is a sum over steps, so it means the same in every mode: over a branch's steps (branch mode), over an
episode's (episode mode's outcome, the sum of its decisions' step rewards) and over a tool-loop rollout's.
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
    """Hypothesis accuracy summed over the scored steps (each step's state: 1 for the hypothesis matching the world
    type): the steps spent on the right hypothesis.

    A sum, as every other component, not a mean per step: a mean of each row is not the mean of the episode once rows
    are summed into it (episode mode, the tool loop), so it would mean something else in every mode.
    """
    return as_floats(row_field("hypothesis_accuracy", kwargs, "hypothesis_reward"))

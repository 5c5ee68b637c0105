"""Reward functions for any recruit_trl environment: they read fields every rollout returns.

* :func:`env_return_reward`: the environment's own shaped reward (``env_return``).
* :func:`format_reward`: a penalty of -1 when the model's text did not parse under the action contract, else 0
  (``valid``). A penalty, not a payment per parsed answer: summed over an episode's decisions (episode mode's outcome)
  a payment would favour long episodes and make each decision's return count the decisions left.
* :func:`action_shaping_reward`: the interface's shaping of the sampled action (``action_shaping``; ``None`` for
  unparseable rows, which :func:`format_reward` already scores). The clinical environment's is the reference's:
  +0.20 allocate, +0.15 recontact, +0.10 screen, -0.10 adjust_strategy while a productive action was available.
* :func:`final_score_reward`: the grader's final score when the episode ended inside the horizon
  (``final_score``; ``None`` otherwise).
* :func:`potential_reward`: the change of the environment's ``potential`` (how good a state is, e.g. conquest's mean of
  its territory and army shares) over the row's steps (``potential_change``; ``None`` for an environment without one).
* :func:`teacher_match_reward`: 1 when the sampled action does what the rollout's ``reward_teacher`` policy would do in
  the same state, else 0 (``teacher_match``): a dense, noise-free signal on
  the states the policy reaches, i.e. on-policy distillation of the teacher inside GRPO.

:func:`row_field` and :func:`as_floats` are the helpers every reward function here and in an environment's own
module is made of.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = [
    "action_shaping_reward",
    "as_floats",
    "env_return_reward",
    "final_score_reward",
    "format_reward",
    "potential_reward",
    "row_field",
    "teacher_match_reward",
]


def row_field(name: str, kwargs: dict[str, Any], func: str) -> Sequence[Any]:
    """The per-row field ``name`` of a reward function's keyword arguments.

    Args:
        name: the field, as the rollout returns it.
        kwargs: the reward function's keyword arguments.
        func: the reward function's name, for the error.

    Raises:
        ValueError: when the rollout did not return the field.
    """
    if name not in kwargs or kwargs[name] is None:
        raise ValueError(
            f"{func} needs the per-row field '{name}', which recruit_trl's rollout functions return; "
            "pass rollout_func=recruit_trl.rollout.rollout_funcs.make_rollout(...) to GRPOTrainer."
        )
    return kwargs[name]


def as_floats(values: Sequence[Any], sign: float = 1.0) -> list[float | None]:
    """``values`` as floats times ``sign``, with ``None`` (a row the component does not apply to) kept."""
    return [None if v is None else sign * float(v) for v in values]


def env_return_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """Sum of the environment's per-step rewards over the scored steps."""
    return as_floats(row_field("env_return", kwargs, "env_return_reward"))


def format_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """-1.0 when the completion did not parse under the action contract, 0 when it did."""
    return [None if v is None else float(v) - 1.0 for v in row_field("valid", kwargs, "format_reward")]


def action_shaping_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """The interface's action shaping of the sampled action (``None`` when the output did not parse)."""
    return as_floats(row_field("action_shaping", kwargs, "action_shaping_reward"))


def final_score_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """The grader's final score when the episode ended inside the scored horizon, else ``None``."""
    return as_floats(row_field("final_score", kwargs, "final_score_reward"))


def potential_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """The change of the environment's potential over the row's steps (``None`` without a potential)."""
    return as_floats(row_field("potential_change", kwargs, "potential_reward"))


def teacher_match_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """1.0 when the sampled action is the rollout teacher's action in the same state, else 0."""
    values = row_field("teacher_match", kwargs, "teacher_match_reward")
    if values and all(v is None for v in values):
        raise ValueError(
            "teacher_match_reward needs a rollout teacher: set RolloutConfig.reward_teacher (--reward_teacher)"
        )
    return as_floats(values)

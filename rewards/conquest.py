"""Reward functions of the conquest board game: they read its per-step reward components (spec section 6).

Fields summed over the scored steps (the sampled action plus the continuation's decisions):

* :func:`territory_reward`: 0.01 per territory gained against the decision's start (``territory``).
* :func:`continent_reward`: 0.02 per continent-bonus army gained (``continent``).
* :func:`elimination_reward`: 0.10 per opponent eliminated (``elimination``).
* :func:`invalid_penalty`: the penalty of answers replaced by the fallback agent (``invalid``, already negative).
* :func:`outcome_reward`: the game's final score when it ended inside the scored steps (``outcome``: 1.0 for a win,
  at most 0.25 for a loss, 0.3-0.9 at the round limit by territories and armies).
* :func:`win_reward`: 1.0 for a game won inside the scored steps, 0.0 for one ended otherwise, ``None`` while it goes
  on (read from ``final_score``: only a win scores 1.0).
"""

from __future__ import annotations

from typing import Any

from rewards.generic import as_floats, row_field

__all__ = [
    "continent_reward",
    "elimination_reward",
    "invalid_penalty",
    "outcome_reward",
    "territory_reward",
    "win_reward",
]


def territory_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """Territories gained over the scored steps, 0.01 each."""
    return as_floats(row_field("territory", kwargs, "territory_reward"))


def continent_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """Continent-bonus armies gained over the scored steps, 0.02 each."""
    return as_floats(row_field("continent", kwargs, "continent_reward"))


def elimination_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """Opponents eliminated over the scored steps, 0.10 each."""
    return as_floats(row_field("elimination", kwargs, "elimination_reward"))


def invalid_penalty(completions: list, **kwargs: Any) -> list[float | None]:
    """The penalty of the scored steps' answers that the fallback agent replaced (negative or 0)."""
    return as_floats(row_field("invalid", kwargs, "invalid_penalty"))


def outcome_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """The game's final score when it ended inside the scored steps, else 0."""
    return as_floats(row_field("outcome", kwargs, "outcome_reward"))


def win_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """1.0 for a won game, 0.0 for a game that ended otherwise, ``None`` for one still going on."""
    scores = row_field("final_score", kwargs, "win_reward")
    return [None if score is None else float(score == 1.0) for score in scores]

"""Advantages of episode mode: one number per decision of a group of G episodes played from one start.

A group is G episodes of the current policy from the same state with the same dice (common random numbers), so the
episodes differ only through the policy's own choices. Both levels read the same numbers: each decision's *step
reward* (the reward functions, ``--reward_funcs`` x ``--reward_weights``, on the decision's own step; the
environment's ``potential`` is one of them, ``rewards.potential_reward``) and the episode's *outcome*, the sum of its
step rewards (:class:`recruit_trl.rollout.rollout_funcs.EpisodeRollout` computes both). Three credits, each a pure
function of the group:

* **episode level** (:func:`leave_one_out`): every decision of episode i gets ``O_i - mean_{j != i} O_j``, the
  outcome ``O`` against the other episodes of the group;
* **step level** (:func:`step_advantages`): the n-step return of a decision (:func:`n_step_returns`: the sum of
  the next n step rewards) against like decisions only. Decisions taken at identical states across the group (the
  same state key; GiGPO's step groups) are compared with those of the other episodes; a decision whose state no other
  episode reached is compared with the decisions at the same position (decision index) in the other episodes, and
  one that no other episode reached the position of carries no step credit. Never with the mean over every position:
  returns cut at the episode's end, or a reward paid on every decision, would make that a credit for the position;
* their weighted sum (:func:`decision_advantages`).

The trainer centres the advantages over the rows it actually trains (:class:`recruit_trl.training.trainer.
RecruitGRPOTrainer`), in both arms of a learning check, which makes the control an exact null.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


def leave_one_out(values: Sequence[float]) -> list[float]:
    """``v_i - mean_{j != i} v_j`` for each value (all zeros for fewer than two values)."""
    n = len(values)
    if n < 2:
        return [0.0] * n
    total = sum(values)
    return [v - (total - v) / (n - 1) for v in values]


def n_step_returns(step_rewards: Sequence[float], n: int) -> list[float]:
    """``R_t = r_t + ... + r_{t+n-1}``, cut at the episode's end (``n <= 0``: to the end)."""
    out, running = [], 0.0
    suffix = [0.0] * (len(step_rewards) + 1)
    for t in range(len(step_rewards) - 1, -1, -1):
        running += step_rewards[t]
        suffix[t] = running
    for t in range(len(step_rewards)):
        end = len(step_rewards) if n <= 0 else min(len(step_rewards), t + n)
        out.append(suffix[t] - suffix[end])
    return out


def step_advantages(returns: Sequence[Sequence[float]], keys: Sequence[Sequence[Hashable]]) -> list[list[float]]:
    """Step-level advantages of a group: ``returns[i][t]`` and ``keys[i][t]`` are decision t of episode i.

    A state key reached by two or more episodes makes a step group: each of its decisions gets its return minus the
    mean return of the step group's decisions in *other* episodes (an episode's own revisits of the state are no
    comparison of choices, so they never enter its baseline). Every other decision t of episode i gets its return
    minus the mean return of decision t of the other episodes that reached it (the same position, from the same start
    with the same dice), or 0 when no other episode made a t-th decision.
    """
    members: dict[Hashable, list[tuple[int, int]]] = {}
    for i, episode in enumerate(keys):
        for t, key in enumerate(episode):
            members.setdefault(key, []).append((i, t))
    out = [[0.0] * len(episode) for episode in returns]
    for positions in members.values():
        by_episode: dict[int, list[float]] = {}
        for i, t in positions:
            by_episode.setdefault(i, []).append(returns[i][t])
        if len(by_episode) < 2:
            for i, t in positions:
                others = [episode[t] for j, episode in enumerate(returns) if j != i and t < len(episode)]
                out[i][t] = returns[i][t] - sum(others) / len(others) if others else 0.0
            continue
        total, count = sum(returns[i][t] for i, t in positions), len(positions)
        for i, t in positions:
            own = by_episode[i]
            out[i][t] = returns[i][t] - (total - sum(own)) / (count - len(own))
    return out


@dataclass
class AdvantageWeights:
    """How the credits add up: ``episode`` x episode level + ``step`` x step level, the step level over ``horizon``
    decisions (0: to the episode's end)."""

    episode: float = 1.0
    step: float = 1.0
    horizon: int = 15


def decision_advantages(
    outcomes: Sequence[float],
    step_rewards: Sequence[Sequence[float]],
    keys: Sequence[Sequence[Hashable]],
    weights: AdvantageWeights,
) -> tuple[list[list[float]], dict[str, float]]:
    """The advantage of every decision of a group, and what went into them.

    Args:
        outcomes: the G episodes' outcomes.
        step_rewards: per episode, each decision's step reward.
        keys: per episode, each decision's state key.
        weights: the weights of the two levels and the step level's horizon.

    Returns:
        ``(advantages, stats)``: per episode, one advantage per decision; ``stats`` holds ``zero_variance`` (1.0 when
        every outcome is the same), ``matched_share`` (the share of decisions in a step group of two or more
        episodes), ``decisions`` and ``advantage_mean`` (the decisions' mean advantage: longer episodes carry more
        decisions, so it need not be zero; the trainer centres the rows it trains).
    """
    episode_level = leave_one_out(outcomes)
    returns = [n_step_returns(rewards, weights.horizon) for rewards in step_rewards]
    step_level = step_advantages(returns, keys)
    advantages = [
        [weights.episode * episode_level[i] + weights.step * a for a in step_level[i]] for i in range(len(outcomes))
    ]
    decisions = sum(len(episode) for episode in keys)
    advantage_mean = sum(a for episode in advantages for a in episode) / decisions if decisions else 0.0
    owners: dict[Hashable, set[int]] = {}
    for i, episode in enumerate(keys):
        for key in episode:
            owners.setdefault(key, set()).add(i)
    matched = sum(1 for episode in keys for key in episode if len(owners[key]) > 1)
    stats = {
        "zero_variance": float(len(set(outcomes)) <= 1),
        "matched_share": matched / decisions if decisions else 0.0,
        "decisions": float(decisions),
        "advantage_mean": advantage_mean,
    }
    return advantages, stats

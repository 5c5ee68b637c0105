"""REINFORCE with an exact leave-one-out baseline (RLOO), as a thin ``GRPOTrainer`` subclass.

TRL's ``RLOOTrainer`` has no ``rollout_func`` or ``env_mask`` hook (its loss would train on environment
tokens), so recruit_trl runs REINFORCE through ``GRPOTrainer`` configured as plain policy gradient:
``scale_rewards="none"`` (no std normalisation), ``beta=0`` (no KL), ``num_iterations=1`` (on-policy, the
importance ratio is exactly 1) and ``loss_type="dr_grpo"`` (a constant normaliser). GRPO's advantage is then
``r_i - mean(r)`` over the group of G samples; multiplying it by ``G / (G - 1)`` gives exactly the
leave-one-out advantage ``r_i - mean_{j != i} r_j``:

    (r_i - (1/G) sum_j r_j) * G/(G-1) = (G r_i - r_i - sum_{j != i} r_j) / (G-1) = r_i - mean_{j != i} r_j.

Environment tokens keep ``env_mask`` 0 and carry no gradient, exactly as in GRPO.
"""

from __future__ import annotations

from typing import Any

from trl import GRPOTrainer

REINFORCE_SETTINGS = {"scale_rewards": "none", "beta": 0.0, "num_iterations": 1, "loss_type": "dr_grpo"}


def leave_one_out_advantages(rewards: list[float], group_size: int) -> list[float]:
    """Reference computation: ``r_i - mean of the other rewards of its group`` (groups are contiguous)."""
    if group_size < 2 or len(rewards) % group_size:
        raise ValueError("need groups of at least 2 that tile the rewards")
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        total = sum(group)
        out.extend(r - (total - r) / (group_size - 1) for r in group)
    return out


class ReinforceTrainer(GRPOTrainer):
    """``GRPOTrainer`` whose advantages are the exact RLOO advantages (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        wrong = {k: getattr(self.args, k) for k, v in REINFORCE_SETTINGS.items() if getattr(self.args, k) != v}
        if wrong:
            raise ValueError(f"ReinforceTrainer needs {REINFORCE_SETTINGS}; got {wrong}")

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        group = self.num_generations if self.model.training else self.num_generations_eval
        output["advantages"] = output["advantages"] * (group / (group - 1))
        return output

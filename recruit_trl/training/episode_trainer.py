"""Episode mode's trainer: TRL's ``GRPOTrainer`` (or a subclass of it) trained on the episode rollout's advantages.

:class:`recruit_trl.rollout.rollout_funcs.EpisodeRollout` returns one row per drawn decision with its own advantage
(the ``advantage`` field, :mod:`recruit_trl.rollout.advantages`). TRL still runs the reward functions (their means are
logged) and forms its group advantages over consecutive rows, which here are unrelated decisions;
:class:`EpisodeAdvantages` replaces those with the rows' own. Everything else (the loss, KL to the reference with
``beta``, clipping, LoRA, accelerate) is TRL's.
"""

from __future__ import annotations

import torch
from trl import GRPOTrainer


class EpisodeAdvantages:
    """A mixin for ``GRPOTrainer`` classes: each row's advantage is its ``advantage`` field from the rollout."""

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)  # rollout fields are merged into ``inputs``
        try:
            advantages = [float(row["advantage"]) for row in inputs]
        except KeyError:
            raise ValueError("episode training needs the rollout's 'advantage' field: use --mode episode") from None
        output["advantages"] = torch.tensor(
            advantages, dtype=output["advantages"].dtype, device=output["advantages"].device
        )
        return output


def episode_trainer(trainer_cls: type = GRPOTrainer) -> type:
    """``trainer_cls`` trained on the episode rollout's advantages (:class:`EpisodeAdvantages` mixed in first)."""
    if issubclass(trainer_cls, EpisodeAdvantages):
        return trainer_cls
    return type(f"Episode{trainer_cls.__name__}", (EpisodeAdvantages, trainer_cls), {})

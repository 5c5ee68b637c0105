"""Episode mode's trainer: TRL's ``GRPOTrainer`` (or a subclass of it) trained on the episode rollout's advantages.

:class:`recruit_trl.rollout.rollout_funcs.EpisodeRollout` returns one row per drawn decision with its own advantage
(the ``advantage`` field, :mod:`recruit_trl.rollout.advantages`). TRL still runs the reward functions (their means are
logged) and forms its group advantages over consecutive rows, which here are unrelated decisions;
:class:`EpisodeAdvantages` replaces those with the rows' own, and so does what TRL logs of them: the ``advantages``
column of its completion logs, and ``frac_reward_zero_std``, which becomes the share of the rows trained on whose own
advantage is zero (no credit either way). Everything else (the loss, KL to the reference with ``beta``, clipping,
LoRA, accelerate) is TRL's.
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
        own = torch.tensor(advantages, dtype=output["advantages"].dtype, device=output["advantages"].device)
        output["advantages"] = own
        # TRL logged its own group advantages of these rows (every process's): log the rows' own instead.
        everyone = self.accelerator.gather(own).tolist()
        logged = self._logs["advantages"]
        for _ in range(min(len(everyone), len(logged))):
            logged.pop()
        logged.extend(everyone)
        mode = "train" if self.model.training else "eval"
        zero_std = self._metrics[mode]["frac_reward_zero_std"]
        if zero_std:
            zero_std[-1] = sum(1 for a in everyone if abs(a) < 1e-12) / max(1, len(everyone))
        return output


def episode_trainer(trainer_cls: type = GRPOTrainer) -> type:
    """``trainer_cls`` trained on the episode rollout's advantages (:class:`EpisodeAdvantages` mixed in first)."""
    if issubclass(trainer_cls, EpisodeAdvantages):
        return trainer_cls
    return type(f"Episode{trainer_cls.__name__}", (EpisodeAdvantages, trainer_cls), {})

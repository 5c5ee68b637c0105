"""The control of every learning claim: the same training with its advantages permuted among the rows.

:class:`ShuffledAdvantages` is mixed into a ``GRPOTrainer`` class (TRL's, :class:`recruit_trl.training.reinforce.
ReinforceTrainer`, or the episode-mode trainer) in front of everything else, so it permutes the advantages the rest
of the class computed: after TRL's group centring and scaling, the REINFORCE rescaling, or the episode rollout's own
advantages. The permutation runs over the rows of one generation batch of one process, which are the rows of one
optimizer step (TRL's default ``steps_per_generation = gradient_accumulation_steps``). The update keeps the size and
the distribution of the credit run's advantages, but no advantage belongs to its row any more: on-policy (importance
ratio 1) its expected gradient is zero, so what a credit run gains beyond its control is learnt from the credit.

:func:`rl_trainer_class` builds the trainer class of a run from the recipe's class, the rollout mode, constrained
decoding and the control flag.
"""

from __future__ import annotations

import torch

from recruit_trl.training.episode_trainer import episode_trainer
from recruit_trl.training.legal_logprobs import legal_trainer
from recruit_trl.training.length_batches import length_sorted_trainer


class ShuffledAdvantages:
    """A mixin for ``GRPOTrainer`` classes: training rows get the advantages of other rows of their batch.

    The permutation is drawn from ``(args.seed, global step, process index)``: a re-run permutes the same way.
    Evaluation batches (``model.training`` false) are left as they are.
    """

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if not self.model.training:
            return output
        advantages = output["advantages"]
        seed = (self.args.seed * 1_000_003 + self.state.global_step) * 257 + self.accelerator.process_index
        order = torch.randperm(advantages.size(0), generator=torch.Generator().manual_seed(seed))
        output["advantages"] = advantages[order.to(advantages.device)]
        return output


def control_trainer(trainer_cls: type) -> type:
    """``trainer_cls`` with :class:`ShuffledAdvantages` in front (the outermost override)."""
    if issubclass(trainer_cls, ShuffledAdvantages):
        return trainer_cls
    return type(f"Control{trainer_cls.__name__}", (ShuffledAdvantages, trainer_cls), {})


def rl_trainer_class(trainer_cls: type, mode: str, shuffle_advantages: bool, constrained: bool = False) -> type:
    """The trainer class of an RL run: ``trainer_cls`` with micro-batches of similar prompt lengths, on the
    log-probabilities of the legal tokens when the rollouts decode ``constrained``, trained on the rows' own advantages
    in episode mode, and with the advantages permuted among the rows when ``shuffle_advantages`` (the control)."""
    trainer_cls = length_sorted_trainer(trainer_cls)
    if constrained:
        trainer_cls = legal_trainer(trainer_cls)
    if mode == "episode":
        trainer_cls = episode_trainer(trainer_cls)
    return control_trainer(trainer_cls) if shuffle_advantages else trainer_cls

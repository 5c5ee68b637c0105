"""The control of every learning claim: the same training with its advantages permuted among the rows.

:class:`ShuffledAdvantages` is mixed into a ``GRPOTrainer`` class (TRL's, :class:`recruit_trl.training.reinforce.
ReinforceTrainer`, or the episode-mode trainer) in front of everything else, so it permutes the advantages the rest
of the class computed: after TRL's group centring and scaling, the REINFORCE rescaling, or the episode rollout's own
advantages. The permutation runs over the rows of one generation batch of one process, which are the rows of one
optimizer step (TRL's default ``steps_per_generation = gradient_accumulation_steps``).

Why the control is an exact null: on-policy (importance ratio 1) the loss's gradient is linear in the advantages,
``sum_i A_i g_i``, so averaged over the permutations it is ``mean(A) * sum_i g_i``: zero only when the trained rows'
advantages sum to zero. TRL's group advantages do (every group's rows are centred on the group's mean), episode mode's
per-decision advantages need not (rows are a sample of the decisions, longer episodes carry more of them). So
:class:`CenteredAdvantages` subtracts the mean advantage of the rows a process trains in a generation batch, in both
arms (the arms then differ only by the permutation): what a credit run gains beyond its control is learnt from the
credit.

:func:`rl_trainer_class` builds the trainer class of a run from the recipe's class, the rollout mode, constrained
decoding and the control flag.
"""

from __future__ import annotations

import torch

from recruit_trl.training.episode_trainer import episode_trainer
from recruit_trl.training.legal_logprobs import legal_trainer
from recruit_trl.training.length_batches import length_sorted_trainer
from recruit_trl.training.packed_groups import packed_trainer
from recruit_trl.training.trl_api import check_trl_private_api
from recruit_trl.training.vllm_colocate import VLLMOnCPU

check_trl_private_api()  # the mixins below override TRL's private methods: refuse a TRL whose signatures changed


class CenteredAdvantages:
    """A mixin for ``GRPOTrainer`` classes: the training rows' advantages minus their mean over the generation batch
    of this process (the rows one optimizer step trains on). Evaluation batches are left as they are."""

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        if self.model.training:
            advantages = output["advantages"]
            output["advantages"] = advantages - advantages.mean()
        return output


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


def centered_trainer(trainer_cls: type) -> type:
    """``trainer_cls`` with :class:`CenteredAdvantages` in front."""
    if issubclass(trainer_cls, CenteredAdvantages):
        return trainer_cls
    return type(trainer_cls.__name__, (CenteredAdvantages, trainer_cls), {})


def rl_trainer_class(trainer_cls: type, mode: str, shuffle_advantages: bool, constrained: bool = False) -> type:
    """The trainer class of an RL run: ``trainer_cls`` with micro-batches of similar prompt lengths, on the
    log-probabilities of the legal tokens when the rollouts decode ``constrained``, the rows that share a prompt
    scored packed (:mod:`recruit_trl.training.packed_groups`), trained on the rows' own advantages
    in episode mode, the advantages centred over the rows trained, and permuted among the rows when
    ``shuffle_advantages`` (the control); with ``use_vllm`` and no GPU, TRL's vLLM generator is the CPU one
    (:mod:`recruit_trl.training.vllm_colocate`)."""
    trainer_cls = length_sorted_trainer(trainer_cls)
    if not issubclass(trainer_cls, VLLMOnCPU):  # TRL's vLLM generator made to work on CPU (use_vllm)
        trainer_cls = type(trainer_cls.__name__, (VLLMOnCPU, trainer_cls), {})
    if constrained:
        trainer_cls = legal_trainer(trainer_cls)
    trainer_cls = packed_trainer(trainer_cls)
    if mode == "episode":
        trainer_cls = episode_trainer(trainer_cls)
    trainer_cls = centered_trainer(trainer_cls)
    return control_trainer(trainer_cls) if shuffle_advantages else trainer_cls

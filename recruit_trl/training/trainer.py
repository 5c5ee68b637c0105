"""The trainers of the RL recipes: :class:`RecruitGRPOTrainer` and :class:`RecruitReinforceTrainer`.

``RecruitGRPOTrainer`` is TRL's ``GRPOTrainer`` with a ``rollout_func`` from :mod:`recruit_trl.rollout`, plus what
long-horizon rollouts need; everything else (the loss, clipping, KL to the reference with ``beta``, LoRA, accelerate,
checkpoints) is TRL's:

* **Packed groups** (:class:`~recruit_trl.training.packed_groups.PackedGroups`): the rows of a micro-batch that share a
  prompt (a branch-mode group) are scored in one forward, the prompt once; equal to the unpacked computation to
  rounding (checked on the first batch; off, with the reason logged, for models that cannot honour it).
* **Legal-token log-probabilities** (:class:`~recruit_trl.training.legal_logprobs.LegalLogprobs`): when the rollout
  decodes constrained and returns each position's legal tokens, every log-probability the trainer computes is over
  those tokens, the distribution the answer was sampled from.
* **Length-sorted micro-batches** (:class:`~recruit_trl.training.length_batches.LengthSortedBatches`): a generation
  batch is split into micro-batches of similar prompt lengths where that leaves the gradient unchanged.
* **The rows' own advantages** (``episode_advantages=True``, episode mode): each row trains on its ``advantage``
  field from the episode rollout instead of TRL's group advantages, which would compare unrelated decisions.
* **Centred advantages**: the training rows' advantages minus their mean over the process's generation batch (the
  rows of one optimizer step), in every run.
* **The control** (``shuffle_advantages=True``): the training rows' advantages permuted among the rows of that
  batch, after everything above: the same run with the credit carried by no row.
* **vLLM on a CPU** (``use_vllm`` without a GPU): TRL's colocated generator with the engine and weight sync of
  vLLM's CPU build (:mod:`recruit_trl.training.vllm_colocate`).

Why centring: on-policy (importance ratio 1) the loss's gradient is linear in the advantages, ``sum_i A_i g_i``, so
averaged over the permutations it is ``mean(A) * sum_i g_i``: zero only when the trained rows' advantages sum to
zero. TRL's group advantages do, episode mode's per-decision advantages need not (rows are a sample of the decisions,
longer episodes carry more of them). Both arms are centred, so they differ only by the permutation.

``RecruitReinforceTrainer`` is REINFORCE with an exact leave-one-out baseline (RLOO) on the same machinery. TRL's
``RLOOTrainer`` has no ``rollout_func`` hook, so it is ``RecruitGRPOTrainer`` configured as plain policy gradient
(:data:`REINFORCE_SETTINGS`: no std normalisation, no KL, on-policy, a constant normaliser). GRPO's advantage is then
``r_i - mean(r)`` over the group of G samples; multiplying it by ``G / (G - 1)`` gives exactly the leave-one-out
advantage ``r_i - mean_{j != i} r_j``:

    (r_i - (1/G) sum_j r_j) * G/(G-1) = (G r_i - r_i - sum_{j != i} r_j) / (G-1) = r_i - mean_{j != i} r_j.

The private ``GRPOTrainer`` members these classes override or call are listed, and checked against the installed TRL
at import, in :mod:`recruit_trl.training.trl_api`.
"""

from __future__ import annotations

from typing import Any

import torch
from trl import GRPOTrainer

from recruit_trl.training.legal_logprobs import LegalLogprobs
from recruit_trl.training.length_batches import LengthSortedBatches
from recruit_trl.training.packed_groups import PackedGroups
from recruit_trl.training.trl_api import check_trl_private_api
from recruit_trl.training.vllm_colocate import cpu_vllm_generation

check_trl_private_api()  # the classes below override TRL's private methods: refuse a TRL that changed them

REINFORCE_SETTINGS = {"scale_rewards": "none", "beta": 0.0, "num_iterations": 1, "loss_type": "dr_grpo"}


class RecruitGRPOTrainer(PackedGroups, LegalLogprobs, LengthSortedBatches, GRPOTrainer):
    """TRL's ``GRPOTrainer`` for multi-step environments (see the module docstring).

    Args:
        *args, **kwargs: ``GRPOTrainer``'s (``model``, ``reward_funcs``, ``args``, ``train_dataset``,
            ``processing_class``, ``peft_config``, ``rollout_func``, ...).
        episode_advantages: train each row on the ``advantage`` field its rollout returned (episode mode's
            :class:`~recruit_trl.rollout.rollout_funcs.EpisodeRollout`) instead of TRL's group advantages.
        shuffle_advantages: the control of a learning claim: the training rows' advantages permuted among the rows
            of their generation batch and multiplied by one random sign, both drawn from ``(args.seed, global step,
            process index)``. The permutation takes the credit away (the mean gradient over permutations is zero);
            the sign makes each optimizer step's update distribution symmetric, so that its mean is zero under
            AdamW and gradient clipping as well, which are not linear in the gradient (a skewed group's mean AdamW
            step over permutations alone is not zero). That holds for one optimizer step per generation batch and
            one pass over it: the recipes refuse the control with ``num_iterations > 1`` or ``steps_per_generation
            > gradient_accumulation_steps``.

    Example::

        trainer = RecruitGRPOTrainer(
            model="path/to/model", reward_funcs=get_reward_funcs(["final_score_reward"]), args=GRPOConfig(...),
            train_dataset=anchors, rollout_func=make_rollout(RolloutConfig(env_name="clinical")),
        )
        trainer.train()
    """

    def __init__(self, *args: Any, episode_advantages: bool = False, shuffle_advantages: bool = False, **kwargs: Any):
        self.episode_advantages = episode_advantages
        self.shuffle_advantages = shuffle_advantages
        with cpu_vllm_generation():  # use_vllm without a GPU: TRL's generator with vLLM's CPU build
            super().__init__(*args, **kwargs)

    def group_advantages(self, advantages: torch.Tensor) -> torch.Tensor:
        """TRL's group advantages as this trainer uses them (a hook: REINFORCE rescales them)."""
        return advantages

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)  # the rollout's fields are merged into ``inputs``
        advantages = self.group_advantages(output["advantages"])
        if self.episode_advantages:
            advantages = self._rows_own_advantages(inputs, advantages)
        if self.model.training:  # evaluation batches are left as they are
            advantages = advantages - advantages.mean()
            if self.shuffle_advantages:
                permutation, sign = self._control_draw(advantages.size(0))
                advantages = sign * advantages[permutation.to(advantages.device)]
        output["advantages"] = advantages
        return output

    def _rows_own_advantages(self, inputs: list[dict], group: torch.Tensor) -> torch.Tensor:
        """Each row's ``advantage`` field, and what TRL logs of the advantages made to say so: its ``advantages``
        completion log, and ``frac_reward_zero_std`` as the share of rows whose own advantage is zero (no credit)."""
        try:
            values = [float(row["advantage"]) for row in inputs]
        except KeyError:
            raise ValueError("episode_advantages needs the rollout's 'advantage' field: use --mode episode") from None
        own = torch.tensor(values, dtype=group.dtype, device=group.device)
        everyone = self.accelerator.gather(own).tolist()
        logged = self._logs["advantages"]  # TRL logged its own group advantages of these rows (every process's)
        for _ in range(min(len(everyone), len(logged))):
            logged.pop()
        logged.extend(everyone)
        zero_std = self._metrics["train" if self.model.training else "eval"]["frac_reward_zero_std"]
        if zero_std:
            zero_std[-1] = sum(1 for a in everyone if abs(a) < 1e-12) / max(1, len(everyone))
        return own

    def _control_draw(self, rows: int) -> tuple[torch.Tensor, float]:
        """The control's permutation of ``rows`` rows and its sign (+1 or -1): a re-run draws the same."""
        seed = (self.args.seed * 1_000_003 + self.state.global_step) * 257 + self.accelerator.process_index
        generator = torch.Generator().manual_seed(seed)
        permutation = torch.randperm(rows, generator=generator)
        return permutation, 1.0 if torch.rand((), generator=generator) < 0.5 else -1.0


class RecruitReinforceTrainer(RecruitGRPOTrainer):
    """:class:`RecruitGRPOTrainer` whose advantages are the exact RLOO advantages (see the module docstring); its
    ``args`` must carry :data:`REINFORCE_SETTINGS`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        wrong = {k: getattr(self.args, k) for k, v in REINFORCE_SETTINGS.items() if getattr(self.args, k) != v}
        if wrong:
            raise ValueError(f"RecruitReinforceTrainer needs {REINFORCE_SETTINGS}; got {wrong}")

    def group_advantages(self, advantages: torch.Tensor) -> torch.Tensor:
        group = self.num_generations if self.model.training else self.num_generations_eval
        return advantages * (group / (group - 1))


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

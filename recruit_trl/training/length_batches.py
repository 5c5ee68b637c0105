"""Micro-batches of similar prompt lengths, each as wide as its own longest prompt.

TRL's ``GRPOTrainer`` left-pads every prompt of a generation batch to the batch's longest, shuffles the rows and
splits them into ``steps_per_generation`` micro-batches, so every forward and backward of the loss runs over the
generation batch's full width. Decision prompts vary in length (a conquest state lists a few or many territories and
candidates), and a fifth or more of those positions can be padding. :class:`LengthSortedBatches` splits the generation
batch by prompt length instead (:func:`length_sorted_split`) and drops each micro-batch's all-padding columns.

Dropping left padding leaves every row's tokens and their relative positions as they were (the model numbers
positions from the first column, and rotary embeddings depend only on the distance between positions), so each row's
per-token loss is TRL's up to floating-point rounding. Which rows share a micro-batch changes an optimizer step's
gradient only where TRL's ``GRPOTrainer._compute_loss`` reduces over a micro-batch in a way that is not a fixed weight
per row; :func:`length_sort_differs` names those settings, and a trainer with one of them takes TRL's split:

- ``grpo``, ``sapo``, ``luspo``: the mean over the micro-batch's rows, divided by the accumulation steps; every
  micro-batch has the same number of rows, so each row weighs ``1 / (rows * steps)`` whatever the split.
- ``dr_grpo``: the sum divided by ``rows * max_completion_length * steps``, a constant.
- ``dapo`` (TRL's default), ``cispo``, ``vespo``: the sum divided by ``num_items_in_batch``, the completion tokens of
  the whole generation batch.
- ``bnpo``: the sum divided by the micro-batch's own token count: the split changes every row's weight.
- ``top_entropy_quantile < 1``: the entropy threshold is a quantile of the micro-batch's tokens.
- an entropy bonus (``entropy_coef != 0`` or ``use_adaptive_entropy``): the mean entropy over the micro-batch's tokens.
- a mixture-of-experts model's router loss: its load balance is measured per micro-batch.
- ``steps_per_generation`` not dividing ``gradient_accumulation_steps``: an optimizer step trains part of a generation
  batch, which would be a band of prompt lengths instead of a random subset of rows.

Everything else the loss uses is fixed per row before the split (advantages and their scaling, the reference and old
log-probabilities, importance-sampling ratios, truncation masks) or per token (clipping, ``delta``, the KL term).
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from trl.trainer.utils import (
    shuffle_sequence_dict,
    split_pixel_values_by_grid,
    split_tensor_dict,
    unsplit_pixel_values_by_grid,
)

logger = logging.getLogger(__name__)

PROMPT_COLUMNS = ("prompt_ids", "prompt_mask")  # the tensors whose columns are prompt positions
# Tensors of multimodal batches that would need cutting with the prompts: such batches take TRL's split.
PROMPT_ALIGNED = ("token_type_ids", "mm_token_type_ids", "pixel_values", "image_position_ids")
# The loss types of TRL 1.16 whose sum over an optimizer step's micro-batches of equal row counts gives every row a
# weight that does not depend on the other rows of its micro-batch (GRPOTrainer._compute_loss, its normalisers).
SPLIT_FREE_LOSSES = frozenset({"grpo", "sapo", "luspo", "dr_grpo", "dapo", "cispo", "vespo"})
# The loss types TRL 1.16 knows whose normaliser depends on the micro-batch, and what it is.
SPLIT_BOUND_LOSSES = {"bnpo": "normalises by each micro-batch's own token count"}


def length_sort_differs(args: Any, aux_loss: bool = False) -> str | None:
    """Why splitting by prompt length would change an optimizer step's gradient from TRL's split, or None.

    Args:
        args: the trainer's ``GRPOConfig`` (its loss type, entropy settings and batch geometry are read).
        aux_loss: whether the loss adds a mixture-of-experts router loss (the trainer's ``aux_loss_enabled``, which
            depends on the model as well as on ``args``).

    Returns:
        None when every row's weight in the step's gradient is the same under either split (the gradients then
        agree up to rounding), else a short reason naming the setting, e.g.
        ``"loss_type='bnpo' normalises by each micro-batch's own token count"``.
    """
    if args.loss_type not in SPLIT_FREE_LOSSES:
        why = SPLIT_BOUND_LOSSES.get(args.loss_type, "is not known to weigh rows independently of the split")
        return f"loss_type={args.loss_type!r} {why}"
    if args.top_entropy_quantile < 1.0:
        return (
            f"top_entropy_quantile={args.top_entropy_quantile} masks tokens by a quantile of each micro-batch's "
            "entropies"
        )
    if args.entropy_coef != 0.0 or args.use_adaptive_entropy:
        return (
            f"the entropy bonus (entropy_coef={args.entropy_coef}, use_adaptive_entropy={args.use_adaptive_entropy}) "
            "is a mean over each micro-batch's tokens"
        )
    if aux_loss:
        return "the router's load-balancing loss is computed per micro-batch"
    steps, accumulation = args.steps_per_generation, args.gradient_accumulation_steps
    if accumulation % steps:
        return (
            f"steps_per_generation={steps} does not divide gradient_accumulation_steps={accumulation}: an optimizer "
            "step would train one band of prompt lengths instead of a random subset of the generation batch"
        )
    return None


def length_sorted_split(batch: dict[str, Any], chunks: int, multiple: int | None = None) -> list[dict[str, Any]]:
    """``batch`` (a generation batch: tensors and lists of one row per sample, scalars) split into ``chunks``
    micro-batches of equal size by prompt length (shortest first; the rows of one prompt next to each other, so that
    they share micro-batches and :mod:`recruit_trl.training.packed_groups` scores their prompt once; otherwise in the
    batch's order), each prompt tensor cut to the micro-batch's longest prompt (the left padding every row has is
    dropped), rounded up to a ``multiple`` of columns when one is given (TRL's ``pad_to_multiple_of``: shapes stay
    multiples of it)."""
    mask = batch["prompt_mask"]
    rows = mask.size(0)
    if rows % chunks:
        raise ValueError(f"{rows} rows do not split into {chunks} equal micro-batches")
    prompts: dict[tuple[int, ...], int] = {}  # each distinct prompt, numbered in the order of its first row
    first = [  # left padding is dropped: the prompt is the row's attended tokens
        prompts.setdefault(tuple(row[-length:]), len(prompts)) if length else -1
        for row, length in zip(batch["prompt_ids"].tolist(), mask.sum(dim=1).tolist(), strict=True)
    ]
    order = torch.argsort(mask.sum(dim=1).cpu() * rows + torch.tensor(first), stable=True)
    size = rows // chunks
    out = []
    for i in range(chunks):
        index = order[i * size : (i + 1) * size]
        chunk = {key: _rows(value, index) for key, value in batch.items()}
        width = int(chunk["prompt_mask"].sum(dim=1).max())
        if multiple:
            width = min(mask.size(1), -(-width // multiple) * multiple)
        for key in PROMPT_COLUMNS:
            chunk[key] = chunk[key][:, chunk[key].size(1) - width :]
        out.append(chunk)
    return out


def _rows(value: Any, index: torch.Tensor) -> Any:
    if value is None or (isinstance(value, torch.Tensor) and value.ndim == 0):
        return value  # a scalar of the whole batch, e.g. num_items_in_batch
    if isinstance(value, torch.Tensor):
        return value[index.to(value.device)]
    return [value[i] for i in index.tolist()]


class LengthSortedBatches:
    """A ``GRPOTrainer`` mixin of :class:`~recruit_trl.training.trainer.RecruitGRPOTrainer`: a generation batch is
    split into micro-batches of similar prompt lengths (:func:`length_sorted_split`, the rows of a prompt together,
    prompts of one length in TRL's random order) instead of TRL's random split, with the same buffering: one
    generation every ``steps_per_generation * num_iterations`` micro-steps, micro-step ``k`` trains on micro-batch
    ``k % steps_per_generation``.

    A trainer whose settings make the split change the gradient (:func:`length_sort_differs`) runs TRL's own
    ``_prepare_inputs`` and logs why once; so do evaluation batches. A batch of one micro-batch and a multimodal one
    take TRL's split after generation."""

    _length_sort_checked = False
    _length_sort_off: str | None = None  # why this trainer takes TRL's split, once checked

    def _prepare_inputs(self, generation_batch: dict[str, Any]) -> dict[str, Any]:
        if not self.model.training or self._trl_split_reason() is not None:
            return super()._prepare_inputs(generation_batch)
        steps = self.args.steps_per_generation
        if self._step % (steps * self.num_iterations) == 0 or self._buffered_inputs is None:
            # TRL's steps in TRL's order: the shuffle is the same draw from the global RNG as TRL's split, so later
            # sampling is unchanged
            batch = self._generate_and_score_completions(generation_batch)
            batch = shuffle_sequence_dict(split_pixel_values_by_grid(batch))
            if steps == 1 or any(batch.get(key) is not None for key in PROMPT_ALIGNED):
                # one micro-batch (nothing to sort) or prompt-aligned image tensors: TRL's split
                self._buffered_inputs = [unsplit_pixel_values_by_grid(b) for b in split_tensor_dict(batch, steps)]
            else:
                self._buffered_inputs = length_sorted_split(batch, steps, self.pad_to_multiple_of)
        return self._buffered_inputs[self._step % steps]

    def _trl_split_reason(self) -> str | None:
        """:func:`length_sort_differs` for this trainer, logged as a warning the first time it gives a reason."""
        if not self._length_sort_checked:
            self._length_sort_off = length_sort_differs(self.args, aux_loss=self.aux_loss_enabled)
            self._length_sort_checked = True
            if self._length_sort_off is not None:
                logger.warning("length-sorted micro-batches off: %s; using TRL's split", self._length_sort_off)
        return self._length_sort_off

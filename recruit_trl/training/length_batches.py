"""Micro-batches of similar prompt lengths, each as wide as its own longest prompt.

TRL's ``GRPOTrainer`` left-pads every prompt of a generation batch to the batch's longest, shuffles the rows and
splits them into ``steps_per_generation`` micro-batches, so every forward and backward of the loss runs over the
generation batch's full width. Decision prompts vary in length (a conquest state lists a few or many territories and
candidates), and a fifth or more of those positions can be padding. :class:`LengthSortedBatches` splits the generation
batch by prompt length instead (:func:`length_sorted_split`) and drops each micro-batch's all-padding columns.

What an optimizer step learns is unchanged: it sums the gradients of all the rows of the generation batch whatever the
split (TRL's default ``dapo`` loss divides by the tokens of the whole batch), and dropping left padding leaves every
row's tokens and their relative positions as they were (the model numbers positions from the first column, and rotary
embeddings depend only on the distance between positions), so results differ from TRL's split only by floating-point
rounding.
"""

from __future__ import annotations

from typing import Any

import torch
from trl.trainer.utils import shuffle_sequence_dict, split_tensor_dict

PROMPT_COLUMNS = ("prompt_ids", "prompt_mask")  # the tensors whose columns are prompt positions
# Tensors of multimodal batches that would need cutting with the prompts: such batches take TRL's split.
PROMPT_ALIGNED = ("token_type_ids", "mm_token_type_ids", "pixel_values", "image_position_ids")


def length_sorted_split(batch: dict[str, Any], chunks: int) -> list[dict[str, Any]]:
    """``batch`` (a generation batch: tensors and lists of one row per sample, scalars) split into ``chunks``
    micro-batches of equal size by prompt length (shortest first), each prompt tensor cut to the micro-batch's longest
    prompt (the left padding every row has is dropped)."""
    mask = batch["prompt_mask"]
    rows = mask.size(0)
    if rows % chunks:
        raise ValueError(f"{rows} rows do not split into {chunks} equal micro-batches")
    order = torch.argsort(mask.sum(dim=1), stable=True)
    size = rows // chunks
    out = []
    for i in range(chunks):
        index = order[i * size : (i + 1) * size]
        chunk = {key: _rows(value, index) for key, value in batch.items()}
        width = int(chunk["prompt_mask"].sum(dim=1).max())
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
    """A mixin for ``GRPOTrainer`` classes: a generation batch is split into micro-batches of similar prompt lengths
    (:func:`length_sorted_split`, ties in TRL's random order) instead of TRL's random split, with the same buffering:
    one generation every ``steps_per_generation * num_iterations`` micro-steps, micro-step ``k`` trains on
    micro-batch ``k % steps_per_generation``. A batch of one micro-batch, an evaluation batch and a multimodal one
    take TRL's own path."""

    def _prepare_inputs(self, generation_batch: dict[str, Any]) -> dict[str, Any]:
        if not self.model.training:
            return super()._prepare_inputs(generation_batch)
        steps = self.args.steps_per_generation
        if self._step % (steps * self.num_iterations) == 0 or self._buffered_inputs is None:
            # TRL's shuffle first: the same draw from the global RNG as TRL's split, so later sampling is unchanged
            batch = shuffle_sequence_dict(self._generate_and_score_completions(generation_batch))
            if steps == 1 or any(batch.get(key) is not None for key in PROMPT_ALIGNED):
                self._buffered_inputs = split_tensor_dict(batch, steps)  # one micro-batch: nothing to sort
            else:
                self._buffered_inputs = length_sorted_split(batch, steps)
        return self._buffered_inputs[self._step % steps]


def length_sorted_trainer(trainer_cls: type) -> type:
    """``trainer_cls`` with :class:`LengthSortedBatches` mixed in, under the same name: what it trains is
    ``trainer_cls``'s (the name reaches the model card and the run report)."""
    if issubclass(trainer_cls, LengthSortedBatches):
        return trainer_cls
    return type(trainer_cls.__name__, (LengthSortedBatches, trainer_cls), {})

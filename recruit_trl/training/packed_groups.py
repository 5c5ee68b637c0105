"""Each prompt computed once in the trainer's passes: the rows of a micro-batch that share a prompt, packed.

A GRPO group is ``num_generations`` rows of one prompt, each followed by its own completion; in branch mode the
prompt is hundreds of tokens and the completion a few, so TRL's forward and backward run the same prompt once per
row. :class:`PackedGroups` scores such rows as one sequence per distinct prompt (:func:`pack_groups`)::

    prompt[:-1] | prompt[-1] completion_1 | prompt[-1] completion_2 | ...

Every completion segment starts with a copy of the prompt's last token, the position that predicts the completion's
first token, so each completion token is predicted inside its own segment (one label per position: TRL's fused LM
head scores the packed sequence as it scores a row). Position ids continue the prompt in every segment, and a 4D
attention mask lets a token see the shared prefix and the earlier tokens of its own segment only
(:meth:`PackedBatch.attention_mask`): each completion token sees exactly the tokens it sees in its own row, so its
log-probability, and the gradient of any loss on them, equal the unpacked computation up to floating-point rounding
(the shared prefix's gradient is the sum of its rows' in one pass instead of several).

The packed path covers the loss's forward and backward, the old and the reference log-probabilities, TRL's fused LM
head (full vocabulary) and the legal-token log-probabilities of constrained decoding
(:mod:`recruit_trl.training.legal_logprobs`), LoRA (4-bit too) or every weight, activation checkpointing, every loss
type and DDP (the model is called as usual, with a different batch). A chunk of rows that share no prompt, or whose
masks are not a left-padded prompt and a completion prefix, takes TRL's path. So does a whole run, said once in the
log, where packing cannot be exact: a mixture-of-experts router loss (balanced over tokens), multimodal inputs, an
attention implementation that takes no dense 4D mask (only ``sdpa`` and ``eager`` do), sliding-window or non-attention
layers (:func:`packing_unsupported`), and a model whose first packed chunk does not give the unpacked log-probabilities
(checked once, in eval mode: a model that ignores the mask fails it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from recruit_trl.training.legal_logprobs import (
    LegalLogprobs,
    captured_hidden_states,
    legal_head_logps_and_entropy,
    logit_transform,
    unwrapped_causal_lm,
)

logger = logging.getLogger(__name__)

IGNORE = -100  # a position that predicts no token (TRL's label convention)
# The attention implementations that take a dense 4D mask as it is given (transformers' masking_utils returns a 4D
# mask unchanged): a boolean one for SDPA, an additive one for eager.
DENSE_MASK_ATTENTION = ("sdpa", "eager")
# How far the first packed chunk's log-probabilities may lie from the unpacked ones: rounding is far below (1e-6 in
# float32, ~1e-2 in bfloat16); a mask the model ignores lets completions see each other, which moves them by O(1).
CHECK_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-6}
CHECK_TOLERANCE_HALF = 0.25


@dataclass
class PackedBatch:
    """Rows packed by shared prompt (:func:`pack_groups`).

    Attributes:
        input_ids: ``(packs, L)`` the packed sequences, right-padded.
        position_ids: ``(packs, L)`` each token's position in its own row (prompt ``0..p-1``, completion after it).
        segments: ``(packs, L)`` 0 for the shared prefix, ``k >= 1`` for the k-th completion segment, -1 for padding.
        shift_labels: ``(packs, L)`` the token each position predicts (its next token in its own row), else -100.
        source: ``(rows, T)`` for each completion token of the unpacked batch, the flat index (``pack * L + i``) of
            the packed position that predicts it; -1 for a position outside the row's completion.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segments: torch.Tensor
    shift_labels: torch.Tensor
    source: torch.Tensor

    def attention_mask(self, implementation: str, dtype: torch.dtype) -> torch.Tensor:
        """``(packs, 1, L, L)``: a token sees the earlier tokens of the shared prefix and of its own segment; a
        padding token sees itself only (a query that sees nothing would give NaN). Boolean (True: attend) for SDPA,
        additive (0 or the dtype's minimum) for eager."""
        seg = self.segments
        length = seg.size(1)
        causal = torch.ones(length, length, dtype=torch.bool, device=seg.device).tril()
        query, key = seg.unsqueeze(2), seg.unsqueeze(1)
        visible = causal & (key >= 0) & (query >= 0) & ((key == 0) | (key == query))
        eye = torch.eye(length, dtype=torch.bool, device=seg.device)
        mask = (visible | (eye & (query < 0))).unsqueeze(1)
        if implementation == "sdpa":
            return mask
        return torch.zeros(mask.shape, dtype=dtype, device=seg.device).masked_fill(~mask, torch.finfo(dtype).min)

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` of the packed positions ``(packs, L, ...)`` as the unpacked batch's ``(rows, T, ...)``: each
        completion token gets the value of the position that predicts it, every other position 0 (still connected
        to ``values``, so a batch without a completion token gives a zero gradient)."""
        flat = values.reshape(-1, *values.shape[2:])
        taken = flat[self.source.clamp(min=0)]
        keep = (self.source >= 0).view(*self.source.shape, *([1] * (values.dim() - 2)))
        return torch.where(keep, taken, torch.zeros((), dtype=taken.dtype, device=taken.device))


def pack_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> PackedBatch | None:
    """Pack the rows of a batch that share a prompt, or None when no two rows do (or the masks are not a left-padded
    prompt followed by a completion whose attended tokens come first).

    Args:
        input_ids: ``(rows, P + T)`` each row's prompt (left-padded) and completion (right-padded), as TRL builds them.
        attention_mask: ``(rows, P + T)`` 1 for the tokens a row attends to.
        logits_to_keep: ``T``, the completion width.

    Returns:
        A :class:`PackedBatch` with one pack per distinct prompt (a prompt of one row packs that row alone), in the
        order of the prompts' first rows.
    """
    rows, width = input_ids.shape
    prompt_width = width - logits_to_keep
    device = input_ids.device
    mask = attention_mask.bool()
    prompt_lengths = mask[:, :prompt_width].sum(1)
    completion_lengths = mask[:, prompt_width:].sum(1)
    columns = torch.arange(width, device=device)
    expected = (columns >= prompt_width - prompt_lengths.unsqueeze(1)) & (
        columns < prompt_width + completion_lengths.unsqueeze(1)
    )
    if not torch.equal(mask, expected) or bool((prompt_lengths == 0).any()):
        return None
    ids, prompt_lengths, completion_lengths = input_ids.tolist(), prompt_lengths.tolist(), completion_lengths.tolist()
    groups: dict[tuple[int, ...], list[int]] = {}
    for row in range(rows):
        groups.setdefault(tuple(ids[row][prompt_width - prompt_lengths[row] : prompt_width]), []).append(row)
    if len(groups) == rows:
        return None
    packs, where = [], {}  # where[row] = (pack, offset of the position predicting its first completion token)
    for pack, (prompt, members) in enumerate(groups.items()):
        tokens, positions = list(prompt[:-1]), list(range(len(prompt) - 1))
        segments, labels = [0] * len(tokens), [IGNORE] * len(tokens)
        for k, row in enumerate(members, start=1):
            completion = ids[row][prompt_width : prompt_width + completion_lengths[row]]
            if not completion:
                continue  # nothing scored (e.g. a truncated completion TRL masked out)
            where[row] = (pack, len(tokens))
            tokens += [prompt[-1], *completion]
            positions += range(len(prompt) - 1, len(prompt) + len(completion))
            segments += [k] * (len(completion) + 1)
            labels += [*completion, IGNORE]
        packs.append((tokens, positions, segments, labels))
    length = max(len(p[0]) for p in packs)

    def padded(i: int, fill: int) -> torch.Tensor:
        return torch.tensor([p[i] + [fill] * (length - len(p[i])) for p in packs], dtype=torch.long, device=device)

    pad_token = int(input_ids[0, -1])  # any real id: padding is masked and predicts nothing
    source = torch.full((rows, logits_to_keep), -1, dtype=torch.long)
    for row, (pack, offset) in where.items():
        n = completion_lengths[row]
        source[row, :n] = pack * length + offset + torch.arange(n)
    return PackedBatch(
        input_ids=padded(0, pad_token),
        position_ids=padded(1, 0),
        segments=padded(2, -1),
        shift_labels=padded(3, IGNORE),
        source=source.to(device),
    )


def packing_unsupported(config) -> str | None:
    """Why a model with this config cannot score packed rows exactly, or None: an attention implementation without a
    dense 4D mask, a mixture-of-experts router loss, or layers other than full attention (a sliding window or a
    recurrent layer does not read the mask the packing relies on)."""
    implementation = getattr(config, "_attn_implementation", None) or "eager"
    if implementation not in DENSE_MASK_ATTENTION:
        return f"attn_implementation={implementation!r} takes no dense 4D attention mask (packing needs sdpa or eager)"
    text_config = config.get_text_config()
    layer_types = getattr(text_config, "layer_types", None)
    if layer_types is not None and any(kind != "full_attention" for kind in layer_types):
        return f"the model has layers other than full attention ({sorted(set(layer_types))})"
    if (
        layer_types is None
        and getattr(text_config, "sliding_window", None)
        and getattr(text_config, "use_sliding_window", True)
    ):
        return f"the model attends within a sliding window of {text_config.sliding_window} tokens"
    return None


class PackedGroups:
    """A ``GRPOTrainer`` mixin of :class:`~recruit_trl.training.trainer.RecruitGRPOTrainer`: every log-probability the
    trainer computes (the loss's, the old and the reference policy's) scores the rows that share a prompt packed
    (:func:`pack_groups`), with TRL's fused LM head, or over the legal tokens when
    :class:`~recruit_trl.training.legal_logprobs.LegalLogprobs` is mixed in behind it. Everything else, and every batch
    or model the packing does not cover, takes the next class's path."""

    _packing_off: str | None = None  # why this trainer scores rows unpacked, once known
    _packing_checked = False  # whether the first packed chunk was compared with the unpacked computation

    def _get_per_token_logps_and_entropies(
        self,
        model,
        input_ids,
        attention_mask,
        logits_to_keep,
        batch_size=None,
        compute_entropy=False,
        compute_aux_loss=False,
        **kwargs,
    ):
        unpacked = super()._get_per_token_logps_and_entropies
        given = sorted(name for name, value in kwargs.items() if value is not None)
        if self._packing_reason(model, compute_aux_loss, given) is not None:
            return unpacked(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **kwargs,
            )  # fmt: skip
        legal = self._legal_ids(logits_to_keep, input_ids.device) if isinstance(self, LegalLogprobs) else None
        batch_size = batch_size or input_ids.size(0)
        if not self._packing_checked:  # every process reaches this call together: see _check_packing
            first = slice(0, batch_size)
            self._check_packing(model, input_ids[first], attention_mask[first], logits_to_keep, legal, first)
        all_logps, all_entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            rows = slice(start, start + batch_size)
            ids, mask = input_ids[rows], attention_mask[rows]
            # packed only once the check has passed (and not turned packing off)
            packed = (
                pack_groups(ids, mask, logits_to_keep) if self._packing_checked and not self._packing_off else None
            )
            if packed is None:
                with self._chunk_legal(legal, rows):  # the next class scores this chunk over its legal tokens
                    logps, entropies, _ = unpacked(model, ids, mask, logits_to_keep, compute_entropy=compute_entropy)
            else:
                chunk_legal = legal[rows] if legal is not None else None
                logps, entropies = self._packed_logps(model, ids, logits_to_keep, packed, chunk_legal, compute_entropy)
            all_logps.append(logps)
            all_entropies.append(entropies)
        entropies = torch.cat(all_entropies) if compute_entropy else None
        return torch.cat(all_logps), entropies, None

    def _packed_logps(self, model, input_ids, logits_to_keep, packed, legal, compute_entropy):
        """``(logps, entropies)`` of the unpacked rows ``(rows, T)``, computed on ``packed``."""
        causal_lm = unwrapped_causal_lm(self.accelerator, model)
        dtype = causal_lm.get_input_embeddings().weight.dtype  # the hidden states' (4-bit layers hold packed bytes)
        mask = packed.attention_mask(causal_lm.config._attn_implementation or "eager", dtype)
        inputs = {"input_ids": packed.input_ids, "attention_mask": mask, "position_ids": packed.position_ids}
        if legal is None:  # TRL's fused LM head, one label per packed position
            with self.accelerator.autocast():
                outputs = model(**inputs, shift_labels=packed.shift_labels, fused_lm_head=True)
            entropies = packed.unpack(outputs.entropy) if compute_entropy else None
            return packed.unpack(outputs.log_probs), entropies
        with self.accelerator.autocast(), captured_hidden_states(causal_lm.base_model) as captured:
            model(**inputs, use_cache=False, logits_to_keep=1)
            hidden = packed.unpack(captured[-1])  # (rows, T, H): the state that predicts each completion token
            legal = legal.masked_fill((packed.source < 0).unsqueeze(-1), -1)  # unattended positions: not scored
            return legal_head_logps_and_entropy(
                hidden, causal_lm.get_output_embeddings(), input_ids[:, -logits_to_keep:], legal, self.temperature,
                logit_transform(causal_lm.config), compute_entropy,
            )  # fmt: skip

    def _check_packing(self, model, input_ids, attention_mask, logits_to_keep, legal, rows):
        """Compare the packed log-probabilities of a call's first chunk with the unpacked ones (no gradient, eval mode:
        no dropout), and turn packing off for the run, said once, when they differ by more than rounding (a NaN
        included).

        Every process of a run makes the same calls in the same order, but its own rows pack or not: the processes
        first agree (one all-gather) whether every first chunk packs, and check only then, all of them at this call,
        so the extra forward passes (which gather the parameters under ZeRO-3) line up; otherwise the check waits
        for a later call and the rows are scored unpacked meanwhile. The largest gap over the processes decides for
        all of them."""
        packed = pack_groups(input_ids, attention_mask, logits_to_keep)
        if not self._every_process(packed is not None):
            return
        self._packing_checked = True
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                chunk_legal = legal[rows] if legal is not None else None
                got, _ = self._packed_logps(model, input_ids, logits_to_keep, packed, chunk_legal, False)
                with self._chunk_legal(legal, rows):
                    want, _, _ = super()._get_per_token_logps_and_entropies(
                        model, input_ids, attention_mask, logits_to_keep
                    )
        finally:
            model.train(was_training)
        scored = attention_mask[:, -logits_to_keep:].bool()
        gap = float((got - want).abs()[scored].max()) if scored.any() else 0.0
        gap = self._largest_over_processes(gap)
        dtype = unwrapped_causal_lm(self.accelerator, model).get_input_embeddings().weight.dtype
        if not gap <= CHECK_TOLERANCE.get(dtype, CHECK_TOLERANCE_HALF):  # a NaN gap is no match either
            self._packing_off = (
                f"the packed log-probabilities of the first batch differ from the unpacked ones by {gap:.3g} (the "
                "model does not honour the packed attention mask)"
            )
            logger.warning("packed groups off: %s; each row is scored on its own", self._packing_off)
            return
        logger.info("packed groups: rows that share a prompt are scored together (checked: %.2g from unpacked)", gap)

    def _every_process(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every process of the run."""
        flags = self.accelerator.gather(torch.tensor([float(flag)], device=self.accelerator.device))
        return bool(flags.min() > 0)

    def _largest_over_processes(self, value: float) -> float:
        """The largest ``value`` over the run's processes; NaN when any has NaN."""
        values = self.accelerator.gather(torch.tensor([value], device=self.accelerator.device))
        return float("nan") if values.isnan().any() else float(values.max())

    @contextmanager
    def _chunk_legal(self, legal: torch.Tensor | None, rows: slice) -> Iterator[None]:
        """With legal sets, the next class's path scores the chunk ``rows`` over its own rows' legal ids."""
        if legal is None:
            yield
            return
        saved, self._legal = self._legal, legal[rows]
        try:
            yield
        finally:
            self._legal = saved

    def _packing_reason(self, model, compute_aux_loss: bool, given: list[str]) -> str | None:
        """Why this call scores rows unpacked, or None; a reason of the run (not of one call) is logged once."""
        if given:
            return f"the batch has {given}"
        if self._packing_off is None and not self._packing_checked:
            why = packing_unsupported(unwrapped_causal_lm(self.accelerator, model).config)
            if why is None and (compute_aux_loss or getattr(self, "aux_loss_enabled", False)):
                why = "the router's load-balancing loss counts every token of every row"
            if why is not None:
                self._packing_off = why
                self._packing_checked = True
                logger.warning("packed groups off: %s; each row is scored on its own", why)
        return self._packing_off

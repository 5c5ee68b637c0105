"""Training on the distribution constrained decoding samples from: log-probabilities over the legal tokens only.

With ``--constrained_decoding`` a rollout draws each answer token from the model's distribution renormalised over
the tokens that keep the answer legal (:func:`recruit_trl.models.generation.sample`, ``allowed=``), and returns
those tokens per position (the rollout field :data:`~recruit_trl.models.generation.LEGAL_FIELD`). TRL's loss would
use the model's *unconstrained* log-probabilities of the same tokens, ``log p(a) = log p_legal(a) + log Z_legal``:
the second term moves probability into or out of the legal set by each row's advantage, which is no credit for the
choice among the candidates and widens the distribution over illegal tokens whenever advantages are negative.

:class:`LegalLogprobs` makes the policy of the loss the policy that sampled: at every completion position that has a
legal set, ``log p(token) = logit(token) - logsumexp(logits of the legal tokens)`` (at the trainer's temperature), and
the logged entropy is that of the same renormalised distribution. A position with one legal token (the forced
``{"action_index": `` around the index) contributes log 1 = 0 and no gradient. Positions without a legal set (free
decoding, environment tokens of a window) keep the whole vocabulary. The same function gives the old and reference
log-probabilities TRL computes when it needs them.
"""

from __future__ import annotations

import torch

from recruit_trl.models.generation import LEGAL_FIELD

LEGAL_IDS = "legal_ids"  # the generation batch's tensor (rows, completion positions, legal tokens), -1 padded


def legal_id_tensor(rows: list[list[list[int]]], width: int, device=None) -> torch.Tensor:
    """``rows`` (per row, per completion position, the legal token ids) as a ``(len(rows), width, K)`` tensor padded
    with -1 (positions past a row's completion, or with no legal set, are all -1)."""
    k = max((len(ids) for row in rows for ids in row[:width]), default=0)
    out = torch.full((len(rows), width, max(1, k)), -1, dtype=torch.long)
    for r, row in enumerate(rows):
        for t, ids in enumerate(row[:width]):
            if ids:
                out[r, t, : len(ids)] = torch.tensor(ids, dtype=torch.long)
    return out.to(device) if device is not None else out


def legal_logps_and_entropy(
    logits: torch.Tensor, tokens: torch.Tensor, legal: torch.Tensor, compute_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities of ``tokens`` (and entropies) under ``logits`` ``(B, T, V)``, renormalised over
    ``legal`` ``(B, T, K)`` where a position has a legal set (any id >= 0), over the vocabulary elsewhere."""
    logits = logits.float()
    has_legal = (legal >= 0).any(-1)
    legal_logits = logits.gather(-1, legal.clamp(min=0)).masked_fill(legal < 0, float("-inf"))
    legal_norm = torch.logsumexp(legal_logits, dim=-1)
    full_norm = torch.logsumexp(logits, dim=-1)
    norm = torch.where(has_legal, legal_norm, full_norm)
    logps = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - norm
    if not compute_entropy:
        return logps, None
    full_logp = logits - full_norm.unsqueeze(-1)
    full_entropy = -(full_logp.exp() * full_logp).sum(-1)
    legal_logp = legal_logits - legal_norm.unsqueeze(-1)
    legal_entropy = -(legal_logp.exp() * legal_logp).nan_to_num(0.0).sum(-1)  # padding: exp(-inf) * -inf
    return logps, torch.where(has_legal, legal_entropy, full_entropy)


class LegalLogprobs:
    """A mixin for ``GRPOTrainer`` classes: with a rollout that returns :data:`LEGAL_FIELD`, every log-probability
    the trainer computes (the loss's, the old and the reference policy's) is over the legal tokens."""

    _legal_rows: list | None = None  # the rows of the generation batch being scored, as the rollout returned them
    _legal: torch.Tensor | None = None  # the legal ids of the batch the loss is computed on

    def _generate(self, prompts):
        result = super()._generate(prompts)
        extra_fields = result[5]  # prompt_ids, completion_ids, tool_mask, completions, logprobs, extra_fields, ...
        self._legal_rows = extra_fields.pop(LEGAL_FIELD, None)  # not a reward function's keyword
        return result

    def _generate_and_score_completions(self, inputs):
        try:
            output = super()._generate_and_score_completions(inputs)
            if self._legal_rows is not None:
                completion_ids = output["completion_ids"]
                output[LEGAL_IDS] = legal_id_tensor(self._legal_rows, completion_ids.size(1), completion_ids.device)
        finally:
            self._legal_rows = None
        return output

    def _compute_loss(self, model, inputs):
        self._legal = inputs.get(LEGAL_IDS)
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._legal = None

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, **kwargs
    ):
        legal = self._legal
        if legal is None and self._legal_rows is not None:  # old / reference log-probabilities while scoring
            legal = legal_id_tensor(self._legal_rows, logits_to_keep, input_ids.device)
        if legal is None or kwargs.get("pixel_values") is not None or kwargs.get("compute_aux_loss"):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, **kwargs
            )
        batch_size = batch_size or input_ids.size(0)
        all_logps, all_entropies = [], []
        for start in range(0, input_ids.size(0), batch_size):
            ids, mask = input_ids[start : start + batch_size], attention_mask[start : start + batch_size]
            with self.accelerator.autocast():
                # logits_to_keep + 1: the last prompt position predicts the first completion token
                logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=logits_to_keep + 1).logits
            logits = logits[:, :-1] / self.temperature
            logps, entropies = legal_logps_and_entropy(
                logits, ids[:, -logits_to_keep:], legal[start : start + batch_size], compute_entropy
            )
            all_logps.append(logps)
            all_entropies.append(entropies)
        entropies = torch.cat(all_entropies) if compute_entropy else None
        return torch.cat(all_logps), entropies, None


def legal_trainer(trainer_cls: type) -> type:
    """``trainer_cls`` trained on the log-probabilities of constrained decoding (:class:`LegalLogprobs` mixed in)."""
    if issubclass(trainer_cls, LegalLogprobs):
        return trainer_cls
    return type(f"Legal{trainer_cls.__name__}", (LegalLogprobs, trainer_cls), {})

"""Training on the distribution constrained decoding samples from: log-probabilities over the legal tokens only.

With ``--constrained_decoding`` a rollout draws each answer token from the model's distribution renormalised over
the tokens that keep the answer legal (:func:`recruit_trl.models.generation.sample`, ``allowed=``), and returns
those tokens per position (the rollout field :data:`~recruit_trl.models.generation.LEGAL_FIELD`). TRL's loss would
use the model's *unconstrained* log-probabilities of the same tokens, ``log p(a) = log p_legal(a) + log Z_legal``:
the second term moves probability into or out of the legal set by each row's advantage, which is no credit for the
choice among the candidates and widens the distribution over illegal tokens whenever advantages are negative.

:class:`LegalLogprobs` makes the policy of the loss the policy that sampled: at every completion position where the
legal set offers a choice, ``log p(token) = logit(token) - logsumexp(logits of the legal tokens)`` (at the trainer's
temperature), and the logged entropy is that of the same renormalised distribution. The same computation gives the
loss's, the old and the reference log-probabilities, and the MoE load-balancing loss when the model has one, so the
importance ratio and the KL term compare legal distributions only.

It never builds the ``(rows, positions, vocabulary)`` logits: the model runs once without a KV cache, and its LM head
projects only the hidden states of the positions that offer a choice (a few per decision). Every other position gets
0: a forced token (one legal token, e.g. ``{"action_index": `` around the index) has log 1 = 0 and no gradient, and a
position without a legal set is an environment token of a window, which no loss term reads
(:func:`check_legal_ids` refuses a batch where a trained token has no legal set).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from accelerate.utils import is_peft_model

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


def check_legal_ids(completion_ids: torch.Tensor, trained: torch.Tensor, legal: torch.Tensor) -> None:
    """Refuse a generation batch the legal log-probabilities would score wrongly.

    Args:
        completion_ids: ``(B, T)`` the completion tokens.
        trained: ``(B, T)`` 1 where a token is trained on (the completion mask times the environment mask).
        legal: ``(B, T, K)`` the legal ids (:func:`legal_id_tensor`).

    Raises:
        RuntimeError: naming the row and position of a trained token without a legal set (its log-probability would
            be 0), or of a token outside its legal set (the rollout's legal field does not describe its tokens).
    """
    has_legal = (legal >= 0).any(-1)
    missing = trained.bool() & ~has_legal
    if missing.any():
        row, position = missing.nonzero()[0].tolist()
        raise RuntimeError(
            f"row {row}, completion position {position}: a trained token without a legal set; a constrained "
            f"rollout returns one for every model token ({LEGAL_FIELD})"
        )
    outside = has_legal & ~(legal == completion_ids.unsqueeze(-1)).any(-1)
    if outside.any():
        row, position = outside.nonzero()[0].tolist()
        raise RuntimeError(
            f"row {row}, completion position {position}: token {int(completion_ids[row, position])} is not in its "
            f"legal set {[i for i in legal[row, position].tolist() if i >= 0]}"
        )


def logit_transform(config) -> tuple[float, float | None]:
    """``(scale, softcap)``: what a causal LM's forward applies to its LM head's output, read from its config as TRL's
    fused LM head reads them (``trl.trainer.utils.add_fused_lm_head``); ``(1.0, None)`` for most models."""
    text_config = config.get_text_config()
    softcap = getattr(text_config, "final_logit_softcapping", None)
    scale = getattr(text_config, "logit_scale", None)  # Cohere
    if scale is None:
        scale = getattr(text_config, "output_multiplier", None)
    if scale is None:
        scale = getattr(text_config, "lm_head_multiplier", None)  # Falcon-H1
    if scale is None and getattr(text_config, "logits_scaling", None) is not None:  # Granite divides, HyperCLOVA X not
        scaling = text_config.logits_scaling
        scale = scaling if text_config.model_type == "hyperclovax" else 1 / scaling
    return (1.0 if scale is None else scale), softcap


@contextmanager
def captured_hidden_states(backbone: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """A list that receives the last hidden state of every ``backbone`` forward while the context is open."""
    captured: list[torch.Tensor] = []
    handle = backbone.register_forward_hook(lambda module, args, output: captured.append(output.last_hidden_state))
    try:
        yield captured
    finally:
        handle.remove()


def legal_head_logps_and_entropy(
    hidden: torch.Tensor,
    head: torch.nn.Module,
    tokens: torch.Tensor,
    legal: torch.Tensor,
    temperature: float,
    transform: tuple[float, float | None] = (1.0, None),
    compute_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token log-probabilities of ``tokens`` (and entropies), renormalised over their legal tokens.

    The LM ``head`` projects only the hidden states of the positions whose legal set holds two tokens or more; the
    logits are scaled and soft-capped as the model's forward does (``transform``, :func:`logit_transform`) and divided
    by ``temperature``. Every other position gets 0 (a forced token: log 1, no gradient; no legal set: not scored).

    Args:
        hidden: ``(B, T, H)`` the hidden states that predict ``tokens`` (one position before each).
        head: the model's LM head.
        tokens: ``(B, T)`` the completion tokens.
        legal: ``(B, T, K)`` their legal ids, -1 padded (:func:`legal_id_tensor`).
        temperature: the sampling temperature.
        transform: ``(scale, softcap)`` of the logits.
        compute_entropy: also return the entropy of each position's renormalised distribution.

    Returns:
        ``(logps, entropies)``, each ``(B, T)`` float32; ``entropies`` is ``None`` without ``compute_entropy``.
    """
    choice = (legal >= 0).sum(-1) > 1
    logits = head(hidden[choice]).float()  # (positions with a choice, vocabulary)
    scale, softcap = transform
    if scale != 1.0:
        logits = logits * scale
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    logits = logits / temperature
    ids = legal[choice]
    legal_logits = logits.gather(-1, ids.clamp(min=0)).masked_fill(ids < 0, float("-inf"))
    norm = torch.logsumexp(legal_logits, dim=-1)
    logps = logits.gather(-1, tokens[choice].unsqueeze(-1)).squeeze(-1) - norm
    # masked_scatter keeps the result connected to the model even when no position offers a choice, so that such a
    # micro-batch gives a zero gradient instead of failing in backward()
    logps = logps.new_zeros(choice.shape).masked_scatter(choice, logps)
    if not compute_entropy:
        return logps, None
    legal_logp = legal_logits - norm.unsqueeze(-1)
    entropy = -(legal_logp.exp() * legal_logp).nan_to_num(0.0).sum(-1)  # padding: exp(-inf) * -inf
    return logps, entropy.new_zeros(choice.shape).masked_scatter(choice, entropy)


def unwrapped_causal_lm(accelerator, model) -> torch.nn.Module:
    """The causal LM inside ``model``: out of the accelerator's wrapper (DDP and the like) and out of PEFT."""
    causal_lm = accelerator.unwrap_model(model)
    return causal_lm.get_base_model() if is_peft_model(causal_lm) else causal_lm


class LegalLogprobs:
    """A ``GRPOTrainer`` mixin of :class:`~recruit_trl.training.trainer.RecruitGRPOTrainer`: with a rollout that
    returns :data:`LEGAL_FIELD` (constrained decoding), every log-probability the trainer computes (the loss's, the old
    and the reference policy's) is over the legal tokens; without it, TRL's."""

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
                legal = legal_id_tensor(self._legal_rows, completion_ids.size(1), completion_ids.device)
                trained = output["completion_mask"] * output.get("tool_mask", 1)
                check_legal_ids(completion_ids, trained, legal)
                output[LEGAL_IDS] = legal
        finally:
            self._legal_rows = None
        return output

    def _compute_loss(self, model, inputs):
        self._legal = inputs.get(LEGAL_IDS)
        try:
            return super()._compute_loss(model, inputs)
        finally:
            self._legal = None

    def _legal_ids(self, logits_to_keep: int, device) -> torch.Tensor | None:
        """The legal ids of the batch being scored ``(rows, logits_to_keep, K)``: the loss's batch, else (the old and
        reference log-probabilities while scoring) the generation batch's; None for free decoding."""
        if self._legal is not None:
            return self._legal
        if self._legal_rows is not None:
            return legal_id_tensor(self._legal_rows, logits_to_keep, device)
        return None

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
        legal = self._legal_ids(logits_to_keep, input_ids.device)
        if legal is None:
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **kwargs,
            )  # fmt: skip
        given = sorted(name for name, value in kwargs.items() if value is not None)
        if given:  # images and the like: TRL's path would score them over the whole vocabulary
            raise NotImplementedError(f"--constrained_decoding trains text-only models; this batch also has {given}")
        causal_lm = unwrapped_causal_lm(self.accelerator, model)
        head, transform = causal_lm.get_output_embeddings(), logit_transform(causal_lm.config)
        # The model itself is called (not its backbone alone), so that DDP, PEFT and ZeRO-3 see an ordinary forward;
        # logits_to_keep=1 keeps the head it runs to one position, and the hook hands over the hidden states.
        router = {"output_router_logits": True} if compute_aux_loss else {}
        batch_size = batch_size or input_ids.size(0)
        all_logps, all_entropies, all_aux_losses = [], [], []
        for start in range(0, input_ids.size(0), batch_size):
            ids, mask = input_ids[start : start + batch_size], attention_mask[start : start + batch_size]
            with self.accelerator.autocast(), captured_hidden_states(causal_lm.base_model) as captured:
                outputs = model(input_ids=ids, attention_mask=mask, use_cache=False, logits_to_keep=1, **router)
                # the last prompt position predicts the first completion token, the last position nothing
                hidden = captured[-1][:, -logits_to_keep - 1 : -1]
                logps, entropies = legal_head_logps_and_entropy(
                    hidden, head, ids[:, -logits_to_keep:], legal[start : start + batch_size], self.temperature,
                    transform, compute_entropy,
                )  # fmt: skip
            all_logps.append(logps)
            all_entropies.append(entropies)
            if compute_aux_loss:
                all_aux_losses.append(outputs.aux_loss)
        entropies = torch.cat(all_entropies) if compute_entropy else None
        aux_loss = torch.stack(all_aux_losses).mean() if compute_aux_loss else None
        return torch.cat(all_logps), entropies, aux_loss

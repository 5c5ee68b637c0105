"""Batched sampling with a Hugging Face causal LM: token ids plus per-token log-probabilities.

Used by the rollout functions (with the trainer's current policy, unwrapped for DDP / DeepSpeed ZeRO-3) and
by evaluation (many episodes in lock-step). Log-probabilities come from the *processed* scores (after
temperature / top-p), i.e. the distribution the tokens were actually sampled from.

Constrained decoding (``allowed=``): each prompt may carry the token sequences of its legal answers (for the index
contract, ``{"action_index": k}`` for every listed candidate; see :func:`answer_token_ids`), and generation is then
restricted to a prefix of one of them followed by an end token: a masked token is never sampled, so every answer
parses. The log-probabilities are those of the masked (renormalised) distribution the tokens were drawn from, and
``legal=`` returns, per completion token, the tokens the mask allowed there, so a trainer can compute the same
distribution (:mod:`recruit_trl.training.legal_logprobs`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase


def eos_ids(tokenizer: PreTrainedTokenizerBase, generation_config: GenerationConfig | None = None) -> set[int]:
    ids = set()
    if generation_config is not None and generation_config.eos_token_id is not None:
        eos = generation_config.eos_token_id
        ids.update(eos if isinstance(eos, list | tuple) else [eos])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


LEGAL_FIELD = "legal_token_ids"  # the rollout field of constrained rows: per completion token, the ids allowed there

TokenSequences = list[list[int]]  # the token ids of the answers one prompt may be completed with


def encode_prompt(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], **template_kwargs) -> list[int]:
    """The token ids of a chat prompt, ending with the generation prompt (``template_kwargs``: chat template
    options such as ``enable_thinking``)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **template_kwargs)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def answer_token_ids(tokenizer: PreTrainedTokenizerBase, answers: Sequence[str]) -> TokenSequences:
    """The token ids of each answer text, as the model writes it after the generation prompt."""
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in answers]


def _prefix_tree(sequences: TokenSequences, ends: set[int]) -> dict:
    root: dict = {}
    for seq in sequences:
        node = root
        for tok in seq:
            node = node.setdefault(tok, {})
        for end in ends:
            node.setdefault(end, {})
    return root


def legal_per_position(tree: dict, completion: Sequence[int]) -> list[list[int]]:
    """The tokens the prefix tree allowed before each token of ``completion`` (empty once it leaves the tree)."""
    out, node = [], tree
    for tok in completion:
        out.append(sorted(node) if node is not None else [])
        node = node.get(tok) if node is not None else None
    return out


def _allowed_tokens_fn(trees: list[dict], width: int, pad_id: int):
    """``prefix_allowed_tokens_fn`` for ``generate``: the tokens that keep row ``i`` on a path of ``trees[i]``."""

    def allowed(row: int, input_ids: torch.Tensor) -> list[int]:
        node = trees[row]
        for tok in input_ids[width:].tolist():
            node = node.get(tok)
            if node is None:  # only after the end token (the row is finished and padded)
                return [pad_id]
        return list(node) or [pad_id]

    return allowed


@torch.no_grad()
def sample(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: Sequence[Sequence[int]],
    generation_config: GenerationConfig,
    max_new_tokens: int,
    chunk_size: int = 64,
    allowed: Sequence[TokenSequences] | None = None,
    unchanged: list[bool | None] | None = None,
    legal: list[list[list[int]]] | None = None,
) -> tuple[list[list[int]], list[list[float]]]:
    """Sample one completion per prompt (left-padded batches of ``chunk_size``).

    Args:
        allowed: per prompt, the token sequences of its legal answers (constrained decoding); ``None`` for free
            generation.
        unchanged: with ``allowed`` and greedy decoding, filled with one flag per completion: whether the model's
            own greedy choice was allowed at every step, i.e. free decoding would have written the same (legal)
            answer (``None`` when sampling).
        legal: with ``allowed``, filled with one list per completion: for each of its tokens, the token ids the
            constraint allowed at that position (the support of the distribution it was drawn from).

    Returns:
        ``(completion_ids, logprobs)``: each completion is cut after its first EOS token (kept, so TRL sees
        it as terminated) and is never empty; ``logprobs`` has one value per completion token.
    """
    config = copy.deepcopy(generation_config)
    config.max_new_tokens = max_new_tokens
    config.output_scores = True
    config.return_dict_in_generate = True
    check_unchanged = unchanged is not None and allowed is not None and not config.do_sample
    config.output_logits = check_unchanged  # the unprocessed logits: the model's own greedy choice
    stop = eos_ids(tokenizer, config)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(stop))
    config.pad_token_id = pad_id
    if config.eos_token_id is None:
        config.eos_token_id = sorted(stop)
    device = next(model.parameters()).device
    completions: list[list[int]] = []
    logprobs: list[list[float]] = []
    for start in range(0, len(prompt_ids), chunk_size):
        batch = prompt_ids[start : start + chunk_size]
        width = max(len(p) for p in batch)
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention[row, width - len(ids) :] = 1
        constraint, trees = None, None
        if allowed is not None:
            trees = [_prefix_tree(seqs, stop) for seqs in allowed[start : start + chunk_size]]
            constraint = _allowed_tokens_fn(trees, width, pad_id)
        out = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            generation_config=config,
            prefix_allowed_tokens_fn=constraint,
        )
        new = out.sequences[:, width:].cpu()
        token_logps = torch.stack(
            [torch.log_softmax(s.float(), dim=-1).gather(1, new[:, t : t + 1].to(s.device)).squeeze(1).cpu()
             for t, s in enumerate(out.scores)],
            dim=1,
        )  # fmt: skip
        own = torch.stack([logits.argmax(-1).cpu() for logits in out.logits], dim=1) if check_unchanged else None
        for row in range(len(batch)):
            ids = new[row].tolist()
            end = next((k + 1 for k, tok in enumerate(ids) if tok in stop), len(ids))
            end = max(end, 1)
            completions.append(ids[:end])
            logprobs.append(token_logps[row, :end].tolist())
            if unchanged is not None:
                unchanged.append(own[row, :end].tolist() == ids[:end] if own is not None else None)
            if legal is not None and trees is not None:
                legal.append(legal_per_position(trees[row], ids[:end]))
    return completions, logprobs


@contextmanager
def policy_for_generation(trainer) -> Iterator[PreTrainedModel]:
    """The trainer's current policy, unwrapped for generation (DDP, DeepSpeed ZeRO-3 gather) and in eval mode.

    TRL does not switch modes around a custom rollout: without ``eval()`` LoRA dropout would be active while
    sampling. The previous mode is restored afterwards.
    """
    from trl.models import unwrap_model_for_generation

    with unwrap_model_for_generation(
        trainer.model_wrapped,
        trainer.accelerator,
        gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
        generation_kwargs=getattr(trainer, "generation_kwargs", None),
        gradient_checkpointing_kwargs=trainer.args.activation_checkpointing_kwargs,  # TRL 1.16 keeps the old name
    ) as model:
        was_training = model.training
        model.eval()
        try:
            yield model
        finally:
            if was_training:
                model.train()

"""Batched sampling with a Hugging Face causal LM: token ids plus per-token log-probabilities.

Used by the rollout functions (with the trainer's current policy, unwrapped for DDP / DeepSpeed ZeRO-3) and
by evaluation (many episodes in lock-step). Log-probabilities come from the *processed* scores (after
temperature / top-p), i.e. the distribution the tokens were actually sampled from.
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


@torch.no_grad()
def sample(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: Sequence[Sequence[int]],
    generation_config: GenerationConfig,
    max_new_tokens: int,
    chunk_size: int = 64,
) -> tuple[list[list[int]], list[list[float]]]:
    """Sample one completion per prompt (left-padded batches of ``chunk_size``).

    Returns:
        ``(completion_ids, logprobs)``: each completion is cut after its first EOS token (kept, so TRL sees
        it as terminated) and is never empty; ``logprobs`` has one value per completion token.
    """
    config = copy.deepcopy(generation_config)
    config.max_new_tokens = max_new_tokens
    config.output_scores = True
    config.return_dict_in_generate = True
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
        out = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            generation_config=config,
        )
        new = out.sequences[:, width:].cpu()
        token_logps = torch.stack(
            [torch.log_softmax(s.float(), dim=-1).gather(1, new[:, t : t + 1].to(s.device)).squeeze(1).cpu()
             for t, s in enumerate(out.scores)],
            dim=1,
        )  # fmt: skip
        for row in range(len(batch)):
            ids = new[row].tolist()
            end = next((k + 1 for k, tok in enumerate(ids) if tok in stop), len(ids))
            end = max(end, 1)
            completions.append(ids[:end])
            logprobs.append(token_logps[row, :end].tolist())
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
        gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
    ) as model:
        was_training = model.training
        model.eval()
        try:
            yield model
        finally:
            if was_training:
                model.train()

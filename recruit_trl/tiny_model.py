"""The warm tiny Qwen3: built from scratch on environment text, pre-trained briefly, cached by its build settings.

What is built
    :func:`build_tiny_model` trains the tokenizer (:func:`recruit_trl.tokenizer.build_tokenizer`) on the corpus,
    builds a randomly initialised ``Qwen3ForCausalLM`` (default: hidden 128, 2 layers, 4 heads / 2 KV heads, tied
    embeddings) on it and *warms* it with a short full-parameter pre-training on the corpus (rows of
    ``{"messages": [...], "completion": str}``). The loss is the language-model loss over every token (the model
    learns the prompt format) plus ``completion_weight`` times the mean loss over the completion tokens and the
    closing ``<|im_end|>`` (it learns to answer, and to stop). The result is a normal Hugging Face folder that
    ``AutoModelForCausalLM.from_pretrained(folder)`` and ``AutoTokenizer.from_pretrained(folder)`` load offline.

Why warming is needed
    A random initialisation samples near-uniformly over the vocabulary: no completion parses, every
    group of an RL step gets the same (fallback) reward, all advantages are zero and nothing is learned.
    LoRA alone cannot sharpen such a model either. A couple of minutes of full-parameter training on
    rendered environment prompts and actions gives a base that emits the action contract almost always
    while still sampling varied actions: a usable starting point for SFT and RL.

Cache
    :func:`ensure_tiny_model` keeps builds in ``<root>/models/<name>-<hash>/`` (:mod:`recruit_trl.build_cache`),
    where ``<hash>`` covers the build kwargs, ``version_key`` and :data:`BUILD_VERSION`. The folder's
    :data:`~recruit_trl.build_cache.METADATA_FILE` holds the build config, corpus size and fingerprint, losses and
    seconds.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from recruit_trl.build_cache import METADATA_FILE, cache_root, cached_build
from recruit_trl.files import write_json_atomic
from recruit_trl.tokenizer import build_tokenizer, render_row, tokenizer_texts

__all__ = [
    "BUILD_VERSION",
    "build_tiny_model",
    "corpus_fingerprint",
    "ensure_tiny_model",
    "length_bucketed_batches",
]

#: Bump when the build recipe changes in a way that changes the built model: it invalidates cached builds.
BUILD_VERSION = "1"

# build_tiny_model keyword arguments that do not change the built model (left out of the cache hash).
_NOT_HASHED = frozenset({"progress", "num_threads"})


def corpus_fingerprint(corpus: Sequence[dict]) -> str:
    """A sha256 over the rows (order matters), as 16 hex digits."""
    h = hashlib.sha256()
    for row in corpus:
        h.update(json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def length_bucketed_batches(lengths: list[int], batch_size: int, rng: random.Random) -> Iterator[list[int]]:
    """One epoch of length-bucketed batches: shuffle, sort within pools of 32 batches, shuffle the batches."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    pool = 32 * batch_size
    batches = []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start : start + pool], key=lengths.__getitem__)
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    yield from batches


def build_tiny_model(
    output_dir: str | Path,
    corpus: Sequence[dict],
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 384,
    vocab_size: int = 2048,
    max_position_embeddings: int = 2048,
    epochs: float = 2.0,
    max_steps: int | None = None,
    max_train_tokens: int | None = 2_500_000,
    lr: float = 3e-3,
    batch_size: int = 16,
    completion_weight: float = 3.0,
    warmup_ratio: float = 0.05,
    weight_decay: float = 0.01,
    max_length: int | None = None,
    num_threads: int | None = 2,
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """Build, warm and save a tiny ``Qwen3ForCausalLM`` + tokenizer into ``output_dir``; return the folder.

    ``corpus`` rows are ``{"messages": [system, user, ...], "completion": "<assistant text>"}``. The model
    trains for ``epochs`` passes over the corpus, capped at about ``max_train_tokens`` tokens (this bounds
    the build time: 2.5M tokens take about two minutes on 2 idle CPU cores with the default sizes), or
    for exactly ``max_steps`` optimizer steps when given. AdamW, linear warm-up then cosine decay to 10%
    of ``lr``, batches of ``batch_size`` rows of similar length (right padding, padding out of the loss).
    Loss = mean LM loss over all tokens + ``completion_weight`` x mean loss over the completion tokens.
    Rows longer than ``max_length`` (default: ``max_position_embeddings``) are skipped. ``num_threads``
    caps torch's CPU threads during the build (restored afterwards). Writes :data:`METADATA_FILE` last.
    """
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    t_start = time.perf_counter()
    build_config = {
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "num_kv_heads": num_kv_heads,
        "intermediate_size": intermediate_size,
        "vocab_size": vocab_size,
        "max_position_embeddings": max_position_embeddings,
        "epochs": epochs,
        "max_steps": max_steps,
        "max_train_tokens": max_train_tokens,
        "lr": lr,
        "batch_size": batch_size,
        "completion_weight": completion_weight,
        "warmup_ratio": warmup_ratio,
        "weight_decay": weight_decay,
        "max_length": max_length,
        "num_threads": num_threads,
        "seed": seed,
    }
    if not corpus:
        raise ValueError("build_tiny_model needs a non-empty corpus")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError("hidden_size must be divisible by num_heads, and num_heads by num_kv_heads")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    max_length = min(max_length or max_position_embeddings, max_position_embeddings)

    prev_threads = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(max(1, min(num_threads, os.cpu_count() or 1)))
    try:
        # Tokenizer on the full training text of every row.
        tokenizer = build_tokenizer(
            tokenizer_texts(corpus), vocab_size=vocab_size, model_max_length=max_position_embeddings
        )
        rendered = [render_row(tokenizer, row) for row in corpus]
        prompt_ids = tokenizer([p for p, _ in rendered], add_special_tokens=False)["input_ids"]
        completion_ids = tokenizer([c for _, c in rendered], add_special_tokens=False)["input_ids"]
        samples = [(p, c) for p, c in zip(prompt_ids, completion_ids, strict=True) if len(p) + len(c) <= max_length]
        if not samples:
            raise ValueError(f"every corpus row is longer than max_length={max_length} tokens")
        t_tok = time.perf_counter() - t_start

        torch.manual_seed(seed)
        config = Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=hidden_size // num_heads,
            max_position_embeddings=max_position_embeddings,
            max_window_layers=num_layers,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            bos_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        model = Qwen3ForCausalLM(config)
        model.float()
        stats = _pretrain(
            model,
            samples,
            pad_id=tokenizer.pad_token_id,
            epochs=epochs,
            max_steps=max_steps,
            max_train_tokens=max_train_tokens,
            lr=lr,
            batch_size=batch_size,
            completion_weight=completion_weight,
            warmup_ratio=warmup_ratio,
            weight_decay=weight_decay,
            seed=seed,
            progress=progress,
        )
        model.eval()
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        model.save_pretrained(output_dir)
        tokenizer.save_pretrained(output_dir)
    finally:
        torch.set_num_threads(prev_threads)

    import tokenizers
    import transformers

    lengths = [len(p) + len(c) for p, c in samples]
    train_seconds, train_cpu_seconds = stats.pop("train_seconds"), stats.pop("train_cpu_seconds")
    meta = {
        "format": "recruit_trl_model",
        "kind": "tiny",
        "build_version": BUILD_VERSION,
        "model_class": "Qwen3ForCausalLM",
        "build_config": build_config,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "corpus_rows": len(corpus),
        "corpus_rows_used": len(samples),
        "corpus_tokens": sum(lengths),
        "corpus_completion_tokens": sum(len(c) for _, c in samples),
        "corpus_max_row_tokens": max(lengths),
        "corpus_fingerprint": corpus_fingerprint(corpus),
        **stats,
        "seconds": {
            "tokenizer": round(t_tok, 2),
            "train": train_seconds,
            "train_cpu": train_cpu_seconds,
            "total": round(time.perf_counter() - t_start, 2),
        },
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "tokenizers": tokenizers.__version__,
        },
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_json_atomic(output_dir / METADATA_FILE, meta)
    return output_dir


def _pretrain(
    model,
    samples: list[tuple[list[int], list[int]]],
    *,
    pad_id: int,
    epochs: float,
    max_steps: int | None,
    max_train_tokens: int | None,
    lr: float,
    batch_size: int,
    completion_weight: float,
    warmup_ratio: float,
    weight_decay: float,
    seed: int,
    progress: bool,
) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    rng = random.Random(seed)
    lengths = [len(p) + len(c) for p, c in samples]
    steps_per_epoch = math.ceil(len(samples) / batch_size)
    if max_steps is not None:
        total = max_steps
    else:
        total = max(1, round(epochs * steps_per_epoch))
        if max_train_tokens:  # bounds the build time on a large corpus
            total = min(total, max(1, math.ceil(max_train_tokens / (batch_size * sum(lengths) / len(lengths)))))
    warmup = max(1, round(warmup_ratio * total))

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "norm" in name else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        t = (step - warmup) / max(1, total - warmup)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    def epoch_stream() -> Iterator[list[int]]:
        while True:
            yield from length_bucketed_batches(lengths, batch_size, rng)

    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="warming tiny model", unit="step", dynamic_ncols=True)
    model.train()
    history: list[tuple[float, float]] = []
    tokens_seen = 0
    t0, cpu0 = time.perf_counter(), time.process_time()
    stream = epoch_stream()
    for step in range(total):
        batch = next(stream)
        width = max(lengths[i] for i in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        kind = torch.zeros((len(batch), width), dtype=torch.long)  # 0 pad, 1 prompt, 2 completion
        for r, i in enumerate(batch):
            p, c = samples[i]
            ids[r, : len(p) + len(c)] = torch.tensor(p + c)
            kind[r, : len(p)] = 1
            kind[r, len(p) : len(p) + len(c)] = 2
        # Right padding + causal attention: real tokens never see the padding, so no attention mask is needed.
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
        target, target_kind = ids[:, 1:], kind[:, 1:]
        tok_loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), reduction="none")
        tok_loss = tok_loss.view_as(target)
        valid = (target_kind > 0).float()
        comp = (target_kind == 2).float()
        lm_loss = (tok_loss * valid).sum() / valid.sum()
        comp_loss = (tok_loss * comp).sum() / comp.sum().clamp(min=1)
        loss = lm_loss + completion_weight * comp_loss
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        tokens_seen += int(valid.sum().item()) + len(batch)
        history.append((lm_loss.item(), comp_loss.item()))
        if bar is not None:
            bar.update(1)
            if step % 10 == 0 or step == total - 1:
                bar.set_postfix(lm=f"{history[-1][0]:.3f}", completion=f"{history[-1][1]:.3f}")
    if bar is not None:
        bar.close()
    train_seconds = time.perf_counter() - t0
    train_cpu_seconds = time.process_time() - cpu0

    tail = history[-max(1, total // 10) :]
    head = history[: max(1, min(10, total // 10))]
    return {
        "steps": total,
        "epochs": round(total / steps_per_epoch, 3),
        "tokens_seen": tokens_seen,
        "tokens_per_second": round(tokens_seen / max(train_seconds, 1e-9)),
        "initial_losses": {
            "lm": round(sum(h[0] for h in head) / len(head), 4),
            "completion": round(sum(h[1] for h in head) / len(head), 4),
        },
        # mean over the last 10% of the steps
        "final_losses": {
            "lm": round(sum(h[0] for h in tail) / len(tail), 4),
            "completion": round(sum(h[1] for h in tail) / len(tail), 4),
        },
        "train_seconds": round(train_seconds, 2),
        # CPU time of all threads: about num_threads x train_seconds on an idle machine, far less when contended
        "train_cpu_seconds": round(train_cpu_seconds, 2),
    }


def _kwargs_hash(build_kwargs: dict, version_key: str) -> str:
    hashed = {k: v for k, v in sorted(build_kwargs.items()) if k not in _NOT_HASHED}
    payload = json.dumps({"kwargs": hashed, "version_key": version_key, "build_version": BUILD_VERSION}, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def ensure_tiny_model(
    corpus_fn: Callable[[], Sequence[dict]],
    cache_dir: str | Path | None = None,
    *,
    name: str = "tiny-qwen3",
    version_key: str = "",
    **build_kwargs: Any,
) -> Path:
    """Return the folder of a cached warm tiny model, building it with ``corpus_fn()`` when missing.

    The folder is ``<cache root>/models/<name>-<hash(build_kwargs, version_key)>``. The corpus is not
    hashed (``corpus_fn`` is not even called on a cache hit): change ``version_key`` when the corpus
    changes (e.g. the environment's render version). ``build_kwargs`` go to :func:`build_tiny_model`.
    """
    folder = cache_root(cache_dir) / "models" / f"{name}-{_kwargs_hash(build_kwargs, version_key)}"

    def build(tmp: Path) -> None:
        corpus = corpus_fn()
        build_tiny_model(tmp, corpus, **build_kwargs)
        meta = json.loads((tmp / METADATA_FILE).read_text())
        meta.update({"name": name, "version_key": version_key})
        write_json_atomic(tmp / METADATA_FILE, meta)

    folder.parent.mkdir(parents=True, exist_ok=True)
    return cached_build(folder, build)

"""The warm tiny Qwen3: built from scratch on environment text, pre-trained briefly, cached by its build settings.

What is built
    :func:`build_tiny_model` trains the tokenizer (:func:`recruit_trl.workflow.tokenizer.build_tokenizer`) on the
    corpus, builds a randomly initialised ``Qwen3ForCausalLM`` (default: hidden 128, 2 layers, 4 heads / 2 KV heads,
    tied embeddings) on it and *warms* it with a short full-parameter pre-training on the corpus (rows of
    ``{"messages": [...], "completion": str}``) with transformers' ``Trainer``
    (:mod:`recruit_trl.workflow.tiny_pretrain`). The loss is the language-model loss over every token (the model learns
    the prompt format) plus ``completion_weight`` times the mean loss over the completion tokens and the closing
    ``<|im_end|>`` (it learns to answer, and to stop). The result is a normal Hugging Face folder that
    ``AutoModelForCausalLM.from_pretrained(folder)`` and ``AutoTokenizer.from_pretrained(folder)`` load offline.

Why warming is needed
    A random initialisation samples near-uniformly over the vocabulary: no completion parses, every
    group of an RL step gets the same (fallback) reward, all advantages are zero and nothing is learned.
    LoRA alone cannot sharpen such a model either. A couple of minutes of full-parameter training on
    rendered environment prompts and actions gives a base that emits the action contract almost always
    while still sampling varied actions: a usable starting point for SFT and RL.

Cache
    :func:`ensure_tiny_model` keeps builds in ``<root>/models/<name>-<hash>/`` (:mod:`recruit_trl.models.build_cache`),
    where ``<hash>`` covers the build kwargs, ``version_key`` and :data:`BUILD_VERSION`. The folder's
    :data:`~recruit_trl.models.build_cache.METADATA_FILE` holds the build config, corpus size and fingerprint, losses
    and seconds.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from recruit_trl.files import write_json_atomic
from recruit_trl.models.build_cache import METADATA_FILE, cache_root, cached_build, run_alone
from recruit_trl.workflow.tokenizer import build_tokenizer, render_row, tokenizer_texts

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

    from recruit_trl.workflow.tiny_pretrain import pretrain

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
        stats = pretrain(
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
        # The corpus is collected here (corpus_fn need not pickle); the build is a single-process job even in a
        # distributed one (run_alone: in a fresh process there, so that every file is written on any rank).
        run_alone(_build_named, tmp, list(corpus_fn()), build_kwargs, name, version_key)

    folder.parent.mkdir(parents=True, exist_ok=True)
    return cached_build(folder, build)


def _build_named(tmp: Path, corpus: list[dict], build_kwargs: dict[str, Any], name: str, version_key: str) -> None:
    """:func:`build_tiny_model` into ``tmp``, with ``name`` and ``version_key`` in the metadata (written last)."""
    build_tiny_model(tmp, corpus, **build_kwargs)
    meta = json.loads((tmp / METADATA_FILE).read_text())
    meta.update({"name": name, "version_key": version_key})
    write_json_atomic(tmp / METADATA_FILE, meta)

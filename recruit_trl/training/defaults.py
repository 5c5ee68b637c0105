"""Recipe defaults: the plugin's environment-neutral ones (CPU trainer settings, the tiny model with LoRA, rewards),
under the environment's own (:attr:`recruit_trl.protocol.EnvInterface.recipe_defaults`), under a named model's preset
for that environment; TrlParser puts a ``--config`` YAML and the command line over all of them
(:func:`recipe_defaults`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import yaml

from recruit_trl.protocol import get_env_interface
from recruit_trl.training.arguments import NOT_WARM_START, SFTScriptArguments, rl_flag
from rewards import DEFAULT_REWARD_WEIGHTS


def cpu_defaults() -> dict[str, Any]:
    """GRPOConfig values that make a plain CPU run work and learn (see shared TRL facts)."""
    return {
        "learning_rate": 3e-5,  # chosen for the tiny model's full fine-tune; a LoRA run wants about 1e-4
        "per_device_train_batch_size": 32,
        "num_generations": 8,
        "max_steps": 60,
        "max_completion_length": 12,
        # The main job scores each sampled action by the final grade of its episode (continued to the end by a fast
        # policy, common random numbers within the group) plus a format term; see the README for the rationale.
        "reward_weights": list(DEFAULT_REWARD_WEIGHTS),
        "beta": 0.0,
        "temperature": 1.0,
        "logging_steps": 1,
        "save_steps": 10,
        **trainer_defaults(),
    }


def trainer_defaults() -> dict[str, Any]:
    """Trainer-config values every recipe shares: no logger, no activation checkpointing, seed 0, and fp32 on the CPU
    when there is no GPU."""
    import torch

    # TRL's configs default `gradient_checkpointing` (transformers 5's deprecated name of `activation_checkpointing`)
    # to True: checkpointing on, about 20 % slower steps to save memory a CPU run does not need, and a FutureWarning
    # for every config built. Unset, the new name decides and transformers leaves it off; either flag given on the
    # command line still turns it on (the old one with transformers' own deprecation warning).
    defaults: dict[str, Any] = {"report_to": "none", "gradient_checkpointing": None, "seed": 0}
    if not torch.cuda.is_available():
        defaults.update({"bf16": False, "use_cpu": True})
    return defaults


def model_defaults() -> dict[str, Any]:
    """ModelConfig values: the tiny local model with LoRA on every linear layer."""
    return {
        "model_name_or_path": "tiny",
        "use_peft": True,
        "lora_r": 16,
        "lora_alpha": 32,
        "lora_target_modules": ["all-linear"],
    }


def sft_defaults() -> dict[str, Any]:
    """``SFTConfig`` values of the warm start (the SFT recipes', and the RL recipes' warm start's): CPU-friendly,
    no hub, no logger. The output folder is each recipe's own."""
    return {
        "learning_rate": 1e-3,
        "num_train_epochs": 2,
        "per_device_train_batch_size": 16,
        "max_length": 1024,
        "logging_steps": 10,
        "save_steps": 100,
        **trainer_defaults(),
    }


def flag_value(argv: Sequence[str], flag: str) -> str | None:
    """The value of ``--flag`` on the command line (``--flag VALUE`` or ``--flag=VALUE``), else ``None``."""
    for i, arg in enumerate(argv):
        if arg == f"--{flag}" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(f"--{flag}="):
            return arg.split("=", 1)[1]
    return None


def requested(argv: Sequence[str], flag: str, alias: str | None = None) -> str | None:
    """The value of ``--flag`` (or ``--alias``) on the command line, else of ``flag`` in the ``--config`` YAML file
    it names, else ``None``."""
    value = flag_value(argv, flag) or (flag_value(argv, alias) if alias else None)
    config = flag_value(argv, "config")
    if value is None and config and Path(config).is_file():
        loaded = yaml.safe_load(Path(config).read_text()) or {}
        if isinstance(loaded, dict) and isinstance(loaded.get(flag), str):
            value = loaded[flag]
    return value


def recipe_defaults(kind: str, recipe: str, env: str, argv: Sequence[str]) -> dict[str, Any]:
    """A recipe's parser defaults, each layer over the one before:

    1. the plugin's: the trainer settings of a CPU run (``kind`` ``"rl"``: :func:`cpu_defaults`, ``"sft"``:
       :func:`sft_defaults`) and the tiny model with LoRA (:func:`model_defaults`); the output folder
       ``outputs/<recipe>`` (``outputs/<recipe>_<model>`` under a model's preset);
    2. the environment's (``--env_name`` / ``--env`` on the command line, ``env_name`` in the ``--config`` YAML, else
       ``env``):
       ``recipe_defaults["sft"]``, taken by the RL recipes' warm start as ``--sft_*`` flags too, then
       ``recipe_defaults[kind]``, then the rollout mode's (``recipe_defaults["<kind>/<mode>"]``, ``--mode`` on the
       command line or in the YAML, e.g. ``"rl/episode"``: the rewards episode mode learns from);
    3. the named model's preset for that environment (``recipe_defaults["<kind>:<model>"]``, ``--model_name_or_path``
       on the command line or in the YAML).

    Raises:
        ValueError: for an unknown environment.
    """
    env = requested(argv, "env_name", alias="env") or env
    try:
        own = get_env_interface(env).recipe_defaults
    except ValueError as exc:
        raise ValueError(f"--env: {exc}") from None
    model = (requested(argv, "model_name_or_path") or model_defaults()["model_name_or_path"]).strip().lower()
    preset = dict(own.get(f"{kind}:{model}", {}))
    defaults = {
        **(cpu_defaults() if kind == "rl" else sft_defaults()),
        **model_defaults(),
        "env_name": env,
        "output_dir": f"outputs/{recipe}_{model}" if preset else f"outputs/{recipe}",
    }
    sft = dict(own.get("sft", {}))
    if kind == "rl":  # the warm start's settings under the RL recipes' names; the SFT recipe's trainer ones stay out
        names = {f.name for f in fields(SFTScriptArguments)} - set(NOT_WARM_START)
        sft = {rl_flag(k) if k in names else k: v for k, v in sft.items() if k in names or k == "tasks"}
    mode = requested(argv, "mode") or "branch"
    return {**defaults, **sft, **own.get(kind, {}), **own.get(f"{kind}/{mode}", {}), **preset}

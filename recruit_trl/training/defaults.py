"""Defaults every recipe shares: rewards, CPU trainer settings, the default model and the named models' presets."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# The main job scores each sampled action by the final grade of its episode (continued to the end by a fast
# policy, common random numbers within the group) plus a format term; see the README for the rationale.
DEFAULT_REWARDS = ("final_score_reward", "format_reward")


DEFAULT_REWARD_WEIGHTS = [1.0, 0.5]


def cpu_defaults() -> dict[str, Any]:
    """GRPOConfig values that make a plain CPU run work and learn (see shared TRL facts)."""
    return {
        "learning_rate": 3e-5,  # chosen for the tiny model's full fine-tune; a LoRA run wants about 1e-4
        "per_device_train_batch_size": 32,
        "num_generations": 8,
        "max_steps": 60,
        "max_completion_length": 12,
        "reward_weights": DEFAULT_REWARD_WEIGHTS,
        "beta": 0.0,
        "temperature": 1.0,
        "logging_steps": 1,
        "save_steps": 10,
        **trainer_defaults(),
    }


def trainer_defaults() -> dict[str, Any]:
    """Trainer-config values every recipe shares: no logger, no gradient checkpointing, seed 0, and fp32 on the CPU
    when there is no GPU."""
    import torch

    defaults: dict[str, Any] = {"report_to": "none", "gradient_checkpointing": False, "seed": 0}
    if not torch.cuda.is_available():
        defaults.update({"bf16": False, "use_cpu": True})
    return defaults


# Defaults for a named model, applied when the command line names it (``--model_name_or_path smollm2``); any flag
# still overrides them. SmolLM2-135M costs about 1.1 s per 400-token decision and 30-45 s per LoRA step of 8 rows on
# 2 CPU cores, so its run is sized for <= 45 minutes: a short LoRA warm start without DAgger (a DAgger round plays
# whole episodes), a few GRPO steps on small groups, and decision-level evaluation instead of whole episodes.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "smollm2": {
        "sft_train_seeds": "300-301",
        "sft_max_steps": 16,
        "sft_batch_size": 8,
        "sft_heldout_rows": 32,
        "sft_learning_rate": 5e-4,
        "dagger_rounds": 0,
        "anchor_seeds": "100-101",
        "max_steps": 12,
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "learning_rate": 1e-4,
        "save_steps": 4,
    }
}


def preset_name(argv: Sequence[str]) -> str | None:
    """The :data:`MODEL_PRESETS` name of the model named on the command line (``--model_name_or_path NAME`` or
    ``--model_name_or_path=NAME``), else ``None``."""
    for i, arg in enumerate(argv):
        name = None
        if arg == "--model_name_or_path" and i + 1 < len(argv):
            name = argv[i + 1]
        elif arg.startswith("--model_name_or_path="):
            name = arg.split("=", 1)[1]
        if name is not None:
            name = name.strip().lower()
            return name if name in MODEL_PRESETS else None
    return None


def model_defaults() -> dict[str, Any]:
    """ModelConfig values: the tiny local model with LoRA on every linear layer."""
    return {
        "model_name_or_path": "tiny",
        "use_peft": True,
        "lora_r": 16,
        "lora_alpha": 32,
        "lora_target_modules": ["all-linear"],
    }

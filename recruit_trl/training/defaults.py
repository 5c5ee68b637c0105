"""Recipe defaults, in three layers: the plugin's environment-neutral ones (each dataclass field's own default; for
TRL's configs the CPU trainer settings, the tiny model with LoRA, rewards), under the environment's own and its named
model's preset (:attr:`recruit_trl.protocol.EnvInterface.recipe_defaults`); TrlParser puts a ``--config`` YAML and the
command line over all of them (:func:`recipe_defaults`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from recruit_trl.protocol import get_env_interface
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


@dataclass
class RecipeChoice:
    """What a recipe's defaults depend on: the environment, the model and the rollout mode (:func:`recipe_choice`)."""

    env_name: str = field(default="", metadata={"aliases": ["--env"]})
    model_name_or_path: str = ""
    mode: str = ""


def recipe_choice(argv: Sequence[str]) -> RecipeChoice:
    """The environment (``--env_name`` / ``--env``), the model (``--model_name_or_path``) and the rollout mode
    (``--mode``) that ``argv`` names, on the command line or in the ``--config`` YAML it names (empty where neither
    does): a first pass of TRL's own parser (its ``parse_known_args``), whose second pass parses every flag over the
    defaults they choose."""
    from trl import TrlParser  # deferred: bench_rollout imports this module before torch

    parser = TrlParser((RecipeChoice,), allow_abbrev=False, add_help=False)  # no --mode read as --model_name_or_path
    return parser.parse_args_and_config(args=list(argv), return_remaining_strings=True)[0]


def recipe_defaults(kind: str, recipe: str, env: str, argv: Sequence[str]) -> dict[str, Any]:
    """A recipe's parser defaults, each layer over the one before (a dataclass field's own default is the plugin's,
    environment-neutral; TrlParser puts a ``--config`` YAML and the command line over all of them):

    1. the plugin's values for TRL's configs: the trainer settings of a CPU run (``kind`` ``"rl"``:
       :func:`cpu_defaults`, ``"sft"``: :func:`sft_defaults`) and the tiny model with LoRA (:func:`model_defaults`);
       the output folder ``outputs/<recipe>`` (``outputs/<recipe>_<model>`` under a model's preset);
    2. the environment's (the one ``argv`` names, else ``env``: :func:`recipe_choice`): ``recipe_defaults["common"]``
       (what every recipe of the environment takes: its tasks, the warm start's settings), then
       ``recipe_defaults[kind]``, then the rollout mode's (``recipe_defaults["<kind>/<mode>"]``, e.g.
       ``"rl/episode"``: the rewards episode mode learns from), then the named model's preset for that environment
       (``recipe_defaults["<kind>:<model>"]``).

    Raises:
        ValueError: for an unknown environment.
    """
    choice = recipe_choice(argv)
    env = choice.env_name or env
    try:
        own = get_env_interface(env).recipe_defaults
    except ValueError as exc:
        raise ValueError(f"--env: {exc}") from None
    model = (choice.model_name_or_path or model_defaults()["model_name_or_path"]).strip().lower()
    preset = dict(own.get(f"{kind}:{model}", {}))
    defaults = {
        **(cpu_defaults() if kind == "rl" else sft_defaults()),
        **model_defaults(),
        "env_name": env,
        "output_dir": f"outputs/{recipe}_{model}" if preset else f"outputs/{recipe}",
    }
    mode = own.get(f"{kind}/{choice.mode or 'branch'}", {})
    return {**defaults, **own.get("common", {}), **own.get(kind, {}), **mode, **preset}

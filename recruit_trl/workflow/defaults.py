"""Recipe defaults, in three layers: the plugin's environment-neutral ones (each dataclass field's own default; for
TRL's configs the CPU trainer settings, the tiny model with LoRA, rewards; the tiny model's own), under the
environment's own and its named model's preset (:attr:`recruit_trl.protocol.EnvInterface.recipe_defaults`); TrlParser
puts a ``--config`` YAML and the command line over all of them (:func:`recipe_defaults`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recruit_trl.models.loading import model_kind
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


# The plugin's defaults for the tiny model built here from scratch (by name, or a folder it was built in), by recipe
# kind: it trains every weight in the warm start (its LoRA lacks the capacity to imitate the teacher) and in RL (a
# fresh LoRA adapter on the fully fine-tuned warm start barely moved its policy), the report plays whole episodes with
# it (a pretrained model on CPU needs minutes per episode and is measured at decision level instead), and its warm
# start trains on the model's own cross-entropy (with a vocabulary of a few hundred tokens TRL's chunked loss, which
# also logs entropy and token accuracy, costs about a fifth of each step).
TINY = "tiny"
TINY_DEFAULTS: dict[str, dict[str, Any]] = {
    "rl": {"sft_full_finetune": True, "rl_full_finetune": True, "eval_episodes": True, "sft_token_metrics": False},
    "sft": {"sft_token_metrics": False},
}
# A quantised model (--load_in_4bit / --load_in_8bit) trains a LoRA adapter: its frozen integer weights cannot be
# fine-tuned, so no layer's full fine-tuning applies to it (asked for on the command line, it is refused).
QUANTISED_DEFAULTS: dict[str, dict[str, Any]] = {
    "rl": {"sft_full_finetune": False, "rl_full_finetune": False},
    "sft": {"use_peft": True},
}


# Flags the recipes no longer take, and what replaced them: refused on one line by the parser's first pass.
REMOVED_FLAGS = {
    "--contract": "was removed: the index contract is the only one",
    "--window_turns": "was removed with window mode: use --mode branch|episode, or TRL's tool loop "
    "(recipes/grpo_environment_factory.py) for several decisions per completion",
}


@dataclass
class RecipeChoice:
    """What a recipe's defaults depend on: the environment, the model (and its quantisation) and the rollout mode
    (:func:`recipe_choice`)."""

    env_name: str = field(default="", metadata={"aliases": ["--env"]})
    model_name_or_path: str = ""
    mode: str = ""
    load_in_4bit: bool = False
    load_in_8bit: bool = False


def recipe_choice(argv: Sequence[str]) -> RecipeChoice:
    """The environment (``--env_name`` / ``--env``), the model (``--model_name_or_path``, ``--load_in_4bit``,
    ``--load_in_8bit``) and the rollout mode (``--mode``) that ``argv`` names, on the command line or in the
    ``--config`` YAML it names (empty or false where neither does): a first pass of TRL's own parser (its
    ``parse_known_args``), whose second pass parses every flag over the defaults they choose.

    Raises:
        ValueError: for a flag of :data:`REMOVED_FLAGS`, with what replaced it.
    """
    from trl import TrlParser  # deferred: bench_rollout imports this module before torch

    for arg in argv:
        flag = str(arg).split("=", 1)[0]
        if flag in REMOVED_FLAGS:
            raise ValueError(f"{flag} {REMOVED_FLAGS[flag]}")

    parser = TrlParser((RecipeChoice,), allow_abbrev=False, add_help=False)  # no --mode read as --model_name_or_path
    return parser.parse_args_and_config(args=list(argv), return_remaining_strings=True)[0]


def model_key(name_or_path: str) -> str:
    """The name a model's defaults are keyed by: :data:`TINY` for the tiny model (named ``tiny``, or a folder
    recruit_trl built it in: :func:`recruit_trl.models.loading.model_kind`), else the name as given, in lower case
    (e.g. ``smollm2``)."""
    name = name_or_path.strip().lower()
    if name != TINY and Path(name_or_path).is_dir() and model_kind(name_or_path) == TINY:
        return TINY
    return name


def recipe_defaults(kind: str, recipe: str, env: str, argv: Sequence[str]) -> dict[str, Any]:
    """A recipe's parser defaults, each layer over the one before (a dataclass field's own default is the plugin's,
    environment-neutral; TrlParser puts a ``--config`` YAML and the command line over all of them):

    1. the plugin's values for TRL's configs: the trainer settings of a CPU run (``kind`` ``"rl"``:
       :func:`cpu_defaults`, ``"sft"``: :func:`sft_defaults`) and the tiny model with LoRA (:func:`model_defaults`);
       the output folder ``outputs/<recipe>`` (``outputs/<recipe>_<model>`` under another model's preset); then the
       tiny model's own (:data:`TINY_DEFAULTS`: every weight trained, whole episodes in the report) when the model is
       the tiny one (:func:`model_key`);
    2. the environment's (the one ``argv`` names, else ``env``: :func:`recipe_choice`): ``recipe_defaults["common"]``
       (what every recipe of the environment takes: its tasks, the warm start's settings), then
       ``recipe_defaults[kind]``, then the rollout mode's (``recipe_defaults["<kind>/<mode>"]``, e.g.
       ``"rl/episode"``: the rewards episode mode learns from), then the model's preset for that environment
       (``recipe_defaults["<kind>:<model>"]``, keyed by :func:`model_key`);
    3. with ``--load_in_4bit`` / ``--load_in_8bit``, :data:`QUANTISED_DEFAULTS`: a LoRA adapter in every stage.

    Raises:
        ValueError: for an unknown environment.
    """
    choice = recipe_choice(argv)
    env = choice.env_name or env
    try:
        own = get_env_interface(env).recipe_defaults
    except ValueError as exc:
        raise ValueError(f"--env: {exc}") from None
    default_model = model_defaults()["model_name_or_path"]
    model = model_key(choice.model_name_or_path or default_model)
    preset = dict(own.get(f"{kind}:{model}", {}))
    defaults = {
        **(cpu_defaults() if kind == "rl" else sft_defaults()),
        **model_defaults(),
        **(TINY_DEFAULTS[kind] if model == TINY else {}),
        "env_name": env,
        "output_dir": f"outputs/{recipe}_{model}" if preset and model != default_model else f"outputs/{recipe}",
    }
    mode = own.get(f"{kind}/{choice.mode or 'branch'}", {})
    quantised = QUANTISED_DEFAULTS[kind] if choice.load_in_4bit or choice.load_in_8bit else {}
    return {**defaults, **own.get("common", {}), **own.get(kind, {}), **mode, **preset, **quantised}

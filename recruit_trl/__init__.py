"""recruit_trl: a Hugging Face TRL plugin for reinforcement learning on long-horizon environments.

Training samples are taken from environment snapshots anywhere in an episode, actions are compared in
step-level groups from the same state, and model output goes through a strict action contract with a
safe fallback. The plugin reaches an environment only through a small protocol (reset, step,
snapshot/restore, a text rendering of the observation and the legal actions), so environments other
than the bundled clinical recruitment one (:mod:`env`) can be added without touching it.

The public API, importable from here::

    from recruit_trl import RecruitGRPOTrainer, RolloutConfig, environment_factory, get_reward_funcs, make_rollout

    rollout = make_rollout(RolloutConfig(env_name="clinical"))  # GRPOTrainer(..., rollout_func=rollout)
    # RecruitGRPOTrainer: GRPOTrainer + packed groups, legal-token log-probabilities, episode advantages, the control
    env_class = environment_factory("conquest")  # GRPOTrainer(..., environment_factory=env_class): TRL's tool loop

Names are imported on first use: ``import recruit_trl`` stays light (the rollouts import torch and transformers).

Importing it also keeps two notices of libraries recruit_trl cannot change off the console (see below); a program that
imports recruit_trl before TRL, as the recipes do, never sees them.
"""

from __future__ import annotations

import importlib
import logging
import warnings
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Notices of libraries recruit_trl cannot change, which every run would print though they ask nothing of the person
# running it; each filter matches its notice's own text, so nothing else is hidden.
# transformers 5 renamed ``PreTrainedModel.is_gradient_checkpointing`` to ``is_activation_checkpointing``; TRL 1.16
# (``unwrap_model_for_generation``, around every rollout's generation) and PEFT 0.21 (every ``PeftModel``) still read
# the old name, and each reading warns. recruit_trl itself uses the new names.
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
# bitsandbytes, which PEFT imports whenever it is installed (so every import of TRL's trainers), tries at import to
# fetch an optional CPU kernel for 4-bit inference from the Hugging Face Hub (kernels-community) and logs a warning
# when it cannot; offline (HF_HUB_OFFLINE=1, as CI runs) the ``kernels`` package logs instead that it skips the
# kernel's publisher check. recruit_trl never downloads; without that kernel bitsandbytes uses its own, and a run that
# does not quantise calls neither.
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
    lambda record: not record.getMessage().startswith("Failed to load CPU gemm_4bit_forward from kernels-community")
)
logging.getLogger("kernels._internals.hf_hub").addFilter(
    lambda record: not record.getMessage().startswith("Skipping publisher trust check for 'kernels-community/")
)

# Public name -> the module that defines it.
_EXPORTS = {
    "make_rollout": "recruit_trl.rollout.rollout_funcs",
    "BranchRollout": "recruit_trl.rollout.rollout_funcs",
    "RolloutConfig": "recruit_trl.rollout.config",
    "PromptConfig": "recruit_trl.rollout.config",
    "EnvInterface": "recruit_trl.protocol",
    "MultiStepEnv": "recruit_trl.protocol",
    "register_env": "recruit_trl.protocol",
    "get_env_interface": "recruit_trl.protocol",
    "get_reward_funcs": "rewards",
    "RecruitGRPOTrainer": "recruit_trl.training.trainer",
    "RecruitReinforceTrainer": "recruit_trl.training.trainer",
    "environment_factory": "recruit_trl.rollout.tool_env",
    "ToolEnvironment": "recruit_trl.rollout.tool_env",
}

__all__ = [
    "BranchRollout",
    "EnvInterface",
    "MultiStepEnv",
    "PromptConfig",
    "RecruitGRPOTrainer",
    "RecruitReinforceTrainer",
    "RolloutConfig",
    "ToolEnvironment",
    "__version__",
    "environment_factory",
    "get_env_interface",
    "get_reward_funcs",
    "make_rollout",
    "register_env",
]

if TYPE_CHECKING:
    from recruit_trl.protocol import EnvInterface, MultiStepEnv, get_env_interface, register_env
    from recruit_trl.rollout.config import PromptConfig, RolloutConfig
    from recruit_trl.rollout.rollout_funcs import BranchRollout, make_rollout
    from recruit_trl.rollout.tool_env import ToolEnvironment, environment_factory
    from recruit_trl.training.trainer import RecruitGRPOTrainer, RecruitReinforceTrainer
    from rewards import get_reward_funcs


# Public names of 0.1.0 that are gone, and what replaced them: an import of one says so.
_REMOVED = {
    "ReinforceTrainer": "it was renamed RecruitReinforceTrainer",
    "WindowRollout": "window mode was removed: use BranchRollout / EpisodeRollout, or environment_factory for TRL's "
    "tool loop",
}


def __getattr__(name: str) -> Any:
    if name in _REMOVED:
        raise AttributeError(f"recruit_trl.{name} is gone: {_REMOVED[name]}")
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})

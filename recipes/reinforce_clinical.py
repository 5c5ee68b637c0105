"""REINFORCE with a leave-one-out baseline (RLOO) on the clinical environment: the GRPO recipe with another trainer.

    accelerate launch recipes/reinforce_clinical.py
    accelerate launch recipes/reinforce_clinical.py --sft_adapter outputs/sft_clinical --max_steps 100

Every step (environment, model, warm start, anchors, rollouts, rewards, report) and every flag are those of
``recipes/grpo_clinical.py``, from its own config file, ``recipes/configs/reinforce_clinical.yaml`` (the main job's
settings, the same SFT config and report config) unless ``--config`` names another, and the command line over it;
only the trainer differs: ``recruit_trl.RecruitReinforceTrainer`` with ``scale_rewards="none"``, ``beta=0``,
``num_iterations=1`` and ``loss_type="dr_grpo"`` (set in that config, and checked), whose advantages are exact
leave-one-out advantages.
"""

from __future__ import annotations

import os

# recruit_trl before TRL: importing it keeps off the console a notice that TRL's own import would print
from recruit_trl.workflow.parsing import parse_or_exit

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trl import GRPOConfig, ModelConfig  # noqa: E402

from recruit_trl.training.trainer import REINFORCE_SETTINGS, RecruitReinforceTrainer  # noqa: E402
from recruit_trl.workflow.arguments import ScriptArguments  # noqa: E402
from recruit_trl.workflow.configs import check_rl_arguments, parse_recipe  # noqa: E402
from recruit_trl.workflow.pipeline import run_rl  # noqa: E402


def main(
    script_args: ScriptArguments,
    training_args: GRPOConfig,
    model_args: ModelConfig,
    trainer_cls=RecruitReinforceTrainer,
) -> RecruitReinforceTrainer:
    """The GRPO recipe's pipeline (``recruit_trl.workflow.pipeline.run_rl``) with ``RecruitReinforceTrainer``."""
    return run_rl(script_args, training_args, model_args, trainer_cls)


def parse_args(argv: list[str] | None = None) -> tuple[ScriptArguments, GRPOConfig, ModelConfig]:
    """The GRPO recipe's flags with REINFORCE's settings, every value checked before any model is built.

    Raises:
        ValueError: one line naming the flag, its value and what it takes.
    """
    types = (ScriptArguments, GRPOConfig, ModelConfig)
    script_args, training_args, model_args = check_rl_arguments(
        *parse_recipe(types, "reinforce_clinical.yaml", argv, rl=True)
    )
    wrong = {k: getattr(training_args, k) for k, v in REINFORCE_SETTINGS.items() if getattr(training_args, k) != v}
    if wrong:
        raise ValueError(f"REINFORCE takes {REINFORCE_SETTINGS} (recipes/configs/reinforce_clinical.yaml sets them), "
                         f"not {wrong}")  # fmt: skip
    return script_args, training_args, model_args


if __name__ == "__main__":
    main(*parse_or_exit(parse_args))

"""REINFORCE with a leave-one-out baseline (RLOO) on the clinical environment: the GRPO recipe with another trainer.

    accelerate launch recipes/reinforce_clinical.py
    accelerate launch recipes/reinforce_clinical.py --sft_adapter outputs/sft_clinical --max_steps 100

Every step (environment, model, warm start, anchors, rollouts, rewards, report) and every flag are those of
``recipes/grpo_clinical.py``; only the trainer differs: ``recruit_trl.RecruitReinforceTrainer`` with
``scale_rewards="none"``, ``beta=0``, ``num_iterations=1`` and ``loss_type="dr_grpo"``, whose advantages are exact
leave-one-out advantages.
"""

from __future__ import annotations

import os
import sys

# recruit_trl before TRL: importing it keeps off the console a notice that TRL's own import would print
from recruit_trl.workflow.parsing import RecipeParser, parse_or_exit

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trl import GRPOConfig, ModelConfig  # noqa: E402

from recruit_trl.training.trainer import REINFORCE_SETTINGS, RecruitReinforceTrainer  # noqa: E402
from recruit_trl.workflow.arguments import ScriptArguments, WarmStartArguments, check_rl_arguments  # noqa: E402
from recruit_trl.workflow.defaults import recipe_defaults  # noqa: E402
from recruit_trl.workflow.pipeline import run_rl  # noqa: E402


def main(
    script_args: ScriptArguments,
    warm: WarmStartArguments,
    training_args: GRPOConfig,
    model_args: ModelConfig,
    trainer_cls=RecruitReinforceTrainer,
) -> RecruitReinforceTrainer:
    """The GRPO recipe's pipeline (``recruit_trl.workflow.pipeline.run_rl``) with ``RecruitReinforceTrainer``."""
    return run_rl(script_args, warm, training_args, model_args, trainer_cls)


def parse_args(argv: list[str] | None = None) -> tuple[ScriptArguments, WarmStartArguments, GRPOConfig, ModelConfig]:
    """The GRPO recipe's flags with REINFORCE's settings, every value checked before any model is built.

    Raises:
        ValueError: one line naming the flag, its value and what it takes.
    """
    parser = RecipeParser((ScriptArguments, WarmStartArguments, GRPOConfig, ModelConfig))
    defaults = recipe_defaults("rl", "reinforce_clinical", "clinical", sys.argv[1:] if argv is None else argv)
    parser.set_defaults(**{**defaults, **REINFORCE_SETTINGS})
    return check_rl_arguments(*parser.parse_args_and_config(args=argv))


if __name__ == "__main__":
    main(*parse_or_exit(parse_args))

"""REINFORCE with a leave-one-out baseline (RLOO) on the clinical environment, sharing the GRPO recipe.

    accelerate launch recipes/reinforce_clinical.py
    accelerate launch recipes/reinforce_clinical.py --sft_adapter outputs/sft_clinical --max_steps 100

Everything (anchors, rollouts, rewards, model, LoRA) is the GRPO recipe's (``recipes/grpo_clinical.py``); only
the trainer differs: ``recruit_trl.reinforce.ReinforceTrainer`` with ``scale_rewards="none"``, ``beta=0``,
``num_iterations=1`` and ``loss_type="dr_grpo"``, whose advantages are exact leave-one-out advantages.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpo_clinical  # noqa: E402

from recruit_trl.reinforce import REINFORCE_SETTINGS, ReinforceTrainer  # noqa: E402


def parse_args(argv: list[str] | None = None):
    return grpo_clinical.parse_args(argv, defaults={**REINFORCE_SETTINGS, "output_dir": "outputs/reinforce_clinical"})


def main(script_args, training_args, model_args):
    return grpo_clinical.main(script_args, training_args, model_args, trainer_cls=ReinforceTrainer)


if __name__ == "__main__":
    main(*parse_args())

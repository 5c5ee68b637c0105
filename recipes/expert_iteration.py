"""Expert iteration: distil the planner's choices on the model's own states, round by round, with TRL's SFTTrainer.

    python recipes/expert_iteration.py           # from the main job's warm start, outputs/grpo_clinical/sft
    python recipes/expert_iteration.py --start FOLDER --labels self   # a control: the model's own choices

Top to bottom:
1. Arguments: ``SFTScriptArguments`` (the environment, its prompts and tasks) + ``ExpertIterationArguments`` (the
   start, rounds, seeds, days, proposals, continuations, racing, margin, labels) + TRL's ``SFTConfig`` (each round's
   fine-tuning: one epoch at the warm start's learning rate) + ``ModelConfig``, from
   ``recipes/configs/expert_iteration_clinical.yaml`` unless ``--config`` names another, the command line over it.
2. Rounds (``recruit_trl.workflow.expert_iteration.run_expert_iteration``): the current model plays its block of
   training seeds greedily; at its states on ``--days`` the planner scores the model's greedy answer and
   ``--candidates`` sampled proposals with ``--continuations`` common-random-number continuations, racing out the
   ones clearly behind; a state whose best proposal beats the greedy choice by ``--margin`` standard errors is kept,
   labelled as ``--labels`` says; the kept rows of every round so far train the same weights for an epoch.
3. Output: each round in ``<output_dir>/round-K`` (``round.json``: states labelled and kept, rows, environment steps,
   planner and training seconds), the last round's model and ``expert_iteration.json`` in ``--output_dir``.
   Evaluate it like any model: ``recruit-trl eval --policy model:<output_dir> --task hard_bench --constrained``.
"""

from __future__ import annotations

# recruit_trl before TRL: importing it keeps off the console a notice that TRL's own import would print
from recruit_trl.workflow.parsing import parse_or_exit

# isort: split
from trl import ModelConfig, SFTConfig

from recruit_trl.models.loading import loading_config
from recruit_trl.workflow.arguments import SFTScriptArguments, check_tasks, env_interface
from recruit_trl.workflow.configs import parse_recipe
from recruit_trl.workflow.expert_iteration import ExpertIterationArguments, run_expert_iteration


def main(
    script_args: SFTScriptArguments,
    iteration: ExpertIterationArguments,
    training_args: SFTConfig,
    model_args: ModelConfig,
) -> dict:
    interface = env_interface(script_args.env_name)
    tasks = list(script_args.tasks or interface.tasks())
    return run_expert_iteration(interface, tasks, iteration, training_args, loading_config(model_args))


def parse_args(
    argv: list[str] | None = None,
) -> tuple[SFTScriptArguments, ExpertIterationArguments, SFTConfig, ModelConfig]:
    """Step 1 above, every value checked before any model is loaded.

    Raises:
        ValueError: one line naming the flag, its value and what it takes.
    """
    types = (SFTScriptArguments, ExpertIterationArguments, SFTConfig, ModelConfig)
    script_args, iteration, training_args, model_args = parse_recipe(types, "expert_iteration_clinical.yaml", argv)
    check_tasks("tasks", script_args.tasks, env_interface(script_args.env_name))
    iteration.round_seeds(iteration.rounds - 1)  # enough training seeds for every round
    return script_args, iteration, training_args, model_args


if __name__ == "__main__":
    main(*parse_or_exit(parse_args))

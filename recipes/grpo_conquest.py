"""GRPO for an LLM agent on conquest (a Risk-compatible board game), through TRL's ``GRPOTrainer``.

With no arguments on a CPU machine this runs the whole pipeline on the tiny model, in one output folder:

    accelerate launch recipes/grpo_conquest.py
    accelerate launch recipes/grpo_conquest.py --config grpo_conquest_smollm2.yaml   # SmolLM2-135M-Instruct with LoRA
    accelerate launch recipes/grpo_conquest.py --mode episode --reward_funcs win_reward potential_reward \\
        --reward_weights 1 1   # the policy's own games, rewarded by the win and the standing gained
    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/grpo_conquest.py \\
        --model_name_or_path Qwen/Qwen3-4B --load_in_4bit --use_peft true --bf16 true --sft_config FILE
        # FILE: sft_conquest.yaml with model_name_or_path: Qwen/Qwen3-4B and use_peft: true (or --sft_config none)

Top to bottom (the pipeline is ``recruit_trl.workflow.pipeline.run_rl``, the clinical recipe's, with the settings
below):
1. Arguments: ``ScriptArguments`` + ``GRPOConfig`` + ``ModelConfig`` through ``TrlParser``, from one config file,
   ``recipes/configs/grpo_conquest.yaml`` (the game's settings) unless ``--config`` names another, and the command
   line over it (``recruit_trl.workflow.configs.parse_recipe``): this recipe is ``recipes/grpo_clinical.py`` with
   the game's config. The warm start's settings live in the SFT config ``--sft_config`` names
   (``sft_conquest.yaml``), the report's in the report config ``--report_config`` names (``report_conquest.yaml``).
2. The model: ``tiny`` is built here from the game's texts (tokenizer and a short warm-up) and cached.
3. Warm start (``recipes/sft_conquest.py``'s pipeline with ``sft_conquest.yaml``, into ``<output_dir>/sft``): the
   teacher decision sets (``sft_data: teacher_sets``: the teacher plays ``classic3`` and ``duel``; train seeds 0-99,
   the fixed 100-row set on seeds 100-109, the 1,000-row held-out set on seeds 300-359), supervised fine-tuning on
   the train rows, then a DAgger round (the student plays train seeds, the teacher labels the states it reaches;
   the better round kept).
4. GRPO from the warm start with branch rollouts: anchors are the teacher's game states (train seeds,
   ``--anchor_days`` = decision numbers); each of a group's sampled answers is applied to a copy of the same snapshot
   and scored by the final score after the teacher plays the agent's seat to the game's end (``--horizon``), with
   the same RNG stream for every branch of a group (common random numbers); plus a format term.
5. Report (``report.json``, PNG plots, a one-screen summary): the benchmark table (rows, strict JSON, valid index,
   teacher match, invalid) of the base, SFT and GRPO models, the safe agent and the teacher on the fixed and held-out
   sets; state values on held-out teacher states; whole games on the report config's held-out ``eval_seeds`` of
   ``classic3`` and ``duel`` (the tiny model; free decoding, so an invalid answer plays the safe agent's action and is
   counted) beside the safe agent, ``balanced`` and the teacher; win rate and invalid rate over training.

A re-run of the same command resumes: finished stages are read back, training continues from its last checkpoint.
"""

from __future__ import annotations

import os

# recruit_trl before TRL: importing it keeps off the console a notice that TRL's own import would print
from recruit_trl.workflow.parsing import parse_or_exit

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trl import GRPOConfig, ModelConfig  # noqa: E402

from recruit_trl.training.trainer import RecruitGRPOTrainer  # noqa: E402
from recruit_trl.workflow.arguments import ScriptArguments  # noqa: E402
from recruit_trl.workflow.configs import check_rl_arguments, parse_recipe  # noqa: E402
from recruit_trl.workflow.pipeline import run_rl  # noqa: E402


def main(
    script_args: ScriptArguments,
    training_args: GRPOConfig,
    model_args: ModelConfig,
    trainer_cls: type[RecruitGRPOTrainer] = RecruitGRPOTrainer,
) -> RecruitGRPOTrainer:
    """Steps 2-5 above (``recruit_trl.workflow.pipeline.run_rl``) with ``recruit_trl.RecruitGRPOTrainer``."""
    return run_rl(script_args, training_args, model_args, trainer_cls)


def parse_args(argv: list[str] | None = None) -> tuple[ScriptArguments, GRPOConfig, ModelConfig]:
    """Step 1 above, every value checked before any model is built.

    Raises:
        ValueError: one line naming the flag, its value and what it takes.
    """
    types = (ScriptArguments, GRPOConfig, ModelConfig)
    return check_rl_arguments(*parse_recipe(types, "grpo_conquest.yaml", argv, rl=True))


if __name__ == "__main__":
    main(*parse_or_exit(parse_args))

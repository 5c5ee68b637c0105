"""GRPO for an LLM agent on the clinical recruitment environment, through TRL's ``GRPOTrainer``.

With no arguments on a CPU machine this is the main job, end to end in one output folder:

    accelerate launch recipes/grpo_clinical.py
    accelerate launch recipes/grpo_clinical.py --model_name_or_path smollm2   # a real LLM with LoRA, <= 45 min
    accelerate launch --config_file accelerate_configs/cpu_ddp.yaml recipes/grpo_clinical.py --max_steps 10
    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/grpo_clinical.py \\
        --model_name_or_path Qwen/Qwen3-4B --load_in_4bit --bf16 true --per_device_train_batch_size 16
    python recipes/grpo_clinical.py --config recipes/grpo_clinical.yaml

Top to bottom (steps 2-6 are ``recruit_trl.workflow.pipeline.run_rl``, which the REINFORCE recipe runs with its own
trainer):
1. Arguments: ``ScriptArguments`` (anchors, rollout mode, rewards, where RL starts, report) + ``WarmStartArguments``
   (the warm start's teacher, data and DAgger, the SFT recipe's own) + ``GRPOConfig`` + ``ModelConfig`` through
   ``TrlParser`` (``--config file.yaml`` supported); the fields' environment-neutral defaults under the environment's
   own (``env/clinical/training_defaults.py``) and a named model's (``smollm2``'s are sized for 45 minutes on 2
   cores), under the YAML and the command line: ``recruit_trl.workflow.defaults.recipe_defaults``.
2. The environment interface (``--env``) and its tasks (``--tasks``, default: all of the environment's).
3. The policy model: ``tiny`` (a warm tiny Qwen3 built locally and cached), ``smollm2`` (from its wheel), or
   any local folder / cached hub id, loaded as ``ModelConfig`` says in every stage (dtype, attention,
   ``--load_in_4bit`` for QLoRA).
4. Warm start (``--warm_start auto``): the SFT recipe's pipeline (``recruit_trl.workflow.warm_start``), in-process with
   this run's ``ModelConfig``, imitates ``--teacher`` (cached in ``<output_dir>/sft``; DAgger rounds, the best round
   kept; its settings are the SFT recipe's ``WarmStartArguments``, its budget ``--sft_epochs`` / ``--sft_max_steps`` /
   ``--sft_batch_size`` / ``--sft_learning_rate``). A pretrained model trains a
   LoRA adapter, which RL continues; the tiny model built here fine-tunes every weight (``--sft_full_finetune``,
   true by default for it) and RL then trains every weight too (``--rl_full_finetune``, likewise) or a fresh adapter
   on it.
5. Anchors: states on tasks x seeds x days, reached by replaying ``--anchor_policy`` (an environment policy) or
   recorded once from the model RL starts from (``--anchor_policy student``: on-policy states); the prompt column
   carries the anchor. Rollouts (``--mode branch|episode``; ``--continuation_seeds`` continuations per distinct
   action, the first ``--self_horizon`` days of each played by the policy itself) and rewards (``--reward_funcs``
   x ``--reward_weights``), then ``trainer.train()`` (resumes from the last checkpoint); the adapter is saved to
   ``--output_dir``.
6. Report (``--report``): ``--eval_baselines``, and the base, SFT and RL models (``--eval_episodes``, true for the
   tiny model), over whole episodes on held-out ``--eval_seeds`` (models greedy; those named by ``--eval_sampled``
   also sampled at ``--eval_temperature`` / ``--eval_top_p``: rows ``<model>-sampled``); the decision-level report
   (``--eval_decisions``: benchmark table and state values on held-out states, every model);
   ``report.json``, PNG plots and a one-screen summary in ``--output_dir`` (``recruit_trl.workflow.run_report``). The
   baselines (pure Python) run in a background process while the warm start traces the teacher, on the core that
   would otherwise idle.
"""

from __future__ import annotations

import os
import sys

# recruit_trl before TRL: importing it keeps off the console a notice that TRL's own import would print
from recruit_trl.workflow.parsing import RecipeParser, parse_or_exit

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trl import GRPOConfig, ModelConfig  # noqa: E402

from recruit_trl.training.trainer import RecruitGRPOTrainer  # noqa: E402
from recruit_trl.workflow.arguments import ScriptArguments, WarmStartArguments, check_rl_arguments  # noqa: E402
from recruit_trl.workflow.defaults import recipe_defaults  # noqa: E402
from recruit_trl.workflow.pipeline import run_rl  # noqa: E402


def main(
    script_args: ScriptArguments,
    warm: WarmStartArguments,
    training_args: GRPOConfig,
    model_args: ModelConfig,
    trainer_cls: type[RecruitGRPOTrainer] = RecruitGRPOTrainer,
) -> RecruitGRPOTrainer:
    """Steps 2-6 above (``recruit_trl.workflow.pipeline.run_rl``) with ``recruit_trl.RecruitGRPOTrainer`` (TRL's
    ``GRPOTrainer`` with packed groups, legal-token log-probabilities, episode advantages and the control)."""
    return run_rl(script_args, warm, training_args, model_args, trainer_cls)


def parse_args(argv: list[str] | None = None) -> tuple[ScriptArguments, WarmStartArguments, GRPOConfig, ModelConfig]:
    """Step 1 above, every value checked before any model is built.

    Raises:
        ValueError: one line naming the flag, its value and what it takes.
    """
    parser = RecipeParser((ScriptArguments, WarmStartArguments, GRPOConfig, ModelConfig))
    parser.set_defaults(**recipe_defaults("rl", "grpo_clinical", "clinical", sys.argv[1:] if argv is None else argv))
    return check_rl_arguments(*parser.parse_args_and_config(args=argv))


if __name__ == "__main__":
    main(*parse_or_exit(parse_args))

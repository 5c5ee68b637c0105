"""GRPO for an LLM agent on the clinical recruitment environment, through TRL's ``GRPOTrainer``.

With no arguments on a CPU machine this is the main job, end to end in one output folder:

    accelerate launch recipes/grpo_clinical.py
    accelerate launch recipes/grpo_clinical.py --config grpo_clinical_smollm2.yaml   # a real LLM with LoRA, <= 45 min
    accelerate launch --config_file accelerate_configs/cpu_ddp.yaml recipes/grpo_clinical.py --max_steps 10
    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/grpo_clinical.py \\
        --config grpo_clinical_qwen3_4b.yaml
    accelerate launch recipes/grpo_clinical.py --sft_config none --report_config none  # plain GRPO from the base model

Top to bottom (steps 2-6 are ``recruit_trl.workflow.pipeline.run_rl``, which the REINFORCE recipe runs with its own
trainer):
1. Arguments: ``ScriptArguments`` (rollout mode, anchors, rewards, and the files that name where RL starts and the
   report) + ``GRPOConfig`` + ``ModelConfig`` through ``TrlParser``, from one config file,
   ``recipes/configs/grpo_clinical.yaml`` unless ``--config`` names another (a path, or a file name in
   ``recipes/configs``: ``grpo_clinical_smollm2.yaml`` is sized for 45 minutes on 2 cores), and the command line
   over it (``recruit_trl.workflow.configs.parse_recipe``; only a CPU-only machine's precision sits under the file).
   The warm start's and the report's settings are not flags here: they live in the files ``--sft_config`` and
   ``--report_config`` name, read and checked with the rest.
2. The environment interface (``--env``) and its tasks (``--tasks``, default: all of the environment's).
3. The policy model: ``tiny`` (a warm tiny Qwen3 built locally and cached), ``smollm2`` (from its wheel), or
   any local folder / cached hub id, loaded as ``ModelConfig`` says in every stage (dtype, attention,
   ``--load_in_4bit`` for QLoRA).
4. Warm start (``--sft_config``, ``sft_clinical.yaml`` here; ``none``: RL starts from the base model): the SFT
   recipe's pipeline (``recruit_trl.workflow.warm_start``) with that SFT config, in-process on this run's model,
   its loading and LoRA shape, environment, tasks, prompts, seed and precision; it imitates the config's ``teacher``
   (cached in ``<output_dir>/sft``; DAgger rounds, the best round kept) for the config's budget
   (``num_train_epochs`` / ``max_steps`` / ``per_device_train_batch_size`` / ``learning_rate``), or
   ``--sft_adapter`` names a warm start already trained. A pretrained model trains a LoRA adapter, which RL
   continues; the tiny model built here fine-tunes every weight (``use_peft: false`` in its SFT config) and RL then
   trains every weight too (``--use_peft false``, its config's) or, with ``--use_peft true``, a fresh adapter on it.
5. Anchors: states on tasks x seeds x days, reached by replaying ``--anchor_policy`` (an environment policy) or
   recorded once from the model RL starts from (``--anchor_policy student``: on-policy states); the prompt column
   carries the anchor. Rollouts (``--mode branch|episode``; ``--continuation_seeds`` continuations per distinct
   action, the first ``--self_horizon`` days of each played by the policy itself) and rewards (``--reward_funcs``
   x ``--reward_weights``), then ``trainer.train()`` (resumes from the last checkpoint); the adapter is saved to
   ``--output_dir``.
6. Report (``--report_config``, ``report_clinical.yaml`` here; ``none``: no report): the config's
   ``eval_baselines``, and the base, SFT and RL models (``eval_episodes``, true for the tiny model), over whole
   episodes on held-out ``eval_seeds`` (models greedy; those named by ``eval_sampled`` also sampled at
   ``eval_temperature`` / ``eval_top_p``: rows ``<model>-sampled``); the decision-level report (``eval_decisions``:
   benchmark table and state values on held-out states, every model); ``report.json``, PNG plots and a one-screen
   summary in ``--output_dir`` (``recruit_trl.workflow.run_report``). The baselines (pure Python) run in a background
   process while the warm start traces the teacher, on the core that would otherwise idle.
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
    """Steps 2-6 above (``recruit_trl.workflow.pipeline.run_rl``) with ``recruit_trl.RecruitGRPOTrainer`` (TRL's
    ``GRPOTrainer`` with packed groups, legal-token log-probabilities, episode advantages and the control)."""
    return run_rl(script_args, training_args, model_args, trainer_cls)


def parse_args(argv: list[str] | None = None) -> tuple[ScriptArguments, GRPOConfig, ModelConfig]:
    """Step 1 above, every value checked before any model is built.

    Raises:
        ValueError: one line naming the flag, its value and what it takes.
    """
    types = (ScriptArguments, GRPOConfig, ModelConfig)
    return check_rl_arguments(*parse_recipe(types, "grpo_clinical.yaml", argv, rl=True))


if __name__ == "__main__":
    main(*parse_or_exit(parse_args))

"""SFT warm start: imitate a teacher policy's decisions, rendered exactly like the RL prompts, with LoRA.

    python recipes/sft_clinical.py                                  # CPU: tiny model, safe-agent teacher
    python recipes/sft_clinical.py --teacher expert --sft_train_seeds 300-347
    accelerate launch recipes/sft_clinical.py --model_name_or_path Qwen/Qwen3-4B --bf16 true --load_in_4bit

Top to bottom:
1. Arguments: ``SFTScriptArguments`` (``recruit_trl.workflow.arguments``: the environment, its tasks) +
   ``WarmStartArguments`` (the teacher, seeds, balancing, DAgger: the flags the RL recipes' warm start takes too) +
   TRL's ``SFTConfig`` + ``ModelConfig`` through ``TrlParser``; CPU-friendly defaults.
2. Data: teacher traces on ``--sft_train_seeds`` (balanced by action type within each task: no type above
   ``--sft_max_type_fraction`` of the rows, the clinical environment's 0.35; an environment that sets no cap of its own
   keeps every row) and ``--sft_heldout_seeds`` (untouched), as conversational prompt/completion rows; saved to
   ``<output_dir>/dataset`` and reused on re-runs.
3. ``SFTTrainer`` trains a LoRA adapter on the completions only (``--use_peft false``: every weight, which suits the
   tiny model, whose LoRA lacks the capacity to condition on the state; a real model keeps LoRA). For the tiny
   model (a vocabulary of a few hundred tokens) the loss is the model's own cross-entropy (``--sft_token_metrics``,
   false by default for it).
4. DAgger (``--dagger_rounds N``): the student plays ``--dagger_seeds`` itself, the teacher labels every state
   it reaches, and training continues on all data so far (``--dagger_epochs``); each round is cached in
   ``<output_dir>/round-K``. The last round's student plays those seeds too, and the round whose student scored
   best is kept (``--sft_keep_best_round``): its adapter (or model) and the tokenizer are saved to ``--output_dir``.
   Start GRPO / REINFORCE from it with ``--sft_adapter <output_dir>``.
5. Held-out report (``<output_dir>/heldout_report.json``): teacher match (also by task and teacher action type),
   strict-JSON and valid-action rates, predicted vs teacher action-type distributions.

Steps 2 to 5 are ``recruit_trl.workflow.warm_start.train_sft``, the pipeline the GRPO recipe's warm start runs too.
"""

from __future__ import annotations

import sys

# recruit_trl before TRL: importing it keeps off the console a notice that TRL's own import would print
from recruit_trl.workflow.parsing import RecipeParser, parse_or_exit

# isort: split
from trl import ModelConfig, SFTConfig

from recruit_trl.workflow.arguments import SFTScriptArguments, WarmStartArguments, check_sft_arguments
from recruit_trl.workflow.defaults import recipe_defaults
from recruit_trl.workflow.model_setup import setup_run
from recruit_trl.workflow.warm_start import train_sft


def main(
    script_args: SFTScriptArguments, warm: WarmStartArguments, training_args: SFTConfig, model_args: ModelConfig
) -> dict:
    # The environment, its tasks, and the base model, resolved once (``tiny`` is built for the environment's prompts).
    setup = setup_run(script_args, model_args.model_name_or_path)
    return train_sft(script_args, warm, training_args, model_args, setup)


def parse_args(argv: list[str] | None = None) -> tuple[SFTScriptArguments, WarmStartArguments, SFTConfig, ModelConfig]:
    """Step 1 above, every value checked before any model is built.

    Raises:
        ValueError: one line naming the flag, its value and what it takes.
    """
    parser = RecipeParser((SFTScriptArguments, WarmStartArguments, SFTConfig, ModelConfig))
    parser.set_defaults(**recipe_defaults("sft", "sft_clinical", "clinical", sys.argv[1:] if argv is None else argv))
    return check_sft_arguments(*parser.parse_args_and_config(args=argv))


if __name__ == "__main__":
    main(*parse_or_exit(parse_args))

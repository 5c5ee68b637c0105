"""SFT warm start: imitate a teacher policy's decisions, rendered exactly like the RL prompts.

    python recipes/sft_clinical.py                                  # CPU: the main job's warm start, on its own
    python recipes/sft_clinical.py --teacher expert --sft_train_seeds 300-347
    python recipes/sft_clinical.py --config sft_clinical_smollm2.yaml   # SmolLM2-135M-Instruct with LoRA
    accelerate launch recipes/sft_clinical.py --config sft_clinical_qwen3_4b.yaml   # Qwen3-4B, QLoRA, one GPU

Top to bottom:
1. Arguments: ``SFTScriptArguments`` (``recruit_trl.workflow.arguments``: the environment, its tasks) +
   ``WarmStartArguments`` (the teacher, seeds, balancing, DAgger) + TRL's ``SFTConfig`` + ``ModelConfig`` through
   ``TrlParser``, from one config file, ``recipes/configs/sft_clinical.yaml`` unless ``--config`` names another, and
   the command line over it (``recruit_trl.workflow.configs.parse_recipe``). That file is also the clinical main
   job's warm start (the RL recipes' ``--sft_config``): the expert's traces on seeds 300-307, one DAgger round, every
   weight of the tiny model, learning rate 3e-4.
2. Data: teacher traces on ``--sft_train_seeds`` (balanced by action type within each task: no type above
   ``--sft_max_type_fraction`` of the rows, 0.35 in the clinical configs; 1 keeps every row) and
   ``--sft_heldout_seeds`` (untouched), as conversational prompt/completion rows; saved to ``<output_dir>/dataset``
   and reused on re-runs.
3. ``SFTTrainer`` on the completions only: every weight with ``--use_peft false`` (the tiny model's config: its LoRA
   lacks the capacity to condition on the state), else a LoRA adapter (a real model's configs). For the tiny model (a
   vocabulary of a few hundred tokens) the loss is the model's own cross-entropy (``--sft_token_metrics false`` in
   its config).
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

# recruit_trl before TRL: importing it keeps off the console a notice that TRL's own import would print
from recruit_trl.workflow.parsing import parse_or_exit

# isort: split
from trl import ModelConfig, SFTConfig

from recruit_trl.workflow.arguments import SFTScriptArguments, WarmStartArguments, check_sft_arguments
from recruit_trl.workflow.configs import parse_recipe
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
    types = (SFTScriptArguments, WarmStartArguments, SFTConfig, ModelConfig)
    return check_sft_arguments(*parse_recipe(types, "sft_clinical.yaml", argv))


if __name__ == "__main__":
    main(*parse_or_exit(parse_args))

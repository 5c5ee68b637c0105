"""SFT on conquest: imitate the teacher's decisions (the teacher decision sets), then benchmark on the fixed and
held-out sets.

    python recipes/sft_conquest.py                                   # CPU: the tiny model, every weight
    python recipes/sft_conquest.py --config sft_conquest_smollm2.yaml   # SmolLM2-135M-Instruct with LoRA
    accelerate launch recipes/sft_conquest.py --model_name_or_path Qwen/Qwen3-4B --bf16 true --load_in_4bit \\
        --use_peft true --sft_token_metrics true

Top to bottom:
1. Arguments: ``SFTScriptArguments`` (environment, tasks) + ``WarmStartArguments`` (teacher, seeds, DAgger) + TRL's
   ``SFTConfig`` + ``ModelConfig`` through ``TrlParser``, from one config file, ``recipes/configs/sft_conquest.yaml``
   unless ``--config`` names another, and the command line over it (``recruit_trl.workflow.configs.parse_recipe``).
   That file is also the board game's warm start in ``recipes/grpo_conquest.py`` (its ``--sft_config``): one epoch,
   one DAgger round, every weight of the tiny model, learning rate 3e-4; ``sft_conquest_smollm2.yaml`` is SmolLM2's
   (12 LoRA steps, no DAgger).
2. Data (``--sft_data teacher_sets``): the teacher plays ``classic3`` and ``duel`` on three disjoint seed ranges, every
   decision is a row (the RL prompt, the answer ``{"action_index": k}``), capped so that no decision phase holds more
   than ``--sft_max_type_fraction`` of a split: ``train`` (``--sft_train_seeds``), ``fixed`` (100 rows,
   ``--sft_fixed_seeds``) and ``heldout`` (1,000 rows, ``--sft_heldout_seeds``); saved in
   ``<output_dir>/dataset/sets``.
3. ``SFTTrainer`` on the completions (every weight of the tiny model built here, ``use_peft: false`` in its config; a
   LoRA adapter for a pretrained or quantised model, ``--use_peft true``), optional DAgger rounds; the model and
   tokenizer are saved to ``--output_dir`` (``recruit_trl.workflow.warm_start.train_sft``, the pipeline
   ``recipes/grpo_conquest.py`` runs as its warm start).
4. Benchmark (``<output_dir>/benchmark.json``, printed): rows, strict JSON, valid index, teacher match and invalid
   count of the base and the trained model on the fixed and held-out sets, greedy with free decoding, and the teacher
   match under constrained decoding as a separate column (``recruit_trl.workflow.decisions.benchmark``).

Re-running the same command resumes: finished steps are read back, an interrupted training continues from its last
checkpoint.
"""

from __future__ import annotations

# recruit_trl before TRL: importing it keeps off the console a notice that TRL's own import would print
from recruit_trl.workflow.parsing import parse_or_exit

# isort: split
from trl import ModelConfig, SFTConfig

from recruit_trl.workflow.arguments import SFTScriptArguments, WarmStartArguments, check_sft_arguments
from recruit_trl.workflow.configs import parse_recipe
from recruit_trl.workflow.model_setup import setup_run
from recruit_trl.workflow.warm_start import benchmark_sft, train_sft


def main(
    script_args: SFTScriptArguments, warm: WarmStartArguments, training_args: SFTConfig, model_args: ModelConfig
) -> dict:
    # The environment, its tasks and the base model are resolved once (``tiny`` is built for the environment's
    # prompts) and carried to every step.
    setup = setup_run(script_args, model_args.model_name_or_path)
    report = train_sft(script_args, warm, training_args, model_args, setup)
    return benchmark_sft(script_args, warm, training_args, model_args, setup, report)


def parse_args(argv: list[str] | None = None) -> tuple[SFTScriptArguments, WarmStartArguments, SFTConfig, ModelConfig]:
    """Step 1 above, every value checked before any model is built.

    Raises:
        ValueError: one line naming the flag, its value and what it takes.
    """
    types = (SFTScriptArguments, WarmStartArguments, SFTConfig, ModelConfig)
    return check_sft_arguments(*parse_recipe(types, "sft_conquest.yaml", argv))


if __name__ == "__main__":
    main(*parse_or_exit(parse_args))

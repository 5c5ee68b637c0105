"""GRPO for an LLM agent on conquest (a Risk-compatible board game), through TRL's ``GRPOTrainer``.

With no arguments on a CPU machine this runs the whole pipeline on the tiny model, in one output folder:

    accelerate launch recipes/grpo_conquest.py
    accelerate launch recipes/grpo_conquest.py --model_name_or_path smollm2   # SmolLM2-135M-Instruct with LoRA
    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/grpo_conquest.py \\
        --model_name_or_path Qwen/Qwen3-4B --load_in_4bit --bf16 true
    python recipes/grpo_conquest.py --config recipes/grpo_conquest.yaml

Top to bottom (the pipeline is ``recruit_trl.pipeline.run_rl``, the clinical recipe's, with the settings below):
1. Arguments: ``ScriptArguments`` + ``GRPOConfig`` + ``ModelConfig`` through ``TrlParser``; the conquest settings
   (:data:`CONQUEST`) over the CPU defaults, a named model's own (:data:`PRESETS`) over those, the command line last.
2. The model: ``tiny`` is built here from the game's texts (tokenizer and a short warm-up) and cached.
3. Warm start (``recipes/sft_conquest.py``'s pipeline, into ``<output_dir>/sft``): the teacher decision sets
   (``--sft_data teacher_sets``: the teacher plays ``classic3`` and ``duel``; train seeds 0-99, the fixed 100-row set
   on seeds 100-109, the 1,000-row held-out set on seeds 300-359), supervised fine-tuning on the train rows, then a
   DAgger round (the student plays train seeds, the teacher labels the states it reaches; the better round kept).
4. GRPO from the warm start with branch rollouts: anchors are the teacher's game states (train seeds,
   ``--anchor_days`` = decision numbers); each of a group's sampled answers is applied to a copy of the same snapshot
   and scored by the final score after the teacher plays the agent's seat to the game's end (``--horizon``), with
   the same RNG stream for every branch of a group (common random numbers); plus a format term.
5. Report (``report.json``, PNG plots, a one-screen summary): the benchmark table (rows, strict JSON, valid index,
   teacher match, invalid) of the base, SFT and GRPO models, the safe agent and the teacher on the fixed and held-out
   sets; state values on held-out teacher states; whole games on held-out ``--eval_seeds`` of ``classic3`` and
   ``duel`` (the tiny model; free decoding, so an invalid answer plays the safe agent's action and is counted) beside
   the safe agent, ``balanced`` and the teacher; win rate and invalid rate over training.

A re-run of the same command resumes: finished stages are read back, training continues from its last checkpoint.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser  # noqa: E402

from recruit_trl.pipeline import run_rl  # noqa: E402
from recruit_trl.training.arguments import ScriptArguments  # noqa: E402
from recruit_trl.training.defaults import cpu_defaults, model_defaults, preset_name

# The conquest settings that differ from the pipeline's CPU defaults.
CONQUEST = {
    "env": "conquest",
    "tasks": ["classic3", "duel"],
    "output_dir": "outputs/grpo_conquest",
    # Warm start: the teacher decision sets (train seeds 0-99; fixed 100-109; held-out 300-359).
    "teacher": "teacher",
    "sft_data": "teacher_sets",
    "sft_train_seeds": "0-99",
    "sft_fixed_seeds": "100-109",
    "sft_heldout_seeds": "300-359",
    "sft_max_type_fraction": 0.25,
    "sft_length_buckets": True,
    "sft_epochs": 1.0,
    "dagger_rounds": 1,  # the student plays, the teacher labels its states: the student learns to recover
    "dagger_seeds": "0-7",
    "dagger_epochs": 0.5,
    # GRPO: anchors on the teacher's games (train seeds), continuations by the teacher to the game's end.
    "anchor_policy": "teacher",
    "anchor_seeds": "0-15",
    "anchor_days": "0-240:16",
    "continuation_policy": "teacher",
    "horizon": 5000,
    # Report: held-out games (seeds never used above), decisions on held-out teacher states.
    "eval_seeds": "1000-1029",  # 200 games a task: --eval_seeds 1000-1199 (a re-run evaluates only)
    "eval_baselines": ["safe", "balanced", "teacher"],
    "eval_constrained": False,
    "decision_seeds": "500-507",
    "decision_days": "0-200:20",
    "decision_continuations": 4,  # one game's outcome from a state is mostly dice
}
# A named model's settings on top. SmolLM2 on 2 CPU cores: ~1.1 s per answer to a 520-token prompt, ~66 s per SFT
# step of 8 rows, ~80 s per GRPO step; 45 minutes hold 12 SFT steps, 6 GRPO steps and the report's ~1,180 answers
# (the benchmark on 100 fixed + 300 held-out rows for SFT and GRPO, the base model on the fixed rows as in the
# anchor's table, no constrained pass; 93 states for base, SFT and GRPO). See docs/conquest.md.
PRESETS = {
    "smollm2": {
        "output_dir": "outputs/grpo_conquest_smollm2",
        "sft_max_steps": 12,
        "sft_batch_size": 8,
        "sft_learning_rate": 5e-4,
        "sft_heldout_rows": 300,
        "dagger_rounds": 0,  # a round plays whole games: minutes per game for SmolLM2 on CPU
        "anchor_seeds": "0-3",
        "max_steps": 6,
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "learning_rate": 1e-4,
        "save_steps": 2,
        "benchmark_constrained": False,
        "benchmark_base_heldout": False,
    }
}


def main(
    script_args: ScriptArguments, training_args: GRPOConfig, model_args: ModelConfig, trainer_cls=GRPOTrainer
) -> GRPOTrainer:
    """Steps 2-5 above (``recruit_trl.pipeline.run_rl``) with TRL's ``GRPOTrainer``."""
    return run_rl(script_args, training_args, model_args, trainer_cls)


def parse_args(argv: list[str] | None = None) -> tuple[ScriptArguments, GRPOConfig, ModelConfig]:
    parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig))
    preset = preset_name(sys.argv[1:] if argv is None else argv)
    parser.set_defaults(**{**cpu_defaults(), **model_defaults(), **CONQUEST, **PRESETS.get(preset, {})})
    return parser.parse_args_and_config(args=argv)


if __name__ == "__main__":
    main(*parse_args())

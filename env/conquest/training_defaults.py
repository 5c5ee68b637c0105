"""conquest's defaults for recruit_trl's recipes (``ConquestInterface.recipe_defaults``).

``"common"`` (every recipe: the tasks and the warm start's settings, which the SFT recipe and the RL recipes' warm
start share), then by recipe kind: ``"sft"`` (the SFT recipe), ``"rl"`` (the RL recipes), ``"rl/episode"`` (the RL
recipes in episode mode, and TRL's tool loop: the rewards of the game's own episodes), ``"sft:tiny"`` (the tiny model's
SFT) and ``"<kind>:smollm2"`` (SmolLM2's runs, sized for 2 CPU cores). Any flag overrides them.
"""

from __future__ import annotations

from typing import Any

# Warm start: the teacher decision sets (the teacher plays classic3 and duel; train seeds 0-99, the fixed 100-row set
# on seeds 100-109, the 1,000-row held-out set on seeds 300-359).
COMMON: dict[str, Any] = {
    "tasks": ["classic3", "duel"],
    "teacher": "teacher",
    "sft_data": "teacher_sets",
    "sft_train_seeds": "0-99",
    "sft_fixed_seeds": "100-109",
    "sft_heldout_seeds": "300-359",
    "sft_max_type_fraction": 0.25,
    "sft_length_buckets": True,
}

SFT: dict[str, Any] = {"num_train_epochs": 1}

# The SFT recipe trains every weight of the tiny model built here (its LoRA lacks the capacity to imitate the
# teacher), as the RL recipes' warm start does (recruit_trl.workflow.defaults.TINY_DEFAULTS); a quantised model
# trains an adapter.
SFT_TINY: dict[str, Any] = {"use_peft": False}

RL: dict[str, Any] = {
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

# Episode mode (and the tool loop): a decision's step reward is the change of the agent's standing (the potential: its
# mean share of territories and armies), and the decision that ends the game also gets 1 for a win (a loss or the
# round limit: 0). An episode's outcome, their sum, is then the win plus the standing gained over the game.
RL_EPISODE: dict[str, Any] = {
    "reward_funcs": ["win_reward", "potential_reward"],
    "reward_weights": [1.0, 1.0],
}

# SmolLM2 on 2 CPU cores: ~1.1 s per answer to a 520-token prompt, ~66 s per SFT step of 8 rows, ~80 s per GRPO step;
# 45 minutes hold 12 SFT steps, 6 GRPO steps and the report's ~1,180 answers (the benchmark on 100 fixed + 300
# held-out rows for SFT and GRPO, the base model on the fixed rows as in the anchor's table, no constrained pass; 93
# states for base, SFT and GRPO). See docs/conquest.md.
RL_SMOLLM2: dict[str, Any] = {
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

# Its rows cost ~1 s each on 2 CPU cores.
SFT_SMOLLM2: dict[str, Any] = {
    "max_steps": 60,
    "per_device_train_batch_size": 8,
    "learning_rate": 5e-4,
    "sft_heldout_rows": 300,
}

RECIPE_DEFAULTS = {
    "common": COMMON,
    "sft": SFT,
    "sft:tiny": SFT_TINY,
    "rl": RL,
    "rl/episode": RL_EPISODE,
    "rl:smollm2": RL_SMOLLM2,
    "sft:smollm2": SFT_SMOLLM2,
}

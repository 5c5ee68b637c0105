"""The clinical environment's defaults for recruit_trl's recipes (``ClinicalInterface.recipe_defaults``).

``"common"`` (every recipe: the warm start's settings, which the SFT recipe and the RL recipes' warm start share),
then by recipe kind: ``"sft"`` (the SFT recipe), ``"rl"`` (the RL recipes, their warm start included) and
``"rl:smollm2"`` (SmolLM2's run, sized for 2 CPU cores). Any flag overrides them.
"""

from __future__ import annotations

from typing import Any

# The warm start caps any action type at 35 % of the teacher's rows (within each task): the teachers play eight
# action types unevenly, and a model trained on the rows as played can win by always predicting the majority action
# (the reference's own SFT collapsed to 100 % adjust_strategy).
COMMON: dict[str, Any] = {"sft_max_type_fraction": 0.35}

SFT: dict[str, Any] = {"teacher": "safe"}

# The main job: GRPO branches from the grader heuristic's states, continued to day 180 by it; a warm start on the
# expert's traces sized for the CPU main job.
RL: dict[str, Any] = {
    "horizon": 180,
    "continuation_policy": "grader_heuristic",
    "anchor_policy": "grader_heuristic",
    "eval_baselines": ["heuristic", "expert"],
    "teacher": "expert",
    "sft_train_seeds": "300-307",
    "sft_heldout_seeds": "400",
    "dagger_rounds": 1,  # what the CPU main job has time for; the best round is kept
    "dagger_seeds": "300-303",  # half the traced seeds: CPU time
    "dagger_epochs": 0.5,  # rows are reshuffled every round, so each round sees a different half
    "sft_length_buckets": True,  # faster on CPU; safe together with sft_keep_best_round
}

# SmolLM2-135M costs about 1.1 s per 400-token decision and 30-45 s per LoRA step of 8 rows on 2 CPU cores, so its
# run is sized for <= 45 minutes: a short LoRA warm start without DAgger (a DAgger round plays whole episodes), a few
# GRPO steps on small groups, and decision-level evaluation instead of whole episodes.
RL_SMOLLM2: dict[str, Any] = {
    "sft_train_seeds": "300-301",
    "sft_max_steps": 16,
    "sft_batch_size": 8,
    "sft_heldout_rows": 32,
    "sft_learning_rate": 5e-4,
    "dagger_rounds": 0,
    "anchor_seeds": "100-101",
    "max_steps": 12,
    "per_device_train_batch_size": 8,
    "num_generations": 4,
    "learning_rate": 1e-4,
    "save_steps": 4,
}

RECIPE_DEFAULTS = {"common": COMMON, "sft": SFT, "rl": RL, "rl:smollm2": RL_SMOLLM2}

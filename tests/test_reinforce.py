"""REINFORCE/RLOO: the trainer's advantages equal a hand-computed leave-one-out baseline."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from recipe_files import load_recipe

from recruit_trl.training.trainer import RecruitReinforceTrainer, leave_one_out_advantages

ROOT = Path(__file__).parents[1]
SMALL = [
    "--anchor_seeds", "100", "--anchor_days", "0-60:20", "--tasks", "easy_bench", "hard_bench",
    "--per_device_train_batch_size", "16", "--num_generations", "4", "--save_strategy", "no", "--horizon", "4",
    "--sft_config", "none", "--report_config", "none", "--use_peft", "true",
    "--reward_funcs", "env_return_reward", "format_reward", "--reward_weights", "1.0", "1.0",
]  # fmt: skip


def test_scaled_group_mean_is_leave_one_out():
    rng = random.Random(0)
    rewards = [rng.uniform(-1, 1) for _ in range(12)]
    g = 4
    grouped = torch.tensor(rewards).view(-1, g)
    grpo = (grouped - grouped.mean(dim=1, keepdim=True)).flatten() * g / (g - 1)
    assert torch.allclose(grpo, torch.tensor(leave_one_out_advantages(rewards, g)), atol=1e-6)
    assert leave_one_out_advantages([1.0, 3.0], 2) == [-2.0, 2.0]
    with pytest.raises(ValueError):
        leave_one_out_advantages([1.0, 2.0, 3.0], 2)


class CapturingTrainer(RecruitReinforceTrainer):
    captured: list = []

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        CapturingTrainer.captured.append((out, {k: list(v) for k, v in self._logs["rewards"].items()}))
        return out


def test_reinforce_recipe_advantages_match_hand_computation(warm_model, tmp_path):
    recipe = load_recipe("reinforce_clinical")
    args = recipe.parse_args(["--model_name_or_path", warm_model, "--max_steps", "1", "--output_dir", str(tmp_path),
                              *SMALL])  # fmt: skip
    assert args[1].scale_rewards == "none" and args[1].loss_type == "dr_grpo" and args[1].beta == 0.0
    CapturingTrainer.captured = []
    recipe.main(*args, trainer_cls=CapturingTrainer)
    out, logged = CapturingTrainer.captured[0]
    weights = [1.0] * len(logged)  # default reward_weights
    n = len(out["advantages"])
    totals = [
        sum(w * (0.0 if v[i] is None or v[i] != v[i] else v[i]) for w, v in zip(weights, logged.values(), strict=True))
        for i in range(n)
    ]
    expected = leave_one_out_advantages(totals, 4)
    assert torch.allclose(out["advantages"].float(), torch.tensor(expected), atol=1e-5)

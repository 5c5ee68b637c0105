"""Constrained rollouts train on the distribution they sampled from (``recruit_trl.training.legal_logprobs``): the
trainer's log-probabilities over the legal tokens equal the sampler's, in every rollout mode."""

from __future__ import annotations

import math

import pytest
import torch
from recipe_files import load_recipe

import recruit_trl.pipeline as pipeline
from recruit_trl.models.generation import LEGAL_FIELD
from recruit_trl.training.control import rl_trainer_class
from recruit_trl.training.legal_logprobs import LEGAL_IDS, LegalLogprobs, legal_id_tensor, legal_logps_and_entropy


def test_log_probabilities_are_renormalised_over_the_legal_tokens_only_where_a_position_has_them():
    logits = torch.tensor([[[0.0, 1.0, 2.0, 3.0], [1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 2.0]]])
    tokens = torch.tensor([[2, 0, 3]])
    legal = legal_id_tensor([[[1, 2], [0], []]], width=3)
    assert legal.tolist() == [[[1, 2], [0, -1], [-1, -1]]]
    logps, entropy = legal_logps_and_entropy(logits, tokens, legal, compute_entropy=True)
    p = math.exp(2) / (math.exp(1) + math.exp(2))
    full = torch.log_softmax(logits[0, 2], -1)
    assert logps[0].tolist() == pytest.approx([math.log(p), 0.0, float(full[3])])  # two legal, one forced, free
    assert entropy[0].tolist() == pytest.approx(
        [-(p * math.log(p) + (1 - p) * math.log(1 - p)), 0.0, float(-(full.exp() * full).sum())]
    )


@pytest.mark.parametrize(
    ("mode", "flags"),
    [
        ("branch", ["--horizon", "2"]),
        ("window", ["--horizon", "1", "--window_turns", "2"]),
        ("episode", ["--episode_decisions", "2", "--episode_groups", "2", "--anchor_days", "0"]),
    ],
)
def test_the_trainer_scores_constrained_rollouts_as_they_were_sampled(mode, flags, warm_model, tmp_path, monkeypatch):
    seen = []

    def recording(*args):
        class Recording(rl_trainer_class(*args)):
            def _generate(self, prompts):
                result = super()._generate(prompts)
                seen.append({"sampled": result[4], "fields": set(result[5])})
                return result

            def _generate_and_score_completions(self, inputs):
                output = super()._generate_and_score_completions(inputs)
                ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
                mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
                width = output["completion_ids"].size(1)
                self.model.eval()  # as sampled: no dropout
                with torch.no_grad():
                    self._legal = output[LEGAL_IDS]
                    legal, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, mask, width)
                    self._legal = None
                    free, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, mask, width)
                self.model.train()
                seen[-1].update(legal=legal, free=free, mask=output["completion_mask"] * output.get("tool_mask", 1))
                return output

        return Recording

    monkeypatch.setattr(pipeline, "rl_trainer_class", recording)
    recipe = load_recipe("grpo_clinical")
    recipe.main(*recipe.parse_args([
        "--model_name_or_path", warm_model, "--mode", mode, *flags, "--constrained_decoding", "true",
        "--anchor_seeds", "100", "--anchor_days", "0-60:20", "--tasks", "easy_bench", "hard_bench",
        "--per_device_train_batch_size", "8", "--num_generations", "4", "--save_strategy", "no",
        "--warm_start", "none", "--report", "false", "--max_steps", "1", "--temperature", "1.5",
        "--output_dir", str(tmp_path),
    ]))  # fmt: skip
    assert len(seen) == 1
    (batch,) = seen
    assert LEGAL_FIELD not in batch["fields"]  # handed to the generation batch, not to the reward functions
    checked = forced = 0
    for row, sampled in enumerate(batch["sampled"]):
        for t, value in enumerate(sampled):
            if batch["mask"][row, t]:
                assert float(batch["legal"][row, t]) == pytest.approx(value, abs=2e-4)
                checked += 1
                forced += value == 0.0
    assert checked > 0 and 0 < forced < checked  # forced tokens (log 1) and real choices both seen
    # TRL's own (whole-vocabulary) log-probabilities of the same tokens are lower wherever the mask cut something
    differ = (batch["free"] < batch["legal"] - 1e-3) & batch["mask"].bool()
    assert differ.any()


def test_only_constrained_runs_train_on_legal_log_probabilities():
    from trl import GRPOTrainer

    assert issubclass(rl_trainer_class(GRPOTrainer, "branch", False, True), LegalLogprobs)
    assert not issubclass(rl_trainer_class(GRPOTrainer, "branch", False, False), LegalLogprobs)
    assert issubclass(rl_trainer_class(GRPOTrainer, "episode", True, True), LegalLogprobs)

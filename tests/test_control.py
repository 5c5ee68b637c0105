"""The control of a learning claim (``--shuffle_advantages``): in every mode and trainer it trains on a permutation of
the credit run's advantages, centred over the rows trained, so its expected gradient is zero; and the credit path's
pieces it is measured against (the run's seed reaching the rollout, a flag of another mode refused)."""

from __future__ import annotations

import pytest
import torch
from recipe_files import load_recipe
from trl import GRPOTrainer

import recruit_trl.pipeline as pipeline
from recruit_trl.rollout.config import MODE_FLAGS, RolloutConfig
from recruit_trl.training.control import CenteredAdvantages, ShuffledAdvantages, control_trainer, rl_trainer_class
from recruit_trl.training.episode_trainer import EpisodeAdvantages
from recruit_trl.training.length_batches import LengthSortedBatches
from recruit_trl.training.reinforce import ReinforceTrainer
from recruit_trl.training.vllm_colocate import VLLMOnCPU

SMALL = [
    "--anchor_seeds", "100", "--anchor_days", "0-60:20", "--tasks", "easy_bench", "hard_bench",
    "--per_device_train_batch_size", "16", "--num_generations", "4", "--save_strategy", "no",
    "--warm_start", "none", "--report", "false", "--max_steps", "1", "--temperature", "1.5",
]  # fmt: skip
BY_MODE = {
    "branch": ["--horizon", "4"],
    "window": ["--horizon", "2", "--window_turns", "2"],
    "episode": ["--episode_decisions", "3", "--episode_groups", "2", "--anchor_days", "0"],
}


def trained_batches(recipe_name: str, flags: list[str], monkeypatch) -> list[tuple]:
    """``(trainer, batch)`` for each generation batch of a one-step run through the recipe: the outermost class's
    output, after every mixin, which is what the loss trains on."""
    seen: list[tuple] = []

    def recording(*args):
        class Recording(rl_trainer_class(*args)):
            def _generate_and_score_completions(self, inputs):
                output = super()._generate_and_score_completions(inputs)
                seen.append((self, {k: v.clone() if torch.is_tensor(v) else v for k, v in output.items()}))
                return output

        return Recording

    monkeypatch.setattr(pipeline, "rl_trainer_class", recording)
    recipe = load_recipe(recipe_name)
    recipe.main(*recipe.parse_args(flags))
    return seen


def trained_advantages(recipe_name: str, flags: list[str], monkeypatch) -> list[list[float]]:
    """The advantages each generation batch of a one-step run through the recipe trains on."""
    return [batch["advantages"].flatten().tolist() for _, batch in trained_batches(recipe_name, flags, monkeypatch)]


def advantage_gradient(trainer, batch: dict, advantages: torch.Tensor) -> torch.Tensor:
    """The gradient of the trainer's loss on ``batch`` with ``advantages``, less the gradient with zero advantages
    (what the KL term or anything else not carried by the advantages contributes): on-policy it is linear in them."""

    def gradient(values: torch.Tensor) -> torch.Tensor:
        trainer.model.zero_grad(set_to_none=True)
        trainer.compute_loss(trainer.model, {**batch, "advantages": values}).backward()
        return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])

    return gradient(advantages) - gradient(torch.zeros_like(advantages))


@pytest.mark.parametrize("mode", ["branch", "window", "episode"])
def test_the_controls_expected_gradient_is_zero_and_the_credits_is_not(mode, warm_model, tmp_path, monkeypatch):
    """For the rows one step trains on, the control's gradient averaged over permutations of the advantages is zero to
    rounding; the credit's gradient is not. Averaging over the n cyclic shifts is exact: each row meets each
    advantage once, as in the mean over all permutations."""
    flags = ["--model_name_or_path", warm_model, *SMALL, "--mode", mode, *BY_MODE[mode], "--beta", "0.04",
             "--output_dir", str(tmp_path), "--shuffle_advantages", "true"]  # fmt: skip
    ((trainer, batch),) = trained_batches("grpo_clinical", flags, monkeypatch)
    trainer.model.eval()  # no dropout: every gradient of the same rows is the same function of the advantages
    advantages = batch["advantages"]
    assert abs(float(advantages.sum())) < 1e-5 and float(advantages.abs().max()) > 1e-3
    credit = advantage_gradient(trainer, batch, advantages)
    shifted = sum(advantage_gradient(trainer, batch, advantages.roll(k)) for k in range(advantages.numel()))
    control = shifted / advantages.numel()
    assert float(credit.norm()) > 1e-4
    assert float(control.norm()) < 1e-4 * float(credit.norm())


class FixedAdvantages:
    """A stand-in for a trainer's ``_generate_and_score_completions``."""

    def __init__(self, advantages: list[float], training: bool = True, seed: int = 0, step: int = 0) -> None:
        self.advantages = torch.tensor(advantages)
        self.model = type("M", (), {"training": training})()
        self.args = type("A", (), {"seed": seed})()
        self.state = type("S", (), {"global_step": step})()
        self.accelerator = type("Acc", (), {"process_index": 0})()

    def _generate_and_score_completions(self, inputs):
        return {"advantages": self.advantages.clone()}


def test_the_permutation_is_drawn_from_seed_and_step_and_spares_evaluation():
    cls = control_trainer(FixedAdvantages)
    values = [float(i) for i in range(32)]
    first = cls(values)._generate_and_score_completions([])["advantages"].tolist()
    assert sorted(first) == values and first != values
    assert cls(values)._generate_and_score_completions([])["advantages"].tolist() == first  # a re-run: the same
    assert cls(values, step=1)._generate_and_score_completions([])["advantages"].tolist() != first
    assert cls(values, seed=1)._generate_and_score_completions([])["advantages"].tolist() != first
    assert cls(values, training=False)._generate_and_score_completions([])["advantages"].tolist() == values


def test_the_control_is_the_outermost_override_in_every_mode():
    for base in (GRPOTrainer, ReinforceTrainer):
        for mode in ("branch", "window", "episode"):
            cls = rl_trainer_class(base, mode, True)
            assert cls.__mro__[1] is ShuffledAdvantages and issubclass(cls, base)
            assert issubclass(cls, EpisodeAdvantages) == (mode == "episode")
            credit = rl_trainer_class(base, mode, False)
            assert issubclass(credit, base) and not issubclass(credit, ShuffledAdvantages)
            assert issubclass(credit, LengthSortedBatches) and issubclass(cls, LengthSortedBatches)
            assert credit.__mro__[1] is CenteredAdvantages and cls.__mro__[3] is CenteredAdvantages
            layers = [c for c in credit.__mro__ if c in (VLLMOnCPU, LengthSortedBatches, base)]
            assert layers == [VLLMOnCPU, LengthSortedBatches, base]  # TRL's vLLM generator made to work on CPU
    once = control_trainer(GRPOTrainer)
    assert control_trainer(once) is once


@pytest.mark.parametrize("name", sorted(MODE_FLAGS))
def test_a_flag_of_another_mode_is_refused_with_a_message(name):
    modes = MODE_FLAGS[name]
    other = next(m for m in ("branch", "window", "episode") if m not in modes)
    value = {bool: True, int: 3, float: 0.5, str: "expert"}[type(getattr(RolloutConfig(env_name="clinical"), name))]
    config = dict(env_name="clinical", continuation_policy="grader_heuristic", horizon=5)
    RolloutConfig(**config, mode=modes[0], **{name: value})  # where it applies: accepted
    with pytest.raises(ValueError, match=f"--{name} applies to .*no effect in {other} mode"):
        RolloutConfig(**config, mode=other, **{name: value})


def test_the_recipe_refuses_a_flag_of_another_mode_before_any_model_is_built(tmp_path, capsys):
    recipe = load_recipe("grpo_clinical")
    with pytest.raises(ValueError, match="--step_horizon applies to episode mode only"):
        recipe.parse_args(["--output_dir", str(tmp_path), "--step_horizon", "3"])
    assert not any(tmp_path.iterdir())


def test_the_runs_seed_reaches_the_rollout(warm_model, tmp_path, monkeypatch):
    seeds = []
    real = pipeline.make_rollout

    def spy(config, interface=None, seed=0):
        seeds.append(seed)
        return real(config, interface, seed)

    monkeypatch.setattr(pipeline, "make_rollout", spy)
    recipe = load_recipe("grpo_clinical")
    flags = ["--model_name_or_path", warm_model, *SMALL, "--horizon", "2", "--output_dir", str(tmp_path)]
    recipe.main(*recipe.parse_args([*flags, "--seed", "7"]))
    assert seeds == [7]

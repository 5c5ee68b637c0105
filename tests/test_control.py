"""The RL recipes' trainer, ``RecruitGRPOTrainer``: one named class (no trainer class built at run time), and the
control of a learning claim (``--shuffle_advantages``): in every mode and trainer it trains on a permutation of the
credit run's advantages, centred over the rows trained, so its expected gradient is zero; and the credit path's pieces
it is measured against (the run's seed reaching the rollout, a flag of another mode refused)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest
import torch
from recipe_files import load_recipe
from trl import GRPOTrainer

import recruit_trl.workflow.pipeline as pipeline
from recruit_trl.rollout.config import MODE_FLAGS, RolloutConfig
from recruit_trl.training.trainer import REINFORCE_SETTINGS, RecruitGRPOTrainer, RecruitReinforceTrainer

SMALL = [
    "--anchor_seeds", "100", "--anchor_days", "0-60:20", "--tasks", "easy_bench", "hard_bench",
    "--per_device_train_batch_size", "16", "--num_generations", "4", "--save_strategy", "no",
    "--sft_config", "none", "--report_config", "none", "--use_peft", "true",
    "--max_steps", "1", "--temperature", "1.5",
]  # fmt: skip
BY_MODE = {
    "branch": ["--horizon", "4"],
    "episode": ["--episode_decisions", "3", "--episode_groups", "2", "--anchor_days", "0"],
}


def trained_batches(recipe_name: str, flags: list[str]) -> list[tuple]:
    """``(trainer, batch)`` for each generation batch of a one-step run through the recipe: the trainer's output,
    which is what the loss trains on."""
    seen: list[tuple] = []
    recipe = load_recipe(recipe_name)
    base = recipe.main.__defaults__[0]  # the recipe's trainer class

    class Recording(base):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            seen.append((self, {k: v.clone() if torch.is_tensor(v) else v for k, v in output.items()}))
            return output

    recipe.main(*recipe.parse_args(flags), trainer_cls=Recording)
    return seen


def advantage_gradient(trainer, batch: dict, advantages: torch.Tensor) -> torch.Tensor:
    """The gradient of the trainer's loss on ``batch`` with ``advantages``, less the gradient with zero advantages
    (what the KL term or anything else not carried by the advantages contributes): on-policy it is linear in them."""

    def gradient(values: torch.Tensor) -> torch.Tensor:
        trainer.model.zero_grad(set_to_none=True)
        trainer.compute_loss(trainer.model, {**batch, "advantages": values}).backward()
        return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])

    return gradient(advantages) - gradient(torch.zeros_like(advantages))


@pytest.mark.parametrize("mode", ["branch", "episode"])
def test_the_controls_expected_gradient_is_zero_and_the_credits_is_not(mode, warm_model, tmp_path):
    """For the rows one step trains on, the control's gradient averaged over permutations of the advantages is zero to
    rounding; the credit's gradient is not. Averaging over the n cyclic shifts is exact: each row meets each
    advantage once, as in the mean over all permutations."""
    flags = ["--model_name_or_path", warm_model, *SMALL, "--mode", mode, *BY_MODE[mode], "--beta", "0.04",
             "--output_dir", str(tmp_path), "--shuffle_advantages", "true"]  # fmt: skip
    ((trainer, batch),) = trained_batches("grpo_clinical", flags)
    trainer.model.eval()  # no dropout: every gradient of the same rows is the same function of the advantages
    advantages = batch["advantages"]
    assert abs(float(advantages.sum())) < 1e-5 and float(advantages.abs().max()) > 1e-3
    credit = advantage_gradient(trainer, batch, advantages)
    shifted = sum(advantage_gradient(trainer, batch, advantages.roll(k)) for k in range(advantages.numel()))
    control = shifted / advantages.numel()
    assert float(credit.norm()) > 1e-4
    assert float(control.norm()) < 1e-4 * float(credit.norm())


class FixedAdvantages(RecruitGRPOTrainer):
    """``RecruitGRPOTrainer`` without a model: TRL's part of ``_generate_and_score_completions`` returns ``advantages``
    (patched in by :func:`fixed`)."""

    def __init__(self, training=True, seed=0, step=0, episode_advantages=False, shuffle_advantages=True):
        self.episode_advantages, self.shuffle_advantages = episode_advantages, shuffle_advantages
        self.model = type("M", (), {"training": training})()
        self.args = type("A", (), {"seed": seed, **REINFORCE_SETTINGS})()
        self.state = type("S", (), {"global_step": step})()
        self.accelerator = type("Acc", (), {"process_index": 0})()


def fixed(monkeypatch, advantages: list[float]) -> None:
    monkeypatch.setattr(
        GRPOTrainer, "_generate_and_score_completions", lambda self, inputs: {"advantages": torch.tensor(advantages)}
    )


def advantages_of(trainer: FixedAdvantages) -> list[float]:
    return trainer._generate_and_score_completions([])["advantages"].tolist()


def test_the_permutation_is_drawn_from_seed_and_step_and_spares_evaluation(monkeypatch):
    values = [float(i) - 15.5 for i in range(32)]  # mean zero: centring leaves them as they are
    fixed(monkeypatch, values)
    first = advantages_of(FixedAdvantages())
    assert sorted(first) == values and first != values
    assert advantages_of(FixedAdvantages()) == first  # a re-run: the same
    assert advantages_of(FixedAdvantages(step=1)) != first
    assert advantages_of(FixedAdvantages(seed=1)) != first
    assert advantages_of(FixedAdvantages(training=False)) == values
    assert advantages_of(FixedAdvantages(shuffle_advantages=False)) == values


def test_the_control_draws_one_sign_per_batch_and_both_signs_occur(monkeypatch):
    values = [0.75, -0.25, -0.25, -0.25]  # a skewed group: one success in four
    fixed(monkeypatch, values)
    signs = set()
    for step in range(20):
        drawn = advantages_of(FixedAdvantages(step=step))
        sign = 1.0 if max(drawn) == pytest.approx(0.75) else -1.0
        assert sorted(sign * a for a in drawn) == pytest.approx(sorted(values))
        signs.add(sign)
    assert signs == {1.0, -1.0}


def adamw_step(advantages: torch.Tensor, max_norm: float) -> torch.Tensor:
    """The change of a softmax policy's logits after one AdamW step with clipping, on 4 rows that sampled actions
    0, 1, 2, 3 of a 6-action softmax with ``advantages`` (the REINFORCE loss ``-mean(A * log p(a))``)."""
    logits = torch.nn.Parameter(torch.tensor([0.3, -0.2, 0.1, 0.0, 0.5, -0.4], dtype=torch.float64))
    optimizer = torch.optim.AdamW([logits], lr=0.1, weight_decay=0.0)
    before = logits.detach().clone()
    loss = -(advantages * torch.log_softmax(logits, -1)[torch.arange(4)]).mean()
    loss.backward()
    torch.nn.utils.clip_grad_norm_([logits], max_norm)
    optimizer.step()
    return logits.detach() - before


def test_averaged_over_permutations_and_signs_one_adamw_step_with_clipping_is_zero():
    """The control is a null of the update, not only of the expected gradient: over every permutation of a skewed
    group's advantages one AdamW step with clipping moves the logits on average (Adam divides each coordinate by its
    own scale, clipping shrinks large gradients more), over every permutation and both signs it does not."""
    advantages = torch.tensor([0.75, -0.25, -0.25, -0.25], dtype=torch.float64)
    permuted = [advantages[list(order)] for order in itertools.permutations(range(4))]
    for max_norm in (1.0, 0.05):  # clipping off and on (the gradient's norm is about 0.2)
        without_sign = torch.stack([adamw_step(a, max_norm) for a in permuted]).mean(0)
        with_sign = torch.stack([adamw_step(s * a, max_norm) for a in permuted for s in (1.0, -1.0)]).mean(0)
        assert float(without_sign.abs().max()) > 1e-3
        assert float(with_sign.abs().max()) < 1e-12


def test_training_advantages_are_centred_in_both_arms_and_evaluation_ones_are_not(monkeypatch):
    fixed(monkeypatch, [0.75, -0.25, -0.25, 0.75])
    for shuffle in (False, True):
        assert sum(advantages_of(FixedAdvantages(shuffle_advantages=shuffle))) == pytest.approx(0.0, abs=1e-7)
    assert advantages_of(FixedAdvantages(training=False)) == [0.75, -0.25, -0.25, 0.75]


def test_reinforce_rescales_the_group_advantages_before_centring(monkeypatch):
    class FixedReinforce(RecruitReinforceTrainer, FixedAdvantages):
        num_generations = 4

    fixed(monkeypatch, [0.75, -0.25, -0.25, -0.25])
    assert advantages_of(FixedReinforce(shuffle_advantages=False)) == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])


def test_the_trainer_is_one_named_class_and_none_is_built_at_run_time():
    """The recipes' trainers are classes written in the source: their method resolution order is one chain of named
    classes, and nothing in recruit_trl/ calls ``type(name, bases, namespace)`` but the tool loop's environment class
    (TRL's ``environment_factory`` takes a class, one per environment and its settings)."""
    chain = [c.__name__ for c in RecruitReinforceTrainer.__mro__]
    assert chain[:6] == [
        "RecruitReinforceTrainer", "RecruitGRPOTrainer", "PackedGroups", "LegalLogprobs", "LengthSortedBatches",
        "GRPOTrainer",
    ]  # fmt: skip
    for recipe_name in ("grpo_clinical", "grpo_conquest", "reinforce_clinical"):
        assert issubclass(load_recipe(recipe_name).main.__defaults__[0], RecruitGRPOTrainer)
    package = Path(pipeline.__file__).parent
    built = [
        f"{path.relative_to(package)}:{node.lineno}"
        for path in sorted(package.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and getattr(node.func, "id", None) == "type"
        and len(node.args) == 3
        and ast.unparse(node.args[1]) != "(ToolEnvironment,)"
    ]
    assert built == []


@pytest.mark.parametrize("name", sorted(MODE_FLAGS))
def test_a_flag_of_another_mode_is_refused_with_a_message(name):
    modes = MODE_FLAGS[name]
    other = next(m for m in ("branch", "episode") if m not in modes)
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

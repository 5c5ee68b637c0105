"""Where the seconds go (recruit_trl.tools.profiling): exclusive shares by hand with a scripted clock, the model's
passes told apart (prefill, decoding, the trainer's forward), and the evaluation's profile through the command line."""

from __future__ import annotations

import json
import types

import pytest
import torch

from recruit_trl.cli import main as cli
from recruit_trl.tools import profiling
from recruit_trl.tools.profiling import SHARES, Profile, share_table
from tests.test_evaluate import TASK


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_share_excludes_the_shares_timed_inside_it_and_the_wrapping_is_undone(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(profiling.time, "perf_counter", clock)
    module = types.SimpleNamespace()

    def env_step():
        clock.now += 2.0
        return "stepped"

    def rollout():
        clock.now += 1.0
        out = module.env_step()
        clock.now += 3.0
        return out

    module.env_step, module.rollout = env_step, rollout
    profile = Profile()
    profile.wrap(module, "env_step", "environment")
    profile.wrap(module, "rollout", "play_other")
    profile.mark_step()
    assert module.rollout() == "stepped"
    profile.mark_step()  # step 1 (left out: warm-up)
    module.rollout()
    module.rollout()
    clock.now += 0.5  # unmeasured: the rest of the step
    profile.mark_step()  # step 2
    shares = profile.per_step()
    assert shares["environment"] == 4.0 and shares["play_other"] == 8.0
    assert shares["other"] == 0.5 and shares["total"] == 12.5
    assert profile.seconds["environment"] == 6.0 and profile.seconds["play_other"] == 12.0  # all three calls
    profile.undo()
    assert module.env_step is env_step and module.rollout is rollout


def test_a_method_wrapped_on_a_class_or_an_instance_is_restored():
    class Env:
        def step(self):
            return 1

    env, other = Env(), Env()
    profile = Profile()
    profile.wrap(Env, "step", "environment")
    profile.wrap(env, "step", "environment")
    assert env.step() == 1 and other.step() == 1
    assert profile.seconds["environment"] > 0.0  # both wrappers timed
    profile.undo()
    assert Env.step.__name__ == "step" and "step" not in vars(env)


def test_the_model_passes_are_told_apart_by_where_they_run(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from recruit_trl.models import generation

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model, padding_side="left")
    prompts = [tokenizer("day 1 screen")["input_ids"], tokenizer("day 2 screen a patient today")["input_ids"]]
    profile = Profile()
    profile.wrap(generation, "sample", "decode")
    profile.hook_model(model)
    calls = []
    model.register_forward_pre_hook(lambda _m, _a, kwargs: calls.append(kwargs["input_ids"].shape), with_kwargs=True)
    config = GenerationConfig(do_sample=False)
    generation.sample(model, tokenizer, prompts, config, 4)
    assert calls and profile.seconds["prefill"] > 0 and profile.seconds["decode"] > 0
    real, positions = profile.tokens["prefill"]
    assert (real, positions) == (sum(map(len, prompts)), 2 * max(map(len, prompts)))  # one prefill, left-padded
    assert "decode" not in profile.tokens
    profile.enter("loss")  # as the trainer's compute_loss
    model(input_ids=torch.tensor([prompts[1]]), attention_mask=torch.ones(1, len(prompts[1]), dtype=torch.long))
    profile.leave()
    assert profile.seconds["trainer_forward"] > 0 and profile.padding()["trainer_forward"] == 0.0
    model(input_ids=torch.tensor([prompts[1]]))  # neither in a rollout nor in the loss
    assert profile.seconds["logprob_recompute"] > 0
    profile.undo()
    assert generation.sample.__name__ == "sample"


def test_eval_profile_prints_where_the_seconds_go(tiny_model, tmp_path, capsys):
    out = tmp_path / "eval.json"
    args = ["eval", "--policy", f"model:{tiny_model}", "--task", TASK, "--seeds", "0", "--no_progress"]
    assert cli([*args, "--profile", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "prefill" in printed and "environment" in printed and "total" in printed
    shares = json.loads(out.read_text())["profile"]
    assert shares["prefill"] > 0 and shares["environment"] > 0 and shares["setup"] > 0
    assert set(shares) <= {*SHARES, "total"}
    assert sum(v for k, v in shares.items() if k != "total") == pytest.approx(shares["total"], abs=0.01)
    assert cli([*args, "--profile", "--workers", "2"]) == 2
    assert "--workers 1" in capsys.readouterr().err


def test_share_table_lists_every_share_given_with_its_fraction():
    table = share_table({"prefill": 3.0, "backward": 1.0, "total": 4.0})
    assert "prefill" in table and "75.0%" in table and "25.0%" in table and "decode" not in table

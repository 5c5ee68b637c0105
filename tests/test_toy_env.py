"""A second environment (tests/toy_env.py, a walk on a number line) runs through recruit_trl unchanged: the
``recruit-trl eval`` command line, the evaluator, teacher traces and both rollout modes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import recruit_trl.rollout.rollout_funcs as rollout_mod
from recruit_trl.protocol import FALLBACK_POLICY, get_env_interface
from recruit_trl.rollout.anchors import Anchor
from recruit_trl.rollout.config import RolloutConfig
from recruit_trl.rollout.rollout_funcs import make_rollout
from recruit_trl.traces import collect_traces
from recruit_trl.workflow.evaluation.evaluate import EvalConfig, evaluate
from recruit_trl.workflow.evaluation.report import format_results, summary, write_report
from recruit_trl.workflow.tokenizer import build_tokenizer

ROOT = Path(__file__).parents[1]
ENV = "tests.toy_env:TOY"
ROW_KEYS = {
    "policy", "task", "episodes", "final_score_mean", "final_score_sd", "episode_length_mean", "strict_json_rate",
    "valid_action_rate", "fallback_rate", "teacher_match", "own_answer_valid_rate", "action_types", "score_terms_mean",
    "per_episode",
}  # fmt: skip


@pytest.fixture(autouse=True)
def importable(monkeypatch):
    """``tests.toy_env`` is imported from the repository root (as ``python -m pytest`` there does anyway)."""
    monkeypatch.syspath_prepend(str(ROOT))


@pytest.fixture
def toy():
    return get_env_interface(ENV)


def test_eval_command_line_runs_the_toy_environment(tmp_path):
    out = tmp_path / "toy.json"
    command = [str(Path(sys.executable).parent / "recruit-trl"), "eval", "--env", ENV, "--policy", "greedy"]
    command += ["--policy", "random", "--seeds", "0-4", "--json", str(out), "--no_progress"]
    # As the README writes it: from the repository root, nothing on PYTHONPATH.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())["results"]
    assert [(r["policy"], r["task"]) for r in rows] == [(p, t) for p in ("greedy", "random") for t in ("near", "far")]
    for row in rows:
        assert set(row) == ROW_KEYS  # no episode metrics of its own: no enrolled / budget fields
        assert row["episodes"] == 5 and 0.0 <= row["final_score_mean"] <= 1.0
        assert row["valid_action_rate"] == 1.0 and row["score_terms_mean"] is None
    scores = {(r["policy"], r["task"]): r["final_score_mean"] for r in rows}
    assert all(scores["greedy", task] > scores["random", task] for task in ("near", "far"))
    header = proc.stdout.splitlines()[0]
    assert header.split()[:4] == ["policy", "task", "score", "len"] and "enrolled" not in proc.stdout


def test_evaluator_report_and_summary(toy, tmp_path):
    config = EvalConfig(env=ENV, seeds=(0, 1, 2), teacher="greedy")
    report = evaluate(["greedy", "random"], config, progress=False)
    assert report["config"]["tasks"] == ["near", "far"]  # the interface's tasks() by default
    greedy = report["results"][0]
    assert greedy["teacher_match"] == 1.0 and greedy["action_types"]["stop"] > 0
    assert "budget" not in format_results(report["results"])
    paths = write_report(tmp_path, report, toy)
    assert set(paths) == {"final_scores", "report"}  # no curve metrics, no grade parts: no other plots
    text = summary(report, toy)
    assert text.splitlines()[0] == "held-out final score (mean ± sd), seeds ?"
    assert "reference" not in text and "after day" not in text


def test_remote_evaluation_needs_a_remote_client():
    with pytest.raises(ValueError, match="no remote client"):
        evaluate(["greedy"], EvalConfig(env=ENV, seeds=(0,), env_url="http://127.0.0.1:1"), progress=False)


def test_traces_render_the_toy_prompts(toy):
    rows = collect_traces(toy, ["near"], [0, 1], teacher="greedy")
    assert rows and all(r["task"] == "near" for r in rows)
    assert rows[0]["messages"][1]["content"].startswith("Day 0/12 | position 0 | target 3\nActions:\n0: left")
    assert {r["action_type"] for r in rows} <= {"left", "right", "wait", "stop"}


class ScriptedSampler:
    """Stands in for recruit_trl.models.generation.sample: answers every prompt with ``text``."""

    def __init__(self, tokenizer, text):
        self.ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    def __call__(
        self, model, tokenizer, prompt_ids, generation_config, max_new_tokens, chunk_size=64, allowed=None, legal=None
    ):
        return [list(self.ids) for _ in prompt_ids], [[-0.5] * len(self.ids) for _ in prompt_ids]


def test_rollouts_play_the_toy_environment(toy, monkeypatch):
    rows = collect_traces(toy, list(toy.tasks()), [0], teacher="greedy")
    tokenizer = build_tokenizer([m["content"] for r in rows for m in r["messages"]] + [r["completion"] for r in rows])
    monkeypatch.setattr(rollout_mod, "sample", ScriptedSampler(tokenizer, '{"action_index": 1}'))  # "right"
    config = RolloutConfig(env_name=ENV, horizon=3, continuation_policy="greedy")
    rollout = make_rollout(config, toy)
    prompts = [Anchor(task, 1, 2, policy="random").key() for task in ("near", "far") for _ in range(2)]
    out = rollout(prompts, None, model=object(), tokenizer=tokenizer, generation_config=None, step=0)
    assert out["valid"] == [1.0] * 4 and set(out["action_type"]) == {"right"}
    for field in toy.reward_fields:
        assert len(out[field]) == 4


def test_a_planner_that_reads_the_live_environment_continues_branches(toy, monkeypatch):
    rows = collect_traces(toy, list(toy.tasks()), [0], teacher="greedy")
    tokenizer = build_tokenizer([m["content"] for r in rows for m in r["messages"]] + [r["completion"] for r in rows])
    monkeypatch.setattr(rollout_mod, "sample", ScriptedSampler(tokenizer, '{"action_index": 1}'))
    config = RolloutConfig(env_name=ENV, mode="branch", horizon=12, continuation_policy="planner")
    rollout = make_rollout(config, toy)
    prompts = [Anchor("far", 1, 2, policy="random").key()]
    out = rollout(prompts, None, model=object(), tokenizer=tokenizer, generation_config=None, step=0)
    assert out["valid"] == [1.0] and out["action_type"] == ["right"]


def toy_configs(folder: Path, rl: dict, sft: dict, report: dict) -> str:
    """The toy walk's configs, written into ``folder``: the clinical recipe's, its warm start's and its report's with
    the walk as the environment and its fallback agent as every policy (the toy names no teacher, anchor,
    continuation or baseline policy of its own), ``rl``, ``sft`` and ``report`` over them; the RL config's path."""
    from recipe_files import config_file

    folder.mkdir()
    fallback = FALLBACK_POLICY
    sft_config = config_file(folder, "sft_clinical.yaml", env_name=ENV, teacher=fallback, **sft)
    report_config = config_file(folder, "report_clinical.yaml", eval_baselines=[fallback], **report)
    return config_file(
        folder, "grpo_clinical.yaml", env_name=ENV, anchor_policy=fallback, continuation_policy=fallback,
        sft_config=sft_config, report_config=report_config, **rl,
    )  # fmt: skip


def test_the_toy_environment_trains_through_the_recipes(warm_model, tmp_path):
    """One SFT step and one GRPO step on the toy walk through recipes/grpo_clinical.py's code paths, then its
    decision-level report: nothing in recruit_trl/ knows the walk. Its configs name the environment and its fallback
    agent for every policy; the rest size the run."""
    from recipe_files import load_recipe

    recipe = load_recipe("grpo_clinical")
    # The warm start: a LoRA adapter (at LoRA's learning rate) on every teacher row (no cap: the walk has few actions).
    config = toy_configs(
        tmp_path / "configs",
        rl={"tasks": ["near", "far"]},
        sft={"sft_train_seeds": "300-301", "sft_heldout_seeds": "400", "max_steps": 1, "dagger_rounds": 0,
             "use_peft": True, "learning_rate": 1e-3, "sft_max_type_fraction": 1.0},
        report={"eval_episodes": True, "eval_seeds": "0-1", "decision_seeds": "500-501", "decision_days": "0-6:3",
                "decision_rows": 8},
    )  # fmt: skip
    flags = [
        "--config", config, "--model_name_or_path", warm_model, "--output_dir", str(tmp_path), "--max_steps", "1",
        "--anchor_seeds", "100", "--anchor_days", "0-6:3",
        "--per_device_train_batch_size", "8", "--num_generations", "4", "--save_strategy", "no",
    ]  # fmt: skip
    trainer = recipe.main(*recipe.parse_args(flags))
    assert trainer.state.global_step == 1
    assert (tmp_path / "sft" / "adapter_model.safetensors").is_file() and (tmp_path / "adapter_config.json").is_file()
    report = json.loads((tmp_path / "report.json").read_text())
    assert {r["policy"] for r in report["results"]} == {"base", "sft", "grpo", "fallback"}
    assert all("enrolled_mean" not in r for r in report["results"])
    bench = report["decisions"]["benchmark"]
    assert set(bench) == {"base", "sft", "grpo", "fallback", "safe"} and bench["fallback"]["teacher_match"] == 1.0
    assert report["decisions"]["state_value"]["grpo"]["n"] == 8


def test_a_reward_function_of_the_environments_own_module_trains_by_dotted_path(warm_model, tmp_path):
    """One GRPO step on the walk with a reward function the ``rewards`` package does not hold, named by its path."""
    from recipe_files import load_recipe

    recipe = load_recipe("grpo_clinical")
    flags = [
        "--env", ENV, "--model_name_or_path", warm_model, "--output_dir", str(tmp_path), "--max_steps", "1",
        "--tasks", "near", "far", "--anchor_seeds", "100", "--anchor_days", "0-6:3", "--sft_config", "none",
        "--anchor_policy", FALLBACK_POLICY, "--continuation_policy", FALLBACK_POLICY, "--use_peft", "true",
        "--per_device_train_batch_size", "8", "--num_generations", "4", "--save_strategy", "no",
        "--report_config", "none", "--horizon", "2", "--reward_funcs", "tests.toy_env:closer_reward", "format_reward",
        "--reward_weights", "1.0", "0.5",
    ]  # fmt: skip
    trainer = recipe.main(*recipe.parse_args(flags))
    assert trainer.state.global_step == 1
    logged = next(h for h in trainer.state.log_history if "rewards/closer_reward/mean" in h)
    assert -6.0 <= logged["rewards/closer_reward/mean"] <= 6.0  # 3 steps scored, each a step and a gust at most

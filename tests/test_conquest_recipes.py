"""The conquest recipes with a tiny budget: one SFT step on the teacher decision sets with the benchmark after it, and
the whole GRPO pipeline (warm start, one GRPO step, report); the rollouts' win rate."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest
from datasets import load_from_disk
from recipe_files import config_file, load_recipe, resolutions

import recruit_trl.rollout.rollout_funcs as rollout_mod
from recruit_trl.models.loading import is_trained
from recruit_trl.protocol import get_env_interface
from recruit_trl.rollout.anchors import Anchor
from recruit_trl.rollout.config import RolloutConfig
from recruit_trl.rollout.rollout_funcs import BranchRollout
from recruit_trl.workflow.configs import read_warm_start

CONQUEST = get_env_interface("conquest")
LABELS = ("base", "sft", "safe", "teacher")
COLUMNS = ("rows", "strict_json", "valid", "teacher_match", "invalid")


@pytest.fixture(scope="module")
def conquest_model(tmp_path_factory) -> str:
    """A small tiny model warmed on conquest texts (a few steps: it need not answer well, only in the game's
    vocabulary)."""
    from recruit_trl.traces import collect_traces
    from recruit_trl.workflow.tiny_model import build_tiny_model

    rows = collect_traces(CONQUEST, ["duel"], range(2), epsilon=0.5, relabel=False)
    model = build_tiny_model(
        tmp_path_factory.mktemp("conquest") / "model", rows, hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
        intermediate_size=128, max_steps=12, batch_size=8, lr=5e-3, num_threads=1, progress=False,
    )  # fmt: skip
    return str(model)


def test_sft_recipe_trains_on_teacher_sets_and_benchmarks(conquest_model, tmp_path, monkeypatch):
    recipe = load_recipe("sft_conquest")
    resolved = resolutions(monkeypatch)
    flags = [
        "--model_name_or_path", conquest_model, "--tasks", "duel", "--sft_train_seeds", "0", "--sft_fixed_seeds", "1",
        "--sft_heldout_seeds", "2", "--max_steps", "1", "--per_device_train_batch_size", "4",
        "--sft_heldout_rows", "8", "--dagger_rounds", "0",
        "--save_strategy", "no", "--output_dir", str(tmp_path),
    ]  # fmt: skip
    report = recipe.main(*recipe.parse_args(flags))
    assert resolved == [conquest_model]  # the model is resolved once, for training and benchmark alike
    # The held-out rows are scored once, by the benchmark; the SFT report keeps the data's and the model's facts.
    sft_report = json.loads((tmp_path / "heldout_report.json").read_text())
    assert is_trained(tmp_path) and "rows" not in sft_report and sft_report["data"]["train_rows"] > 0
    stats = json.loads((tmp_path / "dataset" / "stats.json").read_text())
    assert stats["data"] == report["data"]["data"] == "teacher_sets" and stats["train_rows"] > 0
    saved = json.loads((tmp_path / "benchmark.json").read_text())
    assert set(saved) == {"key", "result"} and saved["result"]["benchmark"] == report["benchmark"]
    for split in ("fixed", "heldout"):
        tables = report["benchmark"][split]
        assert set(tables) == set(LABELS)
        assert stats["sets"]["rows"][split] > 8  # a fixed subset of --heldout_rows rows is scored
        for label in LABELS:
            assert tables[label]["rows"] == 8 and set(tables[label]) >= set(COLUMNS)
            assert tables[label]["invalid"] == round((1 - tables[label]["valid"]) * 8)
        for label in ("base", "sft"):
            assert 0.0 <= tables[label]["teacher_match_constrained"] <= 1.0
        teacher = tables["teacher"]
        assert (teacher["teacher_match"], teacher["valid"], teacher["invalid"]) == (1.0, 1.0, 0)
    # The saved sets: split by game seed, each split on its own seeds.
    sets = load_from_disk(str(tmp_path / "dataset" / "sets" / stats["sets"]["key"]))
    seeds = {split: set(sets[split]["seed"]) for split in ("train", "fixed", "heldout")}
    assert seeds == {"train": {0}, "fixed": {1}, "heldout": {2}}
    assert len(stats["sets"]["rows"]) == 3 and stats["heldout_rows"] == len(sets["heldout"])
    # A second call reuses the model, the held-out report, the data and the benchmark.
    stamps = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    again = recipe.main(*recipe.parse_args(flags))
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()} == stamps
    assert again["benchmark"] == report["benchmark"]


def test_recipe_defaults_are_conquests():
    script_args, training_args, model_args = load_recipe("grpo_conquest").parse_args([])
    assert script_args.sft_config == "sft_conquest.yaml"  # the SFT recipe's own config: its warm start
    warm = read_warm_start(script_args.sft_config, script_args, model_args).warm
    assert (script_args.env_name, script_args.tasks, warm.teacher) == ("conquest", ["classic3", "duel"], "teacher")
    assert warm.sft_data == "teacher_sets" and script_args.anchor_policy == "teacher"
    assert training_args.output_dir == "outputs/grpo_conquest" and model_args.model_name_or_path == "tiny"
    script_args, sft_warm, training_args, _ = load_recipe("sft_conquest").parse_args([])
    assert (script_args.env_name, script_args.tasks, sft_warm.teacher) == ("conquest", ["classic3", "duel"], "teacher")
    assert (sft_warm.sft_data, sft_warm.sft_heldout_seeds) == ("teacher_sets", "300-359")
    assert training_args.output_dir == "outputs/sft_conquest"
    # The warm start's settings are one dataclass, in one file: the RL recipe's warm start is the SFT recipe's config.
    assert vars(warm) == vars(sft_warm)
    assert (warm.dagger_rounds, warm.dagger_seeds, warm.dagger_epochs) == (1, "0-7", 0.5)


def test_grpo_recipe_pipeline_with_a_tiny_budget(conquest_model, tmp_path):
    """Warm start (one SFT step on the teacher sets) -> one GRPO step -> report with the sets' benchmark and the
    rollouts' win rate."""
    recipe = load_recipe("grpo_conquest")
    configs = tmp_path / "configs"
    configs.mkdir()
    sft_config = config_file(
        configs, "sft_conquest.yaml", sft_train_seeds="0", sft_fixed_seeds="1", sft_heldout_seeds="2", max_steps=1,
        dagger_seeds="0", sft_heldout_rows=8,
    )  # fmt: skip
    report_config = config_file(
        configs, "report_conquest.yaml", eval_seeds="1000", eval_baselines=["safe"], decision_seeds="500",
        decision_days="0-10:10", decision_rows=4,
    )  # fmt: skip
    flags = [
        "--model_name_or_path", conquest_model, "--output_dir", str(tmp_path), "--tasks", "duel",
        "--sft_config", sft_config, "--report_config", report_config, "--anchor_seeds", "0",
        "--anchor_days", "0-20:10", "--per_device_train_batch_size", "4", "--num_generations", "4", "--max_steps", "1",
        "--horizon", "20", "--save_strategy", "no",
    ]  # fmt: skip
    trainer = recipe.main(*recipe.parse_args(flags))
    assert (tmp_path / "sft" / "model.safetensors").is_file() and (tmp_path / "model.safetensors").is_file()
    assert json.loads((tmp_path / "sft" / "dataset" / "stats.json").read_text())["data"] == "teacher_sets"
    report = json.loads((tmp_path / "report.json").read_text())
    assert len(report["sft"]["round_selection"]["student_scores"]) == 2  # the default DAgger round was played
    results = {r["policy"]: r for r in report["results"]}
    assert set(results) == {"base", "sft", "grpo", "safe"}
    assert all(r["task"] == "duel" and 0.0 <= r["win_rate"] <= 1.0 for r in results.values())
    sets = report["decisions"]["sets"]
    for split in ("fixed", "heldout"):
        tables = sets["benchmark"][split]
        assert set(tables) == {"base", "sft", "grpo", "teacher", "safe"}
        assert all(t["rows"] == 8 for t in tables.values())  # the SFT config's sft_heldout_rows of each set
        assert tables["teacher"]["teacher_match"] == 1.0
        for label in ("base", "sft", "grpo"):
            assert set(tables[label]) >= {*COLUMNS, "teacher_match_constrained"}
    logged = [h["rollout/win_rate"] for h in trainer.state.log_history if "rollout/win_rate" in h]
    assert len(logged) == 1 and 0.0 <= logged[0] <= 1.0
    curves = report["training"]["curves"]
    assert curves["step"] == [1] and curves["rollout/win_rate"] == logged
    for name in ("training_curves", "action_types", "final_scores", "decisions"):
        path = Path(report["plots"][name])
        assert path.parent == tmp_path and path.read_bytes()[:4] == b"\x89PNG"


class _ScriptedSampler:
    """Stands in for ``recruit_trl.models.generation.sample``: answers prompt k with ``texts[k % len(texts)]``."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts = tokenizer, texts

    def __call__(
        self, model, tokenizer, prompt_ids, generation_config, max_new_tokens, chunk_size=64, allowed=None, legal=None
    ):
        ids = [
            self.tokenizer(self.texts[k % len(self.texts)], add_special_tokens=False)["input_ids"]
            + [self.tokenizer.eos_token_id]
            for k in range(len(prompt_ids))
        ]
        return ids, [[-0.5] * len(x) for x in ids]


def test_branch_rollout_logs_the_share_of_rows_whose_game_is_won(conquest_model, monkeypatch):
    """``rollout/win_rate``: the share of rows whose continuation ends in a win (a final score of 1.0 in conquest;
    a loss scores at most 0.25, a timeout under 0.9, a continuation that stops before the game ends none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(conquest_model)
    logged: dict[str, float] = {}
    trainer = SimpleNamespace(
        use_vllm=False, generation_config=None, processing_class=tokenizer, state=SimpleNamespace(global_step=0),
        _log_metric=lambda name, value: logged.__setitem__(name, value),
    )  # fmt: skip
    monkeypatch.setattr(rollout_mod, "sample", _ScriptedSampler(tokenizer, ['{"action_index": 0}', "no idea"]))
    monkeypatch.setattr(rollout_mod, "policy_for_generation", lambda trainer: nullcontext(object()))
    config = RolloutConfig(env_name="conquest", horizon=12, continuation_policy="teacher")
    rollout = BranchRollout(config)
    # The teacher wins duel seed 0 after 85 decisions: 12 more from decision 80 end it, from decision 0 they do not.
    anchors = [Anchor("duel", 0, 80, policy="teacher"), Anchor("duel", 0, 0, policy="teacher")]
    out = rollout([a.key() for a in anchors for _ in range(2)], trainer)
    wins = [score == 1.0 for score in out["final_score"]]
    assert wins == [True, True, False, False]
    assert logged["rollout/win_rate"] == 0.5
    assert logged["rollout/fallback_rate"] == 0.5  # "no idea": the fallback plays, and the game is still won
    clinical = BranchRollout(RolloutConfig(env_name="clinical"))
    logged.clear()
    clinical.log_metrics(trainer, [{"valid": 1.0, "action_error": None, "action_type": "recontact"}], 1.0, 4, 1)
    rates = {k for k in logged if k.endswith("_rate")}
    assert rates == {"rollout/fallback_rate", "rollout/invalid_action_rate"}  # the clinical game has no rate metrics

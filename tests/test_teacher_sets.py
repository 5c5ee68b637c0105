"""Teacher decision sets (split by game seed, strata capped, saved atomically) and ``recruit-trl benchmark``."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from recruit_trl.cli import main
from recruit_trl.contracts import build_messages
from recruit_trl.protocol import get_env_interface
from recruit_trl.workflow.decisions.answers import action_answer
from recruit_trl.workflow.decisions.benchmark import format_result, run_benchmark
from recruit_trl.workflow.decisions.table import benchmark_table
from recruit_trl.workflow.decisions.teacher_sets import (
    SetConfig,
    set_decisions,
    stratified_sample,
    teacher_game,
    teacher_sets,
)

CONQUEST = get_env_interface("conquest")
CONFIG = SetConfig(
    env="conquest", tasks=("duel",), teacher="teacher", train_seeds=(0, 1), fixed_seeds=(2,), heldout_seeds=(3, 4),
    fixed_size=20, heldout_size=50,
)  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("sets")
    data, metadata = teacher_sets(CONQUEST, CONFIG, root, progress=False)
    return root, data, metadata


def test_splits_are_disjoint_by_game_seed_and_have_the_asked_sizes(built):
    _, data, metadata = built
    seeds = {split: set(data[split]["seed"]) for split in ("train", "fixed", "heldout")}
    assert seeds["train"] <= {0, 1} and seeds["fixed"] == {2} and seeds["heldout"] <= {3, 4}
    assert (len(data["fixed"]), len(data["heldout"])) == (20, 50)
    assert metadata["rows"] == {split: len(data[split]) for split in ("train", "fixed", "heldout")}
    for split in ("train", "fixed", "heldout"):
        counts = Counter(data[split]["stratum"])
        assert metadata["strata"][split] == dict(sorted(counts.items()))
        assert set(counts) == {"reinforce", "trade", "attack", "occupy", "fortify"}
        assert max(counts.values()) <= int(CONFIG.max_share * len(data[split]))
    with pytest.raises(ValueError, match="two splits"):
        SetConfig(env="conquest", tasks=("duel",), teacher="teacher", train_seeds=(0, 1), fixed_seeds=(1,),
                  heldout_seeds=(3,))  # fmt: skip


def test_rows_hold_the_rollouts_prompt_and_the_teachers_index_answer(built):
    _, data, _ = built
    row = data["fixed"][0]
    for step in teacher_game(CONQUEST, "teacher", row["task"], row["seed"]):
        if step.decision == row["decision"]:
            assert row["messages"] == build_messages(CONQUEST, step.obs, step.recent, "index", step.candidates)
            assert json.loads(row["completion"]) == {"action_index": step.index}
            assert row["stratum"] == CONQUEST.decision_phase(step.obs, step.action)
            break


def test_stratified_sample_caps_every_stratum_and_is_deterministic():
    strata = ["a"] * 90 + ["b"] * 8 + ["c"] * 2
    kept = stratified_sample(strata, 10, 0.5, seed=3)
    assert kept == stratified_sample(strata, 10, 0.5, seed=3) and kept == sorted(kept)
    assert Counter(strata[i] for i in kept) == {"a": 4, "b": 4, "c": 2}
    everything = Counter(strata[i] for i in stratified_sample(strata, None, 0.5, seed=3))
    assert everything == {"a": 10, "b": 8, "c": 2}  # the largest sample in which "a" holds at most half


def test_sets_are_reused_for_the_same_settings_and_replaced_when_damaged(built):
    root, _, metadata = built
    path = root / CONFIG.key()
    stamp = (path / "metadata.json").stat().st_mtime_ns
    assert teacher_sets(CONQUEST, CONFIG, root, progress=False)[1] == metadata
    assert (path / "metadata.json").stat().st_mtime_ns == stamp
    (path / "metadata.json").write_text("{torn")
    with pytest.warns(UserWarning, match="not valid JSON"):
        data, again = teacher_sets(CONQUEST, CONFIG, root, progress=False)
    assert again == metadata and len(data["fixed"]) == 20
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temporary folder left behind


def test_benchmark_counts_each_bad_answer_once_and_the_teachers_answer_as_a_match(built):
    _, data, _ = built
    rows = [data["heldout"][i] for i in range(4)]
    decisions, _ = set_decisions(CONQUEST, rows, "teacher")
    illegal = {"type": "move", "n": 10**6}  # no state lists it: a policy playing it has no answer
    assert action_answer(CONQUEST, decisions[2], illegal) == ""
    answers = ["not json", json.dumps({"action_index": len(decisions[1].candidates)}), "", decisions[3].teacher_answer]
    table = benchmark_table(decisions, answers, CONQUEST)
    assert (table["rows"], table["invalid"], table["teacher_match"], table["valid"]) == (4, 3, 0.25, 0.25)
    assert table["errors"] == {"index_out_of_range": 1, "no_json_object": 2}
    d = decisions[3]
    other = next(k for k in range(len(d.candidates)) if k != d.teacher_index)  # listed, but not the teacher's
    assert benchmark_table([d], [json.dumps({"action_index": other})], CONQUEST)["teacher_match"] == 0.0


def test_benchmark_command_on_conquest_duel(built, tmp_path, capsys, warm_model):
    root, _, _ = built
    out = tmp_path / "bench.json"
    argv = ["benchmark", "--env", "conquest", "--tasks", "duel", "--policy", "safe", "--policy", "teacher",
            "--policy", f"model:{warm_model}", "--set", "fixed", "--set", "heldout", "--train_seeds", "0-1",
            "--fixed_seeds", "2", "--heldout_seeds", "3-4", "--fixed_size", "20", "--heldout_size", "50",
            "--data", str(root), "--constrained", "--json", str(out), "--no_progress"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "set fixed (20 rows" in printed and "set heldout (50 rows" in printed
    result = json.loads(out.read_text())
    for split, rows in (("fixed", 20), ("heldout", 50)):
        tables = result["benchmark"][split]
        assert tables["teacher"]["teacher_match"] == 1.0 and tables["teacher"]["invalid"] == 0
        assert tables["safe"]["valid"] == 1.0 and tables["safe"]["teacher_match"] < 1.0
        model = tables[f"model:{warm_model}"]
        assert model["rows"] == rows and model["invalid"] == round((1 - model["valid"]) * rows)
        assert 0.0 <= model["teacher_match_constrained"] <= 1.0
    assert result["sets"]["key"] == CONFIG.key()
    # A label scored on some sets only (the base model on the fixed set, as the anchor's table), a subset of rows.
    only_fixed = run_benchmark(
        CONFIG, {"base": f"model:{warm_model}", "safe": "safe"}, ["fixed", "heldout"], root, max_rows=10,
        policy_sets={"base": ["fixed"]}, progress=False,
    )  # fmt: skip
    assert set(only_fixed["benchmark"]["fixed"]) == {"base", "safe"} and set(only_fixed["benchmark"]["heldout"]) == {
        "safe"
    }
    base = only_fixed["benchmark"]["fixed"]["base"]
    assert base["rows"] == 10 and "teacher_match_constrained" not in base
    assert "set heldout (10 of 50 rows" in format_result(only_fixed)


def test_rows_list_the_types_of_their_candidates_in_the_prompts_order(built):
    _, data, _ = built
    rows = list(data["fixed"])
    decisions, _ = set_decisions(CONQUEST, rows, "teacher")
    for row, d in zip(rows, decisions, strict=True):
        assert row["candidate_types"] == [CONQUEST.action_type(c) for c in d.candidates]
        assert row["candidate_types"][d.teacher_index] == row["action_type"]
    assert len({t for row in rows for t in row["candidate_types"]}) > 2  # the sets list several kinds of action

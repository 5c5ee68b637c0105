"""SFT data: action-type balancing, seed-split datasets in the rollout rendering, held-out report."""

from __future__ import annotations

import json
from collections import Counter

import pytest

import env.agent  # noqa: F401
from recruit_trl.protocol import get_env_interface
from recruit_trl.sft import (
    balance_action_types,
    best_round,
    build_sft_datasets,
    drop_candidates,
    oversample_rows,
    parse_oversample,
)

INTERFACE = get_env_interface("clinical")


def test_balancing_caps_every_type():
    rows = [{"action_type": t} for t in ["a"] * 70 + ["b"] * 20 + ["c"] * 10]
    out = balance_action_types(rows, 0.4, seed=1)
    counts = Counter(r["action_type"] for r in out)
    assert counts["b"] == 20 and counts["c"] == 10
    assert counts["a"] / len(out) <= 0.4 + 1e-9
    assert balance_action_types(rows, 1.0) == rows
    with pytest.raises(ValueError):
        balance_action_types(rows, 0.0)


def test_datasets_split_by_seed_and_match_the_rollout_prompts():
    train, heldout, stats = build_sft_datasets(
        INTERFACE, ["hard_bench_stage_30"], [1, 2], [3], teacher="heuristic", max_type_fraction=0.5
    )
    assert set(train["seed"]) == {1, 2} and set(heldout["seed"]) == {3}
    row = train[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["completion"][0]["role"] == "assistant" and row["completion"][0]["content"].startswith(
        '{"action_index"'
    )
    assert stats["train_rows"] <= stats["train_rows_raw"]
    assert max(Counter(train["action_type"]).values()) / len(train) <= 0.5 + 1e-9
    with pytest.raises(ValueError, match="overlap"):
        build_sft_datasets(INTERFACE, ["hard_bench_stage_30"], [1], [1], teacher="safe")


def test_exploration_is_relabelled_with_the_teacher_action():
    """epsilon plays random candidates; relabel=True still records the teacher's answer for those states."""
    from recruit_trl.traces import collect_traces

    common = {"teacher": "safe", "max_days": 30, "rng_seed": 1}
    clean = collect_traces(INTERFACE, ["medium_bench"], [5], **common)
    relabelled = collect_traces(INTERFACE, ["medium_bench"], [5], epsilon=0.5, **common)
    played = collect_traces(INTERFACE, ["medium_bench"], [5], epsilon=0.5, relabel=False, **common)
    productive = {"allocate_to_site", "recontact", "screen_patient", "adjust_strategy"}
    # The safe teacher never idles, also on the states the exploration reached (other states than its own path).
    assert {r["action_type"] for r in clean} <= productive and {r["action_type"] for r in relabelled} <= productive
    assert [r["messages"] for r in relabelled] != [r["messages"] for r in clean]
    assert [r["messages"] for r in relabelled] == [r["messages"] for r in played]
    # relabel=False records the random candidates that were played instead.
    assert [r["completion"] for r in played] != [r["completion"] for r in relabelled]


def test_balancing_by_task_caps_every_type_within_each_task():
    rows = [{"task": "a", "action_type": "x"}] * 8 + [{"task": "a", "action_type": "y"}] * 2
    rows += [{"task": "b", "action_type": "y"}] * 5 + [{"task": "b", "action_type": "z"}] * 5
    rows = [dict(r, i=i) for i, r in enumerate(rows)]
    overall = balance_action_types(rows, 0.5)
    assert Counter(r["action_type"] for r in overall)["x"] == 8  # 8 of 20 rows: within the global cap
    per_task = balance_action_types(rows, 0.5, group_by="task")
    counts = Counter((r["task"], r["action_type"]) for r in per_task)
    assert counts == {("a", "x"): 2, ("a", "y"): 2, ("b", "y"): 5, ("b", "z"): 5}
    assert [r["i"] for r in per_task] == sorted(r["i"] for r in per_task)  # original order kept


def test_oversampling_repeats_the_chosen_days_of_a_task():
    rows = [{"task": t, "day": d} for t in ("easy_bench", "hard_bench") for d in range(130, 181)]
    out = oversample_rows(rows, ["hard_bench:137-179:3", "easy_bench:180-180:2"])
    assert out[: len(rows)] == rows  # the originals first, in order
    counts = Counter((r["task"], r["day"]) for r in out)
    assert counts[("hard_bench", 137)] == counts[("hard_bench", 179)] == 3 and counts[("hard_bench", 136)] == 1
    assert counts[("hard_bench", 180)] == 1 and counts[("easy_bench", 180)] == 2 and counts[("easy_bench", 150)] == 1
    assert len(out) == len(rows) + 43 * 2 + 1 and oversample_rows(rows, []) == rows
    assert parse_oversample("hard_bench:137-179:3") == ("hard_bench", 137, 179, 3)
    for bad in ("hard_bench", "hard_bench:137:3", "hard_bench:179-137:3", "hard_bench:1-2:0", ":1-2:2", "h:a-b:2"):
        with pytest.raises(ValueError, match="oversample spec"):
            parse_oversample(bad)
    from recruit_trl.protocol import get_env_interface
    from recruit_trl.training import ScriptArguments, with_env_tasks

    with pytest.raises(ValueError, match="its task is not one of --tasks"):  # a typo would repeat nothing
        ScriptArguments(sft_oversample=["hardbench:137-179:3"], tasks=["hard_bench"])
    unchecked = ScriptArguments(sft_oversample=["hardbench:137-179:3"])  # no --tasks: the environment's, then checked
    with pytest.raises(ValueError, match="its task is not one of --tasks"):
        with_env_tasks(unchecked, get_env_interface("clinical"))


def test_dropping_candidates_shows_the_same_choices_at_shifted_positions():
    from recruit_trl.traces import collect_traces

    rows = collect_traces(INTERFACE, ["medium_bench"], [5], teacher="expert", max_days=60)
    assert drop_candidates(rows, 0.0) == rows

    def chosen_line(row):  # the text of the answer's line in the listed candidates
        k = json.loads(row["completion"])["action_index"]
        return row["messages"][-1]["content"].split("\nActions:\n")[1].split("\n")[k].partition(": ")[2]

    every = drop_candidates(rows, 1.0, seed=3)
    assert len(every) == len(rows)
    for before, after in zip(rows, every, strict=True):
        assert len(after["candidate_types"]) == len(before["candidate_types"]) - 1
        assert chosen_line(after) == chosen_line(before) and after["action_type"] == before["action_type"]
    shifted = sum(json.loads(a["completion"]) != json.loads(b["completion"]) for a, b in zip(rows, every, strict=True))
    assert 0 < shifted < len(rows)  # answers move when a line above them goes, stay when one below does
    some = drop_candidates(rows, 0.3, seed=3)
    assert 0 < sum(a is not b for a, b in zip(rows, some, strict=True)) < len(rows)
    assert drop_candidates(rows, 0.3, seed=3) == some  # seeded
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        drop_candidates(rows, 1.5)
    from recruit_trl.training import ScriptArguments

    with pytest.raises(ValueError, match="--sft_drop_candidate must be in"):
        ScriptArguments(sft_drop_candidate=-0.1)
    with pytest.raises(ValueError, match="needs the index contract"):
        ScriptArguments(sft_drop_candidate=0.2, contract="json")


def test_best_round_keeps_the_best_mean_over_tasks_and_the_latest_on_ties():
    collapsed = {"easy": 0.73, "medium": 0.31, "hard": 0.57}  # one task lost: the mean over tasks shows it
    assert best_round([{"easy": 0.70, "medium": 0.52, "hard": 0.57}, collapsed]) == 0
    assert best_round([collapsed, {"easy": 0.69, "medium": 0.57, "hard": 0.60}, collapsed]) == 1
    assert best_round([{"easy": 0.6}, {"easy": 0.6}]) == 1
    with pytest.raises(ValueError):
        best_round([])


def test_extra_traces_add_the_chosen_days_of_more_episodes():
    """Hard's endgame from more episodes: only the chosen days of the extra seeds join the training rows."""
    from recruit_trl.sft import parse_extra_traces
    from recruit_trl.training import ScriptArguments

    args = {"teacher": "heuristic", "max_type_fraction": 1.0}
    base = build_sft_datasets(INTERFACE, ["hard_bench_stage_30"], [1], [3], **args)
    train, _, stats = build_sft_datasets(
        INTERFACE, ["hard_bench_stage_30"], [1], [3], extra_traces=["hard_bench_stage_30:20-25:5-6"], **args
    )
    extra = [(s, d) for s, d in zip(train["seed"], train["day"], strict=True) if s != 1]
    assert stats["train_rows_extra"] == len(extra) > 0 and len(train) == len(base[0]) + len(extra)
    assert {s for s, _ in extra} <= {5, 6} and all(20 <= d <= 25 for _, d in extra)
    with pytest.raises(ValueError, match="overlap"):
        build_sft_datasets(
            INTERFACE, ["hard_bench_stage_30"], [1], [3], extra_traces=["hard_bench_stage_30:0-9:3"], **args
        )
    assert parse_extra_traces("hard_bench:137-180:500-531") == ("hard_bench", 137, 180, list(range(500, 532)))
    for bad in ("hard_bench:137-180", "hard_bench:180-137:1", "hard_bench:1-2:x", ":1-2:3"):
        with pytest.raises(ValueError, match="extra traces spec"):
            parse_extra_traces(bad)
    assert ScriptArguments().sft_extra_traces == []  # off in the main job
    with pytest.raises(ValueError, match="its task is not one of --tasks"):
        ScriptArguments(sft_extra_traces=["hardbench:137-180:500-501"], tasks=["hard_bench"])


def test_heldout_report_breaks_the_teacher_match_down_by_task_and_action_type(warm_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recruit_trl.sft import heldout_report

    _, heldout, _ = build_sft_datasets(
        INTERFACE, ["easy_bench_stage_30", "hard_bench_stage_30"], [1], [3], teacher="safe", max_type_fraction=1.0
    )
    model = AutoModelForCausalLM.from_pretrained(warm_model).eval()
    report = heldout_report(model, AutoTokenizer.from_pretrained(warm_model), heldout, "index")
    cells = report["teacher_match_by_type"]
    assert set(cells) == set(heldout["task"])
    for task, kinds in cells.items():
        rows = [r for r in heldout if r["task"] == task]
        assert {k: n for k, (_, n) in kinds.items()} == dict(Counter(r["action_type"] for r in rows))
    matched = sum(rate * n for kinds in cells.values() for rate, n in kinds.values())
    assert matched == pytest.approx(report["teacher_match"] * report["rows"], abs=1e-2)

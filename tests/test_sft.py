"""SFT data and settings: action-type balancing, seed-split datasets in the rollout rendering, held-out report, and
the warm start's settings declared once for both recipes."""

from __future__ import annotations

from collections import Counter

import pytest
from recipe_files import config_file, load_recipe

import env.clinical.agent  # noqa: F401
from recruit_trl.protocol import get_env_interface
from recruit_trl.workflow.sft_data import balance_action_types, best_round, build_sft_datasets

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


def test_balancing_never_drops_most_rows_silently():
    """A cap below an equal share cannot hold (one type: every row is that type), so it rises to the equal share;
    when balancing still keeps less than half of the rows, a warning names the counts."""
    one_type = [{"action_type": "right"}] * 640
    assert balance_action_types(one_type, 0.35) == one_type
    skewed = [{"action_type": t} for t in ["right"] * 600 + ["stop"] * 20 + ["left"] * 20]
    with pytest.warns(UserWarning, match=r"kept 61 of 640 rows .*'right': 600"):
        out = balance_action_types(skewed, 0.35)
    assert Counter(r["action_type"] for r in out) == {"right": 21, "stop": 20, "left": 20}  # 21 of 61 <= 0.35


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


def test_best_round_keeps_the_best_mean_over_tasks_and_the_latest_on_ties():
    collapsed = {"easy": 0.73, "medium": 0.31, "hard": 0.57}  # one task lost: the mean over tasks shows it
    assert best_round([{"easy": 0.70, "medium": 0.52, "hard": 0.57}, collapsed]) == 0
    assert best_round([collapsed, {"easy": 0.69, "medium": 0.57, "hard": 0.60}, collapsed]) == 1
    assert best_round([{"easy": 0.6}, {"easy": 0.6}]) == 1
    with pytest.raises(ValueError):
        best_round([])


def test_heldout_report_breaks_the_teacher_match_down_by_task_and_action_type(warm_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recruit_trl.workflow.sft_data import heldout_report

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


def test_the_warm_start_settings_are_one_dataclass_that_every_recipe_parses(tmp_path):
    """The SFT recipes and the RL recipes' warm start parse the same :class:`WarmStartArguments` (one field, one
    default each), beside their own dataclass, which repeats none of its fields: the SFT recipe from its command line
    and config, the RL recipe's warm start from the SFT config ``--sft_config`` names; its values are checked at
    start-up, under either recipe."""
    from dataclasses import fields

    from recruit_trl.workflow.arguments import ScriptArguments, SFTScriptArguments, WarmStartArguments
    from recruit_trl.workflow.configs import read_warm_start

    warm = {f.name for f in fields(WarmStartArguments)}
    for own in (ScriptArguments, SFTScriptArguments):
        assert not warm & {f.name for f in fields(own)}, own
    parsed = load_recipe("sft_clinical").parse_args(["--sft_train_seeds", "300-301", "--dagger_rounds", "2"])
    assert isinstance(parsed[0], SFTScriptArguments) and isinstance(parsed[1], WarmStartArguments)
    assert (parsed[1].sft_train_seeds, parsed[1].dagger_rounds) == ("300-301", 2)
    sft_config = config_file(tmp_path, "sft_clinical.yaml", sft_train_seeds="300-301", dagger_rounds=2)
    script_args, _, model_args = load_recipe("grpo_clinical").parse_args(["--sft_config", sft_config])
    assert isinstance(script_args, ScriptArguments)
    warm_start = read_warm_start(script_args.sft_config, script_args, model_args).warm
    assert isinstance(warm_start, WarmStartArguments) and vars(warm_start) == vars(parsed[1])
    with pytest.raises(ValueError, match="--sft_data must be one of"):
        WarmStartArguments(sft_data="rows")
    with pytest.raises(ValueError, match=r"--sft_epsilon must be in \[0, 1\]"):
        WarmStartArguments(sft_epsilon=2)
    assert SFTScriptArguments(env_name="clinical").contract == "index"  # the one contract, not a setting
    with pytest.raises(TypeError, match="contract"):
        SFTScriptArguments(env_name="clinical", contract="json")

"""Decision-level evaluation: the held-out decision set, the benchmark table's counts, state values under common
random numbers, and a model's answers (the shared tiny warm model)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

import env.clinical.agent  # noqa: F401
from recruit_trl.contracts import build_messages, parse_action
from recruit_trl.protocol import get_env_interface
from recruit_trl.rollout.continuation import day_seed, group_seed
from recruit_trl.traces import same_action
from recruit_trl.workflow.decisions.answers import answer_actions, model_answers
from recruit_trl.workflow.decisions.decision_set import decision_set, sample_decisions
from recruit_trl.workflow.decisions.report import evaluate_decisions, format_decision_report
from recruit_trl.workflow.decisions.table import benchmark_table
from recruit_trl.workflow.decisions.values import state_values

INTERFACE = get_env_interface("env.clinical.agent:CLINICAL")
TASKS = ["easy_bench", "hard_bench_stage_30"]
SEEDS = [500, 501]
DAYS = [0, 8, 16, 24]
TEACHER = "grader_heuristic"  # the expert's base policy: the same kind of teacher at a fraction of the cost


@pytest.fixture(scope="module")
def decisions():
    return decision_set(INTERFACE, TASKS, SEEDS, DAYS, teacher=TEACHER, progress=False)


def test_decision_set_is_deterministic_and_renders_the_rollouts_prompt(decisions):
    again = decision_set(INTERFACE, TASKS, SEEDS, DAYS, teacher=TEACHER, progress=False)
    assert [(d.anchor, d.messages, d.teacher_answer) for d in again] == [
        (d.anchor, d.messages, d.teacher_answer) for d in decisions
    ]
    assert len({d.anchor for d in decisions}) == len(decisions) == len(TASKS) * len(SEEDS) * len(DAYS)
    for d in decisions:
        assert d.teacher == TEACHER and d.state.day == d.anchor.day
        assert d.messages == build_messages(INTERFACE, d.state.obs, d.state.recent, "index", d.candidates)
        parsed = parse_action(d.teacher_answer, "index", INTERFACE, d.state.obs, d.candidates)
        assert parsed.valid and parsed.index == d.teacher_index
        assert same_action(INTERFACE, parsed.action, d.teacher_action)


def test_a_planning_teacher_answers_the_same_way_every_time():
    build = [decision_set(INTERFACE, ["hard_bench_stage_30"], SEEDS, [0, 10], teacher="expert", progress=False)]
    build.append(decision_set(INTERFACE, ["hard_bench_stage_30"], SEEDS, [0, 10], teacher="expert", progress=False))
    first, second = ([(d.anchor, d.teacher_action, d.teacher_answer) for d in ds] for ds in build)
    assert first == second and len(first) == 4


def test_fixed_subset_is_deterministic_and_stratified_over_tasks_and_action_types(decisions):
    size = 11
    subset = sample_decisions(INTERFACE, decisions, size, seed=3)
    assert [d.anchor for d in subset] == [d.anchor for d in sample_decisions(INTERFACE, decisions, size, seed=3)]
    built = decision_set(INTERFACE, TASKS, SEEDS, DAYS, teacher=TEACHER, size=size, seed=3, progress=False)
    assert [d.anchor for d in built] == [d.anchor for d in subset]
    assert len(subset) == size and len({d.anchor for d in subset}) == size
    order = [d.anchor for d in decisions]
    assert [order.index(d.anchor) for d in subset] == sorted(order.index(d.anchor) for d in subset)
    per_task = Counter(d.task for d in subset)
    assert sorted(per_task.values()) == [5, 6]
    for task, quota in per_task.items():
        pool = Counter(INTERFACE.action_type(d.teacher_action) for d in decisions if d.task == task)
        kept = Counter(INTERFACE.action_type(d.teacher_action) for d in subset if d.task == task)
        for kind, count in pool.items():  # each type's share of the task's quota, rounded down or up
            share = quota * count / sum(pool.values())
            assert int(share) <= kept[kind] <= int(share) + 1
    assert len(sample_decisions(INTERFACE, decisions, 10_000)) == len(decisions)


def test_benchmark_table_counts_every_kind_of_answer(decisions):
    rows = decisions[:6]
    other = next(k for k, c in enumerate(rows[1].candidates) if not same_action(INTERFACE, c, rows[1].teacher_action))
    answers = [
        rows[0].teacher_answer,  # valid, the teacher's
        json.dumps({"action_index": other}),  # valid, another listed action
        "The best action is 2.",  # malformed
        json.dumps({"action_index": 99}),  # out of range
        json.dumps({"action": 1}),  # the key missing
        None,  # not even text
    ]
    table = benchmark_table(rows, answers, INTERFACE, constrained_answers=[d.teacher_answer for d in rows])
    assert {k: table[k] for k in ("rows", "strict_json", "valid", "teacher_match", "invalid")} == {
        "rows": 6,
        "strict_json": round(4 / 6, 4),
        "valid": round(2 / 6, 4),
        "teacher_match": round(1 / 6, 4),
        "invalid": 4,
    }
    assert table["errors"] == {"index_out_of_range": 1, "no_json_object": 1, "not_text": 1, "wrong_keys": 1}
    majority, count = Counter(d.teacher_index for d in rows).most_common(1)[0]
    assert table["majority_baseline"] == round(count / 6, 4)
    assert table["majority_answer"] == json.dumps({"action_index": majority})
    assert table["teacher_match_constrained"] == 1.0
    assert sum(part["rows"] for part in table["by_task"].values()) == 6
    teacher_types = Counter(INTERFACE.action_type(d.teacher_action) for d in rows)
    assert {t: cell[1] for t, cell in table["teacher_match_by_type"].items()} == teacher_types
    assert sum(cell[0] * cell[1] for cell in table["teacher_match_by_type"].values()) == pytest.approx(1)
    valid_types = Counter(INTERFACE.action_type(a) for a in (rows[0].teacher_action, rows[1].candidates[other]))
    assert table["predicted_types"] == valid_types  # only the valid answers have an action type
    assert benchmark_table([], [], INTERFACE)["rows"] == 0


def replay_value(decision, action, continuation, seed):
    """The final score after ``action`` and then ``continuation``, played directly with the environment and re-seeded
    every day as the rollouts re-seed it."""
    env = INTERFACE.make_env(decision.task)
    env.restore(decision.state.snapshot)
    base = group_seed(decision.anchor, 0, seed)
    env.reseed(day_seed(base, 0))
    obs, _, terminated, truncated, info = env.step(action)
    rng = random.Random(base)
    day = 1
    while not (terminated or truncated):
        env.reseed(day_seed(base, day))
        obs, _, terminated, truncated, info = env.step(continuation(obs, rng))
        day += 1
    return INTERFACE.final_score(info)


def test_teacher_value_is_the_continuation_after_the_teachers_action(decisions):
    rows = decisions[::3]
    values = state_values(
        INTERFACE,
        rows,
        {TEACHER: [d.teacher_action for d in rows]},
        seed=7,
        progress=False,
        continuation="grader_heuristic",
    )
    continuation = INTERFACE.get_policy("grader_heuristic")
    expected = [replay_value(d, d.teacher_action, continuation, 7) for d in rows]
    assert values[TEACHER]["values"] == pytest.approx(expected, abs=1e-6)
    assert values[TEACHER]["n"] == len(rows) and "vs_reference" not in values[TEACHER]


def test_the_same_action_gets_the_same_value_and_others_are_paired(decisions):
    rows = decisions[:8]
    fallback = [INTERFACE.fallback_action(d.state.obs) for d in rows]
    teacher = [d.teacher_action for d in rows]
    first = state_values(INTERFACE, rows, {"teacher": teacher, "safe": fallback}, progress=False)
    second = state_values(INTERFACE, rows, {"safe": fallback, "teacher": [dict(a) for a in teacher]}, progress=False)
    assert first["teacher"]["values"] == second["teacher"]["values"]
    assert first["safe"]["values"] == second["safe"]["values"]
    diff = first["safe"]["vs_reference"]
    pairs = [s - t for s, t in zip(first["safe"]["values"], first["teacher"]["values"], strict=True)]
    assert diff["reference"] == "teacher" and diff["mean"] == pytest.approx(sum(pairs) / len(pairs), abs=1e-4)
    assert diff["better"] == sum(p > 0 for p in pairs) and diff["worse"] == sum(p < 0 for p in pairs)
    # Where the fallback is the teacher's action, the pair shares one outcome: a difference of exactly zero.
    for d, fb, p in zip(rows, fallback, pairs, strict=True):
        if fb == d.teacher_action:
            assert p == 0.0
    other_seed = state_values(INTERFACE, rows, {"teacher": teacher}, seed=1, progress=False)
    assert other_seed["teacher"]["values"] != first["teacher"]["values"]


def test_unparsable_answers_play_the_fallback_and_get_the_safe_agents_values(decisions):
    rows = decisions[:6]
    played = answer_actions(INTERFACE, rows, ["no idea", '{"action_index": 99}', "", "{", "[]", '{"k": 1}'])
    assert played == [INTERFACE.fallback_action(d.state.obs) for d in rows]
    result = evaluate_decisions(INTERFACE, ["safe"], rows, progress=False)
    values = state_values(INTERFACE, rows, {"garbled": played}, progress=False)
    assert values["garbled"]["values"] == result["state_value"]["safe"]["values"]
    assert result["config"]["reference"] == TEACHER and TEACHER in result["state_value"]
    assert result["benchmark"]["safe"]["valid"] == 1.0


def test_model_answers_and_the_whole_evaluation_with_a_tiny_model(warm_model, decisions):
    rows = decisions[:5]
    free = model_answers(warm_model, rows, batch_size=2, progress=False)
    assert len(free) == 5 and all(isinstance(t, str) for t in free)
    forced = model_answers(warm_model, rows, batch_size=4, constrained=True, progress=False)
    assert benchmark_table(rows, forced, INTERFACE)["valid"] == 1.0
    policy = f"model:{warm_model}"
    result = evaluate_decisions(INTERFACE, [policy, "safe"], rows, constrained=True, batch_size=4, progress=False)
    assert result["benchmark"][policy] == benchmark_table(rows, free, INTERFACE, constrained_answers=forced)
    assert (
        result["state_value"][policy]["values"]
        == state_values(INTERFACE, rows, {policy: answer_actions(INTERFACE, rows, free)}, progress=False)[policy][
            "values"
        ]
    )
    assert result["state_value"][policy]["vs_reference"]["n"] == 5
    assert json.loads(json.dumps(result)) == result
    text = format_decision_report(result)
    assert "model:model " in text and "s per decision" in text and "s per continuation" in text

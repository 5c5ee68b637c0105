"""World generation matches the reference's resolved worlds (world_facts.json) exactly."""

from __future__ import annotations

import pytest

from env.clinical import TASKS, get_task, world_fingerprint
from env.clinical.world import get_world, world_trace

FINGERPRINTS = {"easy_bench": "e52b3ffc47cce0ce", "medium_bench": "9924a41965edc15d", "hard_bench": "5c8bf43556674f9c"}


@pytest.mark.parametrize("task", list(TASKS))
def test_fingerprint(task):
    assert world_fingerprint(task) == FINGERPRINTS[task]


@pytest.mark.parametrize("task", list(TASKS))
def test_world_matches_facts(task, world_facts):
    facts = world_facts[task]
    trace = world_trace(task)
    assert trace["patients"] == facts["patients"]
    assert trace["sites"] == facts["sites"]
    assert {str(day): evs for day, evs in trace["events"].items()} == facts["events"]
    assert len(trace["events"]) == facts["event_days"]
    assert sum(len(v) for v in trace["events"].values()) == facts["event_total"]
    assert trace["curriculum"] == facts["curriculum"]
    for key, value in facts["scalars"].items():
        assert trace[key] == value, key
    priorities = [
        round(p["eligibility_score"] * p["willingness"] * (1 - p["dropout_risk"]), 3) for p in trace["patients"]
    ]
    assert sum(p >= 0.35 for p in priorities) == facts["n_priority_ge_035"]


def test_stage_tasks_follow_the_spec():
    expected = {
        "easy_bench": ((13, 55_000.0), (40, 81_000.0), (80, 120_000.0)),
        "medium_bench": ((20, 68_750.0), (60, 101_250.0), (120, 150_000.0)),
        "hard_bench": ((25, 45_833.33), (75, 67_500.0), (150, 100_000.0)),
    }
    for base, rows in expected.items():
        for horizon, (target, budget) in zip((30, 90, 180), rows, strict=True):
            task = get_task(f"{base}_stage_{horizon}")
            assert (task.max_steps, task.target, task.budget) == (horizon, target, budget)
            assert task.default_seed == TASKS[base].default_seed + horizon
            assert max(get_world(task.task_id).events, default=0) < horizon
    assert get_task("hard_bench_stage_30").curriculum == ((25, 4),)
    assert get_task("hard_bench_stage_90").curriculum == ((25, 8), (60, 10))
    assert get_task("easy_bench_stage_30").default_seed == 72
    assert get_task("hard_bench_stage_90").default_seed == 867


def test_unknown_task_message():
    with pytest.raises(
        ValueError, match=r"Unknown task: nope\. Available: \['easy_bench', 'medium_bench', 'hard_bench'\]"
    ):
        get_task("nope")
    assert get_task(None).task_id == "easy_bench"

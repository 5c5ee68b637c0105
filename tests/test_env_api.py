"""Gymnasium-style contract of ClinicalRecruitmentEnv: determinism, snapshots, errors, observation shape."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from env.clinical import ACTION_TYPES, Action, ClinicalRecruitmentEnv, random_policy

OBS_FIELDS = [
    "timestamp", "budget_remaining", "time_to_deadline_days", "enrolled_so_far", "target_enrollment", "task_id",
    "max_steps", "initial_budget", "current_funnel", "available_patients", "recontact_candidates",
    "allocation_candidates", "site_performance", "recent_events", "uncertainty_level", "difficulty",
    "dropout_rate_7d", "screening_backlog", "causal_insight", "hypothesis_accuracy", "world_type", "milestones",
    "active_constraints", "delayed_effects_pending", "uncertainty_components", "patient_memory_summary",
    "counterfactual_hint", "current_plan", "indexed_memory_summary", "retrieved_memory_context",
    "milestone_potential", "active_milestone", "hindsight_available", "token_budget_remaining",
    "token_usage_so_far", "token_efficiency_score", "counterfactual_rollout",
]  # fmt: skip


def play(task, seed, n_steps, policy_seed=0, env=None):
    env = env or ClinicalRecruitmentEnv(task)
    obs, _ = env.reset(seed=seed)
    rng = random.Random(policy_seed)
    trace = []
    for _ in range(n_steps):
        action = random_policy(obs, rng)
        obs, reward, terminated, truncated, info = env.step(action)
        trace.append((action, obs, reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return env, trace


def test_reset_observation_fields_and_values():
    env = ClinicalRecruitmentEnv("hard_bench")
    obs, info = env.reset()
    assert list(obs) == OBS_FIELDS
    assert info == {"task": "hard_bench", "difficulty": 3}
    assert obs["milestone_potential"] == 0.75
    assert obs["recent_events"] == ["irb_delay"]  # the coming day 0's events, a reference quirk
    assert obs["site_performance"]["site_D"] == {
        "conversion_rate": 0.949,
        "avg_wait_days": 4.5,
        "capacity_remaining": 34.0,
        "retention_rate": 0.943,
    }
    assert len(obs["available_patients"]) == 5
    assert obs["current_plan"]["target_phase"] == "screening"  # the day-0 IRB delay has not fired yet
    assert obs["hindsight_available"] is False


def test_worked_example_first_step():
    env = ClinicalRecruitmentEnv("easy_bench")
    env.reset(seed=None)
    action = {
        "action_type": "screen_patient",
        "patient_id": "P-1149",
        "hypothesis": "noise_dominant",
        "confidence": 0.7,
    }
    obs, reward, terminated, truncated, info = env.step(action)
    assert reward == 0.4829
    assert info["step"] == 1 and info["last_action_error"] is None
    assert info["reward_breakdown"]["screen_success"] is True
    assert obs["allocation_candidates"][0]["id"] == "P-1149"
    assert (terminated, truncated) == (False, False)


@pytest.mark.parametrize("task", ["easy_bench", "medium_bench", "hard_bench", "hard_bench_stage_30"])
def test_same_seed_same_actions_same_episode(task):
    _, a = play(task, seed=7, n_steps=200, policy_seed=3)
    _, b = play(task, seed=7, n_steps=200, policy_seed=3)
    assert a == b
    assert a[-1][5]["final_score"] == b[-1][5]["final_score"]
    if task.endswith("_bench"):  # a 30-day random episode can be seed-independent; full ones are not
        _, c = play(task, seed=8, n_steps=200, policy_seed=3)
        assert [x[2] for x in a] != [x[2] for x in c]


@pytest.mark.parametrize("task", ["easy_bench", "medium_bench", "hard_bench"])
def test_snapshot_restore_round_trip(task):
    env, _ = play(task, seed=1, n_steps=60, policy_seed=5)
    snap = env.snapshot()
    rng_state = random.Random(11)
    obs = env._observation()
    continuation = []
    rng = random.Random(11)
    for _ in range(200):
        obs, reward, terminated, truncated, info = env.step(random_policy(obs, rng))
        continuation.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            break
    for _ in range(2):  # the snapshot is reusable, and a fresh env can restore it
        fresh = ClinicalRecruitmentEnv("easy_bench")
        fresh.restore(snap)
        obs = fresh._observation()
        rng = random.Random(11)
        replay = []
        for _ in range(len(continuation)):
            obs, reward, terminated, truncated, info = fresh.step(random_policy(obs, rng))
            replay.append((obs, reward, terminated, truncated, info))
        assert replay == continuation
    assert rng_state.random() == random.Random(11).random()


def test_snapshot_is_isolated_from_later_steps():
    env, _ = play("medium_bench", seed=2, n_steps=40)
    snap = env.snapshot()
    before = env.state()
    play("medium_bench", seed=2, n_steps=0, env=env)  # reset mutates nothing in the snapshot
    env.restore(snap)
    assert env.state() == before


def test_episode_end_flags_and_errors():
    env = ClinicalRecruitmentEnv("hard_bench_stage_30")
    obs, _ = env.reset(seed=0)
    for day in range(30):
        obs, reward, terminated, truncated, info = env.step(
            {"action_type": "plan_next_phase", "target_phase": "screening"}
        )
        assert (terminated, truncated) == (False, day == 29)
    assert 0.001 <= info["final_score"] <= 0.999
    assert info["grader_task"] == "hard_bench"
    assert obs["hindsight_available"] is True and "dominant_action" in info["hindsight_summary"]
    with pytest.raises(RuntimeError, match="Episode is done"):
        env.step({"action_type": "stop_recruitment"})

    obs, _ = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step({"action_type": "stop_recruitment", "confidence": 0.0})
    assert (terminated, truncated) == (True, False)
    assert "final_score" in info


def _scribble(value):
    """Empty every container nested in ``value``, as a careless caller might."""
    if isinstance(value, dict):
        for item in list(value.values()):
            _scribble(item)
        value.clear()
    elif isinstance(value, list):
        for item in value:
            _scribble(item)
        value.clear()


@pytest.mark.parametrize("task", ["easy_bench", "hard_bench"])
def test_changing_the_observation_does_not_change_the_episode(task):
    """Observations and infos share no container with the environment (nor with each other): a caller that empties
    every one of them after choosing its action sees exactly the episode of a caller that does not."""
    _, clean = play(task, seed=4, n_steps=200, policy_seed=2)
    env = ClinicalRecruitmentEnv(task)
    obs, _ = env.reset(seed=4)
    rng = random.Random(2)
    for step in clean:
        action = random_policy(obs, rng)
        _scribble(obs)
        obs, reward, terminated, truncated, info = env.step(action)
        assert (action, obs, reward, terminated, truncated, info) == step
        _scribble(info)


def test_step_before_reset_is_a_clear_error():
    with pytest.raises(RuntimeError, match="reset"):
        ClinicalRecruitmentEnv().step({"action_type": "stop_recruitment"})


@pytest.mark.parametrize(
    ("action", "field"),
    [
        ({"action_type": "dance"}, "action_type"),
        ({}, "action_type"),
        ({"action_type": "screen_patient", "patient_id": 1149}, "patient_id"),
        ({"action_type": "screen_patient", "confidence": 1.5}, "confidence"),
        ({"action_type": "screen_patient", "confidence": -0.1}, "confidence"),
        ({"action_type": "screen_patient", "confidence": "high"}, "confidence"),
        ({"action_type": "screen_patient", "token_cost": -1}, "token_cost"),
        ({"action_type": "recontact", "hypothesis": ["noise_dominant"]}, "hypothesis"),
    ],
)
def test_malformed_actions_raise_value_error_naming_the_field(action, field):
    env = ClinicalRecruitmentEnv("easy_bench")
    env.reset(seed=0)
    with pytest.raises(ValueError, match=field):
        env.step(action)
    assert env.state()["step"] == 0  # nothing consumed


def test_non_dict_action_is_rejected():
    env = ClinicalRecruitmentEnv()
    env.reset()
    with pytest.raises(ValueError, match="dict"):
        env.step("screen_patient")


def test_typed_action_and_coercions_are_accepted():
    env = ClinicalRecruitmentEnv()
    env.reset(seed=0)
    _, r1, *_ = env.step(Action(action_type="screen_patient", patient_id="P-1149", confidence=0.7))
    env.reset(seed=0)
    _, r2, *_ = env.step({"action_type": "screen_patient", "patient_id": "P-1149", "confidence": "0.7", "extra": 1})
    assert r1 == r2


@pytest.mark.parametrize(
    ("action", "error"),
    [
        ({"action_type": "screen_patient", "patient_id": "P-9999"}, "patient_not_found"),
        ({"action_type": "screen_patient"}, "patient_not_found"),
        ({"action_type": "recontact", "patient_id": "nobody"}, "patient_not_found"),
        ({"action_type": "allocate_to_site", "patient_id": "P-1000"}, "patient_not_consented"),
        ({"action_type": "adjust_strategy", "strategy_change": "bribe"}, "unknown_strategy"),
        ({"action_type": "adjust_strategy"}, "unknown_strategy"),
        ({"action_type": "adjust_strategy", "strategy_change": "focus_site_Z"}, "site_not_found"),
        ({"action_type": "adjust_strategy", "strategy_change": "negotiate_site_Q"}, "site_not_found"),
        ({"action_type": "plan_next_phase", "target_phase": "party"}, "invalid_target_phase"),
        ({"action_type": "summarize_and_index", "memory_key": "  "}, "missing_memory_key"),
        ({"action_type": "retrieve_relevant_history"}, "missing_memory_query"),
    ],
)
def test_semantic_failures_consume_the_day(action, error):
    env = ClinicalRecruitmentEnv("medium_bench")
    env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["last_action_error"] == error
    assert obs["timestamp"] == 1
    assert f"error:{error}" in obs["recent_events"]


def test_failed_strategy_is_still_charged():
    env = ClinicalRecruitmentEnv("easy_bench")
    env.reset(seed=0)
    obs, *_ = env.step({"action_type": "adjust_strategy", "strategy_change": "bribe"})
    assert obs["budget_remaining"] == 120_000 - 200


def test_regulatory_hold_blocks_screening_on_hard_day_0():
    env = ClinicalRecruitmentEnv("hard_bench")
    obs, _ = env.reset(seed=0)
    pid = obs["available_patients"][0]["id"]
    for _ in range(3):  # irb_delay on day 0 blocks days 0, 1 and 2
        obs, _, _, _, info = env.step({"action_type": "screen_patient", "patient_id": pid})
        assert info["last_action_error"] == "regulatory_hold_active"
    obs, _, _, _, info = env.step({"action_type": "screen_patient", "patient_id": pid})
    assert info["last_action_error"] is None


action_values = st.one_of(
    st.none(), st.text(max_size=12), st.integers(-3, 3), st.floats(allow_nan=True), st.booleans()
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {"action_type": st.one_of(st.sampled_from(ACTION_TYPES), st.text(max_size=8))},
            optional={
                key: action_values
                for key in (
                    "patient_id",
                    "site_id",
                    "strategy_change",
                    "hypothesis",
                    "target_phase",
                    "memory_key",
                    "memory_query",
                    "memory_payload",
                    "confidence",
                    "token_cost",
                )
            },
        ),
        max_size=25,
    )
)
def test_arbitrary_actions_never_crash(actions):
    env = ClinicalRecruitmentEnv("hard_bench_stage_30")
    env.reset(seed=0)
    for action in actions:
        if env.done:
            break
        try:
            obs, reward, *_ = env.step(action)
        except ValueError:
            continue
        assert -0.5 <= reward <= 0.99
        assert obs["budget_remaining"] >= 0


def test_opt_in_fixes_are_off_by_default_and_work():
    with pytest.raises(ValueError, match="Unknown fixes"):
        ClinicalRecruitmentEnv("easy_bench", fixes=("everything",))
    plain = ClinicalRecruitmentEnv("easy_bench")
    fixed = ClinicalRecruitmentEnv("easy_bench", fixes=("hide_world_type", "screen_failures_leave_recontact"))
    obs, _ = plain.reset(seed=0)
    fixed_obs, _ = fixed.reset(seed=0)
    assert obs["world_type"] == "noise" and fixed_obs["world_type"] == "hidden"
    # Screen until one patient fails screening: it stays a recontact candidate only without the fix.
    for _ in range(40):
        pid = obs["available_patients"][0]["id"]
        action = {"action_type": "screen_patient", "patient_id": pid, "hypothesis": "noise_dominant"}
        obs, *_ = plain.step(action)
        fixed_obs, *_ = fixed.step(action)
        failed = [c for c in obs["recontact_candidates"] if not c["eligible"]]
        if failed:
            assert all(c["eligible"] for c in fixed_obs["recontact_candidates"])
            assert fixed_obs["hypothesis_accuracy"] == 0.0 and obs["hypothesis_accuracy"] == 1.0
            break
    else:
        pytest.fail("no screen failure in 40 screens")


def test_hidden_world_type_is_still_graded_against_the_truth():
    scores = []
    for fixes in ((), ("hide_world_type",)):
        env = ClinicalRecruitmentEnv("hard_bench_stage_30", fixes=fixes)
        env.reset(seed=0)
        for _ in range(30):
            *_, info = env.step(
                {"action_type": "plan_next_phase", "target_phase": "screening", "hypothesis": "dropout_dominant"}
            )
        scores.append(info["final_score"])
    assert scores[0] == scores[1]


def test_grade_terms_add_up_to_the_final_score():
    from env.clinical.graders import _finish

    for task in ("easy_bench", "medium_bench", "hard_bench"):
        env = ClinicalRecruitmentEnv(task)
        obs, _ = env.reset(seed=4)
        assert env.grade_terms() is None  # only once the episode is over
        done, rng = False, random.Random(4)
        while not done:
            obs, _, terminated, truncated, info = env.step(random_policy(obs, rng))
            done = terminated or truncated
        terms = env.grade_terms()
        assert len(terms) >= 9 and all(v >= 0 for v in terms.values())
        assert _finish(sum(terms.values())) == info["final_score"]


@pytest.mark.parametrize("field", ["token_cost", "confidence"])
def test_huge_integers_are_schema_violations_not_overflows(field):
    """float() of an integer of a few hundred digits overflows; the schema rejects such values with ValueError."""
    from env.clinical.models import validate_action

    with pytest.raises(ValueError, match=field):
        validate_action({"action_type": "stop_recruitment", field: 10**400})
    if field == "token_cost":  # the env sums token costs as floats: 64-bit integers only
        with pytest.raises(ValueError, match=field):
            validate_action({"action_type": "stop_recruitment", field: 2**63})


def test_the_package_env_offers_the_clinical_public_names():
    """design.md's public API: ``from env import ClinicalRecruitmentEnv, TASKS``."""
    import env
    import env.clinical
    from env import TASKS, ClinicalRecruitmentEnv

    assert ClinicalRecruitmentEnv is env.clinical.ClinicalRecruitmentEnv and TASKS is env.clinical.TASKS
    assert set(env.__all__) == set(env.clinical.__all__)

"""Action contracts: the strict parser, the fallback, prompt building and SFT targets."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from env.clinical import ClinicalRecruitmentEnv
from recruit_trl.contracts import (
    INDEX_INSTRUCTIONS,
    build_messages,
    completion_text,
    parse_action,
    parse_index,
    parse_json_object,
)
from recruit_trl.protocol import get_env_interface

INTERFACE = get_env_interface("clinical")
HUGE_INT = "7" * 5000  # over Python's 4,300-digit limit on int(str), which json.loads applies
FLOAT_OVERFLOW_INT = "1" + "0" * 400  # 10**400: an int, but float() cannot hold it
DEEP = 100_000  # far past the recursion limit


@pytest.fixture(scope="module")
def obs():
    env = ClinicalRecruitmentEnv("medium_bench")
    obs, _ = env.reset(seed=3)
    for _ in range(6):
        obs, *_ = env.step(INTERFACE.fallback_action(obs))
    return obs


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"action_index": 3}', (3, None)),
        ('  {"action_index":0}\n', (0, None)),
        ('{"action_index": 9}', (None, "index_out_of_range")),
        ('{"action_index": -1}', (None, "index_out_of_range")),
        ('{"action_index": "3"}', (None, "index_not_int")),
        ('{"action_index": true}', (None, "index_not_int")),
        ('{"action_index": 3.0}', (None, "index_not_int")),
        ('{"action_index": 3, "why": "x"}', (None, "wrong_keys")),
        ('{"action_index": 3, "action_index": 4}', (None, "duplicate_key")),
        ('{"action_index": 3}{"action_index": 4}', (None, "malformed_json")),
        ('Sure! {"action_index": 3}', (None, "no_json_object")),
        ("[3]", (None, "no_json_object")),
        ("", (None, "no_json_object")),
        ('{"action_index": 3', (None, "malformed_json")),
        ('{"action_index": ' + HUGE_INT + "}", (None, "number_too_long")),
        ('{"action_index": 1, "x": -' + HUGE_INT + "}", (None, "number_too_long")),
        ('{"action_index": ' + FLOAT_OVERFLOW_INT + "}", (None, "index_out_of_range")),
        ('{"action_index": 1e400}', (None, "index_not_int")),
        ('{"action_index": NaN}', (None, "index_not_int")),
        ('{"action_index": -Infinity}', (None, "index_not_int")),
        ('{"action_index": ' + "[" * DEEP, (None, "malformed_json")),
        ('{"action_index": ' + "[" * DEEP + "]" * DEEP + "}", (None, "malformed_json")),
    ],
)
def test_parse_index_is_strict(text, expected):
    assert parse_index(text, 5) == expected


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_arbitrary_text_never_raises_and_falls_back(obs, text):
    candidates = INTERFACE.candidate_actions(obs)
    parsed = parse_action(text, "index", INTERFACE, obs, candidates)
    assert isinstance(parsed.action, dict)
    if not parsed.valid:
        assert parsed.action == INTERFACE.fallback_action(obs)
        assert parsed.error


@settings(max_examples=200, deadline=None)
@given(st.integers(-5, 40))
def test_index_json_round_trip(obs, k):
    candidates = INTERFACE.candidate_actions(obs)
    parsed = parse_action(json.dumps({"action_index": k}), "index", INTERFACE, obs, candidates)
    assert parsed.valid == (0 <= k < len(candidates))
    if parsed.valid:
        assert parsed.action == candidates[k] and parsed.index == k


def _answer(**fields: str) -> str:
    """A JSON object whose values are the given raw JSON literals (``_answer(x="1e400")`` is ``{"x": 1e400}``)."""
    return "{" + ", ".join(f'"{key}": {value}' for key, value in fields.items()) + "}"


STOP = '"stop_recruitment"'


@pytest.mark.parametrize(
    ("text", "error"),
    [
        # Integers too long for int(str).
        (_answer(action_index=HUGE_INT), "number_too_long"),
        (_answer(action_index="-" + HUGE_INT), "number_too_long"),
        (_answer(action_index=1, confidence=HUGE_INT), "number_too_long"),
        # Integers that parse but overflow float().
        (_answer(action_index=FLOAT_OVERFLOW_INT), "index_out_of_range"),
        (_answer(action_index="-" + FLOAT_OVERFLOW_INT), "index_out_of_range"),
        # Floats that overflow to infinity, and the non-standard NaN/Infinity literals json.loads accepts.
        (_answer(action_index="1e400"), "index_not_int"),
        (_answer(action_index="NaN"), "index_not_int"),
        (_answer(action_index="Infinity"), "index_not_int"),
        (_answer(action_index="-Infinity"), "index_not_int"),
        # Nesting past the recursion limit, closed or not.
        (_answer(action_index="[" * DEEP), "malformed_json"),
        (_answer(action_index="[" * DEEP + "]" * DEEP), "malformed_json"),
        (_answer(action_index=1, note='{"a": ' * DEEP + "1" + "}" * DEEP), "malformed_json"),
        # Lone surrogates, escaped or raw, in values, keys and around the object.
        (_answer(action_index='"\\ud800"'), "index_not_int"),
        ('{"\\udfff": 1}', "wrong_keys"),
        ('{"action_index": 1}\udfff', "malformed_json"),
        ("\ud800", "no_json_object"),
    ],
)
def test_hostile_numbers_nesting_and_surrogates_are_counted_failures(obs, text, error):
    """Answers a longer generation can produce: each is a failure with its reason, never an exception."""
    candidates = INTERFACE.candidate_actions(obs)
    parsed = parse_action(text, "index", INTERFACE, obs, candidates)
    assert parsed.error == error
    assert not parsed.valid and parsed.action == INTERFACE.fallback_action(obs) and parsed.index is None


def _hostile_literal() -> st.SearchStrategy[str]:
    """JSON-ish value literals that break naive number parsing or recursion."""
    nesting = st.sampled_from([1, 50, 990, 1000, 5000, DEEP])
    return st.one_of(
        st.integers(4250, 4400).map(lambda n: "9" * n),  # around the 4,300-digit limit of int(str)
        st.integers(300, 500).map(lambda n: "1" + "0" * n),  # ints float() cannot hold
        st.integers(300, 500).map(lambda n: f"1e{n}"),  # floats that overflow to infinity
        st.sampled_from(["NaN", "Infinity", "-Infinity", "-0", "1e-400", "0", "1", STOP]),
        st.tuples(nesting, st.booleans()).map(lambda t: "[" * t[0] + "]" * t[0] * t[1]),
        st.tuples(nesting, st.booleans()).map(lambda t: '{"a": ' * t[0] + ("1" + "}" * t[0]) * t[1]),
        st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3).map(lambda s: f'"{s}"'),
        st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3).map(json.dumps),
    )


@st.composite
def _hostile_answers(draw) -> str:
    keys = st.sampled_from(["action_index", "action_type", "confidence", "token_cost", "patient_id", "note"])
    fields = draw(st.dictionaries(keys, st.tuples(st.sampled_from(["", "-"]), _hostile_literal()), max_size=3))
    text = _answer(**{key: sign + value for key, (sign, value) in fields.items()})
    return text[: draw(st.integers(0, len(text)))] if draw(st.booleans()) else text  # or cut off mid-answer


@settings(max_examples=100, deadline=None)
@given(_hostile_answers())
def test_hostile_answers_never_raise_and_fall_back(obs, text):
    candidates = INTERFACE.candidate_actions(obs)
    parsed = parse_action(text, "index", INTERFACE, obs, candidates)
    assert isinstance(parsed.action, dict)
    if parsed.valid:
        assert parsed.action == candidates[parsed.index]
    else:
        assert parsed.action == INTERFACE.fallback_action(obs)
        assert parsed.error


def test_the_index_contract_is_the_only_one(obs):
    """The prompt's answer format (the clinical text, unchanged: trained models depend on it); any other contract is
    a configuration error, not a model's failure."""
    system = build_messages(INTERFACE, obs, [], "index")[0]["content"]
    assert system == (
        "You run a clinical-trial recruitment campaign, one action per day. Enrol patients within budget.\n"
        'Reply with one JSON object {"action_index": N} choosing an action from the list.'
    )
    assert system.endswith(INDEX_INSTRUCTIONS) and parse_json_object("null") == (None, "no_json_object")
    for call in (
        lambda: build_messages(INTERFACE, obs, [], "json"),
        lambda: parse_action('{"action_index": 0}', "json", INTERFACE, obs),
        lambda: completion_text(INTERFACE.candidate_actions(obs)[0], "json", INTERFACE.candidate_actions(obs)),
    ):
        with pytest.raises(ValueError, match=r"Unknown action contract 'json'; expected one of \('index',\)"):
            call()


def test_candidates_are_legal_and_listed(obs):
    candidates = INTERFACE.candidate_actions(obs)
    messages = build_messages(INTERFACE, obs, ["d5 screen P-1: ok"], "index", candidates)
    assert [m["role"] for m in messages] == ["system", "user"]
    assert '{"action_index": N}' in messages[0]["content"]
    for k in range(len(candidates)):
        assert f"\n{k}: " in messages[1]["content"]
    for cand in candidates:  # every listed action is accepted by the environment without an error
        env = ClinicalRecruitmentEnv("medium_bench")
        env.reset(seed=3)
        for _ in range(6):
            env.step(INTERFACE.fallback_action(env._observation()))
        _, _, _, _, info = env.step(cand)
        assert info["last_action_error"] is None, (cand, info["last_action_error"])


def test_completion_text_targets(obs):
    candidates = INTERFACE.candidate_actions(obs)
    assert completion_text(candidates[2], "index", candidates) == '{"action_index": 2}'
    with pytest.raises(ValueError, match="not a listed candidate"):
        completion_text({"action_type": "stop_recruitment", "confidence": 0.123}, "index", candidates)


@pytest.mark.parametrize("task", ["easy_bench", "medium_bench", "hard_bench"])
def test_random_candidates_are_legal_for_whole_episodes(task):
    """Holds that start today (fixed calendar) and consents whose window closes today are never listed."""
    import random

    env = ClinicalRecruitmentEnv(task)
    errors, steps = [], 0
    for seed in range(3):
        rng = random.Random(seed)
        obs, _ = env.reset(seed=seed)
        done = False
        while not done:
            action = rng.choice(INTERFACE.candidate_actions(obs))
            obs, _, terminated, truncated, info = env.step(action)
            done, steps = terminated or truncated, steps + 1
            if info["last_action_error"]:
                errors.append((info["step"], action["action_type"], info["last_action_error"]))
    assert steps > 300 and not errors, errors[:5]


def test_free_actions_head_the_list_and_the_fallback_never_idles():
    from env.clinical.agent import PASSIVE_TYPES

    env = ClinicalRecruitmentEnv("hard_bench")
    obs, _ = env.reset(seed=1)
    done, seen_free = False, 0
    while not done:
        kinds = [c["action_type"] for c in INTERFACE.candidate_actions(obs)]
        free = [k in PASSIVE_TYPES and k != "stop_recruitment" for k in kinds]
        n_free = sum(free)
        assert free[:n_free] == [True] * n_free, kinds  # a prefix, recall (when listed) first
        if n_free and "retrieve_relevant_history" in kinds:
            assert kinds[0] == "retrieve_relevant_history"
        seen_free += bool(n_free)
        action = INTERFACE.fallback_action(obs)
        if any(k not in PASSIVE_TYPES for k in kinds):
            assert action["action_type"] not in PASSIVE_TYPES
        obs, _, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
    assert seen_free > 5


def test_plans_are_offered_until_the_agent_has_its_own():
    """The graders pay for a plan of the agent's own; an index-contract student can only make one if it is listed."""
    import random

    from env.clinical.expert import ExpertPolicy
    from recruit_trl.traces import match_candidate

    env = ClinicalRecruitmentEnv("medium_bench")
    obs, _ = env.reset(seed=0)
    listed = [c.get("target_phase") for c in INTERFACE.candidate_actions(obs) if c["action_type"] == "plan_next_phase"]
    assert obs["current_plan"]["plan_id"].startswith("autoplan") and {"screening", "recovery"} <= set(listed)
    # The expert's day-0 plan on medium (a recovery plan) is one of them.
    expert = ExpertPolicy()
    first = expert.act(env, rng=random.Random(0), obs=obs)
    assert first["action_type"] == "plan_next_phase"
    assert match_candidate(INTERFACE, first, INTERFACE.candidate_actions(obs)) is not None
    obs, *_ = env.step(first)
    # With a plan of its own, plans are listed only with the other free actions (hold, nothing productive, lean).
    kinds = [c["action_type"] for c in INTERFACE.candidate_actions(obs)]
    assert obs["current_plan"]["plan_id"].startswith("plan-")
    assert ("plan_next_phase" in kinds) == ("summarize_and_index" in kinds)


def test_one_negotiation_is_listed_with_the_site_that_most_needs_one():
    """With one negotiation per site the student learnt "negotiate" as one position, whatever site needed it."""
    import copy

    from env.clinical.agent import negotiation_order

    env = ClinicalRecruitmentEnv("medium_bench")
    obs, _ = env.reset(seed=0)
    obs = copy.deepcopy(obs)
    sites = obs["site_performance"]
    assert list(sites) == ["site_A", "site_B", "site_C"]
    sites["site_A"].update(conversion_rate=0.95, avg_wait_days=1.0, capacity_remaining=20)  # settled
    sites["site_B"].update(conversion_rate=0.50, avg_wait_days=4.0)
    sites["site_C"].update(conversion_rate=0.40, avg_wait_days=4.0)
    obs["active_constraints"]["focused_site"] = None
    # A is the best site, so the target, but settled: it goes last; of the two that need one, C converts worst.
    assert negotiation_order(obs) == ["site_C", "site_B", "site_A"]
    obs["active_constraints"]["focused_site"] = "site_B"  # a focused site is the target
    assert negotiation_order(obs) == ["site_B", "site_C", "site_A"]
    listed = [c["strategy_change"] for c in INTERFACE.candidate_actions(obs) if c["action_type"] == "adjust_strategy"]
    assert [s for s in listed if s.startswith("negotiate_")] == ["negotiate_site_B"]
    assert "tighten_criteria" not in listed and {"increase_outreach", "relax_criteria"} <= set(listed)
    obs["active_constraints"]["focused_site"] = None
    sites["site_A"]["avg_wait_days"] = 4.0  # the target needs one again: it heads the order
    assert negotiation_order(obs) == ["site_A", "site_C", "site_B"]


def test_the_prompt_shows_what_the_fixed_calendar_holds_after_today():
    """Scheduled dropouts decide when enrolling pays; the prompt shows those still ahead and the curriculum."""
    from env.clinical.agent import calendar_line
    from env.clinical.world import scheduled_dropout_days

    hard = scheduled_dropout_days("hard_bench")
    assert len(hard) == 21 and hard[-5:] == (137, 152, 163, 167, 173)  # spec: 21 scheduled dropouts on hard
    assert scheduled_dropout_days("medium_bench")[-1] == 107
    # A dropout of the decision's own day fires before its action, so it is no longer ahead.
    assert calendar_line("hard_bench", 137) == "Calendar: dropouts ahead 4 next d152 | curriculum d140-152"
    assert calendar_line("hard_bench", 140) == "Calendar: dropouts ahead 4 next d152 | curriculum d140-152 now"
    assert calendar_line("hard_bench", 175) == "Calendar: dropouts ahead 0"
    assert calendar_line("medium_bench", 106) == "Calendar: dropouts ahead 1 next d107"
    assert calendar_line("medium_bench", 107) == "Calendar: dropouts ahead 0"
    # A stage task keeps the calendar's first days only.
    assert calendar_line("hard_bench_stage_30", 0) == "Calendar: dropouts ahead 2 next d18 | curriculum d25-29"
    env = ClinicalRecruitmentEnv("hard_bench")
    obs, _ = env.reset(seed=0)
    assert calendar_line("hard_bench", 0) in INTERFACE.render(obs, [])

"""Answer contract of the conquest environment (spec §7.2, §7.4, §10.8 parser fuzz): any reply, index or raw action
is either valid or replaced by the FallbackSafeAgent action with the right reason; nothing ever raises."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

conquest = pytest.importorskip("env.conquest")
from test_conquest_rules import IDS, NBRS, View  # noqa: E402

ConquestEnv = conquest.ConquestEnv
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# Decision points reached by replaying fixed answers from reset (no snapshot involved): (task, seed, indices).
STATES = {
    "reinforce": ("classic3", 0, []),
    "attack": ("classic3", 0, [0]),
    "fortify": ("duel", 1, [0, 0]),
}


def expected_reason(reply: str, n: int) -> str | None:
    """§7.4 validity of a text reply for a list of n candidates: None when valid, else the reason."""
    try:
        value = json.loads(reply.strip())
    except (ValueError, RecursionError):
        return "invalid_json"
    if not isinstance(value, dict):
        return "not_object"
    if "action_index" not in value:
        return "missing_key"
    if len(value) != 1:
        return "extra_keys"
    k = value["action_index"]
    if not isinstance(k, int) or isinstance(k, bool):
        return "bad_type"
    if not 0 <= k < n:
        return "out_of_range"
    return None


def at(state: str) -> ConquestEnv:
    task, seed, answers = STATES[state]
    env = ConquestEnv(task=task)
    env.reset(seed=seed)
    for k in answers:
        env.step_index(k)
    return env


def fallback_outcome(state: str) -> tuple:
    """Observation and reward after answering candidate 0 (the fallback action) in `state`."""
    env = at(state)
    obs, reward, terminated, truncated, info = env.step_index(0)
    return obs, reward, terminated, truncated, info


_BASE: dict[str, tuple] = {}


def check_reply(state: str, reply: str) -> None:
    """Send `reply`; a valid one is applied, an invalid one applies candidate 0 with a -0.05 invalid component."""
    env = at(state)
    n = len(env.candidates())
    reason = expected_reason(reply, n)
    obs, reward, terminated, truncated, info = env.step_text(reply)
    assert info["fallback"] == (reason is not None), reply
    assert info["fallback_reason"] == reason, reply
    if reason is None:
        assert info["reward_components"]["invalid"] == 0
        return
    if state not in _BASE:
        _BASE[state] = fallback_outcome(state)
    base_obs, base_reward, base_term, base_trunc, base_info = _BASE[state]
    assert obs == base_obs and (terminated, truncated) == (base_term, base_trunc)
    assert info["reward_components"]["invalid"] == -0.05
    assert reward == round(base_reward - 0.05, 6)


def test_states_are_the_intended_phases():
    for state in STATES:
        assert at(state).candidates(), state
        assert View(_obs_of(state)).phase == state


def _obs_of(state: str) -> dict:
    task, seed, answers = STATES[state]
    env = ConquestEnv(task=task)
    obs, _ = env.reset(seed=seed)
    for k in answers:
        obs, *_ = env.step_index(k)
    return obs


EDGE_REPLIES = [
    '{"action_index": 0}',
    '  {"action_index": 1}\n',
    '{"action_index": 0, "action_index": 1}',  # json.loads keeps the last duplicate: one key, valid
    "",
    "   ",
    "0",
    "1",
    "null",
    "true",
    '"{\\"action_index\\": 0}"',
    "[0]",
    "{}",
    '{"action": 0}',
    '{"action_index": 0, "reason": "safe"}',
    '{"Action_Index": 0}',
    '{"action_index": "0"}',
    '{"action_index": 0.0}',
    '{"action_index": 1e0}',
    '{"action_index": true}',
    '{"action_index": false}',
    '{"action_index": null}',
    '{"action_index": [0]}',
    '{"action_index": {"k": 0}}',
    '{"action_index": -1}',
    '{"action_index": 12}',
    '{"action_index": 99999999999999999999999999999999}',
    '{"action_index": -99999999999999999999999999999999}',
    '{"action_index": 1' + "0" * 5000 + "}",  # beyond int max str digits: a ValueError inside json.loads
    "[" * 50000 + "]" * 50000,  # nesting beyond the recursion limit
    '{"action_index": NaN}',
    '{"action_index": Infinity}',
    "NaN",
    '```json\n{"action_index": 0}\n```',
    '```\n{"action_index": 0}\n```',
    'Answer: {"action_index": 0}',
    '{"action_index": 0}{"action_index": 1}',
    '\ufeff{"action_index": 0}',
    '{"action_index": 0',
    "\x00",
    "x" * 100_000,
]


@pytest.mark.parametrize("reply", EDGE_REPLIES, ids=range(len(EDGE_REPLIES)))
def test_edge_replies(reply):
    check_reply("reinforce", reply)


@pytest.mark.parametrize("state", sorted(STATES))
@FUZZ
@given(reply=st.text(max_size=80))
def test_fuzz_text_replies(state, reply):
    check_reply(state, reply)


@FUZZ
@given(data=st.binary(max_size=64))
def test_fuzz_random_bytes(data):
    check_reply("attack", data.decode("utf-8", errors="replace"))
    check_reply("attack", data.decode("latin-1"))


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)


@FUZZ
@given(
    value=JSON_VALUES | st.integers(min_value=-(10**40), max_value=10**40),
    extra=st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=2),
    indent=st.sampled_from([None, 0, 2]),
    fence=st.booleans(),
)
def test_fuzz_json_shaped_replies(value, extra, indent, fence):
    reply = json.dumps({"action_index": value, **extra}, indent=indent)
    if fence:
        reply = f"```json\n{reply}\n```"
    check_reply("fortify", reply)


@FUZZ
@given(value=JSON_VALUES)
def test_fuzz_any_json_document(value):
    check_reply("reinforce", json.dumps(value))


@FUZZ
@given(k=st.integers(min_value=-(10**30), max_value=10**30) | st.booleans() | st.floats() | st.text(max_size=4))
def test_step_index_contract(k):
    """§7.4: step_index with a bad k falls back with reason bad_type or out_of_range; a good k is applied."""
    env = at("attack")
    n = len(env.candidates())
    obs, reward, terminated, truncated, info = env.step_index(k)
    if isinstance(k, bool) or not isinstance(k, int):
        assert info["fallback"] and info["fallback_reason"] == "bad_type"
    elif not 0 <= k < n:
        assert info["fallback"] and info["fallback_reason"] == "out_of_range"
    else:
        assert not info["fallback"] and info["fallback_reason"] is None


RAW_ACTIONS = st.one_of(
    JSON_VALUES,
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["place", "trade", "attack", "blitz", "end_attack", "move", "fortify", "end_turn"])
            | st.text(max_size=6),
        },
        optional={
            "territory": st.sampled_from(IDS) | st.integers(-2, 45) | st.text(max_size=5) | st.none(),
            "from": st.sampled_from(IDS) | st.integers(-2, 45) | st.none(),
            "to": st.sampled_from(IDS) | st.integers(-2, 45) | st.none(),
            "n": st.integers(-3, 60) | st.floats() | st.booleans() | st.text(max_size=3),
            "dice": st.integers(-1, 5) | st.floats() | st.booleans(),
            "cards": st.lists(st.integers(-1, 45) | st.text(max_size=2), max_size=4),
        },
    ),
)


def _is_legal_ref(state: str, action) -> bool:
    """Reference legality of a raw action: a dict equal to an enumerated legal action (dice may be omitted)."""
    if not isinstance(action, dict) or not isinstance(action.get("type"), str):
        return False
    view = View(_obs_of(state))
    legal = {json.dumps(a, sort_keys=True) for a in view.legal()}
    a = dict(action)
    if a.get("type") == "attack" and "dice" not in a and a.get("from") in IDS and a.get("to") in IDS:
        s = IDS.index(a["from"])
        a["dice"] = min(3, view.armies[s] - 1)
    if a.get("type") == "trade" and isinstance(a.get("cards"), list):
        return json.dumps(a, sort_keys=True) in legal and a["cards"] == sorted(a["cards"])
    return json.dumps(a, sort_keys=True) in legal


@pytest.mark.parametrize("state", sorted(STATES))
@FUZZ
@given(action=RAW_ACTIONS)
def test_fuzz_raw_actions(state, action):
    """§7.4: step(raw) with an illegal action falls back with reason `illegal`; is_legal never raises."""
    env = at(state)
    legal = _is_legal_ref(state, action)
    assert env.is_legal(action) == legal
    obs, reward, terminated, truncated, info = env.step(action)
    assert info["fallback"] == (not legal)
    assert info["fallback_reason"] == (None if legal else "illegal")


def test_raw_actions_by_id_and_default_dice():
    """§7.2: territories by id; an attack without dice means the maximum number of dice."""
    env = at("attack")
    view = View(_obs_of("attack"))
    pairs = view.attack_pairs()
    assert pairs, "the attack state has no legal attack"
    s, d = pairs[0]
    assert env.is_legal({"type": "attack", "from": IDS[s], "to": IDS[d]})
    assert env.is_legal({"type": "blitz", "from": IDS[s], "to": IDS[d]})
    assert not env.is_legal({"type": "attack", "from": IDS[s], "to": IDS[d], "dice": min(3, view.armies[s] - 1) + 1})
    assert not env.is_legal({"type": "attack", "from": IDS[s], "to": IDS[s]})
    own = [t for t in NBRS[s] if view.owners[t] == view.p]
    if own:
        assert not env.is_legal({"type": "attack", "from": IDS[s], "to": IDS[own[0]]})
    assert not env.is_legal({"type": "end_turn"}) and env.is_legal({"type": "end_attack"})
    assert not math.isnan(env.step({"type": "attack", "from": IDS[s], "to": IDS[d]})[1])

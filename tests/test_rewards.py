"""Reward functions read the rollout's extra fields, pass None through, and fail clearly without them."""

from __future__ import annotations

import pytest

import rewards
from rewards import (
    action_shaping_reward,
    dropout_penalty,
    enrollment_reward,
    env_return_reward,
    final_score_reward,
    format_reward,
    get_reward_funcs,
    hypothesis_reward,
    milestone_reward,
    potential_reward,
    screening_reward,
    teacher_match_reward,
    weighted_rewards,
)

FIELDS = {
    "env_return": [1.25, -0.5, None],
    "enrollment_gain": [2.0, -1.0, 0.0],
    "screen_success": [1.0, 0.0, 3.0],
    "dropout": [0.0, 2.0, 1.0],
    "milestone_bonus": [0.02, 0.0, 0.05],
    "hypothesis_accuracy": [9.0, 0.0, 4.5],
    "scored_steps": [9, 3, 9],
    "valid": [1.0, 0.0, 0.5],
    "action_shaping": [0.2, None, -0.1],
    "final_score": [None, 0.61, None],
    "teacher_match": [1.0, 0.0, 0.5],
}
COMPLETIONS = ['{"action_index": 0}', "garbage", '{"action_index": 3}']


def test_each_component_reads_its_field():
    kw = dict(FIELDS)
    assert env_return_reward(COMPLETIONS, **kw) == [1.25, -0.5, None]
    assert enrollment_reward(COMPLETIONS, **kw) == [2.0, -1.0, 0.0]
    assert screening_reward(COMPLETIONS, **kw) == [1.0, 0.0, 3.0]
    assert dropout_penalty(COMPLETIONS, **kw) == [-0.0, -2.0, -1.0]
    assert milestone_reward(COMPLETIONS, **kw) == [0.02, 0.0, 0.05]
    assert hypothesis_reward(COMPLETIONS, **kw) == [9.0, 0.0, 4.5]  # summed over the steps, as every component
    assert format_reward(COMPLETIONS, **kw) == [0.0, -1.0, -0.5]  # a penalty on what did not parse
    assert action_shaping_reward(COMPLETIONS, **kw) == [0.2, None, -0.1]
    assert final_score_reward(COMPLETIONS, **kw) == [None, 0.61, None]
    assert teacher_match_reward(COMPLETIONS, **kw) == [1.0, 0.0, 0.5]


def test_missing_field_is_a_clear_error():
    with pytest.raises(ValueError, match="'enrollment_gain'.*rollout"):
        enrollment_reward(COMPLETIONS, env_return=[1.0, 2.0, 3.0])
    # A rollout without a teacher fills teacher_match with None: a configuration error, not "no reward".
    with pytest.raises(ValueError, match="reward_teacher"):
        teacher_match_reward(COMPLETIONS, teacher_match=[None, None, None])


def test_registry_and_imports():
    funcs = get_reward_funcs(["env_return_reward", "format_reward"])
    assert [f.__name__ for f in funcs] == ["env_return_reward", "format_reward"]
    assert set(rewards.__all__) >= set(rewards.REWARD_FUNCS)
    with pytest.raises(ValueError, match="Unknown reward"):
        get_reward_funcs(["nope"])


def test_conquest_components_read_its_fields_by_hand():
    from rewards.conquest import (
        continent_reward,
        elimination_reward,
        invalid_penalty,
        outcome_reward,
        territory_reward,
        win_reward,
    )

    kw = {
        "territory": [0.03, -0.01, 0.0],
        "continent": [0.04, 0.0, -0.02],
        "elimination": [0.1, 0.0, 0.0],
        "invalid": [0.0, -0.05, 0.0],
        "outcome": [1.0, 0.0, 0.42],
        "final_score": [1.0, None, 0.42],
    }
    assert territory_reward(COMPLETIONS, **kw) == [0.03, -0.01, 0.0]
    assert continent_reward(COMPLETIONS, **kw) == [0.04, 0.0, -0.02]
    assert elimination_reward(COMPLETIONS, **kw) == [0.1, 0.0, 0.0]
    assert invalid_penalty(COMPLETIONS, **kw) == [0.0, -0.05, 0.0]
    assert outcome_reward(COMPLETIONS, **kw) == [1.0, 0.0, 0.42]
    assert win_reward(COMPLETIONS, **kw) == [1.0, None, 0.0]  # only a win scores 1.0; a game going on is None


def test_every_environment_reward_field_has_a_reward_function():
    from recruit_trl.protocol import get_env_interface

    read = {"conquest": {"territory", "continent", "elimination", "invalid", "outcome"}}
    assert set(get_env_interface("conquest").reward_fields) == read["conquest"]
    names = {f.__name__ for f in get_reward_funcs(["territory_reward", "continent_reward", "elimination_reward",
                                                   "invalid_penalty", "outcome_reward", "win_reward"])}  # fmt: skip
    assert names <= set(rewards.REWARD_FUNCS)


def test_a_reward_function_by_dotted_path_and_its_errors():
    (func,) = get_reward_funcs(["rewards.generic:format_reward"])
    assert func is format_reward
    with pytest.raises(ValueError, match="Cannot import reward function 'no_such_module:f'"):
        get_reward_funcs(["no_such_module:f"])
    with pytest.raises(ValueError, match="Cannot import"):
        get_reward_funcs(["rewards.generic:no_such_function"])
    with pytest.raises(ValueError, match=r"TRL's signature f\(completions, \*\*kwargs\)"):
        get_reward_funcs(["rewards.generic:as_floats"])
    with pytest.raises(ValueError, match="available: .*win_reward.*package.module:function"):
        get_reward_funcs(["nosuch_reward"])


def test_potential_reward_reads_the_change_of_the_potential_by_hand():
    rows = {"potential_change": [0.125, -0.0625, None, 0.0]}  # None: an environment without a potential
    assert potential_reward(["a", "b", "c", "d"], **rows) == [0.125, -0.0625, None, 0.0]
    assert "potential_reward" in rewards.REWARD_FUNCS
    with pytest.raises(ValueError, match="'potential_change'"):
        potential_reward(["a"], valid=[1.0])


def test_weighted_rewards_sum_as_trl_does_by_hand():
    """sum_i w_i f_i(row) over the functions that scored the row (TRL's nansum), None for a row that none scored
    (TRL's unscorable row), and each function's own values beside it."""
    kw = {**FIELDS, "potential_change": [0.5, None, -0.25]}
    funcs = get_reward_funcs(["final_score_reward", "potential_reward", "action_shaping_reward"])
    totals, parts = weighted_rewards(funcs, [1.0, 2.0, -1.0], kw, COMPLETIONS)
    assert totals == pytest.approx([1.0 - 0.2, 0.61, -0.5 + 0.1])
    assert parts["potential_reward"] == [0.5, None, -0.25] and parts["final_score_reward"] == [None, 0.61, None]
    assert weighted_rewards(funcs[:1], None, kw, COMPLETIONS)[0] == [None, 0.61, None]  # no weights: 1 each
    with pytest.raises(ValueError, match="one weight per reward function"):
        weighted_rewards(funcs, [1.0], kw, COMPLETIONS)

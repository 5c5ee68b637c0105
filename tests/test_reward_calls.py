"""Reward functions are called as TRL 1.16 calls them, in every mode (``rewards.call_reward_funcs``).

TRL's ``GRPOTrainer`` calls the reward functions itself on branch rows; recruit_trl calls them on episode
mode's step rows and on the tool loop's steps. A TRL-style function that reads ``prompts``, ``trainer_state`` and
``completion_ids`` gets them in every mode: through TRL's own trainer (a tiny model, generation scripted) for the
rollout modes, and through TRL's own ``_calculate_rewards`` for the tool loop. The sums are checked against TRL's code
on the same numbers: its ``_calculate_rewards`` (None -> NaN, async functions) and its aggregation lines
(``trl/trainer/grpo_trainer.py:2756-2764``, reproduced: they sit inside ``_generate_and_score_completions``).
"""

from __future__ import annotations

import asyncio
import logging
import math
from functools import partial
from types import SimpleNamespace

import pytest
import torch
import toy_env
from test_rollout import ScriptedSampler
from transformers import TrainerState
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import shutdown_event_loop_in_daemon, start_event_loop_in_daemon

import recruit_trl.rollout.rollout_funcs as rollout_mod
import rewards
from recruit_trl.rollout.anchors import Anchor, anchor_dataset
from recruit_trl.rollout.config import ROW_FIELDS, RolloutConfig
from recruit_trl.rollout.rollout_funcs import BranchRollout, EpisodeRollout
from recruit_trl.rollout.tool_env import environment_dataset, environment_factory, reward_part_funcs
from recruit_trl.traces import collect_traces
from recruit_trl.training.trainer import RecruitGRPOTrainer
from recruit_trl.workflow.tokenizer import build_tokenizer
from rewards import call_reward_funcs, get_reward_funcs, hypothesis_reward, unscorable_as_zero

TOY = "tests.toy_env:TOY"
ANCHOR = Anchor("near", 3, 2, "wanderer")
ANSWERS = ['{"action_index": 1}', '{"action_index": 0}', "no idea"]
STEP = 7  # the trainer's global step in these tests: what the curious reward function scores
# What TRL passes every reward function besides the rows' fields (trl/trainer/grpo_trainer.py:1588-1594, 1626).
TRL_NAMES = {"prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric"}


def curious_reward():
    """A TRL-style reward function that reads TRL's arguments: it scores the trainer's global step (0 without a
    trainer) and records what it was given."""
    calls = []

    def curious(completions, prompts, completion_ids, trainer_state, log_metric, **kwargs):
        calls.append({
            "prompts": list(prompts), "completions": list(completions), "completion_ids": list(completion_ids),
            "trainer_state": trainer_state, "names": {"completions", "prompts", "completion_ids", "trainer_state",
                                                      "log_metric", *kwargs},
            "kwargs": kwargs,
        })  # fmt: skip
        log_metric("curious/calls", 1.0)
        return [float(trainer_state.global_step) if trainer_state is not None else 0.0 for _ in completions]

    return curious, calls


# --------------------------------------------------------------------------------------------- TRL's own trainer
@pytest.fixture(scope="module")
def tokenizer():
    rows = collect_traces(toy_env.TOY, ["near"], range(1), epsilon=0.3, relabel=False)
    texts = [m["content"] for r in rows for m in r["messages"]] + [r["completion"] for r in rows] + ANSWERS
    return build_tokenizer(texts, vocab_size=400)


def tiny_trainer(tokenizer, tmp_path, rollout, reward_funcs, trainer_cls=GRPOTrainer):
    """TRL's GRPOTrainer on a one-layer random model with ``rollout`` as its ``rollout_func``, at global step STEP."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=1, intermediate_size=32, max_position_embeddings=2048)  # fmt: skip
    args = GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=2, num_generations=2, use_cpu=True,
                      max_completion_length=8, report_to=[], save_strategy="no")  # fmt: skip
    trainer = trainer_cls(
        model=AutoModelForCausalLM.from_config(config), reward_funcs=reward_funcs, args=args,
        train_dataset=anchor_dataset([ANCHOR], min_rows=2), processing_class=tokenizer, rollout_func=rollout,
    )  # fmt: skip
    trainer.state.global_step = STEP
    return trainer


def dataset_rows(trainer):
    """A generation batch as TRL's sampler gives it: the anchor's dataset row once per generation."""
    return [dict(trainer.train_dataset[0]) for _ in range(trainer.num_generations)]


def test_branch_rows_reach_the_functions_through_trls_own_path(tokenizer, tmp_path, monkeypatch):
    """TRL calls the functions on the rollout's rows: the dataset's prompt (the anchor key) and columns, the
    rollout's ids and fields, the trainer's state."""
    monkeypatch.setattr(rollout_mod, "sample", ScriptedSampler(tokenizer, ANSWERS))
    config = RolloutConfig(env_name=TOY, continuation_policy="wanderer", horizon=2)
    curious, calls = curious_reward()
    trainer = tiny_trainer(tokenizer, tmp_path, BranchRollout(config, toy_env.TOY), [curious])
    trainer._generate_and_score_completions(dataset_rows(trainer))
    (call,) = calls
    assert call["prompts"] == [ANCHOR.key()] * 2 and call["trainer_state"] is trainer.state
    ids = [tokenizer(a, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for a in ANSWERS[:2]]
    assert call["completion_ids"] == ids
    assert call["names"] >= TRL_NAMES | {"task", "seed", "day", "policy", "valid", "scored_steps", "progress"}
    assert call["kwargs"]["task"] == ["near"] * 2 and call["kwargs"]["seed"] == [3] * 2


def test_episode_step_rows_get_what_trl_passes_for_the_rows_it_scores(tokenizer, tmp_path, monkeypatch):
    """Episode mode calls the functions on every decision's step row with TRL's arguments: the same names TRL passes
    for the rows it scores itself (all but the rollout's ``advantage``), the anchor key as the prompt, each decision's
    own answer and ids, the trainer's state; the step reward is the functions' weighted sum on it."""
    monkeypatch.setattr(rollout_mod, "sample", ScriptedSampler(tokenizer, ANSWERS))
    config = RolloutConfig(env_name=TOY, mode="episode", continuation_policy="wanderer", episode_decisions=2)
    curious, calls = curious_reward()
    funcs = [curious, rewards.final_score_reward]
    rollout = EpisodeRollout(config, toy_env.TOY)
    trainer = tiny_trainer(
        tokenizer, tmp_path, rollout, funcs, trainer_cls=partial(RecruitGRPOTrainer, episode_advantages=True)
    )
    trainer._generate_and_score_completions(dataset_rows(trainer))
    steps, trl = calls  # the rollout's call on the step rows, then TRL's on the rows it trains
    assert steps["names"] == trl["names"] - {"advantage"} and steps["names"] >= TRL_NAMES | {"task", "seed", "day"}
    assert steps["trainer_state"] is trl["trainer_state"] is trainer.state
    assert steps["prompts"] == [ANCHOR.key()] * 4 == trl["prompts"] * 2  # 2 episodes x 2 decisions
    assert {tuple(ids) for ids in steps["completion_ids"]} >= {tuple(ids) for ids in trl["completion_ids"]}
    assert set(steps["completions"]) <= set(ANSWERS) and steps["kwargs"]["policy"] == ["wanderer"] * 4

    episodes = rollout.play(trainer, None, tokenizer, None, [ANCHOR], 2, step=STEP)
    for e in episodes:  # curious scores STEP on every row; the final score only on the last
        assert e["step_rewards"][0] == STEP and e["step_rewards"][-1] == pytest.approx(STEP + e["final_score"])
    trainer.multi_objective_aggregation = "normalize_then_sum"
    with pytest.raises(ValueError, match="normalize_then_sum.*episode mode's step rewards"):
        rollout.play(trainer, None, tokenizer, None, [ANCHOR], 2, step=STEP)


# --------------------------------------------------------------------------------------------- _calculate_rewards
def trl_stub(reward_funcs, environments=None, async_loop=None):
    """What ``GRPOTrainer._calculate_rewards`` reads of the trainer (trl/trainer/grpo_trainer.py:1579-1683), so that
    TRL's own method runs on a handful of numbers."""
    metrics = []
    return SimpleNamespace(
        accelerator=SimpleNamespace(device=torch.device("cpu"), is_main_process=True),
        args=SimpleNamespace(report_to=[]),
        reward_funcs=list(reward_funcs),
        reward_processing_classes=[None] * len(reward_funcs),
        reward_func_names=[f.__name__ for f in reward_funcs],
        state=TrainerState(global_step=STEP),
        environments=environments,
        async_loop=async_loop,
        metrics=metrics,
        _log_metric=lambda name, value: metrics.append((name, value)),
        _log_completion_extra=lambda column, values: None,
    )


def trl_sum(rewards_per_func: torch.Tensor, weights: list[float]) -> torch.Tensor:
    """TRL's weighted sum of a batch, ``sum_then_normalize`` (trl/trainer/grpo_trainer.py:2756-2764), before the
    normalisation: ``nansum`` of the weighted rewards, NaN for a row that every function left out."""
    unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
    rewards = (rewards_per_func * torch.tensor(weights).unsqueeze(0)).nansum(dim=1)
    rewards[unscorable_mask] = torch.nan
    return rewards


def fixed(name, values, is_async=False):
    """A reward function that returns ``values`` (async if asked)."""

    def sync(completions, **kwargs):
        return list(values)

    async def coroutine(completions, **kwargs):
        await asyncio.sleep(0)
        return list(values)

    func = coroutine if is_async else sync
    func.__name__ = name
    return func


def test_the_sum_and_the_none_semantics_are_trls_on_the_same_numbers():
    """None and NaN are left out (nansum), a row that every function left out is unscorable (None here, NaN in TRL),
    a row only a weight-0 function scored is 0, and an async function is awaited: TRL's own _calculate_rewards and
    aggregation lines on the same functions give the same numbers."""
    nan = float("nan")
    funcs = [
        fixed("a", [1.0, None, None, None, 2.0]),
        fixed("b", [0.5, None, nan, None, None], is_async=True),
        fixed("c", [-1.0, None, None, 3.0, None]),
    ]
    weights = [2.0, -1.0, 0.0]
    prompts, completions, ids = ["p"] * 5, ["c"] * 5, [[1, 2]] * 5
    totals, parts = call_reward_funcs(funcs, weights, prompts=prompts, completions=completions, completion_ids=ids,
                                      fields={})  # fmt: skip
    assert totals == [1.5, None, None, 0.0, 4.0]
    assert parts["b"][:2] == [0.5, None] and math.isnan(parts["b"][2])  # as each function returned them

    thread, loop, ready = start_event_loop_in_daemon()
    ready.wait()
    try:
        stub = trl_stub(funcs, async_loop=loop)
        per_func = GRPOTrainer._calculate_rewards(stub, [{"prompt": "p"}] * 5, prompts, completions, ids)
    finally:
        shutdown_event_loop_in_daemon(thread, loop)
    ours = torch.tensor([[nan if v is None else v for v in parts[f.__name__]] for f in funcs]).T
    assert torch.equal(torch.isnan(per_func), torch.isnan(ours))
    assert torch.allclose(per_func.nan_to_num(), ours.nan_to_num())
    trl_totals = trl_sum(per_func, weights).tolist()
    assert [None if math.isnan(t) else pytest.approx(t) for t in trl_totals] == totals


def test_the_keyword_arguments_are_trls():
    """The same names and values as TRL's _calculate_rewards passes for the same rows: prompts, completions,
    completion_ids, every column, trainer_state, log_extra and log_metric."""
    trl_func, trl_calls = curious_reward()
    ours_func, our_calls = curious_reward()
    ours_func.__name__ = trl_func.__name__ = "curious"
    inputs = [{"prompt": "p0", "task": "near", "valid": 1.0}, {"prompt": "p1", "task": "far", "valid": 0.0}]
    prompts, completions, ids = ["p0", "p1"], ["x", "y"], [[5], [6, 7]]
    stub = trl_stub([trl_func])
    GRPOTrainer._calculate_rewards(stub, inputs, prompts, completions, ids)
    logged = []
    totals, _ = call_reward_funcs(
        [ours_func], None, prompts=prompts, completions=completions, completion_ids=ids,
        fields={"task": ["near", "far"], "valid": [1.0, 0.0]}, trainer_state=stub.state,
        log_metric=lambda name, value: logged.append((name, value)),
    )  # fmt: skip
    (trl_call,), (our_call,) = trl_calls, our_calls
    assert our_call["names"] == trl_call["names"] == TRL_NAMES | {"task", "valid"}
    for name in ("prompts", "completions", "completion_ids", "trainer_state"):
        assert our_call[name] == trl_call[name], name
    assert our_call["kwargs"]["task"] == trl_call["kwargs"]["task"] and totals == [STEP, STEP]
    assert logged == stub.metrics == [("curious/calls", 1.0)]


def test_what_cannot_be_called_per_row_is_refused_clearly():
    row = {"prompts": ["p"], "completions": ["c"], "completion_ids": [[1]], "fields": {}}
    ok = fixed("ok", [1.0])
    with pytest.raises(ValueError, match="normalize_then_sum.*sum_then_normalize"):
        call_reward_funcs([ok], None, aggregation="normalize_then_sum", **row)
    with pytest.raises(ValueError, match="Invalid multi_objective_aggregation: mean"):
        call_reward_funcs([ok], None, aggregation="mean", **row)
    with pytest.raises(TypeError, match="reward model"):
        call_reward_funcs([torch.nn.Linear(1, 1)], None, **row)
    with pytest.raises(ValueError, match="returned 2 rewards, but 1 were expected"):
        call_reward_funcs([fixed("two", [1.0, 2.0])], None, **row)
    with pytest.raises(ValueError, match=r"one value per completion \(1\).*'completion_ids': 2"):
        call_reward_funcs([ok], None, **{**row, "completion_ids": [[1], [2]]})
    with pytest.raises(ValueError, match=r"\['trainer_state'\] have the names of arguments TRL passes"):
        call_reward_funcs([ok], None, **{**row, "fields": {"trainer_state": [0]}})
    with pytest.raises(ValueError, match="one weight per reward function"):
        call_reward_funcs([ok], [1.0, 2.0], **row)

    async def inside_a_loop():
        return call_reward_funcs([fixed("later", [1.0], is_async=True)], None, **row)

    with pytest.raises(RuntimeError, match="outside a running loop"):
        asyncio.run(inside_a_loop())
    with pytest.raises(ValueError, match="normalize_then_sum"):
        environment_factory(TOY, interface=toy_env.TOY, aggregation="normalize_then_sum")


def test_an_unscorable_step_counts_zero_with_one_warning_and_a_count(caplog):
    """Episode mode with final_score_reward alone: only an episode's last step row is scored; the others count 0
    (one warning), and the tool loop counts its unscorable steps the same way."""
    rewards._WARNED.discard("test")
    with caplog.at_level(logging.WARNING, logger="rewards"):
        assert unscorable_as_zero([1.0, None, None], "test") == ([1.0, 0.0, 0.0], 2)
        assert unscorable_as_zero([None], "test") == ([0.0], 1)
    assert [r.getMessage() for r in caplog.records].count(
        "test: 2 of 3 rows were scored by no reward function (every one returned None); they count 0. Add a reward "
        "function that scores every row (e.g. format_reward) to give them a reward."
    ) == 1 and len(caplog.records) == 1

    env = environment_factory(TOY, interface=toy_env.TOY, reward_funcs=["final_score_reward"])()
    env.reset(task="near", seed=0)
    env.act(1)
    env.act(1)
    assert env.get_reward() == 0.0 and env.unscorable_steps == 2 and env.summary["unscorable_steps"] == 2


# --------------------------------------------------------------------------------------------- the tool loop
def test_the_tool_loops_steps_get_trls_arguments_for_their_rollout():
    """TRL's _calculate_rewards on two tool-loop rollouts: the weight-0 part functions hand each environment its
    row of TRL's arguments, and get_reward (built as TRL builds it) calls the functions on every step with them."""
    curious, calls = curious_reward()
    factory = environment_factory(TOY, interface=toy_env.TOY, reward_funcs=[curious, "final_score_reward"],
                                  reward_weights=[1.0, 2.0])  # fmt: skip
    rows = [dict(r) for r in environment_dataset(factory, ["near"], [0, 1])]
    environments, prompts = [factory(), factory()], []
    for env, row, moves in zip(environments, rows, (2, 3), strict=True):
        text = env.reset(**row)
        for _ in range(moves):
            env.act(1)
        # The prompt TRL passes for the rollout: the row's, reset's text appended (grpo_trainer.py:2391-2397).
        prompts.append(row["prompt"][:-1] + [{**row["prompt"][-1], "content": row["prompt"][-1]["content"] + text}])

    def get_reward(environments, **kwargs):  # as TRL wraps get_reward (trl/trainer/grpo_trainer.py:724-725)
        return [e.get_reward() for e in environments]

    get_reward.__name__ = factory.__name__
    funcs = [*reward_part_funcs(factory), get_reward]
    stub = trl_stub(funcs, environments=environments)
    completions = [[{"role": "assistant", "content": "..."}]] * 2
    per_func = GRPOTrainer._calculate_rewards(stub, rows, prompts, completions, [[1, 2, 3], [4, 5]])
    first, second = calls  # once per rollout, on its step rows (the score is kept for get_reward)
    assert first["prompts"] == [prompts[0]] * 2 and second["prompts"] == [prompts[1]] * 3
    assert first["completion_ids"] == [[1, 2, 3]] * 2 and second["completion_ids"] == [[4, 5]] * 3
    assert first["trainer_state"] is second["trainer_state"] is stub.state
    assert first["completions"] == ['{"action_index": 1}'] * 2 and first["kwargs"]["seed"] == [0, 0]
    assert first["names"] == TRL_NAMES | {"environments", "task", "seed", *toy_env.TOY.reward_fields, *ROW_FIELDS}
    assert per_func[:, 2].tolist() == [STEP * 2, STEP * 3]  # curious on every step, weight 1
    assert per_func[:, 0].tolist() == [STEP * 2, STEP * 3] and stub.metrics == [("curious/calls", 1.0)] * 2

    alone = factory()  # get_reward called directly: reset's row, no trainer
    alone.reset(**rows[0])
    alone.act(1)
    assert alone.get_reward() == 0.0 and calls[-1]["prompts"] == [prompts[0]]
    assert calls[-1]["trainer_state"] is None and calls[-1]["completion_ids"] == [None]


# --------------------------------------------------------------------------------------------- one meaning
def test_hypothesis_reward_is_additive_so_every_mode_scores_the_same_steps_alike():
    """One row of three steps (a branch, or episode mode's last decision with its continuation) scores what three
    one-step rows sum to (the tool loop, episode mode's decisions): the mean per row it was before did not."""
    accuracy = [1.0, 0.0, 0.3]
    one_row = hypothesis_reward([""], hypothesis_accuracy=[sum(accuracy)], scored_steps=[3])
    per_step = hypothesis_reward([""] * 3, hypothesis_accuracy=accuracy, scored_steps=[1, 1, 1])
    assert one_row == [pytest.approx(sum(per_step))]
    names = ["enrollment_reward", "screening_reward", "dropout_penalty", "milestone_reward", "hypothesis_reward"]
    fields = {"enrollment_gain": [1.0, 2.0], "screen_success": [0.0, 1.0], "dropout": [1.0, 0.0],
              "milestone_bonus": [0.02, 0.0], "hypothesis_accuracy": [1.0, 0.3], "scored_steps": [1, 1]}  # fmt: skip
    merged = {name: [sum(values)] for name, values in fields.items()}
    for func in get_reward_funcs(names):
        assert func([""], **merged) == [pytest.approx(sum(func([""] * 2, **fields)))], func.__name__

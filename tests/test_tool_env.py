"""TRL's ``environment_factory`` over recruit_trl environments (``recruit_trl.rollout.tool_env``): reset / the one
tool / get_reward on both environments, invalid calls, budget cuts, the one-tool chat dialect, and the real recipe for
one step."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from recipe_files import load_recipe

import recruit_trl
from recruit_trl.contracts import INDEX_INSTRUCTIONS, build_messages, digest
from recruit_trl.protocol import get_env_interface
from recruit_trl.rollout.tool_env import (
    METRIC_FUNCS,
    TOOL_CHAT_TEMPLATE,
    TOOL_INSTRUCTIONS,
    ToolEnvironment,
    environment_dataset,
    environment_factory,
    reward_part_funcs,
    tool_calling_tokenizer,
)

ROOT = Path(__file__).parents[1]
CASES = [("clinical", "easy_bench"), ("conquest", "duel")]


def twin(name: str, task: str, seed: int):
    """The same environment played directly, to compare with the tool's."""
    interface = get_env_interface(name)
    env = interface.make_env(task)
    obs, _ = env.reset(seed=seed)
    return interface, env, obs


@pytest.mark.parametrize(("name", "task"), CASES)
def test_reset_reads_the_row_and_returns_the_contract_prompt(name, task):
    cls = environment_factory(name)
    env = cls()
    text = env.reset(prompt=[{"role": "user", "content": ""}], task=task, seed=3, day=7, other="ignored")
    interface, _, obs = twin(name, task, 3)
    assert text == build_messages(interface, obs, [], "index")[-1]["content"]
    assert (env.task, env.seed, env.decisions, env.done) == (task, 3, 0, False)
    assert env.candidates == interface.candidate_actions(obs)
    assert cls.system_prompt == f"{interface.system_prompt}\n{TOOL_INSTRUCTIONS}"
    assert environment_factory(name, task=task)().reset(seed="3") == text  # the row's default task; a str seed
    assert cls.__name__ == f"{name.capitalize()}ToolEnv" and issubclass(cls, ToolEnvironment)


@pytest.mark.parametrize(("name", "task"), CASES)
def test_act_plays_the_listed_candidate_and_answers_with_the_next_state(name, task):
    env = environment_factory(name, recent_k=2)()
    env.reset(task=task, seed=5)
    interface, direct, obs = twin(name, task, 5)
    recent, total = [], 0.0
    for day, k in enumerate([1, 0, 2]):
        candidates = interface.candidate_actions(obs)
        k = min(k, len(candidates) - 1)
        text = env.act(k)
        obs, reward, terminated, truncated, info = direct.step(candidates[k])
        recent.append(digest(interface, day, candidates[k], info))
        total += reward
        assert not (terminated or truncated)
        assert text == build_messages(interface, obs, recent[-2:], "index")[-1]["content"]
    assert env.obs == obs and env.decisions == env.tool_calls == 3 and env.invalid_calls == 0
    assert env.running_return == pytest.approx(total)


@pytest.mark.parametrize(("name", "task"), CASES)
def test_invalid_calls_are_counted_and_answered_with_the_fallback_action(name, task):
    env = environment_factory(name)()
    env.reset(task=task, seed=1)
    interface, direct, obs = twin(name, task, 1)
    for bad, reason in [(10_000, "index_out_of_range"), (-1, "index_out_of_range"), ("2", "index_not_int"),
                        (True, "index_not_int"), (1.0, "index_not_int"), (None, "index_not_int")]:  # fmt: skip
        fallback = interface.fallback_action(obs)
        text = env.act(bad)
        obs, *_ = direct.step(fallback)
        played = interface.describe_action(fallback)
        assert text.startswith(f"Invalid action_index ({reason}): played instead: {played}")
        assert env.obs == obs
    assert env.invalid_calls == 6 and env.decisions == 6
    assert env.invalid_reasons == {"index_out_of_range": 2, "index_not_int": 4}
    assert env.summary["invalid_calls"] == 6


def test_an_action_the_environment_rejects_plays_the_fallback(monkeypatch):
    env = environment_factory("conquest")()
    env.reset(task="duel", seed=0)
    fallback = env.interface.fallback_action(env.obs)
    real_step, played = env.env.step, []

    def step(action):
        played.append(action)
        if action != fallback:
            raise ValueError("not legal now")
        return real_step(action)

    monkeypatch.setattr(env.env, "step", step)
    assert env.act(3).startswith("Invalid action_index (env_rejected)")
    assert played[-1] == fallback and env.invalid_reasons == {"env_rejected": 1}


@pytest.mark.parametrize(("name", "task"), CASES)
def test_a_whole_episode_ends_with_the_final_score(name, task):
    env = environment_factory(name, reward_funcs=["final_score_reward"])()
    text = env.reset(task=task, seed=2)
    interface, direct, obs = twin(name, task, 2)
    while not env.done:
        text = env.act(0)
        obs, reward, terminated, truncated, info = direct.step(interface.candidate_actions(obs)[0])
    assert terminated or truncated
    final = interface.final_score(info)
    assert final is not None and env.final_score == final
    assert text == f"Episode over after {env.decisions} decisions: {interface.outcome(info)}, final score {final:.6g}."
    assert env.get_reward() == final and env.cut_by is None  # the final score is on the last step's row only
    decisions = env.decisions
    assert env.act(0).startswith("The episode is over; nothing was played.")
    assert (env.decisions, env.calls_after_end, env.get_reward()) == (decisions, 1, final)


CONQUEST_PARTS = ["territory_reward", "continent_reward", "elimination_reward", "invalid_penalty", "outcome_reward"]


def test_a_cut_episode_is_scored_by_its_steps_and_says_why():
    # conquest's step reward is the sum of its components: their functions, weight 1 each, sum to the running return.
    cls = environment_factory("conquest", max_tool_calls=2, reward_funcs=CONQUEST_PARTS)
    env = cls()
    env.reset(task="duel", seed=4)
    assert env.get_reward() == 0.0 and env.cut_by == "no_tool_call"
    env.act(0)
    env.act(1)
    assert not env.done and env.get_reward() == pytest.approx(env.running_return) and env.running_return != 0.0
    assert env.cut_by == "tool_call_budget"
    never_reset = environment_factory("conquest")()
    assert never_reset.get_reward() == 0.0  # nothing played
    with pytest.raises(RuntimeError, match="reset"):
        never_reset.act(0)
    env.reset(task="duel", seed=4)  # a reset forgets the episode
    assert (env.decisions, env.running_return, env.step_rows, env.cut_by) == (0, 0.0, [], None)


def test_get_reward_is_the_weighted_sum_of_the_reward_functions_over_the_step_rows():
    """By hand: each function on each step row, weighted, summed; the final score only on the step that ended."""
    names = ["potential_reward", "format_reward", "win_reward", "territory_reward", "outcome_reward"]
    weights = [2.0, 0.5, 3.0, -1.0, 0.25]
    cls = environment_factory("conquest", task="duel", reward_funcs=names, reward_weights=weights)
    conquest = get_env_interface("conquest")
    env = cls()
    env.reset(seed=1)
    by_hand, before = 0.0, env.obs
    answers = [0, 99, 1, 2]  # 99: not listed, the fallback plays and the step's format is 0
    while not env.done:
        k = answers[env.decisions % len(answers)]
        listed = k < len(env.candidates)
        env.act(k)
        info = env._last_info
        ended = env.done
        win = float(conquest.final_score(info) == 1.0) if ended else 0.0
        comps = info["reward_components"]
        by_hand += (2.0 * (conquest.potential(env.obs) - conquest.potential(before)) + 0.5 * (float(listed) - 1.0)
                    + 3.0 * win - comps["territory"] + 0.25 * comps["outcome"])  # fmt: skip
        before = env.obs
    assert env.decisions > 4 and env.invalid_calls > 0 and env.final_score is not None
    assert env.get_reward() == pytest.approx(by_hand)
    assert [row["final_score"] for row in env.step_rows].count(None) == env.decisions - 1
    parts = env.reward_parts
    assert parts["format_reward"] == -env.invalid_calls
    assert sum(w * parts[n] for n, w in zip(names, weights, strict=True)) == pytest.approx(by_hand)
    # The weight-0 functions that log each part, as TRL calls them with the rollouts' environments.
    logged = {f.__name__: f(environments=[env, object()], prompts=[]) for f in reward_part_funcs(cls)}
    assert logged == {n: [parts[n], None] for n in names}


def test_reward_functions_that_cannot_apply_in_the_tool_loop_are_refused():
    with pytest.raises(ValueError, match="teacher_match_reward applies to branch mode only"):
        environment_factory("conquest", reward_funcs=["teacher_match_reward"])
    with pytest.raises(ValueError, match="potential_reward: this environment defines no potential"):
        environment_factory("clinical", reward_funcs=["potential_reward"])
    with pytest.raises(ValueError, match="one weight per"):
        environment_factory("conquest", reward_funcs=["win_reward"], reward_weights=[1.0, 2.0])
    with pytest.raises(ValueError, match="Unknown reward"):
        environment_factory("conquest", reward_funcs=["no_such_reward"])


def test_metric_functions_read_the_rollouts_environments():
    cls = environment_factory("conquest", task="duel")
    ended, cut = cls(), cls()
    ended.reset(seed=0)
    while not ended.done:
        ended.act(0)
    cut.reset(seed=0)
    cut.act(99)
    rows = {f.__name__: f(environments=[ended, cut, object()], prompts=[]) for f in METRIC_FUNCS}
    assert rows == {
        "episode_ended": [1.0, 0.0, None],
        "decisions": [float(ended.decisions), 1.0, None],
        "invalid_calls": [0.0, 1.0, None],
    }


def test_trl_sees_exactly_one_tool_with_its_schema():
    from transformers.utils import get_json_schema

    cls = environment_factory("clinical")
    members = [n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction)]  # what GRPOTrainer lists
    assert [n for n in members if not n.startswith("_") and n not in ("reset", "get_reward")] == ["act"]
    schema = get_json_schema(cls().act)["function"]
    assert schema["name"] == "act" and schema["parameters"]["required"] == ["action_index"]
    assert schema["parameters"]["properties"]["action_index"]["type"] == "integer"
    assert recruit_trl.environment_factory is environment_factory


def test_any_environment_by_module_attribute_and_the_dataset_rows():
    cls = environment_factory("tests.toy_env:TOY", instructions=INDEX_INSTRUCTIONS)
    assert cls.__name__ == "ToyToolEnv" and cls.system_prompt.endswith(INDEX_INSTRUCTIONS)
    env = cls()
    assert "Actions:" in env.reset(task="near", seed=0)
    rows = environment_dataset(cls, ["near", "far"], range(3))
    assert len(rows) == 6 and rows[4]["task"] == "far" and rows[4]["seed"] == 1
    assert rows[0]["prompt"] == [{"role": "system", "content": cls.system_prompt}, {"role": "user", "content": ""}]
    with pytest.raises(ValueError, match="Unknown environment"):
        environment_factory("no_such_env")
    with pytest.raises(ValueError, match="max_tool_calls"):
        environment_factory("conquest", max_tool_calls=0)


@pytest.fixture(scope="module")
def conquest_model(tmp_path_factory) -> str:
    """A small tiny model warmed on conquest duel texts: it answers the index contract most of the time."""
    from recruit_trl.traces import collect_traces
    from recruit_trl.workflow.tiny_model import build_tiny_model

    rows = collect_traces(get_env_interface("conquest"), ["duel"], range(2), epsilon=0.5, relabel=False)
    model = build_tiny_model(
        tmp_path_factory.mktemp("tool_env") / "model", rows, hidden_size=64, num_layers=1, num_heads=2,
        num_kv_heads=1, intermediate_size=128, max_steps=60, batch_size=8, lr=5e-3, num_threads=1, progress=False,
    )  # fmt: skip
    return str(model)


def test_the_one_tool_dialect_renders_the_rollouts_prompts_and_parses_the_contract(conquest_model):
    from transformers import AutoTokenizer
    from trl.chat_template_utils import is_chat_template_prefix_preserving, parse_response, supports_tool_calling

    from recruit_trl.models.generation import encode_prompt

    tokenizer = AutoTokenizer.from_pretrained(conquest_model)
    plain = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
    ]
    before = tokenizer.apply_chat_template(plain, tokenize=False)
    assert not supports_tool_calling(tokenizer)
    assert tool_calling_tokenizer(tokenizer) is tokenizer and tokenizer.chat_template == TOOL_CHAT_TEMPLATE
    assert supports_tool_calling(tokenizer) and is_chat_template_prefix_preserving(tokenizer)
    assert tokenizer.apply_chat_template(plain, tokenize=False) == before  # no tools: the tiny model's ChatML

    cls = environment_factory("conquest", task="duel", instructions=INDEX_INSTRUCTIONS)
    env = cls()
    messages = [{"role": "system", "content": cls.system_prompt}, {"role": "user", "content": env.reset(seed=0)}]
    interface, _, obs = twin("conquest", "duel", 0)
    rollout_prompt = encode_prompt(tokenizer, build_messages(interface, obs, [], "index"))
    prompt = tokenizer.apply_chat_template(messages, tools=[env.act], add_generation_prompt=True, return_dict=False)
    assert prompt == rollout_prompt  # the tool loop's first prompt is the rollouts' prompt, token for token
    call = {"type": "function", "function": {"name": "act", "arguments": {"action_index": 3}}}
    reply = env.act(3)
    messages += [{"role": "assistant", "content": "", "tool_calls": [call]}, {"role": "tool", "name": "act",
                                                                               "content": reply}]  # fmt: skip
    text = tokenizer.apply_chat_template(messages, tools=[env.act], add_generation_prompt=True, tokenize=False)
    head = tokenizer.decode(rollout_prompt) + '{"action_index": 3}<|im_end|>'
    assert text == head + "\n<|im_start|>user\n" + reply + "<|im_end|>\n<|im_start|>assistant\n"  # the next user turn

    def parsed(answer: str) -> dict:
        ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
        return parse_response(tokenizer, ids, prefix=prompt, tools=[env.act])

    assert parsed('{"action_index": 4}<|im_end|>')["tool_calls"] == [
        {"type": "function", "function": {"name": "act", "arguments": {"action_index": 4}}}
    ]
    for not_a_call in ["I attack.<|im_end|>", '{"action_index": 4<|im_end|>', '{"action_index": 4} ok<|im_end|>']:
        assert "tool_calls" not in parsed(not_a_call), not_a_call


def test_a_template_with_tool_calls_is_kept_and_other_templates_are_refused():
    from types import SimpleNamespace

    from trl.chat_template_utils import qwen2_5_chat_template

    from recruit_trl.workflow.tokenizer import build_tokenizer

    tokenizer = build_tokenizer(["hello world"], vocab_size=300)
    tokenizer.chat_template = qwen2_5_chat_template
    assert tool_calling_tokenizer(tokenizer).chat_template == qwen2_5_chat_template
    llama = SimpleNamespace(chat_template="{{ messages[0]['content'] }}", eos_token="</s>")
    llama.apply_chat_template = lambda *a, **k: "hi"
    with pytest.raises(ValueError, match="not ChatML"):
        tool_calling_tokenizer(llama)


def test_recipe_config():
    """The recipe's own config (recipes/configs/grpo_environment_factory.yaml): conquest duel, the game's episode
    rewards; on another environment the rewards are named with it."""
    recipe = load_recipe("grpo_environment_factory")
    script_args, training_args, model_args = recipe.parse_args([])
    assert (script_args.env_name, script_args.tasks, model_args.model_name_or_path) == ("conquest", ["duel"], "tiny")
    assert training_args.max_steps == 4 and model_args.use_peft and training_args.max_tool_calling_iterations == 8
    assert training_args.generation_kwargs == {"max_new_tokens": 12}
    assert (script_args.reward_funcs, training_args.reward_weights) == (["win_reward", "potential_reward"], [1.0, 1.0])
    clinical, clinical_training, _ = recipe.parse_args([
        "--env", "clinical", "--tasks", "easy_bench", "--tiny_tasks", "easy_bench",
        "--reward_funcs", "final_score_reward", "format_reward", "--reward_weights", "1.0", "0.5",
    ])  # fmt: skip
    assert (clinical.reward_funcs, clinical_training.reward_weights) == (["final_score_reward", "format_reward"],
                                                                         [1.0, 0.5])  # fmt: skip
    with pytest.raises(ValueError, match="teacher_match_reward applies to branch mode only"):
        recipe.parse_args(["--reward_funcs", "teacher_match_reward", "--reward_weights", "1"])
    with pytest.raises(ValueError, match="one weight per --reward_funcs"):
        recipe.parse_args(["--reward_funcs", "win_reward"])


def test_recipe_trains_one_step_and_saves_the_adapter(conquest_model, tmp_path):
    """``python recipes/grpo_environment_factory.py --max_steps 1 --output_dir DIR``, with the small test model."""
    argv = [sys.executable, "recipes/grpo_environment_factory.py", "--max_steps", "1", "--output_dir", str(tmp_path),
            "--model_name_or_path", conquest_model]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "adapter_config.json").is_file() and (tmp_path / "adapter_model.safetensors").is_file()
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert info["global_step"] == 1 and info["chat_template"] == "recruit_trl.rollout.tool_env.TOOL_CHAT_TEMPLATE"
    (logged,) = [h for h in info["log_history"] if "rewards/ConquestToolEnv/mean" in h]
    for key in ("tools/call_frequency", "rewards/episode_ended/mean", "rewards/decisions/mean",
                "rewards/invalid_calls/mean", "rewards/win_reward/mean", "rewards/potential_reward/mean"):  # fmt: skip
        assert key in logged, key
    saved = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert saved["response_template"]["fields"]["tool_calls"]["transform"]["function"]["name"] == "act"

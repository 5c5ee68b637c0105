"""conquest's agent interface (``env/conquest/agent.py``) as recruit_trl uses it: registration, ``recruit-trl eval``,
the candidate / ``index`` contract round trip, the fallback on bad answers, reward fields, and the prompt budget
(system + board + candidates within 700 tokens of the tiny model's tokenizer in 200 sampled states)."""

from __future__ import annotations

import json
import random

import pytest

from env.conquest import ConquestEnv, get_policy
from env.conquest.agent import AGENT_FIELDS, CONQUEST, REWARD_FIELDS, ConquestAgentEnv, RemoteConquestAgentEnv
from recruit_trl.cli import main
from recruit_trl.contracts import build_messages, digest, parse_action
from recruit_trl.models.generation import encode_prompt
from recruit_trl.protocol import get_env_interface
from recruit_trl.traces import collect_traces
from recruit_trl.workflow.tokenizer import build_tokenizer, tokenizer_texts

POLICIES = ("random", "safe", "aggressive", "balanced", "teacher")
PROMPT_BUDGET = 700  # tokens: system + board + candidates (docs/conquest.md reports the measured maximum)
BAD_ANSWERS = ("", "nope", '{"action_index": 99}', '{"action_index": true}', '{"action_index": 1, "x": 2}', "[0]")


def spec_view(obs: dict) -> dict:
    """The spec's observation inside a ConquestAgentEnv observation."""
    return {k: v for k, v in obs.items() if k not in AGENT_FIELDS}


def test_conquest_is_registered_by_its_entry_point():
    assert get_env_interface("conquest") is CONQUEST
    assert list(CONQUEST.tasks()) == ["duel", "easy3", "classic3", "classic6"]
    assert CONQUEST.terminal_action_types == frozenset()
    assert isinstance(CONQUEST.make_env("duel"), ConquestAgentEnv)
    assert [row["id"] for row in CONQUEST.describe_tasks(False)] == list(CONQUEST.tasks())


def test_eval_command_line_plays_conquest(tmp_path, capsys):
    out = tmp_path / "conquest.json"
    argv = ["eval", "--env", "conquest", "--task", "duel", "--seeds", "0-1", "--json", str(out), "--no_progress"]
    assert main([*argv, "--policy", "balanced", "--policy", "safe", "--teacher", "teacher"]) == 0
    rows = json.loads(out.read_text())["results"]
    assert [(r["policy"], r["task"], r["episodes"]) for r in rows] == [("balanced", "duel", 2), ("safe", "duel", 2)]
    for row in rows:
        assert 0.0 <= row["final_score_mean"] <= 1.0 and row["valid_action_rate"] == 1.0
        assert row["win_rate"] in (0.0, 0.5, 1.0) and "win_mean" not in row and 0 < row["rounds_mean"] <= 100
        assert 0 <= row["territories_mean"] <= 42
    balanced, safe = rows
    assert balanced["teacher_match"] == 1.0  # the teacher is the balanced action, listed as a candidate
    assert safe["action_types"].get("attack", 0) == safe["action_types"].get("blitz", 0) == 0  # never attacks
    assert "win" in capsys.readouterr().out.splitlines()[0]


def test_the_agent_env_adds_prompt_fields_to_the_spec_observation():
    env, twin = CONQUEST.make_env("classic3"), ConquestEnv("classic3")
    obs, _ = env.reset(seed=3)
    assert spec_view(obs) == twin.reset(seed=3)[0]
    assert obs["candidates"] == env.candidates() and obs["board_text"] == env.render_text()
    assert [f"{k}. {text}" for k, text in enumerate(obs["candidate_texts"])] == env.render_candidates()
    assert CONQUEST.render(obs, ["d0 end turn: ok"]) == env.render_text()
    with pytest.raises(ValueError, match="ConquestAgentEnv"):
        CONQUEST.candidate_actions(spec_view(obs))


@pytest.mark.parametrize("task", ["duel", "classic3"])
def test_index_contract_round_trip(task):
    """Answer k -> obs["candidates"][k] -> env.step re-validates it: the same game as the spec's step_index(k)."""
    env, twin = CONQUEST.make_env(task), ConquestEnv(task)
    obs, _ = env.reset(seed=5)
    twin.reset(seed=5)
    rng, teacher, safe = random.Random(0), get_policy("teacher"), get_policy("safe")
    done, steps = False, 0
    while not done and steps < 150:
        candidates = CONQUEST.candidate_actions(obs)
        assert 1 <= len(candidates) <= 12 and len({json.dumps(c) for c in candidates}) == len(candidates)
        assert candidates[0] == CONQUEST.fallback_action(obs) == safe.act(env)
        assert teacher.act(env) in candidates
        k = rng.randrange(len(candidates))
        parsed = parse_action(json.dumps({"action_index": k}), "index", CONQUEST, obs, candidates)
        assert parsed.valid and parsed.action == candidates[k]
        assert CONQUEST.describe_action(parsed.action, obs) == env.render_candidates()[k].split(". ", 1)[1]
        obs, reward, terminated, truncated, info = env.step(parsed.action)
        expected = twin.step_index(k)
        assert (spec_view(obs), reward, terminated, truncated) == expected[:4]
        assert info["action"] == candidates[k] and not info["fallback"] and info["last_action_error"] is None
        components = CONQUEST.step_components({}, parsed.action, obs, reward, info)
        assert list(components) == list(REWARD_FIELDS) and round(sum(components.values()), 6) == reward
        done, steps = terminated or truncated, steps + 1
        assert (CONQUEST.final_score(info) is not None) == done


def test_bad_answers_fall_back_to_the_safe_action():
    env = CONQUEST.make_env("classic3")
    obs, _ = env.reset(seed=1)
    candidates = CONQUEST.candidate_actions(obs)
    for text in BAD_ANSWERS:
        parsed = parse_action(text, "index", CONQUEST, obs, candidates)
        assert not parsed.valid and parsed.action == candidates[0], text
    snap = env.snapshot()
    _, reward_safe, *_, info = env.step(candidates[0])
    assert not info["fallback"] and info["reward_components"]["invalid"] == 0.0
    env.restore(snap)
    # A well-formed but illegal action: the environment plays candidate 0 and charges the penalty.
    illegal = {"type": "place", "territory": "alaska", "n": 1000}
    _, reward, *_, info = env.step(illegal)
    assert info["fallback"] and info["last_action_error"] == "illegal" and info["action"] == candidates[0]
    assert info["reward_components"]["invalid"] == -0.05 and reward == round(reward_safe - 0.05, 6)
    assert CONQUEST.outcome(info) == "illegal"
    assert digest(CONQUEST, 4, illegal, info) == "d4 place 1000 ALA: illegal"


def test_episode_metrics_and_final_score_at_the_end():
    env = CONQUEST.make_env("duel")
    obs, _ = env.reset(seed=0)
    policy, done = get_policy("balanced"), False
    while not done:
        obs, _, terminated, truncated, info = env.step(policy.act(env, obs=obs))
        done = terminated or truncated
    assert info["outcome"] == "win"  # balanced beats its balanced opponent on this seed (it moves first)
    assert CONQUEST.episode_metrics(obs, info) == {"win": 1.0, "rounds": float(obs["round"]), "territories": 42.0}
    assert CONQUEST.outcome(info) == "win" and CONQUEST.final_score(info) == env.final_score() == 1.0
    assert CONQUEST.candidate_actions(obs) == [] and CONQUEST.fallback_action(obs) == {"type": "end_turn"}
    # A loss: the safe agent never attacks; its rounds stop at the round of its elimination.
    obs, _ = env.reset(seed=0)
    policy, done = get_policy("safe"), False
    while not done:
        obs, _, terminated, truncated, info = env.step(policy.act(env, obs=obs))
        done = terminated or truncated
    assert info["outcome"] == "loss" and CONQUEST.episode_metrics(obs, info)["territories"] == 0.0
    assert CONQUEST.episode_metrics(obs, info)["win"] == 0.0 and 0.0 <= CONQUEST.final_score(info) <= 0.25


def test_remote_env_observes_like_the_local_one():
    """``remote_env``'s client adds the prompt fields from the server's replies and ``GET /state``."""
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from env.client import RemoteEnv
    from env.server import ServerSettings, create_app

    client = TestClient(create_app(ServerSettings(), "conquest"), base_url="http://127.0.0.1")
    remote = RemoteConquestAgentEnv(RemoteEnv("http://127.0.0.1", task="duel", env="conquest", http_client=client))
    local = CONQUEST.make_env("duel")
    assert remote.reset(seed=2) == local.reset(seed=2)
    teacher, done, steps = get_policy("teacher"), False, 0
    while not done:
        action = teacher.act(local) if steps % 7 else {"type": "place", "territory": "alaska", "n": 999}
        expected = local.step(action)
        obs, *rest = remote.step(action)
        done, steps = expected[2] or expected[3], steps + 1
        if done:  # the server has deleted the finished session: no board to fetch, nothing to list
            assert (obs["board_text"], obs["candidates"]) == ("", []) and rest == list(expected[1:])
        else:
            assert (obs, *rest) == expected
            assert CONQUEST.render(obs, []) == local.render_text()
    assert expected[4]["final_score"] is not None and steps > 10
    with pytest.raises(RuntimeError, match="in-process"):
        teacher.act(remote)
    remote.close()


# ---------------------------------------------------------------------------------------------------------------
# Prompt budget


def conquest_tokenizer():
    """The tiny model's tokenizer (``recruit_trl.workflow.tiny_model``: a byte-level BPE of 2048 entries) trained on
    teacher traces of every task, as a conquest warm-up corpus would train it."""
    rows = collect_traces(CONQUEST, list(CONQUEST.tasks()), [0], teacher="teacher", epsilon=0.3, max_days=150)
    return build_tokenizer(tokenizer_texts(rows), vocab_size=2048)


def sampled_prompt_sizes(tokenizer, per_episode: int = 10, largest: int = 4) -> list[tuple[int, str, str, int]]:
    """Prompt sizes (tokens) of 200 states: one episode per task and policy (seed 0), from each its ``largest``
    biggest prompts (the largest phases: a mandatory trade listing 11 sets, an attack with 11 blitz lines) and
    ``per_episode - largest`` more drawn at random. Rows: ``(tokens, task, policy, decision)``."""
    rng = random.Random(0)
    out = []
    for task in CONQUEST.tasks():
        for name in POLICIES:
            env, policy = CONQUEST.make_env(task), CONQUEST.get_policy(name)
            obs, _ = env.reset(seed=0)
            sizes, done = [], False
            while not done:
                sizes.append(len(encode_prompt(tokenizer, build_messages(CONQUEST, obs, [], "index"))))
                obs, _, terminated, truncated, _ = env.step(policy.act(env, obs=obs))
                done = terminated or truncated
            order = sorted(range(len(sizes)), key=lambda i: -sizes[i])
            picked = order[:largest] + rng.sample(order[largest:], per_episode - largest)
            out += [(sizes[i], task, name, i) for i in picked]
    return out


def test_prompts_fit_the_token_budget():
    samples = sampled_prompt_sizes(conquest_tokenizer())
    assert len(samples) == 200
    assert max(samples)[0] <= PROMPT_BUDGET, max(samples)

"""The planner policy (``planner:model:PATH``, recruit_trl.workflow.evaluation.planner): it scores proposals from a
snapshot with common random numbers, never moves the live environment, plays legal actions, and with one candidate
plays the model's own sampled episode."""

from __future__ import annotations

import json
import random

import pytest

from recruit_trl.cli import main as cli
from recruit_trl.protocol import get_env_interface, policy_action
from recruit_trl.workflow.evaluation.cache import cache_key
from recruit_trl.workflow.evaluation.evaluate import EvalConfig, evaluate
from recruit_trl.workflow.evaluation.planner import (
    CandidateScorer,
    PlannerSettings,
    default_continuation,
    planned_model,
)
from tests.toy_env import TOY

TASK = "hard_bench_stage_30"  # 30 decisions: a whole clinical episode in a second


def walk_far(seed: int = 0, moves: int = 0):
    env = TOY.make_env("far")  # target 8
    obs, _ = env.reset(seed=seed)
    for _ in range(moves):
        obs, *_ = env.step({"kind": "wait"})
    return env, obs


def test_candidates_are_scored_with_common_random_numbers_from_the_snapshot():
    # The random continuation never stops: with the same dice and the same moves after it, "right" ends exactly two
    # steps further right than "left", so on the far target it scores higher in every continuation.
    scorer = CandidateScorer(TOY, PlannerSettings(candidates=4, continuations=3, continuation_policy="random"), 0)
    env, _ = walk_far(seed=0, moves=2)
    before = env.snapshot()
    actions = [{"kind": "left"}, {"kind": "right"}, {"kind": "left"}, {"kind": "wait"}]
    choice = scorer.choose(env, actions, "far", seed=0, day=2)
    assert env.snapshot() == before  # the live environment is read, never stepped or re-seeded
    assert choice.index == 1 and choice.scored == 3 and choice.env_steps > 3
    left, right, left_again, wait = choice.means
    assert left == left_again and left < wait < right
    assert scorer.choose(env, actions, "far", seed=0, day=2).means == choice.means  # deterministic
    # Not clairvoyant: the same state with another true future (step RNG) gets the same scores.
    twin, _ = walk_far(seed=0, moves=2)
    twin.reseed(12345)
    assert scorer.choose(twin, actions, "far", seed=0, day=2).means == choice.means
    # Another decision (day) draws other dice.
    assert scorer.choose(env, actions, "far", seed=0, day=3).means != choice.means


def test_one_distinct_proposal_is_played_without_scoring():
    scorer = CandidateScorer(TOY, PlannerSettings(candidates=3), 0)
    env, _ = walk_far()
    choice = scorer.choose(env, [{"kind": "stop"}] * 3, "far", seed=0, day=0)
    assert (choice.index, choice.means, choice.scored, choice.env_steps) == (0, None, 0, 0)


def test_an_action_the_environment_rejects_scores_minus_infinity():
    class Refusing(type(TOY)):
        def make_env(self, task):
            env = super().make_env(task)
            step = env.step

            def checked(action):
                if action.get("kind") == "jump":
                    raise ValueError("no such move")
                return step(action)

            env.step = checked
            return env

    interface = Refusing()
    scorer = CandidateScorer(interface, PlannerSettings(candidates=2, continuation_policy="greedy"), 0)
    env, _ = walk_far()
    choice = scorer.choose(env, [{"kind": "jump"}, {"kind": "wait"}], "far", seed=0, day=0)
    assert choice.index == 1 and choice.means[0] == float("-inf")


def test_clinical_planning_leaves_the_live_episode_where_it_was():
    clinical = get_env_interface("clinical")
    env, twin = clinical.make_env(TASK), clinical.make_env(TASK)
    obs, _ = env.reset(seed=3)
    twin.reset(seed=3)
    scorer = CandidateScorer(clinical, PlannerSettings(candidates=3, continuations=2), 0)
    assert default_continuation(clinical) == "grader_heuristic"  # the continuation of its branch rollouts
    rng = random.Random(0)
    for day in range(4):
        actions = clinical.candidate_actions(obs)
        picks = [actions[rng.randrange(len(actions))] for _ in range(3)]
        choice = scorer.choose(env, picks, TASK, seed=3, day=day)
        played = picks[choice.index]
        obs, *_, info = env.step(played)
        twin_obs, *_, twin_info = twin.step(played)  # the same action in an episode nobody planned from
        assert json.dumps(obs, sort_keys=True, default=str) == json.dumps(twin_obs, sort_keys=True, default=str)
        assert info == twin_info


def test_one_candidate_plays_the_models_own_sampled_episodes(tiny_model):
    base = EvalConfig(env="clinical", tasks=(TASK,), seeds=(0, 1), constrained=True, policy_seed=3)
    own = evaluate([f"model:{tiny_model}"], EvalConfig(**{**base.__dict__, "temperature": 1.0}), progress=False,
                   labels=["policy"])  # fmt: skip
    planned = evaluate(
        [f"planner:model:{tiny_model}"],
        EvalConfig(**{**base.__dict__, "planner_candidates": 1, "planner_temperature": 1.0}),
        progress=False,
        labels=["policy"],
    )
    assert planned["results"] == own["results"]
    assert planned["config"]["planner_cost"]["policy"]["candidates_scored_per_decision"] == 0


def test_the_planner_plays_legal_actions_and_reports_its_cost(tiny_model, tmp_path, capsys):
    out, trace = tmp_path / "planner.json", tmp_path / "trace.jsonl"
    argv = ["eval", "--env", "clinical", "--task", TASK, "--seeds", "0-1", "--constrained", "--no_progress",
            "--policy", f"planner:model:{tiny_model}", "--planner_candidates", "4", "--planner_continuations", "2",
            "--json", str(out), "--trace", str(trace)]  # fmt: skip
    assert cli(argv) == 0
    printed = capsys.readouterr().out
    assert f"planner:model:{tiny_model}: seconds per episode" in printed
    report = json.loads(out.read_text())
    (row,) = report["results"]
    assert row["episodes"] == 2 and row["episode_length_mean"] <= 30  # the planner may stop recruiting early
    assert row["valid_action_rate"] == 1.0 and row["fallback_rate"] == 0.0 and row["strict_json_rate"] == 1.0
    cost = report["config"]["planner_cost"][f"planner:model:{tiny_model}"]
    assert cost["candidates_scored_per_decision"] > 1 and cost["env_steps_per_episode"] > 30
    assert cost["scoring_seconds_per_episode"] > 0
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(records) == 2 * row["episode_length_mean"] and all(record["valid"] for record in records)


def test_planner_names_and_settings_are_checked():
    assert planned_model("planner:model:some/path") == "some/path"
    assert planned_model("model:some/path") is None and planned_model("heuristic") is None
    for bad in ("planner:heuristic", "planner:model:"):
        with pytest.raises(ValueError, match="planner:model:PATH"):
            planned_model(bad)
    with pytest.raises(ValueError, match="temperature > 0"):
        PlannerSettings(candidates=4, temperature=0.0)
    with pytest.raises(ValueError, match="continuations >= 1"):
        PlannerSettings(continuations=0)
    PlannerSettings(candidates=1, temperature=0.0)  # one greedy proposal: the model itself
    with pytest.raises(ValueError, match="temperature > 0"):
        evaluate(["heuristic"], EvalConfig(env="clinical", planner_temperature=0.0), progress=False)
    with pytest.raises(ValueError, match="in-process"):
        evaluate(["planner:model:x"], EvalConfig(env="clinical", env_url="http://127.0.0.1:1"), progress=False)


def test_the_cache_key_holds_the_planners_settings_for_a_planner_only(tiny_model):
    config = EvalConfig(env="clinical", tasks=(TASK,), planner_candidates=5)
    planner_key = cache_key(f"planner:model:{tiny_model}", config, "p")
    model_key = cache_key(f"model:{tiny_model}", config, "m")
    assert planner_key["planner_candidates"] == 5 and "planner_candidates" not in model_key
    assert planner_key["weights"] == model_key["weights"] is not None


def test_conquest_continuations_redraw_the_cards_the_agent_cannot_see():
    """The undrawn pile and the other seats' hands are dealt again from the continuation's seed: the same seed deals
    the same cards (common random numbers), another seed others; what the agent observes stays as it was."""
    conquest = get_env_interface("conquest")
    task = conquest.tasks()[0]
    env = conquest.make_env(task)
    obs, _ = env.reset(seed=1)
    teacher, rng, game = conquest.get_policy("teacher"), random.Random(0), env.game
    while sum(len(h) for s, h in enumerate(game.hands) if s != game.agent) < 3:  # into the game: cards in other hands
        obs, *_, terminated, truncated, _ = env.step(policy_action(teacher, env, obs, rng))
        assert not (terminated or truncated)
    snapshot = env.snapshot()
    seen = json.dumps(env.observation(), sort_keys=True, default=str)
    true_pile = game.draw[game.draw_pos :]
    others = [s for s in range(game.n) if s != game.agent]
    hidden = sorted(game.draw[game.draw_pos :] + [c for s in others for c in game.hands[s]])

    def dealt(seed: int):
        env.restore(snapshot)
        conquest.resample_hidden(env, seed)
        g = env.game
        assert sorted(g.draw[g.draw_pos :] + [c for s in others for c in g.hands[s]]) == hidden  # the same cards
        assert json.dumps(env.observation(), sort_keys=True, default=str) == seen  # what the agent sees
        return g.draw[g.draw_pos :], [g.hands[s] for s in others]

    assert len(true_pile) > 5 and len(hidden) > len(true_pile)  # a pile to draw from, cards in other hands
    assert dealt(7) == dealt(7) and dealt(7) != dealt(8) and dealt(7)[0] != true_pile


def test_planner_labels_on_the_models_own_states(tiny_model):
    """Each state the model reached is labelled with its best proposal over the greedy answer, the paired margin and
    its standard error; a state whose best is the greedy answer has margin 0 and clears no margin."""
    from recruit_trl.workflow.evaluation.evaluate import record_anchors
    from recruit_trl.workflow.planner_labels import LabelSettings, clears, label_states, margin_counts, paired_margin

    assert paired_margin([1.0, 2.0, 3.0], [0.0, 2.0, 1.0]) == (1.0, pytest.approx(1 / 3**0.5))
    clinical = get_env_interface("clinical")
    states = record_anchors(clinical, tiny_model, [TASK], [0, 1], [10, 20], temperature=0.0, progress=False)
    rows = label_states(clinical, tiny_model, states, LabelSettings(candidates=3, continuations=2), progress=False)
    assert [(r["seed"], r["day"]) for r in rows] == [(0, 10), (0, 20), (1, 10), (1, 20)]
    for row in rows:
        means = {int(k): v for k, v in row["means"].items()}
        assert row["greedy"] in means and row["best"] in means and 1 <= row["scored"] == len(means) <= 4
        assert means[row["best"]] == max(means.values()) and row["completion"] == f'{{"action_index": {row["best"]}}}'
        if row["best"] == row["greedy"]:
            assert (row["margin"], row["se"]) == (0.0, 0.0) and not clears(row, 0)
        else:
            assert row["margin"] == pytest.approx(means[row["best"]] - means[row["greedy"]])
        assert row["env_steps"] >= 0 and row["seconds"] >= 0
    counts = margin_counts(rows)
    assert counts["states"] == 4 and counts["clear_1se"] >= counts["clear_2se"] >= counts["clear_3se"]
    again = label_states(clinical, tiny_model, states, LabelSettings(candidates=3, continuations=2), progress=False)
    timeless = lambda labelled: [{k: v for k, v in r.items() if k != "seconds"} for r in labelled]  # noqa: E731
    assert timeless(again) == timeless(rows)  # the same labels: seeded proposals, common random numbers


def test_racing_stops_proposals_clearly_behind_and_keeps_the_policys_own():
    """With the far target "left" falls clearly behind "right" (the leader) and stops before the last continuation;
    the first action (the policy's own) plays every continuation whatever its place; without racing all do."""
    settings = PlannerSettings(candidates=3, continuations=6, continuation_policy="random")
    scorer = CandidateScorer(TOY, settings, 0)
    env, _ = walk_far(seed=0, moves=2)
    actions = [{"kind": "wait"}, {"kind": "left"}, {"kind": "right"}]
    full = scorer.continuation_scores(env.snapshot(), "far", actions, 0, 2)
    raced = scorer.continuation_scores(env.snapshot(), "far", actions, 0, 2, race=2.0)
    keys = [TOY.action_key(a) for a in actions]
    assert [len(full[k]) for k in keys] == [6, 6, 6]
    assert len(raced[keys[0]]) == 6 and len(raced[keys[2]]) == 6 and 3 <= len(raced[keys[1]]) < 6
    assert all(raced[k] == full[k][: len(raced[k])] for k in keys)  # the same continuations, cut short

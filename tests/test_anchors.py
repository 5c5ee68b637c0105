"""Anchors travel as prompt keys and are rebuilt deterministically (replay + snapshot cache)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import env.clinical.agent  # noqa: F401
from recruit_trl.protocol import get_env_interface
from recruit_trl.ranges import parse_int_ranges
from recruit_trl.rollout.anchors import Anchor, AnchorCache, anchor_dataset, anchor_from_prompt, build_anchors

INTERFACE = get_env_interface("clinical")


def test_key_round_trip_and_prompt_forms():
    a = Anchor("hard_bench", 7, 42, "random", 3)
    assert Anchor.from_key(a.key()) == a
    assert anchor_from_prompt(a.key()) == a
    assert anchor_from_prompt([{"role": "user", "content": a.key()}]) == a
    with pytest.raises(ValueError, match="not an anchor"):
        anchor_from_prompt("screen patient P-1000 please")


def test_replay_is_deterministic_and_cached():
    a = Anchor("medium_bench", 3, 25, "random", 1)
    first = AnchorCache(INTERFACE).get(a)
    cache = AnchorCache(INTERFACE)
    second = cache.get(a)
    assert first.obs == second.obs and first.recent == second.recent and first.day == 25
    assert cache.get(a) is second and cache.hits == 1 and cache.misses == 1
    env = cache.env("medium_bench")
    env.restore(second.snapshot)
    assert env._observation() == second.obs


def test_build_anchors_drops_finished_prefixes_and_makes_a_dataset():
    anchors = build_anchors(INTERFACE, ["hard_bench_stage_30"], [0, 1], [0, 10, 40])
    assert {a.day for a in anchors} == {0, 10}  # day 40 is past the 30-day horizon
    ds = anchor_dataset(anchors)
    assert ds.column_names == ["prompt", "task", "seed", "day", "policy"]
    assert Anchor.from_key(ds[0]["prompt"]) == anchors[0]


def test_parse_int_ranges():
    assert parse_int_ranges("0-4") == [0, 1, 2, 3, 4]
    assert parse_int_ranges("0-20:10, 3") == [0, 3, 10, 20]
    with pytest.raises(ValueError, match="bad range"):
        parse_int_ranges("5-1")
    with pytest.raises(ValueError, match="bad range"):
        parse_int_ranges("a-b")


def test_model_anchors_are_recorded_pinned_and_kept_on_disk(warm_model, tmp_path):
    from recruit_trl.rollout.anchors import MODEL_PREFIX, load_states, save_states
    from recruit_trl.workflow.evaluation.evaluate import record_anchors

    task = "hard_bench_stage_30"
    states = record_anchors(INTERFACE, warm_model, [task], [0, 1], [0, 10, 40], temperature=1.0)
    assert sorted((a.seed, a.day) for a in states) == [(0, 0), (0, 10), (1, 0), (1, 10)]  # day 40: episode over
    assert all(a.policy == f"{MODEL_PREFIX}student" for a in states)
    again = record_anchors(INTERFACE, warm_model, [task], [0, 1], [0, 10, 40], temperature=1.0)
    assert [s.obs for s in again.values()] == [s.obs for s in states.values()]  # seeded: the same states
    anchor = Anchor(task, 1, 10, f"{MODEL_PREFIX}student")
    state = states[anchor]
    assert state.day == 10 and len(state.recent) == 2 and not state.done
    env = INTERFACE.make_env(task)
    env.restore(state.snapshot)
    assert env._observation() == state.obs

    cache = AnchorCache(INTERFACE)
    with pytest.raises(ValueError, match="cannot be replayed"):
        cache.get(anchor)
    cache.pin(states)
    assert cache.get(anchor) is state

    path = tmp_path / "anchor_states.json"
    save_states(path, states, {"model": warm_model})
    loaded = load_states(path, {"model": warm_model}, INTERFACE)
    assert list(loaded) == list(states) and loaded[anchor].obs == state.obs
    assert load_states(path, {"model": "another"}, INTERFACE) is None
    assert load_states(tmp_path / "none.json", {}, INTERFACE) is None


def test_recorded_anchor_states_are_stored_as_data_and_replayed_exactly(warm_model, tmp_path):
    """The file holds each episode's recorded actions as JSON; loading replays them into the very same states."""
    from recruit_trl.rollout.anchors import load_states, save_states
    from recruit_trl.workflow.evaluation.evaluate import record_anchors

    task, meta = "hard_bench_stage_30", {"model": warm_model, "temperature": 1.0}
    states = record_anchors(INTERFACE, warm_model, [task], [0, 1], [0, 10, 20], temperature=1.0, progress=False)
    path = tmp_path / "anchor_states.json"
    save_states(path, states, meta)
    stored = json.loads(path.read_text())  # plain data, readable by anyone, executable by no one
    assert stored["meta"] == meta and len(stored["episodes"]) == 2
    loaded = load_states(path, meta, INTERFACE)
    assert list(loaded) == list(states)
    env, again = INTERFACE.make_env(task), INTERFACE.make_env(task)
    for anchor, state in states.items():
        replayed = loaded[anchor]
        assert (replayed.obs, replayed.recent, replayed.done, replayed.day) == (
            state.obs, state.recent, state.done, state.day
        )  # fmt: skip
        env.restore(state.snapshot)
        again.restore(replayed.snapshot)
        for _ in range(5):  # the snapshots continue alike, step RNG included
            action = INTERFACE.fallback_action(env._observation())
            assert env.step(action)[0] == again.step(action)[0]


def test_an_unreadable_anchor_states_file_is_reported_and_never_executed(warm_model, tmp_path):
    import pickle

    from recruit_trl.rollout.anchors import load_states

    path, ran = tmp_path / "anchor_states.json", tmp_path / "ran"

    class Payload:  # what a pickle in a shared output folder could do when unpickled
        def __reduce__(self):
            return Path.touch, (ran,)

    path.write_bytes(pickle.dumps(Payload()))
    with pytest.raises(ValueError, match=r"anchor_states.json.*delete it to record the anchors again"):
        load_states(path, {}, INTERFACE)
    assert not ran.exists()
    for text in ('{"meta": {}, "episodes": [', '{"meta": {}, "format": "something else"}', "[1, 2]"):
        path.write_text(text)
        with pytest.raises(ValueError, match=r"anchor_states.json.*delete it"):
            load_states(path, {}, INTERFACE)

"""Determinism of the conquest environment (spec §3, §10.2-§10.6): RNG vectors, golden games, global-RNG
independence, snapshot/restore and reseed."""

from __future__ import annotations

import copy
import json
import os
import pickle
import random
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

conquest = pytest.importorskip("env.conquest")
from test_conquest_rules import CODES, Referee, View, balanced_answers, replay_reset  # noqa: E402

from env.conquest import golden  # noqa: E402

ConquestEnv = conquest.ConquestEnv
ROOT = Path(__file__).resolve().parents[1]
TASKS = ("duel", "easy3", "classic3", "classic6")


# --- §10.2 golden vectors -----------------------------------------------------------------------------------------


def test_cpython_random_vectors():
    """The vectors of §10.2 on CPython's Mersenne Twister itself (the environment must use exactly these draws)."""
    rng = random.Random(0)
    order = list(range(42))
    rng.shuffle(order)
    deck = list(range(44))
    rng.shuffle(deck)
    draws = [rng.randrange(14) for _ in range(63)]
    assert order[:8] == [36, 11, 33, 0, 37, 20, 14, 7]
    assert deck[:10] == [1, 6, 43, 24, 33, 37, 41, 7, 29, 11]
    assert draws[:10] == [4, 2, 3, 13, 2, 0, 9, 10, 4, 7]
    assert [rng.randint(1, 6) for _ in range(10)] == [3, 2, 3, 4, 1, 1, 2, 6, 2, 1]
    plain = random.Random(0)
    assert [plain.randint(1, 6) for _ in range(10)] == [4, 4, 1, 3, 5, 4, 4, 3, 4, 3]


def test_golden_vectors_through_reset():
    """Seed 0, 3 players: the deal gives seat 0 the §10.2 territories and the 63 placement draws give the armies."""
    env = ConquestEnv(task="classic3")
    obs, _ = env.reset(seed=0)
    seat0 = [CODES[t] for t in range(42) if obs["owners"][t] == 0]
    assert seat0 == "ALA GRE QUE SCA GBR EGY KAM IRK MON CHI MEA IND IDN WAU".split()
    assert [obs["owners"][t] for t in [36, 11, 33, 0, 37, 20, 14, 7]] == [0, 1, 2, 0, 1, 2, 0, 1]
    _, _, owners, armies = replay_reset(0, 3)
    assert obs["owners"] == owners and obs["armies"] == armies
    # The first ten placement draws [4, 2, 3, 13, 2, 0, 9, 10, 4, 7] go to seats 0, 1, 2, 0, ... as indices into
    # each seat's territories in index order; each of those territories holds at least that many extra armies.
    owned = [[t for t in range(42) if obs["owners"][t] == s] for s in range(3)]
    extra = [0] * 42
    for i, k in enumerate([4, 2, 3, 13, 2, 0, 9, 10, 4, 7]):
        extra[owned[i % 3][k]] += 1
    assert all(obs["armies"][t] >= 1 + extra[t] for t in range(42)) and owned[0][4] == 15  # GBR gets the first
    assert obs["draw_pile_left"] == 44 and obs["discard_size"] == 0 and obs["hand"] == []


def test_golden_vectors_first_dice_and_first_cards():
    """After reset the next dice of the game RNG are [3, 2, 3, 4, 1, 1, 2, 6, 2, 1] and cards come off deck[0..]."""
    env = ConquestEnv(task="classic3")
    obs, info = env.reset(seed=0)
    dice = [3, 2, 3, 4, 1, 1, 2, 6, 2, 1]
    deck = [1, 6, 43, 24, 33, 37, 41, 7, 29, 11]
    battles, drawn = [], 0
    first_agent_card = None
    events = list(info["events"])
    for _ in range(400):
        hand_before = obs["hand"]
        obs, _, terminated, truncated, info = env.step(View(obs).balanced())
        events += info["events"]
        for ev in info["events"]:
            if ev["type"] == "card":
                if ev["seat"] == 0 and first_agent_card is None:
                    new = sorted(set(obs["hand"]) - set(hand_before))
                    first_agent_card = (drawn, new)
                drawn += 1
        battles = [e for e in events if e["type"] == "battle"]
        if (first_agent_card and len(battles) >= 4) or terminated or truncated:
            break
    first = battles[0]
    k, m = len(first["att"]), len(first["def"])
    assert first["att"] == sorted(dice[:k], reverse=True) and first["def"] == sorted(dice[k : k + m], reverse=True)
    # With the balanced agent the first card of the game is the agent's: deck[0].
    assert first_agent_card == (0, [deck[0]])


# --- §10.3 golden games -------------------------------------------------------------------------------------------

# Seeds 0 and 1 of every task are also replayed from tests/data/conquest_golden.json in a fresh process.
FAST_GAMES = [(task, seed) for task in TASKS for seed in (0, 3)]


@pytest.mark.parametrize("task,seed", FAST_GAMES)
@pytest.mark.parametrize("answerer", golden.ANSWERERS)
def test_golden_game_is_repeatable(task, seed, answerer):
    """Two runs of the same game give identical per-step hashes, final score and step count."""
    first = golden.play(task, seed, answerer)
    second = golden.play(task, seed, answerer)
    assert first == second
    assert first["steps"] > 0 and (first["terminated"] or first["truncated"])
    assert golden.replay_episode(first) == []


@pytest.mark.slow
@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("answerer", golden.ANSWERERS)
def test_golden_games_all_seeds(task, answerer):
    """§10.3 in full: seeds 0..9, a second run in this process and a replay in a fresh process agree."""
    episodes = [golden.play(task, seed, answerer) for seed in range(10)]
    assert [golden.play(task, seed, answerer) for seed in range(10)] == episodes
    assert _replay_in_fresh_process(episodes, hash_seed="1") == f"{len(episodes)} passed, 0 failed"


def _replay_in_fresh_process(episodes: list[dict], hash_seed: str, tmp_dir: Path | None = None) -> str:
    """Replay `episodes` with `python -m env.conquest.golden` in a new interpreter; returns its last line."""
    with tempfile.TemporaryDirectory(dir=tmp_dir) as tmp:
        path = Path(tmp) / "episodes.json"
        path.write_text(json.dumps({"format": golden.FORMAT, "version": golden.VERSION, "episodes": episodes}))
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        proc = subprocess.run(
            [sys.executable, "-m", "env.conquest.golden", str(path)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=600,
        )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout.strip().splitlines()[-1]


def test_fresh_processes_with_different_hash_seeds_agree(tmp_path):
    """The same games replay in new interpreters with other PYTHONHASHSEED values (no set/hash order leaks)."""
    episodes = [golden.play("classic3", 1, "random"), golden.play("classic6", 2, "teacher")]
    for hash_seed in ("0", "12345"):
        assert _replay_in_fresh_process(episodes, hash_seed, tmp_path) == "2 passed, 0 failed"


# --- §10.4 global RNG independence --------------------------------------------------------------------------------

MODULE_RANDOM = (
    "random",
    "randint",
    "randrange",
    "choice",
    "choices",
    "shuffle",
    "sample",
    "uniform",
    "getrandbits",
    "gauss",
    "seed",
    "getstate",
    "setstate",
)


def _raise(*args, **kwargs):
    raise AssertionError("the module-level random functions must not be used by the environment")


def test_global_random_state_does_not_matter(monkeypatch):
    """Same hashes under different random.seed values and with module `random` (and numpy.random) raising."""
    games = [("classic3", 3, "random"), ("classic6", 1, "teacher"), ("duel", 4, "malformed")]
    random.seed(1)
    reference = [golden.play(*g) for g in games]
    random.seed(987654321)
    assert [golden.play(*g) for g in games] == reference
    for name in MODULE_RANDOM:
        monkeypatch.setattr(random, name, _raise)
    try:
        import numpy.random as npr

        for name in ("random", "rand", "randint", "choice", "shuffle", "permutation", "seed", "default_rng"):
            monkeypatch.setattr(npr, name, _raise)
    except ImportError:
        pass
    assert [golden.play(*g) for g in games] == reference


# --- §10.5 snapshot / restore and §10.6 reseed ----------------------------------------------------------------------


def _step_hashes(env, answers: list[int]) -> tuple[list[str], float | None]:
    """Play `answers` as indices from the current state; per-step hashes and the final score (None if not over)."""
    hashes, info = [], {}
    for k in answers:
        obs, reward, terminated, truncated, info = env.step_index(k)
        hashes.append(golden.sha256(golden.record_of(env, obs, info, (reward, terminated, truncated))))
        if terminated or truncated:
            return hashes, info["final_score"]
    return hashes, None


def _play_to_end(env, seed: int) -> tuple[list[int], tuple[list[str], float]]:
    """Play random candidate indices to the end; returns the answers and (per-step hashes, final score)."""
    rng = random.Random(seed)
    answers, hashes = [], []
    while True:
        k = rng.randrange(len(env.candidates()))
        answers.append(k)
        obs, reward, terminated, truncated, info = env.step_index(k)
        hashes.append(golden.sha256(golden.record_of(env, obs, info, (reward, terminated, truncated))))
        if terminated or truncated:
            return answers, (hashes, info["final_score"])


def _at_step(task: str, seed: int, j: int, **options) -> ConquestEnv:
    env = ConquestEnv(task=task, **options)
    env.reset(seed=seed)
    rng = random.Random(-seed)
    for _ in range(j):
        env.step_index(rng.randrange(len(env.candidates())))
    return env


@pytest.mark.parametrize("task,seed,j", [("classic3", 0, 15), ("classic6", 3, 40), ("duel", 2, 1)])
def test_snapshot_restore_replays_identically(task, seed, j):
    """§10.5: snapshot at step j, play to the end (A); restore and replay -> A, twice; the snapshot never changes."""
    env = _at_step(task, seed, j)
    snap = env.snapshot()
    frozen, pickled = copy.deepcopy(snap), pickle.dumps(snap)
    at_snap = _fingerprint(env)
    answers, a = _play_to_end(env, seed)
    assert pickle.dumps(snap) == pickled, "playing on changed the snapshot"
    for _ in range(2):
        env.restore(snap)
        assert _fingerprint(env) == at_snap
        assert _step_hashes(env, answers) == a
        assert pickle.dumps(snap) == pickled, "the restored state aliases the snapshot"
    # A second environment restored from the same snapshot behaves the same (the snapshot is self-contained).
    other = ConquestEnv(task=task)
    other.reset(seed=seed + 100)
    other.restore(copy.deepcopy(frozen))
    assert _step_hashes(other, answers) == a


def _fingerprint(env) -> str:
    """The visible state through the public API: text view, candidate lines, legal actions."""
    return golden.canonical([env.render_text(), env.render_candidates(), env.legal_actions()])


def test_reseed_branches_and_leaves_no_trace():
    """§10.6: reseed(7) from S gives B twice; restore(S) without reseed gives A again; reseed changes no state."""
    env = _at_step("classic3", 1, 12)
    snap = env.snapshot()
    pickled = pickle.dumps(snap)
    answers = [0] * 2000
    a = _step_hashes(env, answers)
    env.restore(snap)
    before = _fingerprint(env)
    env.reseed(7)
    assert _fingerprint(env) == before, "reseed changed the state"
    b = _step_hashes(env, answers)
    env.restore(snap)
    env.reseed(7)
    assert _step_hashes(env, answers) == b
    assert pickle.dumps(snap) == pickled
    env.restore(snap)
    assert _step_hashes(env, answers) == a
    assert a != b, "reseed(7) did not change the future"


def test_reseed_uses_random_of_the_new_seed():
    """After reseed(s) the dice come from random.Random(s): the Referee follows the game with that stream."""
    env = ConquestEnv(task="classic6")
    ref = Referee(env, "classic6", 2, {})
    for _ in range(10):
        ref.step(*balanced_answers(ref))
    ref.reseed(31337)
    battles = ref.battles
    ref.play(balanced_answers)
    assert ref.battles > battles


# --- the recorded golden file ---------------------------------------------------------------------------------------

GOLDEN_FILE = ROOT / "tests" / "data" / "conquest_golden.json"


def test_golden_file_covers_every_task_and_answerer():
    episodes = golden.load_episodes(str(GOLDEN_FILE))
    assert {(e["task"], e["answerer"]) for e in episodes} == {(t, a) for t in TASKS for a in golden.ANSWERERS}
    assert all(e["steps"] == len(e["answers"]) == len(e["hashes"]) > 0 for e in episodes)
    assert all(e["terminated"] or e["truncated"] for e in episodes)


def test_golden_file_replays_in_a_fresh_process():
    """`python -m env.conquest.golden tests/data/conquest_golden.json` reproduces every recorded hash."""
    proc = subprocess.run(
        [sys.executable, "-m", "env.conquest.golden", str(GOLDEN_FILE)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    count = len(golden.load_episodes(str(GOLDEN_FILE)))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == f"{count} passed, 0 failed"


def test_golden_cli_reports_a_tampered_episode(tmp_path):
    """A changed hash or final score fails that episode only, names the step, and exits with status 1."""
    episodes = golden.load_episodes(str(GOLDEN_FILE))[:3]
    bad_hash = copy.deepcopy(episodes[0])
    bad_hash["hashes"][3] = "0" * 64
    bad_score = copy.deepcopy(episodes[1])
    bad_score["final_score"] = -1.0
    path = tmp_path / "bad.json"
    path.write_text(
        json.dumps(
            {"format": golden.FORMAT, "version": golden.VERSION, "episodes": [bad_hash, bad_score, episodes[2]]}
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "env.conquest.golden", str(path)], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 1
    assert proc.stdout.strip().splitlines()[-1] == "1 passed, 2 failed"
    assert "step 3" in proc.stdout and "final_score" in proc.stdout


def test_malformed_answerer_hits_every_fallback_reason():
    """The malformed replies of the golden games exercise each text reason of §7.4."""
    env = ConquestEnv(task="classic3")
    env.reset(seed=0)
    reasons = set()
    for reply in golden.MALFORMED_REPLIES:
        *_, terminated, truncated, info = env.step_text(reply)
        reasons.add(info["fallback_reason"])
        if terminated or truncated:
            break
    assert reasons == {None, "invalid_json", "not_object", "missing_key", "extra_keys", "bad_type", "out_of_range"}

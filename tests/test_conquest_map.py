"""Map facts of the conquest environment (spec §1, §10.1), from the spec's JSON and from the env's board module."""

from __future__ import annotations

import json
from collections import Counter, deque
from pathlib import Path

import pytest

SPEC_MAP = Path("/work/shared/spec/conquest/classic_map.json")
SIZES = [9, 4, 7, 6, 12, 4]
BONUSES = [5, 2, 5, 3, 7, 2]
SYMBOLS = ["infantry", "cavalry", "artillery"]


def _load_map() -> dict:
    """The map JSON: the spec copy when present, else the copy shipped with the environment."""
    if SPEC_MAP.exists():
        return json.loads(SPEC_MAP.read_text())
    local = Path(__file__).resolve().parents[1] / "env" / "conquest" / "classic_map.json"
    if not local.exists():
        pytest.skip("no classic_map.json available")
    return json.loads(local.read_text())


@pytest.fixture(scope="module")
def data() -> dict:
    return _load_map()


def _adjacency(n: int, borders: list[tuple[int, int]]) -> list[set[int]]:
    adj: list[set[int]] = [set() for _ in range(n)]
    for a, b in borders:
        adj[a].add(b)
        adj[b].add(a)
    return adj


def _connected(nodes: set[int], adj: list[set[int]]) -> bool:
    """True when `nodes` induce a connected subgraph (breadth-first search inside `nodes`)."""
    start = min(nodes)
    seen = {start}
    queue = deque([start])
    while queue:
        t = queue.popleft()
        for u in adj[t]:
            if u in nodes and u not in seen:
                seen.add(u)
                queue.append(u)
    return seen == nodes


def test_json_territories_and_continents(data):
    terrs = data["territories"]
    assert len(terrs) == 42 and [t["index"] for t in terrs] == list(range(42))
    assert len({t["id"] for t in terrs}) == 42
    codes = [t["code"] for t in terrs]
    assert len(set(codes)) == 42 and all(len(c) == 3 and c.isalpha() and c.isupper() for c in codes)
    conts = data["continents"]
    assert [c["index"] for c in conts] == list(range(6))
    assert [len(c["territories"]) for c in conts] == SIZES
    assert [c["bonus"] for c in conts] == BONUSES
    member = Counter(t for c in conts for t in c["territories"])
    assert set(member) == {t["id"] for t in terrs} and set(member.values()) == {1}
    cont_of = {t: c["id"] for c in conts for t in c["territories"]}
    assert all(cont_of[t["id"]] == t["continent"] for t in terrs)
    # Canonical order: continents are contiguous blocks in JSON order (NA 0-8, SA 9-12, ...).
    flat = [t for c in conts for t in c["territories"]]
    assert flat == [t["id"] for t in terrs]


def test_json_borders_graph(data):
    index = {t["id"]: t["index"] for t in data["territories"]}
    borders = [(index[a], index[b]) for a, b in data["borders"]]
    assert len(borders) == 83 == data["num_borders"]
    assert all(a < b for a, b in borders), "each border listed once with index(a) < index(b)"
    assert len(set(borders)) == 83
    adj = _adjacency(42, borders)
    assert all(t not in adj[t] for t in range(42))
    assert all(a in adj[b] and b in adj[a] for a, b in borders)
    assert _connected(set(range(42)), adj)
    cont_of = {index[t]: c["index"] for c in data["continents"] for t in c["territories"]}
    for c in range(6):
        assert _connected({t for t in range(42) if cont_of[t] == c}, adj), f"continent {c} not connected"
    inter = {tuple(sorted((index[a], index[b]))) for a, b in data["intercontinental_borders"]}
    assert len(inter) == 14
    assert inter == {(a, b) for a, b in borders if cont_of[a] != cont_of[b]}
    # §11: the majority map keeps NGU-WAU and EAF-MEA and rejects NWT-QUE, ALB-EUS, EGY-CON.
    pairs = {frozenset(p) for p in data["borders"]}
    assert frozenset(("new_guinea", "western_australia")) in pairs
    assert frozenset(("east_africa", "middle_east")) in pairs
    for rejected in (("northwest_territory", "quebec"), ("alberta", "eastern_us"), ("egypt", "congo")):
        assert frozenset(rejected) not in pairs


def test_json_cards(data):
    deck = data["cards"]["deck"]
    assert len(deck) == 44 == data["num_cards"]
    ids = [t["id"] for t in data["territories"]]
    for i, card in enumerate(deck):
        assert card["id"] == i
        if i < 42:
            assert card["territory"] == ids[i] and card["symbol"] == SYMBOLS[i % 3]
        else:
            assert card.get("territory") is None and card["symbol"] == "wild"
    assert Counter(c["symbol"] for c in deck) == {"infantry": 14, "cavalry": 14, "artillery": 14, "wild": 2}


def test_json_rule_constants(data):
    rc = data["rules_constants"]
    assert rc["initial_armies_by_player_count"] == {"2": 40, "3": 35, "4": 30, "5": 25, "6": 20}
    assert rc["trade_values_first_six"] == [4, 6, 8, 10, 12, 15]
    assert rc["trade_value_increment_after_sixth"] == 5


# --- the environment's board module must agree with the JSON -------------------------------------------------


def test_env_board_matches_json(data):
    """env/conquest/board.py exposes the same map: ids, codes, continents, borders, neighbours, cards, constants."""
    board = pytest.importorskip("env.conquest.board")
    terrs = data["territories"]
    index = {t["id"]: t["index"] for t in terrs}
    assert list(board.IDS) == [t["id"] for t in terrs]
    assert list(board.CODES) == [t["code"] for t in terrs]
    assert list(board.NAMES) == [t["name"] for t in terrs]
    assert list(board.CONTINENT_BONUS) == BONUSES
    members = [sorted(index[t] for t in c["territories"]) for c in data["continents"]]
    assert [sorted(m) for m in board.CONTINENT_MEMBERS] == members
    assert [board.CONTINENT_OF[t] for t in range(42)] == [c for c, m in enumerate(members) for _ in m]
    borders = sorted((index[a], index[b]) for a, b in data["borders"])
    assert sorted(tuple(b) for b in board.BORDERS) == borders
    adj = _adjacency(42, borders)
    assert [list(n) for n in board.NEIGHBORS] == [sorted(a) for a in adj], "neighbour lists sorted by index"
    symbols = [board.SYMBOL_NAMES[board.CARD_SYMBOL[i]] for i in range(44)]
    assert symbols == [c["symbol"] for c in data["cards"]["deck"]]
    assert board.INITIAL_ARMIES == {2: 40, 3: 35, 4: 30, 5: 25, 6: 20}
    assert [board.trade_value(k) for k in range(1, 11)] == [4, 6, 8, 10, 12, 15, 20, 25, 30, 35]


def test_env_map_copy_is_the_spec_map(data):
    """The JSON shipped with the environment is the spec's data file."""
    local = Path(__file__).resolve().parents[1] / "env" / "conquest" / "classic_map.json"
    if not local.exists():
        pytest.skip("no env/conquest/classic_map.json")
    assert json.loads(local.read_text()) == data

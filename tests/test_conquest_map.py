"""Map facts of the conquest environment (``docs/spec/conquest/rules.md`` §1, §10.1).

Three independent sources must agree: the spec's map ``docs/spec/conquest/classic_map.json``, the numbers the spec's
text states (§10.1: continent sizes and bonuses, border count, card counts) and the environment: its own data file
``env/conquest/classic_map.json`` and the board that ``env.conquest.board`` builds from it (ids, continents,
adjacency, cards, constants).
"""

from __future__ import annotations

import json
import re
from collections import Counter, deque
from pathlib import Path

import pytest

from env.conquest import board

ROOT = Path(__file__).resolve().parents[1]
SPEC_DIR = ROOT / "docs" / "spec" / "conquest"
SPEC_MAP = SPEC_DIR / "classic_map.json"
ENV_MAP = ROOT / "env" / "conquest" / "classic_map.json"
SYMBOLS = ["infantry", "cavalry", "artillery"]


def _section_10_1() -> dict:
    """Numbers of rules.md §10.1 ("Map: 42 territories, 6 continents with sizes 9/4/... and bonuses 5/2/..., 83
    borders, ... cards 14/14/14 + 2 wild"), parsed from the text (whitespace, line breaks included, normalised)."""
    text = " ".join((SPEC_DIR / "rules.md").read_text(encoding="utf-8").split())
    found = re.search(
        r"\*\*Map\*\*: (\d+) territories, (\d+) continents with sizes ([\d/]+) and bonuses ([\d/]+), (\d+) borders,"
        r".*? cards (\d+)/(\d+)/(\d+) \+ (\d+) wild",
        text,
    )
    assert found, "rules.md §10.1 no longer states the map facts in the expected words"
    terrs, conts, sizes, bonuses, borders, inf, cav, art, wild = found.groups()
    return {
        "territories": int(terrs),
        "continents": int(conts),
        "sizes": [int(x) for x in sizes.split("/")],
        "bonuses": [int(x) for x in bonuses.split("/")],
        "borders": int(borders),
        "symbols": {"infantry": int(inf), "cavalry": int(cav), "artillery": int(art), "wild": int(wild)},
    }


FACTS = _section_10_1()
SIZES = FACTS["sizes"]
BONUSES = FACTS["bonuses"]


@pytest.fixture(scope="module")
def data() -> dict:
    """The spec's map JSON."""
    return json.loads(SPEC_MAP.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def env_data() -> dict:
    """The map JSON the environment ships and loads (``env.conquest.board`` reads this file)."""
    return json.loads(ENV_MAP.read_text(encoding="utf-8"))


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
    n, k = FACTS["territories"], FACTS["continents"]
    terrs = data["territories"]
    assert len(terrs) == n == data["num_territories"] and [t["index"] for t in terrs] == list(range(n))
    assert len({t["id"] for t in terrs}) == n
    codes = [t["code"] for t in terrs]
    assert len(set(codes)) == n and all(len(c) == 3 and c.isalpha() and c.isupper() for c in codes)
    conts = data["continents"]
    assert [c["index"] for c in conts] == list(range(k)) and k == data["num_continents"]
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
    n, k, m = FACTS["territories"], FACTS["continents"], FACTS["borders"]
    index = {t["id"]: t["index"] for t in data["territories"]}
    borders = [(index[a], index[b]) for a, b in data["borders"]]
    assert len(borders) == m == data["num_borders"]
    assert all(a < b for a, b in borders), "each border listed once with index(a) < index(b)"
    assert len(set(borders)) == m
    adj = _adjacency(n, borders)
    assert all(t not in adj[t] for t in range(n))
    assert all(a in adj[b] and b in adj[a] for a, b in borders)
    assert _connected(set(range(n)), adj)
    cont_of = {index[t]: c["index"] for c in data["continents"] for t in c["territories"]}
    for c in range(k):
        assert _connected({t for t in range(n) if cont_of[t] == c}, adj), f"continent {c} not connected"
    inter = {tuple(sorted((index[a], index[b]))) for a, b in data["intercontinental_borders"]}
    assert len(inter) == 14  # §1
    assert inter == {(a, b) for a, b in borders if cont_of[a] != cont_of[b]}
    # §11: the majority map keeps NGU-WAU and EAF-MEA and rejects NWT-QUE, ALB-EUS, EGY-CON.
    pairs = {frozenset(p) for p in data["borders"]}
    assert frozenset(("new_guinea", "western_australia")) in pairs
    assert frozenset(("east_africa", "middle_east")) in pairs
    for rejected in (("northwest_territory", "quebec"), ("alberta", "eastern_us"), ("egypt", "congo")):
        assert frozenset(rejected) not in pairs


def test_json_cards(data):
    n = FACTS["territories"]
    deck = data["cards"]["deck"]
    assert len(deck) == sum(FACTS["symbols"].values()) == data["num_cards"]
    ids = [t["id"] for t in data["territories"]]
    for i, card in enumerate(deck):
        assert card["id"] == i
        if i < n:
            assert card["territory"] == ids[i] and card["symbol"] == SYMBOLS[i % 3]
        else:
            assert card.get("territory") is None and card["symbol"] == "wild"
    assert Counter(c["symbol"] for c in deck) == FACTS["symbols"]


def test_json_rule_constants(data):
    rc = data["rules_constants"]
    assert rc["initial_armies_by_player_count"] == {"2": 40, "3": 35, "4": 30, "5": 25, "6": 20}
    assert rc["trade_values_first_six"] == [4, 6, 8, 10, 12, 15]
    assert rc["trade_value_increment_after_sixth"] == 5


# --- the environment's map file and board must agree with the spec's JSON ------------------------------------------


def test_env_map_file_matches_spec_territory_by_territory(data, env_data):
    """``env/conquest/classic_map.json`` holds the spec's map: every territory (index, id, name, code, continent),
    every continent (members, bonus), the borders, the card deck and the rule constants."""
    assert len(env_data["territories"]) == len(data["territories"])
    for spec_t, env_t in zip(data["territories"], env_data["territories"], strict=True):
        assert env_t == spec_t, f"territory {spec_t['index']} ({spec_t['id']})"
    assert len(env_data["continents"]) == len(data["continents"])
    for spec_c, env_c in zip(data["continents"], env_data["continents"], strict=True):
        assert env_c == spec_c, f"continent {spec_c['index']} ({spec_c['id']})"
    for key in ("borders", "intercontinental_borders"):
        spec_pairs = {frozenset(p) for p in data[key]}
        env_pairs = {frozenset(p) for p in env_data[key]}
        assert len(env_data[key]) == len(data[key]), key
        assert env_pairs - spec_pairs == set(), f"{key} not in the spec"
        assert spec_pairs - env_pairs == set(), f"{key} missing from the env's map"
    assert env_data["cards"] == data["cards"]
    assert env_data["rules_constants"] == data["rules_constants"]
    for key in ("num_territories", "num_continents", "num_borders", "num_cards"):
        assert env_data[key] == data[key], key


def test_env_board_matches_spec_json(data):
    """The board ``env.conquest.board`` builds (ids, codes, names, continents, borders, adjacency, cards, constants)
    equals the same structures derived here from the spec's JSON."""
    n = FACTS["territories"]
    terrs = data["territories"]
    index = {t["id"]: t["index"] for t in terrs}
    assert board.NUM_TERRITORIES == n
    assert list(board.IDS) == [t["id"] for t in terrs]
    assert list(board.CODES) == [t["code"] for t in terrs]
    assert list(board.NAMES) == [t["name"] for t in terrs]
    assert board.INDEX == index
    assert list(board.CONTINENT_IDS) == [c["id"] for c in data["continents"]]
    assert list(board.CONTINENT_NAMES) == [c["name"] for c in data["continents"]]
    assert list(board.CONTINENT_BONUS) == BONUSES
    members = [sorted(index[t] for t in c["territories"]) for c in data["continents"]]
    assert [list(m) for m in board.CONTINENT_MEMBERS] == members
    assert [len(m) for m in board.CONTINENT_MEMBERS] == SIZES
    assert [board.CONTINENT_OF[t] for t in range(n)] == [c for c, m in enumerate(members) for _ in m]
    borders = sorted(tuple(sorted((index[a], index[b]))) for a, b in data["borders"])
    assert [tuple(b) for b in board.BORDERS] == borders and len(borders) == FACTS["borders"]
    adj = _adjacency(n, borders)
    for t in range(n):
        assert list(board.NEIGHBORS[t]) == sorted(adj[t]), f"neighbours of {board.IDS[t]} (sorted by index)"
        assert board.ADJACENT[t] == frozenset(adj[t]), f"adjacency of {board.IDS[t]}"
    assert board.NUM_CARDS == data["num_cards"]
    symbols = [board.SYMBOL_NAMES[board.CARD_SYMBOL[i]] for i in range(board.NUM_CARDS)]
    assert symbols == [c["symbol"] for c in data["cards"]["deck"]]
    rc = data["rules_constants"]
    assert board.INITIAL_ARMIES == {int(k): v for k, v in rc["initial_armies_by_player_count"].items()}
    assert board.CARD_BONUS_ARMIES == rc["territory_card_bonus_armies"]
    assert board.MIN_REINFORCEMENT == rc["min_reinforcement"]
    assert board.TERRITORIES_PER_ARMY == rc["territories_per_reinforcement_army"]
    first, step = rc["trade_values_first_six"], rc["trade_value_increment_after_sixth"]
    expected = [first[k - 1] if k <= len(first) else first[-1] + step * (k - len(first)) for k in range(1, 11)]
    assert [board.trade_value(k) for k in range(1, 11)] == expected == [4, 6, 8, 10, 12, 15, 20, 25, 30, 35]

"""The classic 42-territory board and the rule constants, loaded once from ``classic_map.json``.

Everything is a flat tuple indexed by canonical territory index (0..41, JSON order) or continent index (0..5),
so the game state can be plain lists of ints. Cards: card ``i < 42`` shows territory ``i`` with symbol
``i % 3`` (0 infantry, 1 cavalry, 2 artillery); cards 42 and 43 are wild (symbol 3, no territory).
"""

from __future__ import annotations

import json
from pathlib import Path

_DATA = json.loads(Path(__file__).with_name("classic_map.json").read_text(encoding="utf-8"))

NUM_TERRITORIES: int = len(_DATA["territories"])
IDS: tuple[str, ...] = tuple(t["id"] for t in _DATA["territories"])
NAMES: tuple[str, ...] = tuple(t["name"] for t in _DATA["territories"])
CODES: tuple[str, ...] = tuple(t["code"] for t in _DATA["territories"])
INDEX: dict[str, int] = {tid: i for i, tid in enumerate(IDS)}

CONTINENT_IDS: tuple[str, ...] = tuple(c["id"] for c in _DATA["continents"])
CONTINENT_NAMES: tuple[str, ...] = tuple(c["name"] for c in _DATA["continents"])
CONTINENT_BONUS: tuple[int, ...] = tuple(c["bonus"] for c in _DATA["continents"])
# Members in canonical index order.
CONTINENT_MEMBERS: tuple[tuple[int, ...], ...] = tuple(
    tuple(sorted(INDEX[t] for t in c["territories"])) for c in _DATA["continents"]
)
# Short continent labels for render_text (the spec shows "NA" and "SA"; the other four follow the same pattern).
CONTINENT_CODES: tuple[str, ...] = ("NA", "SA", "EU", "AF", "AS", "AU")
_CONT_INDEX = {cid: i for i, cid in enumerate(CONTINENT_IDS)}
CONTINENT_OF: tuple[int, ...] = tuple(_CONT_INDEX[t["continent"]] for t in _DATA["territories"])

BORDERS: tuple[tuple[int, int], ...] = tuple(sorted((INDEX[a], INDEX[b]) for a, b in _DATA["borders"]))


def _neighbours() -> tuple[tuple[int, ...], ...]:
    nbrs: list[set[int]] = [set() for _ in range(NUM_TERRITORIES)]
    for a, b in BORDERS:
        nbrs[a].add(b)
        nbrs[b].add(a)
    return tuple(tuple(sorted(s)) for s in nbrs)


NEIGHBORS: tuple[tuple[int, ...], ...] = _neighbours()
ADJACENT: tuple[frozenset[int], ...] = tuple(frozenset(n) for n in NEIGHBORS)

NUM_CARDS: int = _DATA["num_cards"]
WILD: int = 3
SYMBOL_NAMES: tuple[str, ...] = ("infantry", "cavalry", "artillery", "wild")
SYMBOL_SHORT: tuple[str, ...] = ("inf", "cav", "art", "wild")
CARD_SYMBOL: tuple[int, ...] = tuple(i % 3 if i < NUM_TERRITORIES else WILD for i in range(NUM_CARDS))

_CONSTANTS = _DATA["rules_constants"]
INITIAL_ARMIES: dict[int, int] = {int(k): v for k, v in _CONSTANTS["initial_armies_by_player_count"].items()}
_FIRST_VALUES: tuple[int, ...] = tuple(_CONSTANTS["trade_values_first_six"])
_VALUE_STEP: int = _CONSTANTS["trade_value_increment_after_sixth"]
CARD_BONUS_ARMIES: int = _CONSTANTS["territory_card_bonus_armies"]
MIN_REINFORCEMENT: int = _CONSTANTS["min_reinforcement"]
TERRITORIES_PER_ARMY: int = _CONSTANTS["territories_per_reinforcement_army"]


def trade_value(k: int) -> int:
    """Armies for the ``k``-th set traded in the game (k >= 1): 4, 6, 8, 10, 12, 15, then +5 each."""
    if k <= len(_FIRST_VALUES):
        return _FIRST_VALUES[k - 1]
    return _FIRST_VALUES[-1] + _VALUE_STEP * (k - len(_FIRST_VALUES))

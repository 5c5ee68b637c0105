"""Raw actions: the JSON dicts of the spec (section 7.2) and the compact tuples the engine uses.

An action tuple starts with its type code; the codes follow the canonical type order, so sorting tuples is the
canonical order of section 7.2 (type, then parameters as index tuples ascending):

* ``(TRADE, c1, c2, c3)``, ``(PLACE, t, n)``, ``(ATTACK, src, dst, dice)``, ``(BLITZ, src, dst)``,
  ``(MOVE, n)``, ``(FORTIFY, src, dst, n)``, ``(END_ATTACK,)``, ``(END_TURN,)``.

Dicts name territories by id (``"western_us"``) and cards by id (0..43). :func:`from_dict` is strict: exact key
set (``dice`` may be omitted from an attack, meaning the maximum), ints that are not bools, known territory ids,
trade cards as three ascending distinct ints. It never raises; it returns ``None`` for anything malformed.
"""

from __future__ import annotations

from typing import Any

from env.conquest.board import IDS, INDEX

TRADE, PLACE, ATTACK, BLITZ, MOVE, FORTIFY, END_ATTACK, END_TURN = range(8)
TYPE_NAMES: tuple[str, ...] = ("trade", "place", "attack", "blitz", "move", "fortify", "end_attack", "end_turn")
_TYPE_CODE = {name: code for code, name in enumerate(TYPE_NAMES)}
_KEYS: dict[int, frozenset[str]] = {
    TRADE: frozenset({"type", "cards"}),
    PLACE: frozenset({"type", "territory", "n"}),
    ATTACK: frozenset({"type", "from", "to", "dice"}),
    BLITZ: frozenset({"type", "from", "to"}),
    MOVE: frozenset({"type", "n"}),
    FORTIFY: frozenset({"type", "from", "to", "n"}),
    END_ATTACK: frozenset({"type"}),
    END_TURN: frozenset({"type"}),
}
_ATTACK_NO_DICE = frozenset({"type", "from", "to"})

Action = tuple  # an action tuple as described above


def to_dict(a: Action) -> dict[str, Any]:
    """The spec's JSON dict for an action tuple."""
    kind = a[0]
    if kind == TRADE:
        return {"type": "trade", "cards": [a[1], a[2], a[3]]}
    if kind == PLACE:
        return {"type": "place", "territory": IDS[a[1]], "n": a[2]}
    if kind == ATTACK:
        return {"type": "attack", "from": IDS[a[1]], "to": IDS[a[2]], "dice": a[3]}
    if kind == BLITZ:
        return {"type": "blitz", "from": IDS[a[1]], "to": IDS[a[2]]}
    if kind == MOVE:
        return {"type": "move", "n": a[1]}
    if kind == FORTIFY:
        return {"type": "fortify", "from": IDS[a[1]], "to": IDS[a[2]], "n": a[3]}
    return {"type": TYPE_NAMES[kind]}


def _int(v: Any) -> int | None:
    return v if type(v) is int else None


def _territory(v: Any) -> int | None:
    return INDEX.get(v) if type(v) is str else None


def from_dict(d: Any) -> Action | None:
    """Parse an action dict; ``None`` if malformed. An attack without ``dice`` gets ``None`` as its dice."""
    if not isinstance(d, dict):
        return None
    kind = _TYPE_CODE.get(d.get("type")) if isinstance(d.get("type"), str) else None
    if kind is None:
        return None
    keys = d.keys()
    if keys != _KEYS[kind] and not (kind == ATTACK and keys == _ATTACK_NO_DICE):
        return None
    if kind == TRADE:
        cards = d["cards"]
        if not isinstance(cards, list | tuple) or len(cards) != 3:
            return None
        c = [_int(x) for x in cards]
        if None in c or not c[0] < c[1] < c[2]:
            return None
        return (TRADE, c[0], c[1], c[2])
    if kind == PLACE:
        t, n = _territory(d["territory"]), _int(d["n"])
        return None if t is None or n is None else (PLACE, t, n)
    if kind == MOVE:
        n = _int(d["n"])
        return None if n is None else (MOVE, n)
    if kind in (END_ATTACK, END_TURN):
        return (kind,)
    s, t = _territory(d["from"]), _territory(d["to"])
    if s is None or t is None:
        return None
    if kind == BLITZ:
        return (BLITZ, s, t)
    if kind == FORTIFY:
        n = _int(d["n"])
        return None if n is None else (FORTIFY, s, t, n)
    if "dice" not in d:
        return (ATTACK, s, t, None)
    k = _int(d["dice"])
    return None if k is None else (ATTACK, s, t, k)

"""The shared heuristics of spec section 8.1, the FallbackSafeAgent (section 7.4) and the bots (8.2-8.4).

Each bot is a function ``bot(g) -> action tuple`` for the seat to act (``g.cur``) at a decision with at least two
legal actions (forced decisions are auto-applied before any bot is asked). Only ``random`` draws, from the seat's
bot RNG; all others are pure integer heuristics. Ties go to the lower territory index, then lower card ids.

Choices the spec leaves open:

* ``balanced`` reinforce rule (b) reads "owned territories with an enemy neighbour inside c*" literally: an owned
  territory (anywhere) with at least one enemy-owned neighbour that lies in the target continent c*.
* ``balanced``/``aggressive`` fortify look only at the single best source; if its reach has no border
  territory they end the turn.
"""

from __future__ import annotations

import random

from env.conquest.actions import ATTACK, BLITZ, END_ATTACK, END_TURN, FORTIFY, MOVE, PLACE, TRADE, Action
from env.conquest.board import CARD_SYMBOL, CONTINENT_MEMBERS, CONTINENT_OF, NEIGHBORS, NUM_TERRITORIES, WILD
from env.conquest.rules import (
    attack_pairs,
    bonus_territories,
    fortify_pairs,
    reach,
    trade_legal,
    trade_mandatory,
    valid_sets,
)
from env.conquest.state import Game

_ALL = range(NUM_TERRITORIES)


# ------------------------------------------------------------------------------------------- 8.1 helpers


def enemy_nbrs(g: Game, t: int) -> list[int]:
    """Neighbours of ``t`` not owned by ``t``'s owner."""
    owner = g.owner
    p = owner[t]
    return [e for e in NEIGHBORS[t] if owner[e] != p]


def is_border(g: Game, t: int) -> bool:
    owner = g.owner
    p = owner[t]
    for e in NEIGHBORS[t]:
        if owner[e] != p:
            return True
    return False


def threat(g: Game, t: int) -> int:
    """Sum of the armies on ``t``'s enemy neighbours."""
    owner, armies = g.owner, g.armies
    p = owner[t]
    return sum(armies[e] for e in NEIGHBORS[t] if owner[e] != p)


def pressure(g: Game, t: int) -> int:
    """``threat(t) - armies[t]``."""
    return threat(g, t) - g.armies[t]


def target_continent(g: Game, p: int) -> int | None:
    """Among continents ``p`` owns partly, the max of ``(owned*1000 // size, -enemy armies, -index)``."""
    owner, armies = g.owner, g.armies
    best, best_key = None, None
    for c, members in enumerate(CONTINENT_MEMBERS):
        owned = enemy = 0
        for t in members:
            if owner[t] == p:
                owned += 1
            else:
                enemy += armies[t]
        if 0 < owned < len(members):
            key = (owned * 1000 // len(members), -enemy, -c)
            if best_key is None or key > best_key:
                best, best_key = c, key
    return best


def trade_key(g: Game, p: int, cards: tuple[int, ...]) -> tuple:
    """Sort key, best first: gives the territory bonus now, fewer wilds, lexicographic ids."""
    wilds = sum(1 for c in cards if CARD_SYMBOL[c] == WILD)
    return (0 if bonus_territories(g, p, cards) else 1, wilds, cards)


def ranked_sets(g: Game, p: int) -> list[tuple[int, int, int]]:
    """``p``'s valid sets ordered by :func:`trade_key`."""
    return sorted(valid_sets(g.hands[p]), key=lambda cards: trade_key(g, p, cards))


def _best_set(g: Game) -> Action | None:
    """The best-ranked set as a trade action if a trade is legal now."""
    if not trade_legal(g):
        return None
    sets = ranked_sets(g, g.cur)
    return (TRADE, *sets[0]) if sets else None


def _argmax(items: list[int], key) -> int | None:
    """The item with the largest key; ties to the earlier item (callers pass index-ordered lists)."""
    best, best_key = None, None
    for t in items:
        k = key(t)
        if best_key is None or k > best_key:
            best, best_key = t, k
    return best


def _owned(g: Game, p: int) -> list[int]:
    owner = g.owner
    return [t for t in _ALL if owner[t] == p]


def _amount(g: Game) -> int:
    """Armies a reinforce-rule placement puts down: ``R``, or 1 during setup."""
    return 1 if g.phase == "setup_place" else g.R


# ------------------------------------------------------------------------------------- 7.4 safe fallback


def safe_action(g: Game) -> Action:
    """FallbackSafeAgent: always legal, never attacks, never trades unless forced."""
    phase, p = g.phase, g.cur
    if phase == "setup_place":
        return (PLACE, _argmax(_owned(g, p), lambda t: pressure(g, t)), 1)
    if phase == "reinforce":
        if trade_mandatory(g):
            return (TRADE, *valid_sets(g.hands[p])[0])
        owned = _owned(g, p)
        border = [t for t in owned if is_border(g, t)]
        t = _argmax(border, lambda t: pressure(g, t)) if border else owned[0]
        return (PLACE, t, g.R)
    if phase == "attack":
        return (END_ATTACK,)
    if phase == "occupy":
        return (MOVE, g.occ_min)
    return (END_TURN,)


# ------------------------------------------------------------------------------------------- 8.4 balanced


def _balanced_place(g: Game, p: int) -> int:
    owner = g.owner
    owned = _owned(g, p)
    full = {c for c, members in enumerate(CONTINENT_MEMBERS) if all(owner[t] == p for t in members)}
    a = [t for t in owned if CONTINENT_OF[t] in full and is_border(g, t) and pressure(g, t) > 0]
    if a:
        return _argmax(a, lambda t: pressure(g, t))
    c = target_continent(g, p)
    if c is not None:
        b = [t for t in owned if any(owner[e] != p and CONTINENT_OF[e] == c for e in NEIGHBORS[t])]
        if b:
            return _argmax(b, lambda t: g.armies[t])
    return _argmax([t for t in owned if is_border(g, t)], lambda t: pressure(g, t))


def balanced_action(g: Game) -> Action:
    """The ``balanced`` bot (also the teacher), spec section 8.4."""
    phase, p, armies = g.phase, g.cur, g.armies
    if phase == "setup_place":
        return (PLACE, _balanced_place(g, p), 1)
    if phase == "reinforce":
        trade = _best_set(g)
        return trade if trade is not None else (PLACE, _balanced_place(g, p), g.R)
    if phase == "attack":
        c = target_continent(g, p)
        seeking = not g.conquered
        best, best_key = None, None
        for s, d in attack_pairs(g, p):
            a_s, a_d = armies[s], armies[d]
            if (a_s >= 3 and 2 * (a_s - 1) >= 3 * a_d) or (seeking and a_s - 1 >= a_d + 1):
                key = (CONTINENT_OF[d] == c, a_s - a_d)
                if best_key is None or key > best_key:
                    best, best_key = (s, d), key
        return (BLITZ, *best) if best is not None else (END_ATTACK,)
    if phase == "occupy":
        if not is_border(g, g.occ_dst):
            return (MOVE, g.occ_min)
        if not is_border(g, g.occ_src):
            return (MOVE, g.occ_max)
        return (MOVE, max(g.occ_min, armies[g.occ_src] // 2))
    return _fortify_to_border(g, p, lambda t: pressure(g, t))


def _fortify_to_border(g: Game, p: int, dest_key) -> Action:
    """Fortify rule shared by balanced and aggressive: richest interior source to the best border in reach."""
    owned = _owned(g, p)
    interior = [t for t in owned if g.armies[t] >= 2 and not is_border(g, t)]
    src = _argmax(interior, lambda t: g.armies[t])
    if src is None:
        return (END_TURN,)
    dst = _argmax([d for d in reach(g, src) if is_border(g, d)], dest_key)
    if dst is None:
        return (END_TURN,)
    return (FORTIFY, src, dst, g.armies[src] - 1)


# ----------------------------------------------------------------------------------------- 8.3 aggressive


def _aggressive_place(g: Game, p: int) -> int:
    armies = g.armies
    border = [t for t in _owned(g, p) if is_border(g, t)]
    return _argmax(border, lambda t: (armies[t] - min(armies[e] for e in enemy_nbrs(g, t)), armies[t]))


def aggressive_action(g: Game) -> Action:
    """The ``aggressive`` bot, spec section 8.3."""
    phase, p, armies = g.phase, g.cur, g.armies
    if phase == "setup_place":
        return (PLACE, _aggressive_place(g, p), 1)
    if phase == "reinforce":
        trade = _best_set(g)
        return trade if trade is not None else (PLACE, _aggressive_place(g, p), g.R)
    if phase == "attack":
        best, best_key = None, None
        for s, d in attack_pairs(g, p):
            if armies[s] - 1 >= armies[d] and (best_key is None or armies[s] - armies[d] > best_key):
                best, best_key = (s, d), armies[s] - armies[d]
        return (BLITZ, *best) if best is not None else (END_ATTACK,)
    if phase == "occupy":
        return (MOVE, g.occ_max)
    return _fortify_to_border(g, p, lambda t: armies[t])


# --------------------------------------------------------------------------------------------- 8.2 random


def random_action(g: Game, rng: random.Random | None = None) -> Action:
    """The ``random`` bot, spec section 8.2, drawing from ``rng`` (default: the acting seat's bot RNG)."""
    b = rng if rng is not None else g.bot_rng(g.cur)
    phase, p, armies = g.phase, g.cur, g.armies
    if phase == "setup_place":
        owned = _owned(g, p)
        return (PLACE, owned[b.randrange(len(owned))], 1)
    if phase == "reinforce":
        if trade_mandatory(g):
            sets = valid_sets(g.hands[p])
            return (TRADE, *sets[b.randrange(len(sets))])
        if trade_legal(g) and b.randrange(2) == 0:
            sets = valid_sets(g.hands[p])
            return (TRADE, *sets[b.randrange(len(sets))])
        owned = _owned(g, p)
        t = owned[b.randrange(len(owned))]
        return (PLACE, t, 1 + b.randrange(g.R))
    if phase == "attack":
        pairs = attack_pairs(g, p)
        i = b.randrange(len(pairs) + 1)
        if i == len(pairs):
            return (END_ATTACK,)
        s, d = pairs[i]
        return (ATTACK, s, d, 1 + b.randrange(min(3, armies[s] - 1)))
    if phase == "occupy":
        return (MOVE, g.occ_min + b.randrange(g.occ_max - g.occ_min + 1))
    pairs = fortify_pairs(g, p)
    i = b.randrange(len(pairs) + 1)
    if i == len(pairs):
        return (END_TURN,)
    s, d = pairs[i]
    return (FORTIFY, s, d, 1 + b.randrange(armies[s] - 1))


BOTS = {
    "random": random_action,
    "safe": safe_action,
    "aggressive": aggressive_action,
    "balanced": balanced_action,
    "teacher": balanced_action,
}

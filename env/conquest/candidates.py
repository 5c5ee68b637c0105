"""The compact candidate list of spec section 7.3: at most K legal actions for an LLM prompt.

Candidate 0 is the FallbackSafeAgent action; then up to K-1 others chosen by rank (the ``balanced`` action mapped
to LLM space first, then the phase's ranked pool), displayed in canonical order. Integer keys only, no RNG.

Choice the spec leaves open: in the ``reinforce`` pool, the non-border owned territories ("then for other owned
t") are ranked by the same key as the border ones (pressure desc, then index asc).
"""

from __future__ import annotations

from collections.abc import Iterator

from env.conquest.actions import ATTACK, BLITZ, FORTIFY, MOVE, PLACE, TRADE, Action
from env.conquest.board import NUM_TERRITORIES
from env.conquest.bots import balanced_action, is_border, pressure, ranked_sets, safe_action
from env.conquest.rules import attack_pairs, reach, trade_legal, trade_mandatory
from env.conquest.state import Game

_ALL = range(NUM_TERRITORIES)


def teacher_action(g: Game) -> Action:
    """The ``balanced`` action mapped to LLM space (``attack(s, d, k)`` becomes ``blitz(s, d)``)."""
    a = balanced_action(g)
    return (BLITZ, a[1], a[2]) if a[0] == ATTACK else a


def _by_pressure(g: Game, ts: list[int]) -> list[int]:
    return sorted(ts, key=lambda t: (-pressure(g, t), t))


def ranked_pool(g: Game) -> Iterator[Action]:
    """The phase's ranked pool, best first."""
    phase, p, owner, armies = g.phase, g.cur, g.owner, g.armies
    if phase == "setup_place":
        for t in _by_pressure(g, [t for t in _ALL if owner[t] == p]):
            yield (PLACE, t, 1)
    elif phase == "reinforce":
        if trade_mandatory(g):
            for cards in ranked_sets(g, p):
                yield (TRADE, *cards)
            return
        if trade_legal(g):
            for cards in ranked_sets(g, p)[:3]:
                yield (TRADE, *cards)
        owned = [t for t in _ALL if owner[t] == p]
        border = [t for t in owned if is_border(g, t)]
        other = [t for t in owned if not is_border(g, t)]
        for t in _by_pressure(g, border) + _by_pressure(g, other):
            yield (PLACE, t, g.R)
    elif phase == "attack":
        pairs = sorted(attack_pairs(g, p), key=lambda sd: (armies[sd[1]] - armies[sd[0]] + 1, -armies[sd[0]], sd))
        for s, d in pairs:
            yield (BLITZ, s, d)
    elif phase == "occupy":
        yield (MOVE, g.occ_max)
        yield (MOVE, (g.occ_min + g.occ_max) // 2)
    elif phase == "fortify":
        sources = [t for t in _ALL if owner[t] == p and armies[t] >= 2]
        sources.sort(key=lambda t: (is_border(g, t), -armies[t], t))
        for s in sources[:4]:
            dests = _by_pressure(g, [d for d in reach(g, s) if is_border(g, d)])
            for d in dests[:3]:
                yield (FORTIFY, s, d, armies[s] - 1)


def candidate_list(g: Game, k: int) -> list[Action]:
    """Spec section 7.3: ``[safe action] + sorted(chosen)`` with ``len(chosen) <= k - 1``."""
    first = safe_action(g)
    must = teacher_action(g)
    chosen = [] if must == first else [must]
    seen = {first, must}
    if len(chosen) < k - 1:
        for a in ranked_pool(g):
            if a not in seen:
                seen.add(a)
                chosen.append(a)
                if len(chosen) >= k - 1:
                    break
    chosen.sort()
    return [first, *chosen]

"""The agent's observation dict (spec section 9): plain JSON types, the agent's view only.

Hidden: the draw-pile order and other seats' card ids. ``armies_to_place`` is ``R`` in ``reinforce``, the agent's
remaining setup armies in ``setup_place``, else 0. ``events`` are copies (the live event log stays private).
"""

from __future__ import annotations

from typing import Any

from env.conquest.board import CARD_SYMBOL, CONTINENT_MEMBERS, IDS, NUM_TERRITORIES, SYMBOL_NAMES, trade_value
from env.conquest.state import Game

MAX_OBS_EVENTS = 20


def copy_event(e: dict[str, Any]) -> dict[str, Any]:
    """A copy of an event whose nested lists/dicts are copies too."""
    out = {}
    for k, v in e.items():
        if isinstance(v, list):
            v = v[:]
        elif isinstance(v, dict):
            v = {kk: (vv[:] if isinstance(vv, list) else vv) for kk, vv in v.items()}
        out[k] = v
    return out


def observation(g: Game, num_candidates: int) -> dict[str, Any]:
    """Build the observation dict of the current state."""
    owner, armies, n, agent = g.owner, g.armies, g.n, g.agent
    army_totals = [0] * n
    for t in range(NUM_TERRITORIES):
        army_totals[owner[t]] += armies[t]
    continent_owner = []
    for members in CONTINENT_MEMBERS:
        first = owner[members[0]]
        continent_owner.append(first if all(owner[t] == first for t in members) else -1)
    hand = g.hands[agent]
    phase = g.phase
    if phase == "reinforce":
        to_place = g.R
    elif phase == "setup_place":
        to_place = g.setup_left[agent]
    else:
        to_place = 0
    occupy = None
    if phase == "occupy":
        occupy = {"from": IDS[g.occ_src], "to": IDS[g.occ_dst], "min": g.occ_min, "max": g.occ_max}
    return {
        "task": g.opts.task,
        "seed": g.seed,
        "phase": phase,
        "reinforce_kind": g.rkind if phase == "reinforce" else None,
        "seat_to_act": g.cur,
        "agent_seat": agent,
        "round": g.round,
        "max_rounds": g.opts.max_rounds,
        "turn": g.turn,
        "owners": owner[:],
        "armies": armies[:],
        "alive": g.alive[:],
        "territory_counts": g.tcount[:],
        "army_totals": army_totals,
        "card_counts": [len(h) for h in g.hands],
        "hand": hand[:],
        "hand_symbols": [SYMBOL_NAMES[CARD_SYMBOL[c]] for c in hand],
        "sets_traded": g.sets_traded,
        "next_trade_value": trade_value(g.sets_traded + 1),
        "armies_to_place": to_place,
        "occupy": occupy,
        "conquered_this_turn": g.conquered,
        "continent_owner": continent_owner,
        "draw_pile_left": len(g.draw) - g.draw_pos,
        "discard_size": len(g.discard),
        "events": [copy_event(e) for e in g.events[-MAX_OBS_EVENTS:]],
        "done": g.done,
        "num_candidates": num_candidates,
    }

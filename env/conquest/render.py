"""Text for prompts: the candidate lines of spec section 7.3 and ``render_text()`` of section 9.

Choices the spec leaves open: an empty hand renders as ``hand: -``, no shown event as ``last: -``; the
``game_over`` event renders as ``game over: {outcome}``; a raw ``attack`` (never a candidate, only for logs) as
``attack S Name(a) -> D Name(Po,d) with k dice``; with ``territory_bonus="every_card"`` a trade line names every
bonus territory. The seat-to-act marker ``*`` is omitted once the game is over.
"""

from __future__ import annotations

from typing import Any

from env.conquest.actions import ATTACK, BLITZ, END_ATTACK, FORTIFY, MOVE, PLACE, TRADE, Action
from env.conquest.board import (
    CARD_SYMBOL,
    CODES,
    CONTINENT_BONUS,
    CONTINENT_CODES,
    CONTINENT_MEMBERS,
    INDEX,
    NAMES,
    NUM_TERRITORIES,
    SYMBOL_SHORT,
    WILD,
    trade_value,
)
from env.conquest.bots import threat
from env.conquest.rules import bonus_territories
from env.conquest.state import Game

MAX_CHARS = 2400
ANSWER_INSTRUCTION = 'answer with exactly {"action_index": k}'  # the last line of a conquest prompt (section 7.3)
_EVENT_CHARS = 60
_SHOWN_EVENTS = 6


def card_text(c: int) -> str:
    """``"3 ALB inf"`` for a territory card, ``"43 wild"`` for a wild card."""
    sym = CARD_SYMBOL[c]
    return f"{c} wild" if sym == WILD else f"{c} {CODES[c]} {SYMBOL_SHORT[sym]}"


def action_text(g: Game, a: Action) -> str:
    """The spec's one-line text of an action for the seat to act."""
    kind, armies, owner = a[0], g.armies, g.owner
    if kind == TRADE:
        cards = a[1:]
        syms = "/".join(SYMBOL_SHORT[CARD_SYMBOL[c]] for c in cards)
        text = f"trade {cards[0]},{cards[1]},{cards[2]} ({syms}) for +{trade_value(g.sets_traded + 1)}"
        return text + "".join(f" and +2 on {CODES[t]}" for t in bonus_territories(g, g.cur, cards))
    if kind == PLACE:
        t = a[1]
        return f"place {a[2]} on {CODES[t]} {NAMES[t]} (has {armies[t]}, enemy adj {threat(g, t)})"
    if kind in (ATTACK, BLITZ):
        s, d = a[1], a[2]
        text = f"attack {CODES[s]} {NAMES[s]}({armies[s]}) -> {CODES[d]} {NAMES[d]}(P{owner[d]},{armies[d]})"
        if kind == BLITZ:
            return text + " until won or 1 left"
        dice = a[3] if a[3] is not None else min(3, armies[s] - 1)
        return text + f" with {dice} dice"
    if kind == MOVE:
        s, d, n = g.occ_src, g.occ_dst, a[1]
        return f"move {n} into {CODES[d]} (leave {armies[s] - n} in {CODES[s]})"
    if kind == FORTIFY:
        s, d = a[1], a[2]
        return f"fortify {a[3]} from {CODES[s]}({armies[s]}) to {CODES[d]}({armies[d]})"
    return "end attacks" if kind == END_ATTACK else "end turn without fortifying"


def candidate_lines(g: Game, cands: list[Action]) -> list[str]:
    """``"{k}. {text}"`` for each candidate."""
    return [f"{k}. {action_text(g, a)}" for k, a in enumerate(cands)]


def _code(tid: str) -> str:
    return CODES[INDEX[tid]]


def event_phrase(e: dict[str, Any]) -> str | None:
    """The short phrase of an event for the ``last:`` line, ``None`` for events not shown."""
    kind, p = e["type"], f"P{e.get('seat')}"
    if kind == "battle":
        return f"{p} {_code(e['from'])}>{_code(e['to'])} -{e['att_loss']}/-{e['def_loss']}"
    if kind == "conquer":
        return f"{p} took {_code(e['to'])} from P{e['victim']}"
    if kind == "eliminate":
        return f"{p} eliminated P{e['victim']}"
    if kind == "trade":
        return f"{p} traded +{e['value']}"
    if kind == "place":
        return f"{p} +{e['n']} {_code(e['territory'])}"
    if kind == "fortify":
        return f"{p} moved {e['n']} {_code(e['from'])}>{_code(e['to'])}"
    if kind == "card":
        return f"{p} drew"
    if kind == "turn_start":
        return f"{p} turn {e['turn']}"
    if kind == "game_over":
        return f"game over: {e['outcome']}"
    return None


def render_text(g: Game) -> str:
    """The agent's view as text (spec section 9), at most 2400 characters."""
    owner, armies, n = g.owner, g.armies, g.n
    lines = [
        f"conquest {g.opts.task} | round {g.round}/{g.opts.max_rounds} turn {g.turn} | {g.phase} | you P{g.agent}"
    ]
    seat_armies = [0] * n
    for t in range(NUM_TERRITORIES):
        seat_armies[owner[t]] += armies[t]
    seats = []
    for s in range(n):
        star = "*" if s == g.cur and not g.done else ""
        if g.alive[s]:
            seats.append(f"P{s}{star} {g.tcount[s]}t {seat_armies[s]}a {len(g.hands[s])}c")
        else:
            seats.append(f"P{s} out")
    lines.append(" | ".join(seats) + f" | next set +{trade_value(g.sets_traded + 1)}")
    for c, members in enumerate(CONTINENT_MEMBERS):
        cells = " ".join(f"{CODES[t]}{owner[t]}:{armies[t]}" for t in members)
        first = owner[members[0]]
        whole = f" [P{first}]" if all(owner[t] == first for t in members) else ""
        lines.append(f"{CONTINENT_CODES[c]}+{CONTINENT_BONUS[c]} {cells}{whole}")
    hand = ", ".join(card_text(c) for c in g.hands[g.agent]) or "-"
    to_place = g.R if g.phase == "reinforce" else (g.setup_left[g.agent] if g.phase == "setup_place" else 0)
    lines.append(f"hand: {hand} | to place {to_place} | conquered {'yes' if g.conquered else 'no'}")
    if g.phase == "occupy":
        s, d = g.occ_src, g.occ_dst
        lines.append(f"occupy {CODES[d]} from {CODES[s]}: move {g.occ_min}..{g.occ_max}")
    phrases = [p for p in (event_phrase(e) for e in g.events) if p is not None][-_SHOWN_EVENTS:]
    lines.append("last: " + ("; ".join(p[:_EVENT_CHARS] for p in phrases) or "-"))
    return "\n".join(lines)[:MAX_CHARS]

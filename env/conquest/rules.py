"""The rules of conquest (spec sections 3-6): setup, legality, enumeration, applying actions, the end of the game.

Every function takes the :class:`~env.conquest.state.Game` and works on its flat lists. ``apply`` expects a legal
action tuple (see :mod:`env.conquest.actions`); the environment checks legality first. The game RNG is drawn only
in :func:`new_game` (deal, deck, automatic placement), by battles and by a discard reshuffle.

Choices the spec leaves open (deterministic, documented here):

* Automatic initial placement inside ``reset`` emits no events (only play does).
* A truncation by the round limit leaves ``round = max_rounds + 1`` (the round was counted, its first turn never
  started) and ``cur`` on the seat that would have moved.
* ``turn_start`` events also carry ``turn`` (the render phrase ``P1 turn 14`` needs it); the agent's ``card``
  events carry the card id, bots' do not; ``eliminate.cards_taken`` is the number of cards taken; with
  ``territory_bonus="every_card"`` ``trade.bonus_territory`` names the first bonus territory.
* A ``max_agent_steps`` truncation during ``occupy`` first moves the minimum in (:func:`truncate`).
* ``eliminate`` is emitted at the conquest that eliminates (so it lands in the same agent step as the
  ``elimination`` reward); ``conquer`` is emitted when the armies move in (it carries ``moved``), so it may come
  one agent step later when the agent decides the occupation.
"""

from __future__ import annotations

import random
from itertools import combinations

from env.conquest.actions import ATTACK, BLITZ, END_ATTACK, END_TURN, FORTIFY, MOVE, PLACE, TRADE, Action, to_dict
from env.conquest.board import (
    ADJACENT,
    CARD_BONUS_ARMIES,
    CARD_SYMBOL,
    CONTINENT_BONUS,
    CONTINENT_MEMBERS,
    IDS,
    INITIAL_ARMIES,
    MIN_REINFORCEMENT,
    NEIGHBORS,
    NUM_CARDS,
    NUM_TERRITORIES,
    TERRITORIES_PER_ARMY,
    WILD,
    trade_value,
)
from env.conquest.state import Game
from env.conquest.tasks import Options

_ALL = range(NUM_TERRITORIES)


# ----------------------------------------------------------------------------------------------------- setup


def new_game(opts: Options, seed: int) -> Game:
    """Deal, shuffle the deck and (with ``placement="auto"``) place every army; draws exactly as spec section 3."""
    g = Game(opts, seed)
    n, rng = g.n, g.rng
    order = list(_ALL)
    rng.shuffle(order)
    deck = list(range(NUM_CARDS))
    rng.shuffle(deck)
    g.draw = deck
    for i, t in enumerate(order):
        s = i % n
        g.owner[t] = s
        g.armies[t] = 1
        g.tcount[s] += 1
    g.setup_left = [INITIAL_ARMIES[n] - g.tcount[s] for s in range(n)]
    if opts.placement == "auto":
        owned = [[t for t in _ALL if g.owner[t] == s] for s in range(n)]
        left, armies, randrange = g.setup_left, g.armies, rng.randrange
        while any(left):
            for s in range(n):
                if left[s]:
                    lst = owned[s]
                    armies[lst[randrange(len(lst))]] += 1
                    left[s] -= 1
        g.round = 1
        start_turn(g, 0)
    else:
        g.cur = 0
    return g


# --------------------------------------------------------------------------------------------------- helpers


def continent_bonus(g: Game, p: int) -> int:
    """Sum of the bonuses of the continents seat ``p`` owns completely."""
    owner = g.owner
    total = 0
    for c, members in enumerate(CONTINENT_MEMBERS):
        for t in members:
            if owner[t] != p:
                break
        else:
            total += CONTINENT_BONUS[c]
    return total


def reinforcements(g: Game, p: int) -> int:
    """Turn-start armies: ``max(3, territories // 3)`` plus the bonuses of fully owned continents."""
    return max(MIN_REINFORCEMENT, g.tcount[p] // TERRITORIES_PER_ARMY) + continent_bonus(g, p)


def is_set(c1: int, c2: int, c3: int) -> bool:
    """Three cards form a set: same symbol, three different symbols, or any two plus at least one wild."""
    a, b, c = CARD_SYMBOL[c1], CARD_SYMBOL[c2], CARD_SYMBOL[c3]
    return a == WILD or b == WILD or c == WILD or (a == b == c) or (a != b and b != c and a != c)


def valid_sets(hand: list[int]) -> list[tuple[int, int, int]]:
    """Every set in a sorted hand, in lexicographic id order."""
    return [s for s in combinations(hand, 3) if is_set(*s)]


def has_set(hand: list[int]) -> bool:
    return len(hand) >= 5 or any(is_set(*s) for s in combinations(hand, 3))


def trade_mandatory(g: Game) -> bool:
    """In ``reinforce``, a hand of 5 or more cards must trade first (both reinforce kinds)."""
    return len(g.hands[g.cur]) >= 5


def trade_legal(g: Game) -> bool:
    """Whether any trade is legal now (spec section 5.2)."""
    if g.phase != "reinforce":
        return False
    hand = g.hands[g.cur]
    if len(hand) >= 5:
        return True
    return g.rkind == "turn_start" and has_set(hand)


def bonus_territories(g: Game, p: int, cards: tuple[int, ...]) -> list[int]:
    """Territories that get the +2 card bonus if seat ``p`` trades ``cards`` now (under the active option)."""
    mode = g.opts.territory_bonus
    if mode == "off" or (mode == "once_per_turn" and g.bonus_used):
        return []
    owner = g.owner
    hits = [c for c in cards if c < NUM_TERRITORIES and owner[c] == p]
    return hits[:1] if mode == "once_per_turn" else hits


def can_attack_from(g: Game, s: int, p: int) -> bool:
    if g.owner[s] != p or g.armies[s] < 2:
        return False
    owner = g.owner
    return any(owner[e] != p for e in NEIGHBORS[s])


def attack_pairs(g: Game, p: int) -> list[tuple[int, int]]:
    """Legal ``(src, dst)`` attack pairs of seat ``p`` in index order."""
    owner, armies = g.owner, g.armies
    return [(s, d) for s in _ALL if owner[s] == p and armies[s] >= 2 for d in NEIGHBORS[s] if owner[d] != p]


def any_attack(g: Game, p: int) -> bool:
    owner, armies = g.owner, g.armies
    for s in _ALL:
        if owner[s] == p and armies[s] >= 2:
            for d in NEIGHBORS[s]:
                if owner[d] != p:
                    return True
    return False


def reach(g: Game, s: int) -> list[int]:
    """Territories (sorted, ``s`` excluded) a fortify from ``s`` may reach under the active ``fortify`` option."""
    owner = g.owner
    p = owner[s]
    if g.opts.fortify == "adjacent":
        return [d for d in NEIGHBORS[s] if owner[d] == p]
    seen = {s}
    stack = [s]
    while stack:
        t = stack.pop()
        for e in NEIGHBORS[t]:
            if e not in seen and owner[e] == p:
                seen.add(e)
                stack.append(e)
    seen.discard(s)
    return sorted(seen)


def any_fortify(g: Game, p: int) -> bool:
    """A fortify exists iff some owned territory with >= 2 armies has an owned neighbour (both modes)."""
    owner, armies = g.owner, g.armies
    for s in _ALL:
        if owner[s] == p and armies[s] >= 2:
            for e in NEIGHBORS[s]:
                if owner[e] == p:
                    return True
    return False


def fortify_pairs(g: Game, p: int) -> list[tuple[int, int]]:
    """Legal ``(src, dst)`` fortify pairs of seat ``p`` in index order."""
    owner, armies = g.owner, g.armies
    return [(s, d) for s in _ALL if owner[s] == p and armies[s] >= 2 for d in reach(g, s)]


# ------------------------------------------------------------------------------------------ legality / lists


def forced_action(g: Game) -> Action | None:
    """The single legal action when the decision has exactly one, else ``None`` (decisions of any seat)."""
    phase, p = g.phase, g.cur
    if phase == "attack":
        return None if any_attack(g, p) else (END_ATTACK,)
    if phase == "fortify":
        return None if any_fortify(g, p) else (END_TURN,)
    if phase == "occupy":
        return (MOVE, g.occ_min) if g.occ_min == g.occ_max else None
    if phase == "reinforce":
        hand = g.hands[p]
        if len(hand) >= 5:
            sets = valid_sets(hand)
            return (TRADE, *sets[0]) if len(sets) == 1 else None
        if g.rkind == "turn_start" and has_set(hand):
            return None
        if g.tcount[p] == 1 and g.R == 1:
            return (PLACE, g.owner.index(p), 1)
        return None
    if phase == "setup_place" and g.tcount[p] == 1:
        return (PLACE, g.owner.index(p), 1)
    return None


def legal_actions(g: Game) -> list[Action]:
    """Every legal action of the seat to act, in canonical order (spec section 7.2); empty when done."""
    if g.done:
        return []
    p, owner, armies = g.cur, g.owner, g.armies
    phase = g.phase
    if phase == "setup_place":
        return [(PLACE, t, 1) for t in _ALL if owner[t] == p]
    if phase == "reinforce":
        out: list[Action] = []
        if trade_legal(g):
            out = [(TRADE, *s) for s in valid_sets(g.hands[p])]
        if not trade_mandatory(g):
            out += [(PLACE, t, k) for t in _ALL if owner[t] == p for k in range(1, g.R + 1)]
        return out
    if phase == "attack":
        pairs = attack_pairs(g, p)
        out = [(ATTACK, s, d, k) for s, d in pairs for k in range(1, min(3, armies[s] - 1) + 1)]
        return out + [(BLITZ, s, d) for s, d in pairs] + [(END_ATTACK,)]
    if phase == "occupy":
        return [(MOVE, k) for k in range(g.occ_min, g.occ_max + 1)]
    out = [(FORTIFY, s, d, k) for s, d in fortify_pairs(g, p) for k in range(1, armies[s])]
    return out + [(END_TURN,)]


def is_legal(g: Game, a: Action) -> bool:
    """Whether action tuple ``a`` is legal for the seat to act (attack dice ``None`` = the maximum)."""
    if g.done or not a:
        return False
    kind, phase, p, owner, armies = a[0], g.phase, g.cur, g.owner, g.armies
    if phase == "setup_place":
        return kind == PLACE and a[2] == 1 and owner[a[1]] == p
    if phase == "reinforce":
        if kind == TRADE:
            hand = g.hands[p]
            return trade_legal(g) and a[1] in hand and a[2] in hand and a[3] in hand and is_set(a[1], a[2], a[3])
        return kind == PLACE and not trade_mandatory(g) and owner[a[1]] == p and 1 <= a[2] <= g.R
    if phase == "attack":
        if kind == END_ATTACK:
            return True
        if kind not in (ATTACK, BLITZ):
            return False
        s, d = a[1], a[2]
        if owner[s] != p or owner[d] == p or armies[s] < 2 or d not in ADJACENT[s]:
            return False
        return kind == BLITZ or a[3] is None or 1 <= a[3] <= min(3, armies[s] - 1)
    if phase == "occupy":
        return kind == MOVE and g.occ_min <= a[1] <= g.occ_max
    if phase == "fortify":
        if kind == END_TURN:
            return True
        if kind != FORTIFY:
            return False
        s, d, k = a[1], a[2], a[3]
        if owner[s] != p or owner[d] != p or s == d or not 1 <= k <= armies[s] - 1:
            return False
        return d in ADJACENT[s] if g.opts.fortify == "adjacent" else d in reach(g, s)
    return False


# ---------------------------------------------------------------------------------------------------- apply


def apply(g: Game, a: Action) -> None:
    """Apply legal action ``a`` for the seat to act, with all its consequences up to the next decision."""
    kind = a[0]
    if kind == PLACE:
        _place(g, a[1], a[2])
    elif kind == TRADE:
        _trade(g, a[1:])
    elif kind == ATTACK:
        s, d = a[1], a[2]
        dice = a[3] if a[3] is not None else min(3, g.armies[s] - 1)
        if _battle(g, s, d, dice):
            _conquest(g, s, d, dice)
    elif kind == BLITZ:
        _blitz(g, a[1], a[2])
    elif kind == MOVE:
        _move(g, a[1])
    elif kind == END_ATTACK:
        _end_attack(g)
    elif kind == FORTIFY:
        s, d, k = a[1], a[2], a[3]
        g.armies[s] -= k
        g.armies[d] += k
        g.events.append({"type": "fortify", "seat": g.cur, "from": IDS[s], "to": IDS[d], "n": k})
        end_turn(g)
    else:
        g.events.append({"type": "end_turn", "seat": g.cur})
        end_turn(g)


def auto_event(g: Game, a: Action) -> None:
    """Record that ``a`` was applied automatically (the only legal action)."""
    g.events.append({"type": "auto", "seat": g.cur, "action": to_dict(a)})


def _place(g: Game, t: int, k: int) -> None:
    p = g.cur
    g.armies[t] += k
    g.events.append({"type": "place", "seat": p, "territory": IDS[t], "n": k})
    if g.phase == "setup_place":
        g.setup_left[p] -= 1
        n = g.n
        for i in range(1, n + 1):
            s = (p + i) % n
            if g.setup_left[s]:
                g.cur = s
                return
        g.round = 1
        start_turn(g, 0)
        return
    g.R -= k
    if g.R == 0 and len(g.hands[p]) < 5:
        g.phase = "attack"
        g.rkind = None


def _trade(g: Game, cards: tuple[int, ...]) -> None:
    p = g.cur
    hand = g.hands[p]
    for c in cards:
        hand.remove(c)
    g.sets_traded += 1
    value = trade_value(g.sets_traded)
    g.R += value
    g.discard.extend(cards)
    bonus = bonus_territories(g, p, cards)
    for t in bonus:
        g.armies[t] += CARD_BONUS_ARMIES
    if bonus and g.opts.territory_bonus == "once_per_turn":
        g.bonus_used = True
    g.events.append(
        {
            "type": "trade",
            "seat": p,
            "cards": list(cards),
            "value": value,
            "bonus_territory": IDS[bonus[0]] if bonus else None,
        }
    )


def _dice_fast(rng, k: int) -> list[int]:
    """``[rng.randint(1, 6) for _ in range(k)]``, inlined: CPython draws ``randint(1, 6)`` as ``1 +
    _randbelow(6)``, i.e. ``getrandbits(3)`` until the value is below 6."""
    bits = rng.getrandbits
    out = []
    for _ in range(k):
        r = bits(3)
        while r >= 6:
            r = bits(3)
        out.append(r + 1)
    return out


def _dice_plain(rng, k: int) -> list[int]:
    return [rng.randint(1, 6) for _ in range(k)]


def _pick_dice():
    """Use the inlined dice only if this interpreter draws exactly as ``randint`` (checked once at import)."""
    a, b = random.Random(20260101), random.Random(20260101)
    return _dice_fast if _dice_fast(a, 2000) == _dice_plain(b, 2000) and a.random() == b.random() else _dice_plain


roll_dice = _pick_dice()


def _battle(g: Game, s: int, d: int, dice: int) -> bool:
    """One battle (attacker dice, then defender dice, from the game RNG); True if ``d`` is conquered."""
    armies = g.armies
    rng = g.rng
    g.rng_state = None
    att = roll_dice(rng, dice)
    att.sort(reverse=True)
    dfn = roll_dice(rng, 2 if armies[d] >= 2 else 1)
    dfn.sort(reverse=True)
    m = len(dfn)
    a_loss = d_loss = 0
    for i in range(dice if dice < m else m):
        if att[i] > dfn[i]:
            d_loss += 1
        else:
            a_loss += 1
    armies[s] -= a_loss
    armies[d] -= d_loss
    g.events.append(
        {
            "type": "battle",
            "seat": g.cur,
            "from": IDS[s],
            "to": IDS[d],
            "att": att,
            "def": dfn,
            "att_loss": a_loss,
            "def_loss": d_loss,
        }
    )
    return armies[d] == 0


def _blitz(g: Game, s: int, d: int) -> None:
    armies = g.armies
    while True:
        dice = armies[s] - 1 if armies[s] < 4 else 3
        if _battle(g, s, d, dice):
            _conquest(g, s, d, dice)
            return
        if armies[s] == 1:
            return


def _conquest(g: Game, s: int, d: int, dice: int) -> None:
    p = g.cur
    victim = g.owner[d]
    g.owner[d] = p
    g.tcount[p] += 1
    g.tcount[victim] -= 1
    g.conquered = True
    elim = g.tcount[victim] == 0
    taken = -1
    if elim:
        g.alive[victim] = False
        g.elim_round[victim] = g.round
        taken = len(g.hands[victim])
        g.hands[p] = sorted(g.hands[p] + g.hands[victim])
        g.hands[victim] = []
        if p == g.agent:
            g.agent_elims += 1
        g.events.append({"type": "eliminate", "seat": p, "victim": victim, "cards_taken": taken})
    g.occ_src, g.occ_dst, g.occ_min, g.occ_max = s, d, dice, g.armies[s] - 1
    g.occ_victim, g.occ_elim = victim, taken
    if elim and (victim == g.agent or g.tcount[p] == NUM_TERRITORIES):
        _move(g, dice)
        finish(g, "win" if p == g.agent else "loss")
        return
    g.phase = "occupy"


def _move(g: Game, k: int) -> None:
    p, s, d, victim = g.cur, g.occ_src, g.occ_dst, g.occ_victim
    g.armies[s] -= k
    g.armies[d] = k
    g.events.append({"type": "conquer", "seat": p, "victim": victim, "from": IDS[s], "to": IDS[d], "moved": k})
    elim = g.occ_elim >= 0
    g.occ_src = g.occ_dst = g.occ_min = g.occ_max = g.occ_victim = g.occ_elim = -1
    if elim and len(g.hands[p]) >= 6:
        g.phase = "reinforce"
        g.rkind = "after_elimination"
        g.R = 0
    else:
        g.phase = "attack"


def _end_attack(g: Game) -> None:
    p = g.cur
    if g.conquered:
        if g.draw_pos >= len(g.draw) and g.discard:
            g.rng.shuffle(g.discard)
            g.rng_state = None
            g.draw, g.draw_pos, g.discard = g.discard, 0, []
        if g.draw_pos < len(g.draw):
            card = g.draw[g.draw_pos]
            g.draw_pos += 1
            hand = g.hands[p]
            hand.append(card)
            hand.sort()
            event = {"type": "card", "seat": p}
            if p == g.agent:
                event["card"] = card
            g.events.append(event)
    g.phase = "fortify"


# --------------------------------------------------------------------------------------------- turns and end


def start_turn(g: Game, p: int) -> None:
    """Spec section 5.1: count the turn, reset the per-turn flags, compute R, enter ``reinforce``."""
    g.cur = p
    g.turn += 1
    g.conquered = False
    g.bonus_used = False
    g.R = reinforcements(g, p)
    g.phase = "reinforce"
    g.rkind = "turn_start"
    g.events.append({"type": "turn_start", "seat": p, "round": g.round, "turn": g.turn, "reinforcements": g.R})


def end_turn(g: Game) -> None:
    """Pass to the next alive seat (counting rounds); truncate when the round limit is passed."""
    p, alive = g.cur, g.alive
    nxt = next((s for s in range(p + 1, g.n) if alive[s]), None)
    if nxt is None:
        nxt = alive.index(True)
        g.round += 1
    g.cur = nxt
    if g.round > g.opts.max_rounds:
        finish(g, "timeout")
    else:
        start_turn(g, nxt)


def final_score(g: Game, outcome: str) -> float:
    """Spec section 6: win 1.0; loss by elimination round; timeout by the agent's territories and armies."""
    a = g.agent
    if outcome == "win":
        return 1.0
    if outcome == "loss":
        return round(0.25 * min(1.0, (g.elim_round[a] - 1) / g.opts.max_rounds), 6)
    armies_a = sum(k for t, k in enumerate(g.armies) if g.owner[t] == a)
    armies_all = sum(g.armies)
    return round(0.3 + 0.6 * (0.5 * g.tcount[a] / NUM_TERRITORIES + 0.5 * armies_a / armies_all), 6)


def truncate(g: Game) -> None:
    """End the episode by ``max_agent_steps``; a pending occupation first completes with its minimum move (the
    armies stay on the agent's side, so the score is unchanged, and every territory keeps >= 1 army)."""
    if g.phase == "occupy":
        _move(g, g.occ_min)
    finish(g, "timeout")


def finish(g: Game, outcome: str) -> None:
    """End the episode with ``outcome`` ("win", "loss" or "timeout")."""
    g.done = True
    g.outcome = outcome
    g.terminated = outcome != "timeout"
    g.truncated = outcome == "timeout"
    g.phase = "game_over"
    g.rkind = None
    if outcome == "win":
        g.winner = g.agent
    else:
        g.winner = next((s for s in range(g.n) if g.tcount[s] == NUM_TERRITORIES), None)
    g.score = final_score(g, outcome)
    g.events.append({"type": "game_over", "outcome": outcome, "winner": g.winner})

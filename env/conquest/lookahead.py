"""``teacher_lookahead`` (spec section 8.5): score every candidate by a short common-random-numbers rollout.

For each candidate in index order: snapshot the game, apply the candidate, play the agent seat with ``balanced``
and the bots with their own policies until the agent's next turn starts (in setup: its next placement) or the
game ends, score ``V = 10*T_a + A_a + 20*B_a - 5*max_o T_o`` (+10^6 on a win, -10^6 on a loss), restore. Every
rollout starts from the same RNG states, so all candidates see the same dice. The best V wins; ties go to the
balanced candidate, then to the lower index.
"""

from __future__ import annotations

from env.conquest.bots import BOTS, balanced_action
from env.conquest.candidates import teacher_action
from env.conquest.rules import apply, auto_event, continent_bonus, forced_action
from env.conquest.state import Game

WIN_BONUS = 10**6


def rollout_value(g: Game) -> int:
    """``V`` of the current state for the agent."""
    a = g.agent
    armies_a = sum(k for t, k in enumerate(g.armies) if g.owner[t] == a)
    others = max((g.tcount[s] for s in range(g.n) if s != a), default=0)
    v = 10 * g.tcount[a] + armies_a + 20 * continent_bonus(g, a) - 5 * others
    if g.outcome == "win":
        v += WIN_BONUS
    elif g.outcome == "loss":
        v -= WIN_BONUS
    return v


def _play_to_next_turn(g: Game, turn0: int) -> None:
    agent, bots = g.agent, g.opts.bots
    while not g.done:
        if g.cur == agent and (g.turn != turn0 or g.phase == "setup_place"):
            return
        a = forced_action(g)
        if a is not None:
            auto_event(g, a)
            apply(g, a)
        elif g.cur == agent:
            apply(g, balanced_action(g))
        else:
            apply(g, BOTS[bots[g.cur]](g))


def lookahead_index(g: Game) -> int:
    """The chosen index into ``g.cands`` (the agent's current candidate list); the game is left unchanged."""
    cands = g.cands
    preferred = cands.index(teacher_action(g))
    snap = g.snapshot()
    turn0 = g.turn
    best, best_key = 0, None
    for i, a in enumerate(cands):
        apply(g, a)
        _play_to_next_turn(g, turn0)
        key = (rollout_value(g), i == preferred, -i)
        if best_key is None or key > best_key:
            best, best_key = i, key
        g.restore(snap)
    return best

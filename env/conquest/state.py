"""The complete mutable state of one conquest episode, as flat lists and scalars, with snapshot/restore.

:class:`Game` holds no behaviour beyond copying itself and handing out its RNGs; the rules live in
:mod:`env.conquest.rules`. Lists are indexed by territory (0..41) or seat (0..n-1).

RNG bookkeeping (why it looks unusual): ``Random.getstate()`` costs tens of microseconds, so the state tuple is
cached in ``rng_state`` and dropped (set to ``None``) by every code path that draws. A snapshot taken with a valid
cache reuses the tuple, and restoring a snapshot whose tuple is the cached one skips ``setstate``; the observable
behaviour is exactly that of a full copy. Bot RNGs (spec section 3) are created lazily: ``brng[s] is None`` means
"fresh from the formula for the current seed", which is what a seat's RNG is until it is first drawn.
"""

from __future__ import annotations

import random
from operator import attrgetter
from typing import Any

from env.conquest.tasks import Options

BOT_SEED_FACTOR = 1_000_003

# Scalars and never-mutated-in-place objects: a snapshot stores them by reference.
_SCALARS = (
    "opts",
    "n",
    "agent",
    "phase",
    "rkind",
    "R",
    "occ_src",
    "occ_dst",
    "occ_min",
    "occ_max",
    "occ_victim",
    "occ_elim",
    "cur",
    "turn",
    "round",
    "conquered",
    "bonus_used",
    "draw",
    "draw_pos",
    "sets_traded",
    "seed",
    "done",
    "terminated",
    "truncated",
    "outcome",
    "winner",
    "score",
    "agent_steps",
    "agent_elims",
    "ref_t",
    "ref_b",
    "ref_elims",
    "cands",
)
_get_scalars = attrgetter(*_SCALARS)


class Game:
    """One episode's state. Field meanings (spec names in parentheses):

    * board: ``owner``, ``armies`` (per territory), ``tcount`` (territories per seat), ``alive``,
      ``elim_round`` (round of elimination, 0 while alive), ``setup_left`` (armies still to place in setup);
    * cards: ``hands`` (sorted card ids per seat), ``draw`` (the draw pile, never mutated in place) and
      ``draw_pos``, ``discard``, ``sets_traded``;
    * turn: ``phase``, ``rkind`` (reinforce kind or None), ``R`` (armies to place), ``occ_*`` (occupy payload:
      source, target, min, max, victim, cards taken from the victim if it was eliminated else -1),
      ``cur`` (seat to act), ``turn``, ``round``, ``conquered`` (conquered_this_turn),
      ``bonus_used`` (bonus_used_this_turn);
    * randomness: ``seed``, ``rng`` (game RNG), ``brng`` (bot RNGs), cached states (see module docstring);
    * episode: ``done``, ``terminated``, ``truncated``, ``outcome`` ("win"/"loss"/"timeout"), ``winner``,
      ``score`` (final score), ``agent_steps``, ``agent_elims`` (seats eliminated by the agent);
    * agent bookkeeping: ``ref_t``/``ref_b``/``ref_elims`` (territories, continent bonus and eliminations when the
      agent's current decision was requested), ``events`` (since that decision), ``cands`` (cached candidates).
    """

    __slots__ = (
        *_SCALARS,
        "owner",
        "armies",
        "tcount",
        "alive",
        "elim_round",
        "setup_left",
        "hands",
        "discard",
        "events",
        "rng",
        "rng_state",
        "brng",
        "bstate",
    )

    def __init__(self, opts: Options, seed: int) -> None:
        n = opts.players
        self.opts = opts
        self.n = n
        self.agent = opts.agent_seat
        self.owner = [0] * 42
        self.armies = [0] * 42
        self.tcount = [0] * n
        self.alive = [True] * n
        self.elim_round = [0] * n
        self.setup_left = [0] * n
        self.hands: list[list[int]] = [[] for _ in range(n)]
        self.draw: list[int] = []
        self.draw_pos = 0
        self.discard: list[int] = []
        self.sets_traded = 0
        self.phase = "setup_place"
        self.rkind: str | None = None
        self.R = 0
        self.occ_src = self.occ_dst = self.occ_min = self.occ_max = self.occ_victim = self.occ_elim = -1
        self.cur = 0
        self.turn = 0
        self.round = 0
        self.conquered = False
        self.bonus_used = False
        self.seed = seed
        self.rng = random.Random(seed)
        self.rng_state: Any = None
        self.brng: list[random.Random | None] = [None] * n
        self.bstate: list[Any] = [None] * n
        self.done = False
        self.terminated = False
        self.truncated = False
        self.outcome: str | None = None
        self.winner: int | None = None
        self.score: float | None = None
        self.agent_steps = 0
        self.agent_elims = 0
        self.ref_t = self.ref_b = self.ref_elims = 0
        self.events: list[dict[str, Any]] = []
        self.cands: list[tuple] | None = None

    def bot_rng(self, seat: int) -> random.Random:
        """Seat ``seat``'s bot RNG ``Random(1_000_003 * (seed + 1) + seat)``; the caller is about to draw from it."""
        r = self.brng[seat]
        if r is None:
            r = self.brng[seat] = random.Random(BOT_SEED_FACTOR * (self.seed + 1) + seat)
        self.bstate[seat] = None
        return r

    def reseed(self, seed: int) -> None:
        """Replace the game RNG and every bot RNG for ``seed`` (spec section 3); nothing else changes."""
        self.seed = seed
        self.rng = random.Random(seed)
        self.rng_state = None
        self.brng = [None] * self.n
        self.bstate = [None] * self.n

    def resample_hidden(self, seed: int) -> None:
        """Deal again, from ``random.Random(seed)``, the cards the agent's observation does not identify: the undrawn
        part of the draw pile and the other seats' hands are pooled, shuffled and dealt back in the same counts (the
        hands sorted, as always). The board, the agent's hand, the discard, every count and the RNGs stay."""
        rng = random.Random(seed)
        others = [s for s in range(self.n) if s != self.agent]
        pool = self.draw[self.draw_pos :] + [card for s in others for card in self.hands[s]]
        rng.shuffle(pool)
        dealt = 0
        for s in others:
            count = len(self.hands[s])
            self.hands[s] = sorted(pool[dealt : dealt + count])
            dealt += count
        self.draw = self.draw[: self.draw_pos] + pool[dealt:]  # a new list: the pile is never changed in place

    def snapshot(self) -> tuple:
        """An independent copy of the whole state (lists copied, RNG states as immutable tuples)."""
        rs = self.rng_state
        if rs is None:
            rs = self.rng_state = self.rng.getstate()
        bots = []
        for s, r in enumerate(self.brng):
            if r is None:
                bots.append(None)
            else:
                st = self.bstate[s]
                if st is None:
                    st = self.bstate[s] = r.getstate()
                bots.append(st)
        return (
            _get_scalars(self),
            self.owner[:],
            self.armies[:],
            self.tcount[:],
            self.alive[:],
            self.elim_round[:],
            self.setup_left[:],
            [h[:] for h in self.hands],
            self.discard[:],
            self.events[:],
            rs,
            tuple(bots),
        )

    def restore(self, snap: tuple) -> None:
        """Make this state equal to ``snap`` (which stays untouched and reusable)."""
        scalars, owner, armies, tcount, alive, elim_round, setup_left, hands, discard, events, rs, bots = snap
        for name, value in zip(_SCALARS, scalars, strict=True):
            setattr(self, name, value)
        self.owner = owner[:]
        self.armies = armies[:]
        self.tcount = tcount[:]
        self.alive = alive[:]
        self.elim_round = elim_round[:]
        self.setup_left = setup_left[:]
        self.hands = [h[:] for h in hands]
        self.discard = discard[:]
        self.events = events[:]
        if self.rng_state is not rs:
            self.rng.setstate(rs)
            self.rng_state = rs
        n = len(bots)
        if len(self.brng) != n:
            self.brng = [None] * n
            self.bstate = [None] * n
        for s, st in enumerate(bots):
            if st is None:
                self.brng[s] = None
                self.bstate[s] = None
            elif self.bstate[s] is not st or self.brng[s] is None:
                r = self.brng[s]
                if r is None:
                    r = self.brng[s] = random.Random()
                r.setstate(st)
                self.bstate[s] = st

"""``ConquestEnv``: the conquest board game as a Gymnasium-style, snapshot-able environment (spec sections 3-9)."""

from __future__ import annotations

from typing import Any

from env.conquest.actions import ATTACK, Action, from_dict, to_dict
from env.conquest.bots import BOTS
from env.conquest.candidates import candidate_list
from env.conquest.observation import copy_event, observation
from env.conquest.parse import check_index, parse_reply
from env.conquest.render import candidate_lines
from env.conquest.render import render_text as _render_text
from env.conquest.rules import (
    apply,
    auto_event,
    continent_bonus,
    forced_action,
    is_legal,
    legal_actions,
    new_game,
    truncate,
)
from env.conquest.state import Game
from env.conquest.tasks import DEFAULT_TASK, Options, resolve_options

Observation = dict[str, Any]
Info = dict[str, Any]
INVALID_PENALTY = -0.05


class ConquestSnapshot:
    """An opaque, independent copy of a :class:`ConquestEnv`'s whole state (see :meth:`ConquestEnv.snapshot`)."""

    __slots__ = ("data",)

    def __init__(self, data: tuple) -> None:
        self.data = data


def play_until_decision(g: Game) -> None:
    """Auto-apply forced actions and play bot seats until the agent must decide or the game is over."""
    agent, bots = g.agent, g.opts.bots
    while not g.done:
        a = forced_action(g)
        if a is not None:
            auto_event(g, a)
            apply(g, a)
        elif g.cur == agent:
            return
        else:
            apply(g, BOTS[bots[g.cur]](g))


class ConquestEnv:
    """The conquest environment (``docs/spec/conquest/rules.md`` is the contract; section numbers below refer to it).

    Gymnasium-style contract:

    * ``obs, info = env.reset(seed=0, options=None, **options)``: options of section 2 (``task``, ``agent_seat``,
      ``opponents``, ``placement``, ``fortify``, ``territory_bonus``, ``max_rounds``, ``max_agent_steps``,
      ``candidate_k``) come from the constructor, ``options`` or keywords (later ones win); ``seed=None`` takes
      the option's seed, else 0. Bots play until the agent's first decision. ``info`` has ``candidates`` and
      ``events``.
    * ``obs, reward, terminated, truncated, info = env.step(action)`` with a raw action dict (section 7.2);
      ``env.step_index(k)`` with an index into :meth:`candidates`; ``env.step_text(reply)`` with a model reply
      (section 7.4). Each is one agent step: the action is applied, forced decisions are auto-applied, bots play,
      and the call returns at the agent's next decision or the end.
    * Bad input never raises out of ``step*``: an illegal or malformed raw action (a non-dict too) has reason
      ``illegal``; a bad index ``bad_type`` or ``out_of_range``; an invalid reply one of ``invalid_json``,
      ``not_object``, ``missing_key``, ``extra_keys``, ``bad_type``, ``out_of_range``, ``illegal``. The
      FallbackSafeAgent action (candidate 0) is applied instead, with ``info["fallback"] = True``,
      ``info["fallback_reason"]`` set and reward component ``invalid = -0.05``.
    * ``info``: ``reward_components`` (``territory``, ``continent``, ``elimination``, ``invalid``, ``outcome``,
      each rounded to 6 places; ``reward`` is their rounded sum), ``fallback``, ``fallback_reason``, ``action``
      (the action applied), ``events`` (all of this step's events), ``candidates`` (the next list), and at the end
      ``final_score`` and ``outcome`` (``win``/``loss``/``timeout``). A win or loss is ``terminated``; the round
      limit or ``max_agent_steps`` is ``truncated``. A ``step*`` call after the end changes nothing and returns
      reward 0 with the final flags.
    * ``snapshot()`` / ``restore(s)`` copy the whole state, RNGs included; ``reseed(seed)`` replaces the RNGs only.
    """

    def __init__(self, task: str = DEFAULT_TASK, **options: Any) -> None:
        self._defaults: dict[str, Any] = {"task": task, **options}
        self._opts: Options = resolve_options(self._defaults)
        self.game: Game | None = None

    # ------------------------------------------------------------------------------------------ properties

    @property
    def task(self) -> str:
        """The current episode's task (the constructor's before the first reset)."""
        return self._opts.task if self.game is None else self.game.opts.task

    @property
    def options(self) -> Options:
        """The resolved options of the current episode."""
        return self._opts if self.game is None else self.game.opts

    @property
    def done(self) -> bool:
        return self.game is not None and self.game.done

    def _game(self) -> Game:
        if self.game is None:
            raise RuntimeError("Call reset() first.")
        return self.game

    # ------------------------------------------------------------------------------------------- episode

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None, **kwargs: Any
    ) -> tuple[Observation, Info]:
        """Start an episode (deal, deck, placement, bot play up to the agent's first decision)."""
        merged = {**self._defaults, **(options or {}), **kwargs}
        if seed is not None:
            merged["seed"] = seed
        opts = resolve_options(merged)
        g = new_game(opts, opts.seed)
        self.game = g
        play_until_decision(g)
        self._begin_decision(g)
        info: Info = {"candidates": self.candidates(), "events": [copy_event(e) for e in g.events]}
        if g.done:
            info["final_score"] = g.score
            info["outcome"] = g.outcome
        return self.observation(), info

    def step(self, action: Any) -> tuple[Observation, float, bool, bool, Info]:
        """One agent step with a raw action dict (section 7.2)."""
        g = self._game()
        if g.done:
            return self._after_end()
        a = from_dict(action)
        if a is None or not is_legal(g, a):
            return self._play(g, None, "illegal")
        if a[0] == ATTACK and a[3] is None:
            a = (ATTACK, a[1], a[2], min(3, g.armies[a[1]] - 1))
        return self._play(g, a, None)

    def step_index(self, k: Any) -> tuple[Observation, float, bool, bool, Info]:
        """One agent step choosing candidate ``k`` of :meth:`candidates`."""
        g = self._game()
        if g.done:
            return self._after_end()
        k, reason = check_index(k, len(g.cands))
        return self._play_index(g, k, reason)

    def step_text(self, reply: Any) -> tuple[Observation, float, bool, bool, Info]:
        """One agent step from a model reply ``{"action_index": k}`` (section 7.4)."""
        g = self._game()
        if g.done:
            return self._after_end()
        k, reason = parse_reply(reply, len(g.cands))
        return self._play_index(g, k, reason)

    def _play_index(self, g: Game, k: int | None, reason: str | None):
        if reason is not None:
            return self._play(g, None, reason)
        a = g.cands[k]
        if not is_legal(g, a):
            return self._play(g, None, "illegal")
        return self._play(g, a, None)

    def _play(self, g: Game, a: Action | None, reason: str | None):
        """Apply ``a`` (or the fallback when ``reason`` is set), play on, and score the step (section 6)."""
        fallback = reason is not None
        if fallback:
            a = g.cands[0]
        g.events = []
        g.agent_steps += 1
        g.cands = None
        apply(g, a)
        play_until_decision(g)
        if not g.done and g.agent_steps >= g.opts.max_agent_steps:
            truncate(g)
        agent = g.agent
        components = {
            "territory": round(0.01 * (g.tcount[agent] - g.ref_t), 6),
            "continent": round(0.02 * (continent_bonus(g, agent) - g.ref_b), 6),
            "elimination": round(0.10 * (g.agent_elims - g.ref_elims), 6),
            "invalid": INVALID_PENALTY if fallback else 0.0,
            "outcome": g.score if g.done else 0.0,
        }
        reward = round(sum(components.values()), 6)
        self._begin_decision(g)
        info: Info = {
            "reward_components": components,
            "fallback": fallback,
            "fallback_reason": reason,
            "action": to_dict(a),
            "events": [copy_event(e) for e in g.events],
            "candidates": self.candidates(),
        }
        if g.done:
            info["final_score"] = g.score
            info["outcome"] = g.outcome
        return self.observation(), reward, g.terminated, g.truncated, info

    def _after_end(self):
        g = self.game
        zero = dict.fromkeys(("territory", "continent", "elimination", "invalid", "outcome"), 0.0)
        info: Info = {
            "reward_components": zero,
            "fallback": False,
            "fallback_reason": None,
            "action": None,
            "events": [],
            "candidates": [],
            "final_score": g.score,
            "outcome": g.outcome,
        }
        return self.observation(), 0.0, g.terminated, g.truncated, info

    @staticmethod
    def _begin_decision(g: Game) -> None:
        """Cache the candidate list and the reward references of the agent's new decision."""
        if g.done:
            g.cands = []
            return
        g.cands = candidate_list(g, g.opts.candidate_k)
        g.ref_t = g.tcount[g.agent]
        g.ref_b = continent_bonus(g, g.agent)
        g.ref_elims = g.agent_elims

    # ----------------------------------------------------------------------------------------- queries

    def observation(self) -> Observation:
        """The current observation (section 9)."""
        g = self._game()
        return observation(g, len(g.cands))

    def candidates(self) -> list[dict[str, Any]]:
        """The compact candidate list (section 7.3) as action dicts; empty once the game is over."""
        return [to_dict(a) for a in self._game().cands]

    def render_candidates(self) -> list[str]:
        """One ``"{k}. {text}"`` line per candidate."""
        g = self._game()
        return candidate_lines(g, g.cands)

    def render_text(self) -> str:
        """The agent's view as text (section 9), at most 2400 characters."""
        return _render_text(self._game())

    def legal_actions(self) -> list[dict[str, Any]]:
        """Every legal raw action of the agent's current decision in canonical order (large; for tests)."""
        return [to_dict(a) for a in legal_actions(self._game())]

    def is_legal(self, action: Any) -> bool:
        """Whether raw action dict ``action`` is legal now; never raises."""
        a = from_dict(action)
        return a is not None and is_legal(self._game(), a)

    def final_score(self) -> float | None:
        """The final score (section 6) once the episode is over, else ``None``."""
        g = self._game()
        return g.score if g.done else None

    # --------------------------------------------------------------------------------------- branching

    def snapshot(self) -> ConquestSnapshot:
        """An independent copy of the complete state (board, cards, phase, counters, RNG states, bookkeeping)."""
        return ConquestSnapshot(self._game().snapshot())

    def restore(self, snap: ConquestSnapshot) -> None:
        """Return to the moment ``snap`` was taken; ``snap`` stays valid for further restores."""
        if not isinstance(snap, ConquestSnapshot):
            raise TypeError(f"restore() takes a ConquestSnapshot, got {type(snap).__name__}")
        if self.game is None:
            opts = snap.data[0][0]
            self.game = Game(opts, opts.seed)
        self.game.restore(snap.data)

    def reseed(self, seed: int) -> None:
        """Replace the game RNG and every bot RNG for ``seed``; the board, hands and draw pile stay."""
        if type(seed) is not int:
            raise TypeError(f"seed must be an int, got {seed!r}")
        self._game().reseed(seed)

"""The conquest environment as the server serves it and a client reads it (:data:`CONQUEST`, ``--env conquest``).

``recruit-trl serve --env conquest`` serves :class:`~env.conquest.core.ConquestEnv` with the routes, sessions,
limits and errors of every served environment (:mod:`env.server`); ``RemoteEnv(url, task=..., env="conquest")``
plays it. A reset takes the task (``duel``, ``easy3``, ``classic3`` (default), ``classic6``) and a seed >= 0 (none:
0); the other options of spec section 2 keep their defaults.

A step payload is a JSON object whose key says which call of the env it is:

* ``{"action_index": k}`` -> ``env.step_index(k)``: an index into the candidate list (``info["candidates"]`` of
  the previous reply);
* ``{"reply": text}`` -> ``env.step_text(text)``: a model's raw answer, parsed by the env (spec section 7.4);
* a raw action ``{"type": ..., ...}`` (spec section 7.2) -> ``env.step(action)``.

The value is forwarded as it is, so a bad index, a reply that breaks the answer contract and an illegal or
malformed raw action are not HTTP errors: exactly as in-process, the FallbackSafeAgent's action is applied and the
reply's ``metadata.info`` says why (``fallback``, ``fallback_reason``, reward component ``invalid``). Only a payload
that is none of the three forms is refused (422 / ``VALIDATION_ERROR``): not an object, none or several of the keys
``type``, ``action_index`` and ``reply``, or another key next to ``action_index`` or ``reply``.

Replies: the observation of spec section 9 (its own ``done`` equals the reply's), ``metadata.info`` the env's
``info`` (``candidates``, ``events``, ``reward_components``, ``fallback``..., ``final_score`` and ``outcome`` at the
end), and ``metadata.terminated`` / ``metadata.truncated``. ``GET /state`` adds the text views an LLM prompt is
built from (``render_text`` and ``candidate_lines``) to the episode's progress.
"""

from __future__ import annotations

from typing import Any

from env.conquest.board import IDS, NUM_TERRITORIES
from env.conquest.core import ConquestEnv
from env.conquest.parse import KEY as INDEX_KEY
from env.conquest.tasks import DEFAULT_TASK, TASKS
from env.server.served import ActionError, ServedEnv

__all__ = ["CONQUEST", "OBSERVATION_FIELDS", "REPLY_KEY", "ServedConquestEnv", "parse_action"]

APP_NAME = "conquest"
REPLY_KEY = "reply"
TYPE_KEY = "type"
FORM_KEYS = (TYPE_KEY, INDEX_KEY, REPLY_KEY)
OBSERVATION_FIELDS = (
    "task", "seed", "phase", "reinforce_kind", "seat_to_act", "agent_seat", "round", "max_rounds", "turn", "owners",
    "armies", "alive", "territory_counts", "army_totals", "card_counts", "hand", "hand_symbols", "sets_traded",
    "next_trade_value", "armies_to_place", "occupy", "conquered_this_turn", "continent_owner", "draw_pile_left",
    "discard_size", "events", "done", "num_candidates",
)  # fmt: skip
PHASES = ("setup_place", "reinforce", "attack", "occupy", "fortify", "game_over")
REINFORCE_KINDS = ("turn_start", "after_elimination")
EVENT_TYPES = (
    "turn_start", "trade", "place", "battle", "conquer", "eliminate", "card", "fortify", "end_turn", "auto",
    "game_over",
)  # fmt: skip
OUTCOMES = ("win", "loss", "timeout")
TASK_PURPOSES = {
    "duel": "1-vs-1 against the balanced bot",
    "easy3": "curriculum start: two random bots",
    "classic3": "the main task: a balanced and an aggressive bot",
    "classic6": "crowded board: five bots",
}


class ServedConquestEnv:
    """A :class:`ConquestEnv` behind the server: ``step(payload)`` dispatches on the payload's form (see the module
    docstring), ``state()`` is the ``GET /state`` document. ``env`` is the wrapped environment."""

    def __init__(self, task: str) -> None:
        self.env = ConquestEnv(task)

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        return self.env.reset(seed=seed, options=options)

    def step(self, payload: dict[str, Any]) -> tuple[dict, float, bool, bool, dict]:
        """One agent step for a payload accepted by :func:`parse_action`."""
        if INDEX_KEY in payload:
            return self.env.step_index(payload[INDEX_KEY])
        if REPLY_KEY in payload:
            return self.env.step_text(payload[REPLY_KEY])
        return self.env.step(payload)

    def state(self) -> dict[str, Any]:
        """The episode's progress and its text views: the board (``render_text``) and the candidate lines."""
        env = self.env
        g = env.game
        return {
            "task": env.task,
            "seed": g.seed,
            "phase": g.phase,
            "round": g.round,
            "turn": g.turn,
            "agent_steps": g.agent_steps,
            "done": g.done,
            "terminated": g.terminated,
            "truncated": g.truncated,
            "outcome": g.outcome,
            "final_score": env.final_score(),
            "render_text": env.render_text(),
            "candidate_lines": env.render_candidates(),
        }


def _error(kind: str, loc: list, msg: str, value: Any) -> dict[str, Any]:
    return {"type": kind, "loc": loc, "msg": msg, "input": value}


def parse_action(payload: Any) -> dict[str, Any]:
    """The payload itself when it has one of the three forms; else :class:`ActionError` (only the form is checked
    here: what the values mean is for the env, which falls back on bad ones like in-process)."""
    if not isinstance(payload, dict):
        raise ActionError([_error("dict_type", [], "Input should be a valid dictionary", payload)])
    forms = [key for key in FORM_KEYS if key in payload]
    if not forms:
        msg = "Field required: one of 'type' (a raw action), 'action_index' or 'reply'"
        raise ActionError([_error("missing", [], msg, payload)])
    if len(forms) > 1:
        msg = f"Exactly one of 'type', 'action_index' and 'reply' is allowed, got {forms}"
        raise ActionError([_error("extra_forbidden", [forms[1]], msg, payload[forms[1]])])
    form = forms[0]
    if form != TYPE_KEY:
        extra = [key for key in payload if key != form]
        if extra:
            msg = f"Extra inputs are not permitted next to '{form}'"
            raise ActionError([_error("extra_forbidden", [key], msg, payload[key]) for key in extra])
    return payload


def _obj(props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), **extra}


_INT, _STR, _BOOL, _NUM = {"type": "integer"}, {"type": "string"}, {"type": "boolean"}, {"type": "number"}
_COUNT = {"type": "integer", "minimum": 0}
_TERRITORY = {"type": "string", "enum": list(IDS)}
_INTS = {"type": "array", "items": _INT}
_BOARD = {"type": "array", "items": _INT, "minItems": NUM_TERRITORIES, "maxItems": NUM_TERRITORIES}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def action_schema() -> dict[str, Any]:
    """JSON schema of a step payload: a candidate index, a model reply or a raw action (spec sections 7.2-7.4)."""
    n = {"type": "integer", "minimum": 1}
    raw = {
        "trade": {"cards": {"type": "array", "items": _INT, "minItems": 3, "maxItems": 3}},
        "place": {"territory": _TERRITORY, "n": n},
        "attack": {"from": _TERRITORY, "to": _TERRITORY, "dice": {"type": "integer", "minimum": 1, "maximum": 3}},
        "blitz": {"from": _TERRITORY, "to": _TERRITORY},
        "move": {"n": n},
        "fortify": {"from": _TERRITORY, "to": _TERRITORY, "n": n},
        "end_attack": {},
        "end_turn": {},
    }
    raw_actions = []
    for name, props in raw.items():
        required = ["type", *(p for p in props if p != "dice")]  # an attack without dice rolls the most it may
        schema = {"type": "object", "properties": {"type": {"const": name}, **props}, "required": required}
        raw_actions.append({**schema, "additionalProperties": False, "title": f"raw {name}"})
    index = _obj({INDEX_KEY: _COUNT}, additionalProperties=False, title="candidate index")
    reply = _obj({REPLY_KEY: _STR}, additionalProperties=False, title="model reply")
    return {"title": "Action", "anyOf": [index, reply, *raw_actions]}


def observation_schema() -> dict[str, Any]:
    """JSON schema of the observation (spec section 9)."""
    event = {"type": "object", "properties": {"type": {"enum": list(EVENT_TYPES)}}, "required": ["type"]}
    occupy = _obj({"from": _TERRITORY, "to": _TERRITORY, "min": _INT, "max": _INT})
    props = {
        "task": {"enum": list(TASKS)},
        "seed": _COUNT,
        "phase": {"enum": list(PHASES)},
        "reinforce_kind": {"enum": [*REINFORCE_KINDS, None]},
        "seat_to_act": _INT,
        "agent_seat": _INT,
        "round": _COUNT,
        "max_rounds": _INT,
        "turn": _COUNT,
        "owners": _BOARD,
        "armies": _BOARD,
        "alive": {"type": "array", "items": _BOOL},
        "territory_counts": _INTS,
        "army_totals": _INTS,
        "card_counts": _INTS,
        "hand": _INTS,
        "hand_symbols": {"type": "array", "items": {"enum": ["infantry", "cavalry", "artillery", "wild"]}},
        "sets_traded": _COUNT,
        "next_trade_value": _INT,
        "armies_to_place": _COUNT,
        "occupy": _nullable(occupy),
        "conquered_this_turn": _BOOL,
        "continent_owner": {"type": "array", "items": _INT, "minItems": 6, "maxItems": 6},
        "draw_pile_left": _COUNT,
        "discard_size": _COUNT,
        "events": {"type": "array", "items": event, "maxItems": 20},
        "done": _BOOL,
        "num_candidates": _COUNT,
    }
    return _obj(props, title="Observation")


def state_schema() -> dict[str, Any]:
    """JSON schema of ``GET /state`` (:meth:`ServedConquestEnv.state` + the server's ``episode_id`` and
    ``step_count``)."""
    props = {
        "task": {"enum": list(TASKS)},
        "seed": _COUNT,
        "phase": {"enum": list(PHASES)},
        "round": _COUNT,
        "turn": _COUNT,
        "agent_steps": _COUNT,
        "done": _BOOL,
        "terminated": _BOOL,
        "truncated": _BOOL,
        "outcome": {"enum": [*OUTCOMES, None]},
        "final_score": _nullable(_NUM),
        "render_text": {"type": "string", "maxLength": 2400},
        "candidate_lines": {"type": "array", "items": _STR},
        "episode_id": _nullable(_STR),
        "step_count": _COUNT,
    }
    return _obj(props, title="State")


def tasks_document() -> dict[str, Any]:
    """``GET /tasks``: every task by id with its purpose, players, bots in seat order (after the agent's seat 0) and
    round limit."""
    return {
        tid: {
            "description": TASK_PURPOSES[tid],
            "players": spec.players,
            "opponents": list(spec.bots),
            "max_rounds": spec.max_rounds,
        }
        for tid, spec in TASKS.items()
    }


CONQUEST = ServedEnv(
    name="conquest",
    app_name=APP_NAME,
    title="Conquest",
    description="conquest: a deterministic, Risk-compatible territory-conquest board game (42 territories, dice "
    "combat, escalating card sets) played by one agent seat against rule-based bots.",
    make_env=ServedConquestEnv,
    tasks=tasks_document(),
    default_task=DEFAULT_TASK,
    parse_action=parse_action,
    action_schema=action_schema(),
    observation_schema=observation_schema(),
    state_schema=state_schema(),
    observation_fields=OBSERVATION_FIELDS,
    min_seed=0,
    api_description="HTTP API and OpenEnv WebSocket protocol for the conquest board game environment.",
)

"""A second, tiny environment for the tests: a walk on a number line, seen through its own ``EnvInterface``.

Each day the walker steps ``left``, ``right`` or ``wait``s, or ``stop``s (ending the walk); now and then a gust (the
environment's RNG) pushes it one more step. After :data:`DAYS` days (or a stop) the final score is
``1 - distance to the target / target`` (at least 0). It shares nothing with the clinical environment, so recruit_trl
running it (``recruit-trl eval --env tests.toy_env:TOY``, traces, rollouts) shows that nothing there is clinical.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from recruit_trl.protocol import EnvInterface

DAYS = 12
TARGETS = {"near": 3, "far": 8}  # task -> target position (the walk starts at 0)
KINDS = ("left", "right", "wait", "stop")
MOVES = {"left": -1, "right": 1, "wait": 0, "stop": 0}
GUST = 0.2  # chance of a gust each day


class Walk:
    """The environment: Gymnasium-style ``reset``/``step`` with ``snapshot``/``restore``/``reseed``."""

    def __init__(self, task: str) -> None:
        if task not in TARGETS:
            raise ValueError(f"unknown task {task!r}; expected one of {sorted(TARGETS)}")
        self.task, self.target = task, TARGETS[task]
        self.position, self.day, self.rng = 0, 0, random.Random(0)

    def observation(self) -> dict[str, Any]:
        return {"task": self.task, "day": self.day, "days": DAYS, "position": self.position, "target": self.target}

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        self.position, self.day, self.rng = 0, 0, random.Random(seed)
        return self.observation(), {}

    def step(self, action: Mapping[str, Any]):
        kind = action.get("kind")
        info: dict[str, Any] = {"last_action_error": None if kind in KINDS else "unknown_kind"}
        before = abs(self.target - self.position)
        self.position += MOVES.get(kind, 0)
        if self.rng.random() < GUST:
            self.position += self.rng.choice((-1, 1))
        self.day += 1
        distance = abs(self.target - self.position)
        terminated, truncated = kind == "stop", self.day >= DAYS and kind != "stop"
        if terminated or truncated:
            info["final_score"] = round(max(0.0, 1 - distance / self.target), 4)
        return self.observation(), float(before - distance), terminated, truncated, info

    def snapshot(self) -> tuple:
        return self.position, self.day, self.rng.getstate()

    def restore(self, snapshot: tuple) -> None:
        self.position, self.day, state = snapshot
        self.rng.setstate(state)

    def reseed(self, seed: int) -> None:
        self.rng = random.Random(seed)


def toward(obs: Mapping[str, Any]) -> str:
    """The step that closes the distance to the target (``stop`` on it)."""
    gap = obs["target"] - obs["position"]
    return "right" if gap > 0 else "left" if gap < 0 else "stop"


def greedy_policy(obs: Mapping[str, Any], rng: random.Random | None = None) -> dict[str, Any]:
    return {"kind": toward(obs)}


def random_policy(obs: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
    return {"kind": rng.choice(KINDS[:3])}  # never stops: a random walk of the whole episode


def wanderer_policy(obs: Mapping[str, Any], rng: random.Random) -> dict[str, Any]:
    """Heads for the target two days in three, else a random move; never stops: its walks pass the target and come
    back, so states on both sides of it (anchors for branch mode) are visited."""
    gap = obs["target"] - obs["position"]
    if gap and rng.random() < 2 / 3:
        return {"kind": toward(obs)}
    return {"kind": rng.choice(KINDS[:3])}


class Planner:
    """A policy that reads the live environment (``act`` only, not callable), as board-game bots do."""

    def act(self, env: Walk, obs: Mapping[str, Any] | None = None, rng: random.Random | None = None) -> dict[str, Any]:
        return {"kind": "stop" if env.position == env.target else toward(env.observation())}


class ToyInterface(EnvInterface):
    """recruit_trl's ``EnvInterface`` for :class:`Walk` (required members only: every optional one keeps its
    generic default)."""

    name = "toy"
    system_prompt = "You walk on a number line, one step per day. Reach the target and stop there."
    reward_fields = ("env_return", "progress")
    terminal_action_types = frozenset({"stop"})

    def make_env(self, task: str) -> Walk:
        return Walk(task)

    def tasks(self) -> Sequence[str]:
        return tuple(TARGETS)

    def render(self, obs: Mapping[str, Any], recent: Sequence[str]) -> str:
        text = f"Day {obs['day']}/{obs['days']} | position {obs['position']} | target {obs['target']}"
        return text + ("\nRecent: " + "; ".join(recent) if recent else "")

    def candidate_actions(self, obs: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [{"kind": kind} for kind in KINDS]

    def describe_action(self, action: Mapping[str, Any], obs: Mapping[str, Any] | None = None) -> str:
        return str(action.get("kind"))

    def fallback_action(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        return greedy_policy(obs)

    def action_type(self, action: Mapping[str, Any]) -> str:
        return str(action.get("kind"))

    def action_types(self) -> Sequence[str]:
        return KINDS

    def step_components(self, obs_before, action, obs, reward: float, info) -> dict[str, float]:
        gain = abs(obs_before["target"] - obs_before["position"]) - abs(obs["target"] - obs["position"])
        return {"env_return": reward, "progress": float(gain)}

    def action_shaping(self, obs: Mapping[str, Any], action: Mapping[str, Any]) -> float:
        return 0.1 if action.get("kind") == toward(obs) else 0.0

    def outcome(self, info: Mapping[str, Any]) -> str:
        return info.get("last_action_error") or "ok"

    def final_score(self, info: Mapping[str, Any]) -> float | None:
        return info.get("final_score")

    def get_policy(self, name: str):
        policies = {
            "greedy": greedy_policy,
            "random": random_policy,
            "wanderer": wanderer_policy,
            "planner": Planner(),
        }
        return policies[name] if name in policies else super().get_policy(name)


TOY = ToyInterface()


def closer_reward(completions: list, **kwargs: Any) -> list[float | None]:
    """The walk's own TRL reward function, outside the ``rewards`` package: the distance closed over the scored steps
    (the rollout's ``progress`` field), named as ``--reward_funcs tests.toy_env:closer_reward``."""
    return [None if value is None else float(value) for value in kwargs["progress"]]


class AimlessToyInterface(ToyInterface):
    """The walk whose fallback agent goes nowhere (left, right and wait in turn): a start far below the best policy,
    for the learning check's toy rung.

    The tiny model built for it imitates that fallback (70% of its warm-up answers, 30% random candidates) and an
    unparsable answer plays it too, so neither the model as built nor the fallback reaches the target, while the
    model still samples every move: what a model trained on it scores above that is learnt. Its prompt says which
    way the target lies, so reading the state is one word and the tiny model's arithmetic is not what is measured.
    """

    name = "toy_aimless"

    def render(self, obs: Mapping[str, Any], recent: Sequence[str]) -> str:
        first, *rest = super().render(obs, recent).split("\n", 1)
        gap = obs["target"] - obs["position"]
        where = "to the right" if gap > 0 else "to the left" if gap < 0 else "here"
        return "\n".join([f"{first} | the target is {where}", *rest])

    def fallback_action(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        return {"kind": ("left", "right", "wait")[obs["day"] % 3]}


AIMLESS_TOY = AimlessToyInterface()


# ---------------------------------------------------------------------------------------------------------------
# Serving: the walk as env.server serves it (``recruit-trl serve --env tests.toy_env:served_toy``)


class ServedWalk(Walk):
    """:class:`Walk` with the ``state()`` document of ``GET /state``."""

    def state(self) -> dict[str, Any]:
        return {"task": self.task, "day": self.day, "position": self.position, "target": self.target}


def parse_served_action(payload: Any) -> dict[str, Any]:
    """A step payload as a walk action: exactly ``{"kind": one of KINDS}``, else an ``ActionError`` naming the field
    (a 422 from the server)."""
    from env.server.served import ActionError

    if not isinstance(payload, dict):
        raise ActionError(
            [{"type": "dict_type", "loc": [], "msg": "Input should be a valid dictionary", "input": payload}]
        )
    errors = [
        {"type": "extra_forbidden", "loc": [key], "msg": "Extra inputs are not permitted", "input": payload[key]}
        for key in payload
        if key != "kind"
    ]
    if "kind" not in payload:
        errors.insert(0, {"type": "missing", "loc": ["kind"], "msg": "Field required", "input": payload})
    elif payload["kind"] not in KINDS:
        msg = "Input should be " + ", ".join(repr(kind) for kind in KINDS)
        errors.insert(0, {"type": "literal_error", "loc": ["kind"], "msg": msg, "input": payload["kind"]})
    if errors:
        raise ActionError(errors)
    return {"kind": payload["kind"]}


def served_toy():
    """The walk's :class:`env.server.served.ServedEnv`: no ``split_done`` (the server reports ``terminated`` and
    ``truncated``) and no field list (the observation is the whole reply)."""
    from env.server.served import ServedEnv

    integer, text = {"type": "integer"}, {"type": "string"}
    walk = {"task": text, "day": integer, "position": integer, "target": integer}
    state = {**walk, "episode_id": {"anyOf": [text, {"type": "null"}]}, "step_count": integer}
    return ServedEnv(
        name="toy",
        app_name="toy-walk",
        title="Toy walk",
        description="A walk on a number line: reach the target and stop there.",
        make_env=ServedWalk,
        tasks={task: {"target": target, "days": DAYS} for task, target in TARGETS.items()},
        default_task="near",
        parse_action=parse_served_action,
        action_schema={
            "type": "object",
            "properties": {"kind": {"enum": list(KINDS)}},
            "required": ["kind"],
            "additionalProperties": False,
        },
        observation_schema={"type": "object", "properties": {**walk, "days": integer}, "required": [*walk, "days"]},
        state_schema={"type": "object", "properties": state, "required": list(state)},
    )

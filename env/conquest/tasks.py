"""Tasks (spec section 2) and the resolution of a reset's options into one frozen :class:`Options`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from env.conquest.board import INITIAL_ARMIES

BOT_NAMES: tuple[str, ...] = ("random", "safe", "aggressive", "balanced", "teacher")
PLACEMENTS = ("auto", "agent")
FORTIFY_MODES = ("connected", "adjacent")
TERRITORY_BONUS_MODES = ("once_per_turn", "every_card", "off")


@dataclass(frozen=True)
class TaskSpec:
    """A task: its bots in seat order (the agent's seat excluded) and its round limit."""

    name: str
    bots: tuple[str, ...]
    max_rounds: int

    @property
    def players(self) -> int:
        return len(self.bots) + 1


TASKS: dict[str, TaskSpec] = {
    "duel": TaskSpec("duel", ("balanced",), 100),
    "easy3": TaskSpec("easy3", ("random", "random"), 60),
    "classic3": TaskSpec("classic3", ("balanced", "aggressive"), 100),
    "classic6": TaskSpec("classic6", ("balanced", "aggressive", "balanced", "aggressive", "random"), 120),
}
DEFAULT_TASK = "classic3"


@dataclass(frozen=True)
class Options:
    """Everything fixed for one episode. ``bots[s]`` is the bot name of seat ``s`` (``None`` at the agent's seat)."""

    task: str
    seed: int
    agent_seat: int
    bots: tuple[str | None, ...]
    placement: str
    fortify: str
    territory_bonus: str
    max_rounds: int
    max_agent_steps: int
    candidate_k: int

    @property
    def players(self) -> int:
        return len(self.bots)


OPTION_NAMES = frozenset(
    {
        "task",
        "seed",
        "agent_seat",
        "opponents",
        "placement",
        "fortify",
        "territory_bonus",
        "max_rounds",
        "max_agent_steps",
        "candidate_k",
        "neutral",
    }
)


def _int_option(options: dict[str, Any], name: str, default: int, low: int) -> int:
    value = options.get(name, default)
    if value is None:
        value = default
    if type(value) is not int or value < low:
        raise ValueError(f"Option {name!r} must be an int >= {low}, got {value!r}")
    return value


def _choice(options: dict[str, Any], name: str, allowed: tuple[str, ...]) -> str:
    value = options.get(name) or allowed[0]
    if value not in allowed:
        raise ValueError(f"Option {name!r} must be one of {allowed}, got {value!r}")
    return value


def resolve_options(options: dict[str, Any]) -> Options:
    """Validate ``options`` (spec section 2 names; missing ones take the defaults) into :class:`Options`.

    Raises:
        ValueError: unknown task or option name, or a bad value. ``neutral`` is reserved: only a false value is
            accepted (the two-player game has no neutral army).
    """
    unknown = set(options) - OPTION_NAMES
    if unknown:
        raise ValueError(f"Unknown options {sorted(unknown)}; known: {sorted(OPTION_NAMES)}")
    if options.get("neutral"):
        raise ValueError("Option 'neutral' is reserved: the two-player game has no neutral army")
    task = options.get("task") or DEFAULT_TASK
    if task not in TASKS:
        raise ValueError(f"Unknown task {task!r}; known: {sorted(TASKS)}")
    spec = TASKS[task]
    opponents = options.get("opponents")
    if opponents is None:
        opponents = spec.bots
    if not isinstance(opponents, list | tuple) or any(b not in BOT_NAMES for b in opponents):
        raise ValueError(f"Option 'opponents' must be a list of bot names from {BOT_NAMES}, got {opponents!r}")
    players = len(opponents) + 1
    if players not in INITIAL_ARMIES:
        raise ValueError(f"{players} players is not supported (2..6)")
    seed = _int_option(options, "seed", 0, 0)
    agent_seat = _int_option(options, "agent_seat", 0, 0)
    if agent_seat >= players:
        raise ValueError(f"agent_seat {agent_seat} out of range for {players} players")
    rest = iter(opponents)
    bots = tuple(None if s == agent_seat else next(rest) for s in range(players))
    return Options(
        task=task,
        seed=seed,
        agent_seat=agent_seat,
        bots=bots,
        placement=_choice(options, "placement", PLACEMENTS),
        fortify=_choice(options, "fortify", FORTIFY_MODES),
        territory_bonus=_choice(options, "territory_bonus", TERRITORY_BONUS_MODES),
        max_rounds=_int_option(options, "max_rounds", spec.max_rounds, 1),
        max_agent_steps=_int_option(options, "max_agent_steps", 2000, 1),
        candidate_k=_int_option(options, "candidate_k", 12, 2),
    )

"""conquest seen by an LLM agent: recruit_trl's ``EnvInterface`` (:data:`CONQUEST`) and the env it plays.

This module implements recruit_trl's ``EnvInterface`` for the conquest board game (a subclass of
:class:`recruit_trl.protocol.EnvInterface`, the one recruit_trl module ``env`` imports): :data:`CONQUEST`, which the
package declares as the entry point ``conquest`` of the ``recruit_trl.envs`` group (``pyproject.toml``). The texts,
candidates, rewards and scores are the spec's (``docs/spec/conquest/rules.md`` sections 6-9); this module maps
them onto the interface and holds the game's defaults for training.

Design: the plugin asks for an action's candidates, prompt text and fallback from the observation alone
(``candidate_actions(obs)``, ``render(obs, recent)``, ``fallback_action(obs)``), but the spec's candidate list needs
state its observation hides (the per-turn card bonus flag, the fortify option, the draw pile, ...). So
:meth:`ConquestInterface.make_env` builds a :class:`ConquestAgentEnv`: a :class:`~env.conquest.core.ConquestEnv`
whose observation also carries, computed by the environment itself at each decision,

* ``candidates``: the compact candidate list of section 7.3 as raw action dicts (candidate 0 is the
  FallbackSafeAgent's action, the teacher's action is always listed, display in canonical order);
* ``candidate_texts``: their section 7.3 texts (the lines without the ``"{k}. "`` prefix);
* ``board_text``: ``render_text()`` of section 9;

and whose step ``info`` also carries ``last_action_error`` (the spec's ``fallback_reason``: the name recruit_trl
reads to count invalid actions). Everything else (rules, RNG, rewards, the spec's observation fields) is
``ConquestEnv``'s, unchanged; ``ConquestEnv`` itself keeps the spec's observation. The interface is then a pure
function of these observations. The server (``env.conquest.served``) serves the spec's observation; against it,
:meth:`ConquestInterface.remote_env` gives a :class:`RemoteConquestAgentEnv`, which adds the same fields from the
reply's ``info["candidates"]`` and the server's ``GET /state`` texts.

The ``index`` contract: the plugin maps ``{"action_index": k}`` to ``obs["candidates"][k]``, a full raw action, and
the environment re-validates it (an action that is not legal, or not well formed, is replaced by the
FallbackSafeAgent's action with ``info["fallback"]``, ``last_action_error`` and the ``invalid`` penalty).

Policies (:func:`env.conquest.policies.get_policy`) are objects with ``act(env, obs=None, rng=None)``: recruit_trl
hands them the live environment (they read ``env.game``), so they play in-process only; an evaluation against a
server plays models.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from env.conquest.actions import TYPE_NAMES
from env.conquest.board import CODES, INDEX
from env.conquest.core import ConquestEnv
from env.conquest.policies import ConquestPolicy, get_policy
from env.conquest.tasks import TASKS
from recruit_trl.protocol import FALLBACK_POLICY, EnvInterface

REWARD_FIELDS = ("territory", "continent", "elimination", "invalid", "outcome")
# One word: the prompt (system + board + candidates) must stay within 700 tokens of the tiny model's tokenizer, and
# the spec's texts alone take up to ~690 (a mandatory trade lists up to 11 sets of ~25 tokens each); the board's
# first line names the game, the task and the agent's seat ("conquest classic3 | ... | you P0").
SYSTEM_PROMPT = "Risk."
# What the interface reads from a ConquestAgentEnv observation, besides the spec's fields.
AGENT_FIELDS = ("candidates", "candidate_texts", "board_text")


class ConquestAgentEnv(ConquestEnv):
    """:class:`ConquestEnv` whose observation also carries the agent's prompt material (see the module docstring).

    ``reset``, ``step``, ``step_index``, ``step_text``, ``snapshot``, ``restore`` and ``reseed`` are
    ``ConquestEnv``'s; the observation adds ``candidates``, ``candidate_texts`` and ``board_text``, and the steps'
    ``info`` adds ``last_action_error`` (``None`` or the fallback reason of section 7.4).
    """

    def observation(self) -> dict[str, Any]:
        obs = super().observation()
        obs["candidates"] = self.candidates()
        obs["candidate_texts"] = [line.split(". ", 1)[1] for line in self.render_candidates()]
        obs["board_text"] = self.render_text()
        return obs

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        return _with_error(super().step(action))

    def step_index(self, k: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        return _with_error(super().step_index(k))

    def step_text(self, reply: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        return _with_error(super().step_text(reply))


def _with_error(result: tuple) -> tuple:
    obs, reward, terminated, truncated, info = result
    info["last_action_error"] = info["fallback_reason"]
    return obs, reward, terminated, truncated, info


class RemoteConquestAgentEnv:
    """A client of a conquest server (``recruit-trl serve --env conquest``) with :class:`ConquestAgentEnv`'s
    observations and ``info``, for evaluations against a server (``recruit-trl eval --env_url``).

    The server replies with the spec's observation and ``info`` (whose ``candidates`` is the next list); the texts
    come from ``GET /state`` (``render_text``, ``candidate_lines``): one more request per decision. Once the game is
    over nothing is listed and the board is empty (over HTTP the server has deleted the session by then).

    Args:
        remote: an :class:`env.client.RemoteEnv` of the conquest server.
    """

    def __init__(self, remote: Any) -> None:
        self.remote = remote

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        obs, info = self.remote.reset(seed=seed, options=options)
        return self._agent_obs(obs, info), info

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = _with_error(self.remote.step(action))
        return self._agent_obs(obs, info), reward, terminated, truncated, info

    def close(self) -> None:
        self.remote.close()

    @property
    def game(self) -> Any:
        """Not available: the game lives on the server (the conquest policies read it, so they play in-process)."""
        raise RuntimeError("conquest policies need the live game: evaluate them in-process (without --env_url)")

    def _agent_obs(self, obs: dict[str, Any], info: Mapping[str, Any]) -> dict[str, Any]:
        if obs["done"]:
            return {**obs, "candidates": [], "candidate_texts": [], "board_text": ""}
        state = self.remote.state()
        texts = [line.split(". ", 1)[1] for line in state["candidate_lines"]]
        return {**obs, "candidates": info["candidates"], "candidate_texts": texts, "board_text": state["render_text"]}


def _code(territory: Any) -> str:
    """A territory id's 3-letter code (the id itself when it is not one)."""
    i = INDEX.get(territory) if isinstance(territory, str) else None
    return CODES[i] if i is not None else str(territory)


def action_digest(action: Mapping[str, Any]) -> str:
    """A short text of a raw action for the digest of recent actions (``"blitz ALB>QUE"``, ``"place 3 ONT"``)."""
    kind = action.get("type")
    if kind == "trade":
        return "trade " + ",".join(str(c) for c in action.get("cards", ()))
    if kind == "place":
        return f"place {action.get('n')} {_code(action.get('territory'))}"
    if kind in ("attack", "blitz"):
        dice = f" {action['dice']}d" if kind == "attack" and action.get("dice") is not None else ""
        return f"{kind} {_code(action.get('from'))}>{_code(action.get('to'))}{dice}"
    if kind == "move":
        return f"move {action.get('n')}"
    if kind == "fortify":
        return f"fortify {action.get('n')} {_code(action.get('from'))}>{_code(action.get('to'))}"
    if kind == "end_attack":
        return "end attacks"
    return "end turn" if kind == "end_turn" else str(kind)


def agent_fields(obs: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[str], str]:
    """``(candidates, candidate_texts, board_text)`` of a :class:`ConquestAgentEnv` observation.

    Raises:
        ValueError: the observation is the spec's bare one (e.g. from a server that serves ``ConquestEnv``).
    """
    missing = [name for name in AGENT_FIELDS if name not in obs]
    if missing:
        raise ValueError(f"conquest observation lacks {missing}: play a ConquestAgentEnv (CONQUEST.make_env)")
    return obs["candidates"], obs["candidate_texts"], obs["board_text"]


class ConquestInterface(EnvInterface):
    """:class:`recruit_trl.protocol.EnvInterface` for the conquest board game."""

    name = "conquest"
    continuation_policy = "teacher"
    system_prompt = SYSTEM_PROMPT
    reward_fields = REWARD_FIELDS
    terminal_action_types: frozenset[str] = frozenset()  # only the game ends the game
    rate_metrics = ("win",)  # evaluation rows carry win_rate

    def make_env(self, task: str) -> ConquestAgentEnv:
        return ConquestAgentEnv(task)

    def tasks(self) -> Sequence[str]:
        return tuple(TASKS)

    def action_types(self) -> Sequence[str]:
        return TYPE_NAMES

    def action_type(self, action: Mapping[str, Any]) -> str:
        return str(action.get("type"))

    def get_policy(self, name: str) -> ConquestPolicy:
        return super().get_policy(name) if name == FALLBACK_POLICY else get_policy(name)

    def remote_env(self, url: str, task: str, transport: str) -> RemoteConquestAgentEnv:
        """A client of ``recruit-trl serve --env conquest`` whose observations are :meth:`make_env`'s."""
        from env.client import RemoteEnv  # needs the ``server`` extra (httpx), only for remote evaluation

        return RemoteConquestAgentEnv(RemoteEnv(url, task=task, transport=transport, env="conquest"))

    def describe_tasks(self, all_tasks: bool = False) -> list[dict[str, Any]]:
        """One row per task: players, the seats (``A`` = the agent, then the bots) and the round limit."""
        return [
            {
                "id": spec.name,
                "players": spec.players,
                "seats": ", ".join(("A", *spec.bots)),
                "max_rounds": spec.max_rounds,
            }
            for spec in TASKS.values()
        ]

    def decision_phase(self, obs: Mapping[str, Any], action: Mapping[str, Any]) -> str:
        """The stratum of a decision in a teacher decision set: ``trade`` when the action trades cards, else the
        observation's phase (``reinforce``, ``attack``, ``occupy``, ``fortify``; setup placements count as
        ``reinforce``)."""
        if action.get("type") == "trade":
            return "trade"
        phase = str(obs["phase"])
        return "reinforce" if phase == "setup_place" else phase

    def episode_metrics(self, obs: Mapping[str, Any], info: Mapping[str, Any]) -> dict[str, float]:
        """``win`` (1 once the agent has won, else 0), ``rounds`` played and the agent's ``territories``."""
        return {
            "win": float(info.get("outcome") == "win"),
            "rounds": float(min(obs["round"], obs["max_rounds"])),
            "territories": float(obs["territory_counts"][obs["agent_seat"]]),
        }

    def potential(self, obs: Mapping[str, Any]) -> float:
        """The agent's standing: the mean of its share of the territories and its share of the armies on the board."""
        seat = obs["agent_seat"]
        territories = obs["territory_counts"][seat] / max(1, sum(obs["territory_counts"]))
        armies = obs["army_totals"][seat] / max(1, sum(obs["army_totals"]))
        return 0.5 * territories + 0.5 * armies

    def state_key(self, obs: Mapping[str, Any]) -> str:
        """The game state the observation shows, without its event log (and the texts that repeat it): two games
        that reached the same board, hands, phase and counters by different moves are at the same state."""
        kept = {k: v for k, v in obs.items() if k not in ("events", "board_text", "candidate_texts")}
        return json.dumps(kept, sort_keys=True, default=str)

    def resample_hidden(self, env: ConquestEnv, seed: int) -> None:
        """The cards the agent cannot see (the undrawn pile and the other seats' hands, whose ids the observation
        hides: :func:`env.conquest.state.Game.resample_hidden`) dealt again from ``seed``."""
        env._game().resample_hidden(seed)

    # ------------------------------------------------------------------ rendering
    def render(self, obs: Mapping[str, Any], recent: Sequence[str]) -> str:
        """The board of section 9, ``render_text()``.

        ``recent`` (digests of the agent's last actions) is not shown: the board's ``last:`` line already lists the
        latest events, the agent's own included, and the ~700-token prompt budget has no room for a second list.
        """
        return agent_fields(obs)[2]

    def describe_action(self, action: Mapping[str, Any], obs: Mapping[str, Any] | None = None) -> str:
        """With ``obs``, a listed candidate's section 7.3 text; otherwise (digests) a short text of the action."""
        if obs is not None:
            candidates, texts, _ = agent_fields(obs)
            for candidate, text in zip(candidates, texts, strict=True):
                if candidate == action:
                    return text
        return action_digest(action)

    def outcome(self, info: Mapping[str, Any]) -> str:
        """The fallback reason, else ``ok`` with the agent's territory change (``ok +2t``), or the game's outcome."""
        if info.get("fallback"):
            return str(info.get("fallback_reason"))
        if info.get("outcome"):
            return str(info["outcome"])
        change = round(info.get("reward_components", {}).get("territory", 0.0) * 100)
        return f"ok {change:+d}t" if change else "ok"

    # ------------------------------------------------------------------ actions
    def candidate_actions(self, obs: Mapping[str, Any]) -> list[dict[str, Any]]:
        return [dict(a) for a in agent_fields(obs)[0]]

    def fallback_action(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        """Candidate 0: the FallbackSafeAgent's action (``end_turn`` once the game is over and nothing is listed)."""
        candidates = agent_fields(obs)[0]
        return dict(candidates[0]) if candidates else {"type": "end_turn"}

    # ------------------------------------------------------------------ rewards
    def step_components(
        self,
        obs_before: Mapping[str, Any],
        action: Mapping[str, Any],
        obs: Mapping[str, Any],
        reward: float,
        info: Mapping[str, Any],
    ) -> dict[str, float]:
        components = info["reward_components"]
        return {name: float(components[name]) for name in REWARD_FIELDS}

    def action_shaping(self, obs: Mapping[str, Any], action: Mapping[str, Any]) -> float:
        return 0.0  # the spec's shaped reward is all in the step components

    def final_score(self, info: Mapping[str, Any]) -> float | None:
        return info.get("final_score")


CONQUEST = ConquestInterface()

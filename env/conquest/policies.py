"""Named policies for the agent's seat, registered in the style of ``env.clinical.policies``.

A conquest policy needs the game state, so each one is an object with ``act(env, obs=None, rng=None) -> action
dict`` (``recruit_trl.protocol.policy_action`` calls ``act`` when a policy has it) for the agent's current
decision in a :class:`~env.conquest.core.ConquestEnv`:

* ``random``: the ``random`` bot of section 8.2 drawing from the agent seat's bot RNG (the spec's random
  baseline, reproducible from the episode seed; the ``rng`` argument is not used);
* ``safe``: the FallbackSafeAgent (section 7.4); ``aggressive`` and ``balanced``: the bots of sections 8.3-8.4;
* ``teacher``: the balanced action mapped to LLM space (always a candidate), :meth:`ConquestPolicy.index` gives
  its candidate index; ``teacher_lookahead``: the candidate picked by the rollouts of section 8.5.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from env.conquest.actions import Action, to_dict
from env.conquest.bots import aggressive_action, balanced_action, random_action, safe_action
from env.conquest.candidates import teacher_action
from env.conquest.lookahead import lookahead_index
from env.conquest.state import Game


class ConquestPolicy:
    """A named policy: ``choose(game) -> action tuple`` wrapped as ``act(env, obs, rng) -> action dict``."""

    def __init__(self, name: str, choose: Callable[[Game], Action]) -> None:
        self.name = name
        self.choose = choose

    def act(self, env: Any, obs: dict[str, Any] | None = None, rng: random.Random | None = None) -> dict[str, Any]:
        """The policy's raw action for ``env``'s current agent decision."""
        return to_dict(self.choose(env.game))

    def index(self, env: Any) -> int:
        """The position of this policy's action in ``env.candidates()`` (it must be a candidate)."""
        g = env.game
        return g.cands.index(self.choose(g))

    def __repr__(self) -> str:
        return f"ConquestPolicy({self.name!r})"


POLICIES: dict[str, ConquestPolicy] = {}


def register_policy(name: str) -> Callable[[Callable[[Game], Action]], Callable[[Game], Action]]:
    """Decorator: register ``choose(game) -> action tuple`` as policy ``name``."""

    def wrap(choose: Callable[[Game], Action]) -> Callable[[Game], Action]:
        POLICIES[name] = ConquestPolicy(name, choose)
        return choose

    return wrap


def get_policy(name: str) -> ConquestPolicy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"Unknown policy: {name!r}. Registered: {sorted(POLICIES)}") from None


register_policy("random")(random_action)
register_policy("safe")(safe_action)
register_policy("aggressive")(aggressive_action)
register_policy("balanced")(balanced_action)
register_policy("teacher")(teacher_action)


@register_policy("teacher_lookahead")
def lookahead_action(g: Game) -> Action:
    """The candidate chosen by :func:`env.conquest.lookahead.lookahead_index`."""
    return g.cands[lookahead_index(g)]


def teacher_index(env: Any) -> int:
    """The teacher's answer: the index of the balanced action in the candidate list (section 8.5)."""
    g = env.game
    return g.cands.index(teacher_action(g))


def teacher_lookahead_index(env: Any) -> int:
    """The lookahead teacher's answer (section 8.5)."""
    return lookahead_index(env.game)


def play_episode(env: Any, policy: ConquestPolicy | str, seed: int | None = 0, **options: Any) -> dict[str, Any]:
    """Play one episode with ``policy`` at the agent's seat; return a summary of the outcome."""
    if isinstance(policy, str):
        policy = get_policy(policy)
    obs, info = env.reset(seed=seed, **options)
    total, steps, fallbacks, done = 0.0, 0, 0, env.done
    while not done:
        obs, reward, terminated, truncated, info = env.step(policy.act(env, obs=obs))
        total += reward
        steps += 1
        fallbacks += info["fallback"]
        done = terminated or truncated
    g = env.game
    return {
        "final_score": g.score,
        "outcome": g.outcome,
        "win": g.outcome == "win",
        "rounds": min(g.round, g.opts.max_rounds),
        "steps": steps,
        "total_reward": round(total, 6),
        "fallbacks": fallbacks,
    }

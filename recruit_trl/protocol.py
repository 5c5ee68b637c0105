"""The small protocol recruit_trl needs from a multi-step environment, and a registry of environments.

recruit_trl never imports a concrete environment. An environment package implements two things:

* :class:`MultiStepEnv`: Gymnasium-style ``reset``/``step`` plus ``snapshot``/``restore`` (so a sampled
  action can be scored from the *same* state many times) and ``reseed`` (common random numbers inside a
  group: every branch of a group continues with the same RNG stream).
* :class:`EnvInterface`: everything textual and task-specific: the system prompt, a compact rendering of
  an observation, the enumeration of legal candidate actions (the ``index`` action contract), validation
  of a free JSON action (the ``json`` contract), a safe fallback action, a short description of an action
  for digests, the named per-step reward components, and the policies that can play prefixes and
  continuations.

Register an interface with :func:`register_env` (usually at import of the environment's module) and look it
up by name with :func:`get_env_interface`; a ``"package.module:attribute"`` string is imported on demand,
so a recipe can name an environment that recruit_trl has never heard of.
"""

from __future__ import annotations

import importlib
import json
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

Observation = dict[str, Any]
Info = dict[str, Any]
Action = dict[str, Any]
# A policy maps an observation (and its own RNG) to an action; it never touches the environment's RNG.
# A policy object may also offer ``act(env, obs=obs, rng=rng)``: callers that hold the live environment use it, so a
# planner can look ahead from the current state (re-seeding its simulated copies, never reading the true RNG).
Policy = Callable[[Observation, random.Random], Action]
StepResult = tuple[Observation, float, bool, bool, Info]


def action_key(interface: EnvInterface, action: Action) -> Any:
    """What identifies ``action`` when two actions are compared (SFT labels, teacher match, guides, DAgger).

    The interface's optional ``action_key(action)`` (e.g. the fields that say what is done, without free-text
    annotations); by default the whole action, canonically serialised.
    """
    key = getattr(interface, "action_key", None)
    return key(action) if key is not None else json.dumps(action, sort_keys=True, default=str)


def policy_action(policy: Policy, env: MultiStepEnv, obs: Observation, rng: random.Random) -> Action:
    """``policy``'s action in ``env``'s current state ``obs``: a planner (a policy with ``act``) looks ahead from the
    live environment, any other policy reads the observation only."""
    act = getattr(policy, "act", None)
    return act(env, obs=obs, rng=rng) if act is not None else policy(obs, rng)


@runtime_checkable
class MultiStepEnv(Protocol):
    """A Gymnasium-style environment whose whole state can be copied and re-seeded."""

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[Observation, Info]: ...

    def step(self, action: Action) -> StepResult: ...

    def snapshot(self) -> Any: ...

    def restore(self, snapshot: Any) -> None: ...

    def reseed(self, seed: int) -> None: ...


class EnvInterface(Protocol):
    """What the plugin needs to turn an environment into prompts, actions and reward fields.

    Attributes:
        name: registry name.
        system_prompt: sent once at the top of every prompt (the plugin appends the contract's answer format).
        reward_fields: names of the per-step reward components :meth:`step_components` returns; the rollout
            sums them over the scored horizon and forwards them to the reward functions under these names.
        terminal_action_types: action types by which the agent ends the episode itself (never explored at
            random when collecting traces).
    """

    name: str
    system_prompt: str
    reward_fields: tuple[str, ...]
    terminal_action_types: frozenset[str]

    def make_env(self, task: str) -> MultiStepEnv: ...

    def tasks(self) -> Sequence[str]: ...

    def render(self, obs: Observation, recent: Sequence[str]) -> str:
        """The observation as compact text (``recent`` holds digests of the last actions, oldest first)."""
        ...

    def candidate_actions(self, obs: Observation) -> list[Action]:
        """Legal candidate actions with full arguments, in a stable order (the ``index`` contract)."""
        ...

    def describe_action(self, action: Action, obs: Observation | None = None) -> str:
        """A one-line description for the digest of recent actions; with ``obs``, for the candidate list (it
        may then add visible facts, e.g. a patient's attributes)."""
        ...

    def validate_action(self, payload: Mapping[str, Any], obs: Observation) -> Action:
        """A complete action from a model's free JSON object (the ``json`` contract); raise ValueError if bad."""
        ...

    def fallback_action(self, obs: Observation) -> Action:
        """The safe agent's action, used whenever the model's output cannot be parsed."""
        ...

    def action_type(self, action: Action) -> str: ...

    def action_types(self) -> Sequence[str]: ...

    def step_components(
        self, obs_before: Observation, action: Action, obs: Observation, reward: float, info: Info
    ) -> dict[str, float]:
        """Named reward components of one environment step (keys: :attr:`reward_fields`)."""
        ...

    def action_shaping(self, obs: Observation, action: Action) -> float:
        """A shaping bonus for choosing ``action`` in ``obs`` (scored once, for the sampled action)."""
        ...

    def outcome(self, info: Info) -> str:
        """A short outcome string for the digest of recent actions (e.g. ``"ok"`` or an error code)."""
        ...

    def final_score(self, info: Info) -> float | None:
        """The episode's final grade when ``info`` is from its last step, else ``None``."""
        ...

    def get_policy(self, name: str) -> Policy: ...

    # Optional members (looked up with getattr; the plugin has generic defaults):
    # def action_key(self, action: Action) -> Hashable: what identifies an action when two are compared (default:
    #     the whole action); e.g. the clinical environment ignores the free-text hypothesis and confidence.
    # The weighted parts of the finished episode's final grade, for reports.
    # def score_terms(self, env: MultiStepEnv) -> Mapping[str, float] | None: ...


_REGISTRY: dict[str, EnvInterface | Callable[[], EnvInterface]] = {}


def register_env(name: str, interface: EnvInterface | Callable[[], EnvInterface]) -> None:
    """Make an environment interface (or a zero-argument factory of one) available by name."""
    _REGISTRY[name] = interface


def get_env_interface(name: str) -> EnvInterface:
    """Look up a registered interface, or import ``"package.module:attribute"`` (an interface or a factory).

    Raises:
        ValueError: when the name is neither registered nor importable.
    """
    if name not in _REGISTRY and ":" in name:
        module_name, attr = name.split(":", 1)
        try:
            target = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"Cannot import environment interface {name!r}: {exc}") from None
        _REGISTRY[name] = target
    if name not in _REGISTRY:
        raise ValueError(f"Unknown environment {name!r}. Registered: {sorted(_REGISTRY)}; or pass 'module:attribute'.")
    entry = _REGISTRY[name]
    if callable(entry) and not hasattr(entry, "render"):
        entry = entry()
        _REGISTRY[name] = entry
    return entry

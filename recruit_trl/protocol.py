"""The small protocol recruit_trl needs from a multi-step environment, and how environments are found.

recruit_trl never imports a concrete environment. An environment package implements two things (subclassing
:class:`EnvInterface` is the one import it makes from recruit_trl):

* :class:`MultiStepEnv`: Gymnasium-style ``reset``/``step`` plus ``snapshot``/``restore`` (so a sampled
  action can be scored from the *same* state many times) and ``reseed`` (common random numbers inside a
  group: every branch of a group continues with the same RNG stream).
* :class:`EnvInterface`: everything textual and task-specific: the system prompt, a compact rendering of
  an observation, the enumeration of legal candidate actions (the ``index`` action contract), a safe
  fallback action, a short description of an action for digests, the named per-step reward components, and the
  policies that can play prefixes and continuations; optionally episode metrics, reference figures, a remote
  client, task descriptions and its defaults for training (each optional member's generic default is on the base
  class).

:func:`get_env_interface` finds an interface by name: registered in-process with :func:`register_env`, declared by
an installed package as an entry point of the ``recruit_trl.envs`` group
(``clinical = "env.clinical.agent:CLINICAL"`` in this project's ``pyproject.toml``), or named
``"package.module:attribute"`` (imported on demand), so a recipe can name an environment that recruit_trl has never
heard of.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import os
import random
import sys
from collections.abc import Callable, Hashable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

Observation = dict[str, Any]
Info = dict[str, Any]
Action = dict[str, Any]
# A policy maps an observation (and its own RNG) to an action; it never touches the environment's RNG.
# A policy object may also offer ``act(env, obs=obs, rng=rng)``: callers that hold the live environment use it, so a
# planner can look ahead from the current state (re-seeding its simulated copies, never reading the true RNG).
Policy = Callable[[Observation, random.Random], Action]
StepResult = tuple[Observation, float, bool, bool, Info]


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


FALLBACK_POLICY = "fallback"  # every environment's policy of last resort: its fallback action in every state


class FallbackPolicy:
    """The fallback agent of an interface as a policy: :meth:`EnvInterface.fallback_action` in every state."""

    def __init__(self, interface: EnvInterface) -> None:
        self.interface = interface

    def __call__(self, obs: Observation, rng: random.Random) -> Action:
        return self.interface.fallback_action(obs)


class EnvInterface:
    """What the plugin needs to turn an environment into prompts, actions and reward fields, and the environment's
    training defaults: the base class of every environment interface, each optional member's default in one place.

    A subclass sets the four attributes and implements the methods that raise ``NotImplementedError`` here; every
    other member has a generic default (documented on it) that the subclass may override.

    Attributes:
        name: registry name.
        system_prompt: sent once at the top of every prompt (the plugin appends the contract's answer format).
        reward_fields: names of the per-step reward components :meth:`step_components` returns; the rollout
            sums them over the scored horizon and forwards them to the reward functions under these names.
        terminal_action_types: action types by which the agent ends the episode itself (never explored at
            random when collecting traces).
        curve_metrics: those of :meth:`episode_metrics` whose course over the episode is reported too:
            ``<name>_by_day_mean`` (the mean curve after each decision), ``<name>_peak_mean`` and, for the days of
            ``metric_days``, ``<name>_at_mean`` ({"15": value after 15 decisions, ...}); the report plots them.
        metric_days: see ``curve_metrics``.
        rate_metrics: those of :meth:`episode_metrics` that are 0/1 outcomes (e.g. a win); evaluation rows carry
            ``<name>_rate``, the share of episodes ending with 1, instead of ``<name>_mean``.
        reference_scores: a published reference final score per task, drawn in plots and printed in summaries.
        reference_band: ``(metric, label, low, high)``, a published reference range of a curve metric, shaded on its
            curve plot up to the last of ``metric_days``.
        continuation_policy: the policy that plays an episode on to its end after a decision under study: fast and
            strong, it scores a decision by what it leads to (the planner's default; the recipes' configs name it
            too). The plugin's own default is the fallback agent (:data:`FALLBACK_POLICY`).
    """

    name: str = ""
    system_prompt: str = ""
    reward_fields: tuple[str, ...] = ()
    terminal_action_types: frozenset[str] = frozenset()
    curve_metrics: tuple[str, ...] = ()
    metric_days: tuple[int, ...] = ()
    rate_metrics: tuple[str, ...] = ()
    reference_scores: Mapping[str, float] = MappingProxyType({})
    reference_band: tuple[str, str, float, float] | None = None
    continuation_policy: str = FALLBACK_POLICY

    # Required: the environment and its text.

    def make_env(self, task: str) -> MultiStepEnv:
        raise NotImplementedError

    def tasks(self) -> Sequence[str]:
        raise NotImplementedError

    def render(self, obs: Observation, recent: Sequence[str]) -> str:
        """The observation as compact text (``recent`` holds digests of the last actions, oldest first)."""
        raise NotImplementedError

    def candidate_actions(self, obs: Observation) -> list[Action]:
        """Legal candidate actions with full arguments, in a stable order (the ``index`` contract)."""
        raise NotImplementedError

    def describe_action(self, action: Action, obs: Observation | None = None) -> str:
        """A one-line description for the digest of recent actions; with ``obs``, for the candidate list (it
        may then add visible facts, e.g. the clinical environment lists a patient's attributes)."""
        raise NotImplementedError

    def fallback_action(self, obs: Observation) -> Action:
        """The safe agent's action, used whenever the model's output cannot be parsed."""
        raise NotImplementedError

    def action_type(self, action: Action) -> str:
        raise NotImplementedError

    def action_types(self) -> Sequence[str]:
        raise NotImplementedError

    def step_components(
        self, obs_before: Observation, action: Action, obs: Observation, reward: float, info: Info
    ) -> dict[str, float]:
        """Named reward components of one environment step (keys: :attr:`reward_fields`)."""
        raise NotImplementedError

    def final_score(self, info: Info) -> float | None:
        """The episode's final grade when ``info`` is from its last step, else ``None``."""
        raise NotImplementedError

    # Optional, with the generic default.

    def get_policy(self, name: str) -> Policy:
        """The environment policy called ``name``. Here only :data:`FALLBACK_POLICY` (the fallback agent, which every
        environment has); a subclass adds its own policies and hands other names to this method.

        Raises:
            ValueError: for an unknown name.
        """
        if name == FALLBACK_POLICY:
            return FallbackPolicy(self)
        raise ValueError(f"Unknown policy {name!r} for environment {self.name!r} (every environment has "
                         f"{FALLBACK_POLICY!r})")  # fmt: skip

    def action_shaping(self, obs: Observation, action: Action) -> float:
        """A shaping bonus for choosing ``action`` in ``obs`` (scored once, for the sampled action). Default: 0."""
        return 0.0

    def outcome(self, info: Info) -> str:
        """A short outcome string for the digest of recent actions. Default: the step's ``last_action_error``, else
        ``"ok"``."""
        return str(info.get("last_action_error") or "ok")

    def action_key(self, action: Action) -> Hashable:
        """What identifies an action when two are compared (SFT labels, teacher match, guides, DAgger). Default: the
        whole action, canonically serialised (the clinical environment ignores its free-text hypothesis)."""
        return json.dumps(action, sort_keys=True, default=str)

    def score_terms(self, env: MultiStepEnv) -> Mapping[str, float] | None:
        """The weighted parts of the finished episode's final grade, for reports. Default: none."""
        return None

    def episode_metrics(self, obs: Observation, info: Info) -> Mapping[str, float]:
        """Numbers read after every step (e.g. the clinical ``{"enrolled": ..., "budget_left": ...}``); evaluation
        rows carry ``<name>_mean``, the mean of the value at the episode's end. Default: none."""
        return {}

    def potential(self, obs: Observation) -> float | None:
        """How good a state is (e.g. conquest's mean of the agent's territory and army shares): its change over a
        row's steps is the row's ``potential_change`` field, read by ``rewards.potential_reward``. Default: ``None``,
        no potential (the field is then ``None``)."""
        return None

    def potential_change(self, obs_before: Observation, obs: Observation) -> float | None:
        """:meth:`potential` of ``obs`` minus that of ``obs_before`` (``None`` without a potential)."""
        before, after = self.potential(obs_before), self.potential(obs)
        return None if before is None or after is None else float(after - before)

    def has_potential(self) -> bool:
        """Whether the interface defines :meth:`potential` (a subclass overrides it)."""
        return type(self).potential is not EnvInterface.potential

    def resample_hidden(self, env: MultiStepEnv, seed: int) -> None:
        """Redraw, from ``seed``, what ``env``'s state holds that the agent's observation does not show and that a
        continuation from a snapshot would otherwise know in advance (e.g. the order of a draw pile), consistently
        with the observation. The planner calls it in every continuation after restoring the snapshot, so that its
        choice rests on what the policy can see. Default: nothing (the step RNG, which :meth:`MultiStepEnv.reseed`
        replaces, is all an environment hides)."""

    def state_key(self, obs: Observation) -> Hashable:
        """What makes two states the same, for episode mode's step groups (e.g. conquest leaves out its event log).
        Default: the whole observation, canonically serialised."""
        return json.dumps(obs, sort_keys=True, default=str)

    def remote_env(self, url: str, task: str, transport: str) -> MultiStepEnv:
        """A client of the environment server at ``url`` (``recruit-trl eval --env_url``).

        Raises:
            ValueError: by default: the environment has no remote client.
        """
        raise ValueError(f"Environment {self.name!r} has no remote client (no remote_env): evaluate in-process")

    def decision_phase(self, obs: Observation, action: Action) -> str:
        """The stratum of a decision whose action (the teacher's) is ``action``, for teacher decision sets (e.g.
        conquest's reinforce / trade / attack / occupy / fortify). Default: the action's type."""
        return self.action_type(action)

    def describe_tasks(self, all_tasks: bool = False) -> list[dict[str, Any]]:
        """One row per task for ``recruit-trl tasks`` (the first column its id; ``all_tasks``: also variants outside
        :meth:`tasks`). Default: the ids of :meth:`tasks`."""
        return [{"id": task} for task in self.tasks()]


ENTRY_POINT_GROUP = "recruit_trl.envs"
_REGISTRY: dict[str, EnvInterface | Callable[[], EnvInterface]] = {}


def register_env(name: str, interface: EnvInterface | Callable[[], EnvInterface]) -> None:
    """Make an environment interface (or a zero-argument factory of one) available by name in this process."""
    _REGISTRY[name] = interface


def import_from_working_directory(module_name: str) -> Any:
    """``importlib.import_module``, falling back to the current directory as ``python -m`` would: a console script
    (``recruit-trl``) puts its own bin folder first on ``sys.path``, not the directory it runs in, so
    ``--env tests.toy_env:TOY`` run from a repository root would not find ``tests`` otherwise."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing_is_the_module = exc.name is not None and (module_name + ".").startswith(exc.name + ".")
        if not missing_is_the_module or os.getcwd() in sys.path or "" in sys.path:
            raise
        sys.path.insert(0, os.getcwd())
        return importlib.import_module(module_name)


def get_env_interface(name: str) -> EnvInterface:
    """The interface called ``name``: registered with :func:`register_env`, else an installed package's entry point
    of the ``recruit_trl.envs`` group, else ``"package.module:attribute"`` imported (an interface or a factory).

    Entry points are read from the installed packages' metadata: a package in development needs ``pip install -e .``
    (again after its entry points change).

    Raises:
        ValueError: when the name is none of these, or its target cannot be loaded.
    """
    if name not in _REGISTRY:
        entry_points = {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
        if name in entry_points:
            try:
                _REGISTRY[name] = entry_points[name].load()
            except (ImportError, AttributeError) as exc:
                raise ValueError(f"Cannot load environment {name!r} ({entry_points[name].value}): {exc}") from exc
        elif ":" in name:
            module_name, attr = name.split(":", 1)
            try:
                _REGISTRY[name] = getattr(import_from_working_directory(module_name), attr)
            except (ImportError, AttributeError) as exc:
                raise ValueError(f"Cannot import environment interface {name!r}: {exc}") from None
        else:
            known = sorted(set(_REGISTRY) | set(entry_points))
            raise ValueError(f"Unknown environment {name!r}. Known: {known}; or pass 'package.module:attribute'.")
    entry = _REGISTRY[name]
    if not isinstance(entry, EnvInterface) and callable(entry):  # a factory (or the class itself)
        entry = entry()
        _REGISTRY[name] = entry
    if not isinstance(entry, EnvInterface):
        raise ValueError(f"Environment {name!r} is a {type(entry).__name__}, not an EnvInterface: subclass "
                         "recruit_trl.protocol.EnvInterface")  # fmt: skip
    return entry

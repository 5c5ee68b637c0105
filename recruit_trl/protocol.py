"""The small protocol recruit_trl needs from a multi-step environment, and how environments are found.

recruit_trl never imports a concrete environment. An environment package implements two things:

* :class:`MultiStepEnv`: Gymnasium-style ``reset``/``step`` plus ``snapshot``/``restore`` (so a sampled
  action can be scored from the *same* state many times) and ``reseed`` (common random numbers inside a
  group: every branch of a group continues with the same RNG stream).
* :class:`EnvInterface`: everything textual and task-specific: the system prompt, a compact rendering of
  an observation, the enumeration of legal candidate actions (the ``index`` action contract), validation
  of a free JSON action (the ``json`` contract), a safe fallback action, a short description of an action
  for digests, the named per-step reward components, and the policies that can play prefixes and
  continuations; optionally episode metrics, reference figures, a remote client and task descriptions.

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
import random
from collections.abc import Callable, Hashable, Mapping, Sequence
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

    The optional members (episode metrics, reference figures, a remote client, ...) are listed at the end of the
    class, each with the generic default the plugin uses without it.
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
        may then add visible facts, e.g. the clinical environment lists a patient's attributes)."""
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

    # Optional members, looked up with getattr; the plugin's generic default follows each one:
    #
    # def action_key(self, action: Action) -> Hashable: what identifies an action when two are compared (SFT labels,
    #     teacher match). Default: the whole action. The clinical environment ignores its free-text hypothesis.
    # def score_terms(self, env: MultiStepEnv) -> Mapping[str, float] | None: the weighted parts of the finished
    #     episode's final grade, for reports. Default: none.
    # json_instructions: str: the ``json`` contract's answer format, appended to the system prompt (name the
    #     action's fields here). Default: ``recruit_trl.contracts.DEFAULT_JSON_INSTRUCTIONS``, "Answer with exactly
    #     one JSON object: the action."
    # def episode_metrics(self, obs: Observation, info: Info) -> Mapping[str, float]: numbers read after every step
    #     (e.g. the clinical {"enrolled": ..., "budget_left": ...}); evaluation rows carry ``<name>_mean``, the mean
    #     of the value at the episode's end. Default: no metrics.
    # curve_metrics: tuple[str, ...]: those of the episode metrics whose course over the episode is reported too:
    #     ``<name>_by_day_mean`` (the mean curve after each decision), ``<name>_peak_mean`` and, for the days of
    #     ``metric_days``, ``<name>_at_mean`` ({"15": value after 15 decisions, ...}); the report plots them.
    #     Default: ().
    # metric_days: tuple[int, ...]: see ``curve_metrics``. Default: ().
    # rate_metrics: tuple[str, ...]: those of the episode metrics that are 0/1 outcomes (e.g. a win); evaluation rows
    #     carry ``<name>_rate``, the share of episodes ending with 1, instead of ``<name>_mean``. Default: ().
    # reference_scores: Mapping[str, float]: a published reference final score per task, drawn in plots and
    #     printed in summaries. Default: {}.
    # reference_band: tuple[str, str, float, float] | None: ``(metric, label, low, high)``, a published reference
    #     range of a curve metric, shaded on its curve plot up to the last of ``metric_days``. Default: None.
    # def remote_env(self, url: str, task: str, transport: str) -> MultiStepEnv: a client of an environment server
    #     (``recruit-trl eval --env-url``). Default: a ValueError (no remote client). See :func:`remote_env`.
    # def decision_phase(self, obs: Observation, action: Action) -> str: the stratum of a decision whose action (the
    #     teacher's) is ``action``, for teacher decision sets (e.g. conquest's reinforce / trade / attack / occupy /
    #     fortify). Default: the action's type. See :func:`recruit_trl.decisions.teacher_sets.decision_stratum`.
    # def describe_tasks(self, all_tasks: bool) -> list[dict[str, Any]]: one row per task for
    #     ``recruit-trl tasks`` (the first column its id; ``all_tasks``: also variants outside :meth:`tasks`).
    #     Default: the ids of :meth:`tasks`. See :func:`describe_tasks`.
    # def episode_outcome(self, obs: Observation, info: Info) -> float: what a finished episode is worth to episode
    #     mode's episode-level advantage (e.g. conquest's win: 1.0, a loss or a timeout 0.0). Default: the final
    #     score (0.0 when there is none). See :func:`episode_outcome`.
    # def potential(self, obs: Observation) -> float: how good a state is, for episode mode's step-level returns
    #     (the step reward is the potential's change; e.g. conquest's mean of territory and army shares). Default:
    #     none, and the step reward is the environment's own. See :func:`step_reward`.
    # def state_key(self, obs: Observation) -> Hashable: what makes two states the same, for episode mode's step
    #     groups (e.g. conquest leaves out its event log). Default: the whole observation. See :func:`state_key`.


def episode_metrics(interface: EnvInterface, obs: Observation, info: Info) -> Mapping[str, float]:
    """The interface's optional ``episode_metrics(obs, info)`` after a step; none by default."""
    metrics = getattr(interface, "episode_metrics", None)
    return metrics(obs, info) if metrics is not None else {}


def episode_outcome(interface: EnvInterface, obs: Observation, info: Info) -> float:
    """The interface's optional ``episode_outcome(obs, info)`` of a finished episode; by default its final score
    (0.0 when ``info`` has none)."""
    outcome = getattr(interface, "episode_outcome", None)
    if outcome is not None:
        return float(outcome(obs, info))
    score = interface.final_score(info)
    return float(score) if score is not None else 0.0


def step_reward(interface: EnvInterface, obs_before: Observation, obs: Observation, reward: float) -> float:
    """A step's reward for episode mode's n-step returns: the change of the interface's optional ``potential(obs)``
    from ``obs_before`` to ``obs``, else the environment's own ``reward``."""
    potential = getattr(interface, "potential", None)
    return float(potential(obs) - potential(obs_before)) if potential is not None else float(reward)


def state_key(interface: EnvInterface, obs: Observation) -> Hashable:
    """The interface's optional ``state_key(obs)``; by default the whole observation, canonically serialised."""
    key = getattr(interface, "state_key", None)
    return key(obs) if key is not None else json.dumps(obs, sort_keys=True, default=str)


def remote_env(interface: EnvInterface, url: str, task: str, transport: str) -> MultiStepEnv:
    """A client of the environment server at ``url`` from the interface's optional ``remote_env``.

    Raises:
        ValueError: when the interface has no remote client.
    """
    make = getattr(interface, "remote_env", None)
    if make is None:
        raise ValueError(f"Environment {interface.name!r} has no remote client (no remote_env): evaluate in-process")
    return make(url, task, transport)


def describe_tasks(interface: EnvInterface, all_tasks: bool = False) -> list[dict[str, Any]]:
    """The interface's optional ``describe_tasks(all_tasks)`` rows, by default ``{"id": task}`` per task."""
    describe = getattr(interface, "describe_tasks", None)
    return describe(all_tasks) if describe is not None else [{"id": task} for task in interface.tasks()]


ENTRY_POINT_GROUP = "recruit_trl.envs"
_REGISTRY: dict[str, EnvInterface | Callable[[], EnvInterface]] = {}


def register_env(name: str, interface: EnvInterface | Callable[[], EnvInterface]) -> None:
    """Make an environment interface (or a zero-argument factory of one) available by name in this process."""
    _REGISTRY[name] = interface


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
                _REGISTRY[name] = getattr(importlib.import_module(module_name), attr)
            except (ImportError, AttributeError) as exc:
                raise ValueError(f"Cannot import environment interface {name!r}: {exc}") from None
        else:
            known = sorted(set(_REGISTRY) | set(entry_points))
            raise ValueError(f"Unknown environment {name!r}. Known: {known}; or pass 'package.module:attribute'.")
    entry = _REGISTRY[name]
    if callable(entry) and not hasattr(entry, "render"):
        entry = entry()
        _REGISTRY[name] = entry
    return entry

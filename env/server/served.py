"""What the server and the client know about an environment (:class:`ServedEnv`), and how one is found by name.

The server (:func:`env.server.create_app`, ``python -m env.server --env NAME``) and the client
(:class:`env.client.RemoteEnv`) hold no environment's details: each environment describes itself once with a
:class:`ServedEnv` (its name, how to build an env for a task, its tasks, how to parse an action, the documents of
``/schema``, ``/tasks`` and ``/metadata``, and how a client reads the replies back). The clinical one is
``env.clinical.served.CLINICAL``.

:func:`find_served` resolves a name, in this order:

1. an entry point of the ``recruit_trl.served_envs`` group, declared in a package's ``pyproject.toml``::

       [project.entry-points."recruit_trl.served_envs"]
       myenv = "mypackage.served:MY_SERVED"

   Entry points are read from the installed packages' metadata (a package in development needs
   ``pip install -e .`` again after adding one). Reading a group imports nothing from recruit_trl, so ``env/``
   stays independent of it; the group is separate from ``recruit_trl.envs`` (the agent interfaces) because serving
   needs none of recruit_trl's machinery, only this descriptor.
2. ``"package.module:attribute"``, imported.
3. the built-in ``clinical``, the default of ``--env``, so that a source checkout never installed still serves it.

The attribute is a :class:`ServedEnv` or a function that returns one (built on first use).

This module imports nothing heavy (no FastAPI), so environments can build their descriptor anywhere.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ENTRY_POINT_GROUP = "recruit_trl.served_envs"
DEFAULT_ENV = "clinical"
_BUILTIN = {"clinical": "env.clinical.served:CLINICAL"}
ENVELOPE_KEYS = frozenset({"done", "reward", "metadata"})  # the keys a flat HTTP reply adds to the observation


class ActionError(ValueError):
    """A step payload that is not a valid action; the server answers 422 (HTTP) or ``VALIDATION_ERROR`` (WebSocket).

    Args:
        errors: one item per violation, as FastAPI writes them: ``type``, ``loc`` (the path inside the action,
            e.g. ``["confidence"]``; ``[]`` for the action itself), ``msg``, ``input`` and an optional ``ctx``.
    """

    def __init__(self, errors: Sequence[Mapping[str, Any]]) -> None:
        self.errors = [dict(err) for err in errors]
        parts = [
            f"invalid action field '{'.'.join(str(p) for p in err['loc']) or 'action'}': {err['msg']}"
            for err in self.errors
        ]
        super().__init__("; ".join(parts) or "invalid action")


def pydantic_errors(exc: Any) -> list[dict[str, Any]]:
    """The items of a pydantic ``ValidationError`` for :class:`ActionError`: ``type``, ``loc``, ``msg``, ``input``
    and ``ctx`` (values that are not JSON scalars written as text)."""
    out = []
    for err in exc.errors(include_url=False):
        item = {"type": err["type"], "loc": list(err["loc"]), "msg": err["msg"], "input": err.get("input")}
        if "ctx" in err:
            item["ctx"] = {
                k: v if isinstance(v, int | float | str | bool | None) else str(v) for k, v in err["ctx"].items()
            }
        out.append(item)
    return out


def env_state(env: Any) -> dict[str, Any]:
    """The default ``GET /state`` document: the env's own ``state()``."""
    return env.state()


@dataclass(frozen=True)
class ServedEnv:
    """An environment as the server serves it and a client reads it.

    The env that ``make_env(task)`` builds has Gymnasium-style ``reset(seed=None, options=None) -> (obs, info)``
    (the server passes ``options={"task": task}``) and ``step(action) -> (obs, reward, terminated, truncated,
    info)``, with JSON-able dict observations and infos. A session keeps its env while its task stays the same and
    builds a new one when a reset names another task.

    Attributes:
        name: the name ``--env`` takes.
        app_name: ``name`` in ``GET /`` and ``GET /metadata``.
        title: the OpenAPI title.
        description: the environment in a sentence or two (``GET /metadata``).
        make_env: a new env playing a task (a canonical task id).
        tasks: ``GET /tasks``: task id -> its description (a JSON object); ``GET /`` lists the ids.
        default_task: the task of a reset that names none.
        parse_action: the action of a step payload, which is any JSON value (or the raw bytes of a body that is not
            JSON); raises :class:`ActionError` on a schema violation. Semantic failures are not for the parser: the
            env reports them in its ``info``, like in-process.
        action_schema: the JSON schema of an action (``GET /schema``, and the OpenAPI body of ``POST /step``).
        observation_schema: the JSON schema of an observation (``GET /schema``).
        state_schema: the JSON schema of ``GET /state`` (``GET /schema``).
        resolve_task: the canonical id of a task id that is not a key of ``tasks`` (variants, aliases); raises
            ``ValueError`` whose message is the 400 reply. ``None``: only the ids of ``tasks`` are accepted.
        state: ``GET /state`` of an env (the server adds ``episode_id`` and ``step_count``); default ``env.state()``.
        metadata_keys: ``info`` keys repeated at the top of a step's ``metadata`` (and read back from there by the
            client when a server sends them only there).
        split_done: ``(obs, done, action) -> (terminated, truncated)``, how a client derives the two flags from a
            reply that carries only ``done`` (the clinical reference's reply shape). ``None``: the server reports
            ``terminated`` and ``truncated`` in every step's ``metadata`` and the client reads them.
        observation_fields: the observation's keys, in order; a client takes exactly these from a reply and refuses
            a reply that lacks one. ``None``: every key of the observation (of a flat HTTP reply: all but ``done``,
            ``reward`` and ``metadata``).
        reset_info: the reset ``info`` a client builds from the observation when the reply has no
            ``metadata.info``; ``None``: ``{}``.
        min_seed: the smallest seed ``make_env``'s envs accept; a reset with a smaller one is refused with a 422
            (``VALIDATION_ERROR``), like a seed outside 64 bits. ``None``: every 64-bit seed.
        readme: a file served as ``readme_content`` in ``GET /metadata`` (``None``: null).
        author: ``author`` in ``GET /metadata``.
        api_description: the OpenAPI description (default: one line naming ``app_name``).
    """

    name: str
    app_name: str
    title: str
    description: str
    make_env: Callable[[str], Any]
    tasks: Mapping[str, Mapping[str, Any]]
    default_task: str
    parse_action: Callable[[Any], dict[str, Any]]
    action_schema: Mapping[str, Any]
    observation_schema: Mapping[str, Any]
    state_schema: Mapping[str, Any]
    resolve_task: Callable[[str], str] | None = None
    state: Callable[[Any], dict[str, Any]] = env_state
    metadata_keys: tuple[str, ...] = ()
    split_done: Callable[[Mapping[str, Any], bool, Mapping[str, Any]], tuple[bool, bool]] | None = None
    observation_fields: tuple[str, ...] | None = None
    reset_info: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    min_seed: int | None = None
    readme: Path | None = None
    author: str = "recruit_trl"
    api_description: str = ""

    def __post_init__(self) -> None:
        if self.default_task not in self.tasks:
            raise ValueError(f"default_task {self.default_task!r} is not one of the tasks {list(self.tasks)}")


_FOUND: dict[str, ServedEnv] = {}


def known_names() -> list[str]:
    """The names :func:`find_served` resolves without a ``module:attribute``."""
    return sorted({ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)} | set(_BUILTIN))


def find_served(name: str | ServedEnv) -> ServedEnv:
    """The :class:`ServedEnv` called ``name`` (see the module docstring for the lookup order); a ServedEnv is
    returned as it is.

    Raises:
        ValueError: when ``name`` is none of these, or its target cannot be loaded or is not a ServedEnv.
    """
    if isinstance(name, ServedEnv):
        return name
    found = _FOUND.get(name)
    if found is not None:
        return found
    entry_points = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    target = entry_points.get(name) or (name if ":" in name else _BUILTIN.get(name))
    if target is None:
        raise ValueError(f"Unknown environment {name!r}. Known: {known_names()}; or pass 'package.module:attribute'.")
    module_name, _, attribute = target.partition(":")
    try:
        value = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as exc:  # ValueError: an empty module name
        raise ValueError(f"Cannot load environment {name!r} ({target}): {exc}") from exc
    if not isinstance(value, ServedEnv) and callable(value):
        value = value()
    if not isinstance(value, ServedEnv):
        raise ValueError(f"{target} is not a ServedEnv (got {type(value).__name__})")
    _FOUND[name] = value
    return value

"""Shaped rewards as TRL reward functions, one function per component, selected by name (:func:`get_reward_funcs`).

Every function has TRL's reward-function signature ``f(completions, **kwargs) -> list[float | None]`` and
reads the extra per-row fields that the recruit_trl rollouts return (``recruit_trl.rollout.rollout_funcs``), so rewards
are computed from what happened in the environment, never by re-parsing completions. ``None`` marks a row the
component does not apply to (TRL ignores it in the weighted sum). Weights go through
``GRPOConfig.reward_weights`` (same order as ``reward_funcs``); TRL logs each component under the function's
name (``rewards/<name>/mean``).

The components for any environment are in :mod:`rewards.generic` (environment return, format, action shaping, final
score, the environment's potential, teacher match), each environment's in a module of its own: :mod:`rewards.clinical`
(enrolment, screening, dropouts, milestones, hypothesis accuracy) and :mod:`rewards.conquest` (territory, continent,
elimination, invalid answers, outcome, win); all are importable from here and named by :func:`get_reward_funcs`. A
reward function this package does not hold (a new environment's) is named as ``package.module:function``.

The same functions and weights define what is learnt in every mode, and they are called the same way in each: TRL's
``GRPOTrainer`` calls them on a branch (branch mode); where recruit_trl calls them itself, on each
decision's step row in episode mode (its step reward; their sum is the episode's outcome) and on each step row of TRL's
tool loop (``get_reward``, their sum), :func:`call_reward_funcs` passes the same keyword arguments as TRL and sums as
TRL does. The environments' components, the potential's change and the final score are additive over steps (a row
holds their sum over its scored steps, or the final score on the step that ends the episode), so a branch, an episode
and a tool-loop rollout that score the same steps get the same reward from them.
:data:`DEFAULT_REWARDS` with :data:`DEFAULT_REWARD_WEIGHTS` are the plugin's defaults.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from recruit_trl.protocol import import_from_working_directory
from rewards.clinical import dropout_penalty, enrollment_reward, hypothesis_reward, milestone_reward, screening_reward
from rewards.conquest import (
    continent_reward,
    elimination_reward,
    invalid_penalty,
    outcome_reward,
    territory_reward,
    win_reward,
)
from rewards.generic import (
    action_shaping_reward,
    env_return_reward,
    final_score_reward,
    format_reward,
    potential_reward,
    teacher_match_reward,
)

RewardFunc = Callable[..., list[float | None]]
# GRPOConfig.multi_objective_aggregation's values in TRL 1.16 (trl/trainer/grpo_config.py).
SUM_THEN_NORMALIZE = "sum_then_normalize"
NORMALIZE_THEN_SUM = "normalize_then_sum"
# The keyword arguments TRL 1.16 passes every reward function itself (trl/trainer/grpo_trainer.py:1588-1598 and 1626):
# a row field of one of these names could not be passed beside them.
TRL_ARGUMENTS = (
    "prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments",
)  # fmt: skip

logger = logging.getLogger(__name__)
_WARNED: set[str] = set()  # the callers of unscorable_as_zero that have warned

# The plugin's default rewards: the final grade when the scored steps end the episode, and a parsed answer.
DEFAULT_REWARDS = ("final_score_reward", "format_reward")
DEFAULT_REWARD_WEIGHTS = (1.0, 0.5)

REWARD_FUNCS: dict[str, RewardFunc] = {
    f.__name__: f
    for f in (
        env_return_reward,
        enrollment_reward,
        screening_reward,
        dropout_penalty,
        milestone_reward,
        hypothesis_reward,
        format_reward,
        action_shaping_reward,
        final_score_reward,
        potential_reward,
        teacher_match_reward,
        territory_reward,
        continent_reward,
        elimination_reward,
        invalid_penalty,
        outcome_reward,
        win_reward,
    )
}


def get_reward_funcs(names: Sequence[str]) -> list[RewardFunc]:
    """Reward functions by name (see :data:`REWARD_FUNCS`) or as ``package.module:function``.

    Raises:
        ValueError: naming an unknown name (with the ones that exist), a path that does not import, or a function
            without TRL's reward signature ``f(completions, **kwargs)``.
    """
    return [reward_func(name) for name in names]


def reward_func(name: str) -> RewardFunc:
    """One reward function: a name of :data:`REWARD_FUNCS`, or ``package.module:function`` imported (from the
    working directory too, as ``python -m`` would), its signature checked."""
    if name in REWARD_FUNCS:
        return REWARD_FUNCS[name]
    if ":" not in name:
        raise ValueError(
            f"Unknown reward function {name!r}; available: {sorted(REWARD_FUNCS)}, or 'package.module:function'"
        )
    module_name, attribute = name.split(":", 1)
    try:
        func = getattr(import_from_working_directory(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"Cannot import reward function {name!r}: {exc}") from None
    if not callable(func) or not _takes_completions_and_kwargs(func):
        raise ValueError(
            f"Reward function {name!r} must have TRL's signature f(completions, **kwargs) -> list[float | None]"
        )
    return func


def call_reward_funcs(
    funcs: Sequence[RewardFunc],
    weights: Sequence[float] | None,
    *,
    prompts: Sequence[Any],
    completions: Sequence[Any],
    completion_ids: Sequence[Any],
    fields: Mapping[str, Sequence[Any]],
    trainer_state: Any = None,
    log_metric: Callable[[str, float], None] | None = None,
    log_extra: Callable[[str, list], None] | None = None,
    environments: Sequence[Any] | None = None,
    aggregation: str = SUM_THEN_NORMALIZE,
) -> tuple[list[float | None], dict[str, list[float | None]]]:
    """Call the reward functions on rows as TRL 1.16's ``GRPOTrainer`` calls them, and sum them as it does.

    Each function gets TRL's keyword arguments (``trl/trainer/grpo_trainer.py``, ``_calculate_rewards``):
    ``prompts``, ``completions``, ``completion_ids``, every per-row field (TRL: the dataset's columns and the rollout's
    extra fields), ``trainer_state``, ``log_extra``, ``log_metric``, and ``environments`` when given. Synchronous
    functions run in order, then the async ones together (as TRL runs them: ``asyncio.gather``). A row's total is
    ``sum_i weights[i] * value_i`` over the functions that scored it: ``None`` (or NaN) is skipped, TRL's ``nansum``;
    a row that no function scored is *unscorable* and its total is ``None`` (TRL marks it NaN and gives it no
    advantage): the caller decides what it counts (see :func:`unscorable_as_zero`).

    Args:
        funcs: the reward functions, ``f(completions, **kwargs) -> list[float | None]``, sync or async.
        weights: one weight per function (``None``: 1 each), as ``GRPOConfig.reward_weights``.
        prompts, completions, completion_ids: one per row, what TRL passes under these names.
        fields: the rows' other fields, one list per name.
        trainer_state: the trainer's ``state`` (``None`` without a trainer).
        log_metric, log_extra: the trainer's ``_log_metric`` and ``_log_completion_extra`` (``None``: a function that
            logs nothing, for callers whose rows are not TRL's completion rows).
        environments: one environment per row (TRL's tool loop), else not passed.
        aggregation: ``GRPOConfig.multi_objective_aggregation``; only ``"sum_then_normalize"`` gives each row a total
            of its own (see :func:`check_row_aggregation`).

    Returns:
        ``(totals, parts)``: per row the weighted sum (``None`` when unscorable), and per function (by ``__name__``)
        its unweighted values as it returned them.

    Raises:
        ValueError: for ``"normalize_then_sum"`` or an unknown aggregation, not one weight per function, inputs of
            other lengths than ``completions``, a field named as one of TRL's arguments, or a function that does not
            return one value per row.
        TypeError: for a reward model (``torch.nn.Module``): TRL tokenises its texts itself, row fields mean nothing
            to it.
        RuntimeError: for an async function called from inside a running event loop.
    """
    check_row_aggregation(aggregation)
    weights = [1.0] * len(funcs) if weights is None else [float(w) for w in weights]
    if len(weights) != len(funcs):
        raise ValueError(f"reward weights {weights} must give one weight per reward function ({len(funcs)})")
    n = len(completions)
    given = {"prompts": prompts, "completion_ids": completion_ids, **fields}
    if environments is not None:
        given["environments"] = environments
    wrong = {name: len(values) for name, values in given.items() if len(values) != n}
    if wrong:
        raise ValueError(f"every reward function input needs one value per completion ({n}); lengths: {wrong}")
    clash = sorted(set(fields) & set(TRL_ARGUMENTS))
    if clash:
        raise ValueError(f"row fields {clash} have the names of arguments TRL passes reward functions itself")
    kwargs: dict[str, Any] = {
        "prompts": list(prompts),
        "completions": list(completions),
        "completion_ids": list(completion_ids),
        **{name: list(values) for name, values in fields.items()},
        "trainer_state": trainer_state,
        "log_extra": log_extra or _log_nothing,
        "log_metric": log_metric or _log_nothing,
    }
    if environments is not None:
        kwargs["environments"] = list(environments)
    names = [getattr(func, "__name__", str(func)) for func in funcs]
    outputs: list[list[float | None]] = [[] for _ in funcs]
    waiting = []
    for i, func in enumerate(funcs):
        if _is_reward_model(func):
            raise TypeError(f"reward model {names[i]} cannot score these rows: pass reward functions")
        if _is_async_callable(func):
            waiting.append(i)
        else:
            outputs[i] = _checked(names[i], func(**kwargs), n)
    if waiting:
        for i, output in zip(waiting, _run_async([funcs[i] for i in waiting], kwargs), strict=True):
            outputs[i] = _checked(names[i], output, n)
    totals: list[float | None] = []
    for k in range(n):
        scored = [(w, float(out[k])) for w, out in zip(weights, outputs, strict=True) if not _missing(out[k])]
        totals.append(sum(w * value for w, value in scored) if scored else None)
    return totals, dict(zip(names, outputs, strict=True))


def check_row_aggregation(aggregation: str) -> None:
    """Refuse a ``multi_objective_aggregation`` that a total of each row on its own cannot follow.

    TRL 1.16 knows two (``trl/trainer/grpo_trainer.py``, ``_generate_and_score_completions``):
    ``"sum_then_normalize"`` sums each row's weighted rewards, then normalises the sums over the group;
    ``"normalize_then_sum"`` first normalises each function over a group's generations, so a row's reward depends on
    the other rows of its group. A step reward or a tool-loop reward is one row's own number: only the first applies.

    Raises:
        ValueError: for ``"normalize_then_sum"`` or an unknown aggregation.
    """
    if aggregation == NORMALIZE_THEN_SUM:
        raise ValueError(
            "multi_objective_aggregation='normalize_then_sum' normalises each reward function over a group's "
            "generations before summing; episode mode's step rewards and the tool loop's get_reward sum one row's "
            "rewards on their own: use multi_objective_aggregation='sum_then_normalize'"
        )
    if aggregation != SUM_THEN_NORMALIZE:
        raise ValueError(
            f"Invalid multi_objective_aggregation: {aggregation}. Must be 'sum_then_normalize' or "
            "'normalize_then_sum'."
        )


def unscorable_as_zero(totals: Sequence[float | None], where: str) -> tuple[list[float], int]:
    """``totals`` with each unscorable row (``None``) counted 0, and how many there were.

    Where rows are summed into an episode's outcome (episode mode's step rewards, the tool loop's steps), a step that
    no reward function scores adds nothing: 0, the sum's neutral value. The first time for ``where``, a warning says
    so (e.g. ``win_reward`` alone scores only an episode's last step).
    """
    unscorable = sum(1 for total in totals if total is None)
    if unscorable and where not in _WARNED:
        _WARNED.add(where)
        logger.warning(
            "%s: %d of %d rows were scored by no reward function (every one returned None); they count 0. "
            "Add a reward function that scores every row (e.g. format_reward) to give them a reward.",
            where, unscorable, len(totals),
        )  # fmt: skip
    return [0.0 if total is None else total for total in totals], unscorable


def weighted_rewards(
    funcs: Sequence[RewardFunc],
    weights: Sequence[float] | None,
    fields: Mapping[str, Sequence[Any]],
    completions: Sequence[Any],
) -> tuple[list[float | None], dict[str, list[float | None]]]:
    """:func:`call_reward_funcs` on rows known by their fields and texts only: ``fields`` may hold ``prompts`` and
    ``completion_ids`` (a rollout's output), else they are ``None`` per row; there is no trainer."""
    fields = dict(fields)
    none = [None] * len(completions)
    prompts, completion_ids = fields.pop("prompts", none), fields.pop("completion_ids", none)
    return call_reward_funcs(
        funcs, weights, prompts=prompts, completions=completions, completion_ids=completion_ids, fields=fields
    )


def _checked(name: str, output: Sequence[float | None], n: int) -> list[float | None]:
    """A function's output, refused as TRL refuses it when it is not one value per row."""
    output = list(output)
    if len(output) != n:
        raise ValueError(
            f"The reward function '{name}' returned {len(output)} rewards, but {n} were expected (one per row)."
        )
    return output


def _missing(value: float | None) -> bool:
    # TRL turns None into NaN and sums with nansum: a NaN a function returns is as absent as a None.
    return value is None or math.isnan(float(value))


def _log_nothing(*args: Any) -> None:
    """``log_metric`` / ``log_extra`` where nothing may be logged (no trainer, or rows that are not TRL's)."""


def _is_reward_model(func: Any) -> bool:
    # Without torch imported no module can exist; importing it only to ask would slow every caller down.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(func, torch.nn.Module)


def _is_async_callable(func: Any) -> bool:
    """As TRL 1.16's ``trl.trainer.utils.is_async_callable``: a coroutine function, through ``functools.partial``,
    or a callable object with an async ``__call__``."""
    while isinstance(func, functools.partial):
        func = func.func
    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)


def _run_async(funcs: Sequence[RewardFunc], kwargs: dict[str, Any]) -> list[Sequence[float | None]]:
    """The async functions' outputs, run together on an event loop of their own, in order."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        raise RuntimeError(
            "async reward functions are awaited on an event loop of their own; call this outside a running loop"
        )

    async def together() -> list[Sequence[float | None]]:
        return list(await asyncio.gather(*(func(**kwargs) for func in funcs)))

    return asyncio.run(together())


def _takes_completions_and_kwargs(func: Callable) -> bool:
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return False
    takes_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
    takes_completions = any(p.name == "completions" or p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters)
    return takes_kwargs and takes_completions


__all__ = [
    "DEFAULT_REWARDS",
    "DEFAULT_REWARD_WEIGHTS",
    "NORMALIZE_THEN_SUM",
    "REWARD_FUNCS",
    "SUM_THEN_NORMALIZE",
    "TRL_ARGUMENTS",
    "RewardFunc",
    "call_reward_funcs",
    "check_row_aggregation",
    "get_reward_funcs",
    "reward_func",
    "unscorable_as_zero",
    "weighted_rewards",
    *REWARD_FUNCS,
]

"""Any registered environment as a TRL ``environment_factory``: TRL's own tool loop instead of recruit_trl's rollouts.

TRL 1.16's ``GRPOTrainer(environment_factory=...)`` takes a class. For every rollout it calls ``reset(**row)`` with
the dataset row's columns and appends the returned text to the prompt's last message; the class's public methods
are tools (their type hints and Google-style docstrings become the tool schema); TRL generates, parses a tool call,
runs the method, appends its reply (masked out of the loss) and generates again inside one growing completion, until
the model answers without a tool call or a budget is hit (``max_completion_length`` tokens,
``max_tool_calling_iterations`` calls, the model's context); then ``get_reward()`` scores the rollout.

:func:`environment_factory` builds that class for any environment :func:`recruit_trl.protocol.get_env_interface`
finds (``clinical``, ``conquest``, an entry point, ``package.module:attribute``):

* ``reset(task=..., seed=..., **other_columns)`` resets the environment and returns the rendered state with its
  numbered candidate actions: the ``index`` contract's user message (:func:`recruit_trl.contracts.build_messages`).
* one tool, ``act(action_index: int)``: the compact contract ``{"action_index": k}`` as the tool's arguments. It plays
  candidate ``k`` and returns the next state's text, or the episode's result when it ends. A value the contract's
  strict parser rejects (out of range, not an int) is counted and answered with the environment's fallback action
  (:func:`recruit_trl.contracts.parse_action`), and the reply says so; training never stops on it.
* ``get_reward()``: the reward functions' weighted sum over the rollout, ``sum_i w_i sum_d f_i(step row d)``, with
  the same functions and weights as every other mode (``reward_funcs`` and ``reward_weights`` of
  :func:`environment_factory`; the recipe's ``--reward_funcs`` and ``--reward_weights``), called and summed as TRL
  calls and sums them (:func:`rewards.call_reward_funcs`): the sum of the step rewards, as episode mode's outcome.
  Each call of ``act`` that played a step adds a step row, the fields episode mode gives a decision (the environment's
  reward components, ``valid``, ``action_shaping``, ``potential_change``, and ``final_score`` on the step that ended
  the episode, ``None`` elsewhere); a rollout the tool loop cut has no final score. ``cut_by`` on the instance says
  why a rollout stopped before the episode's end; the weight-0 reward functions :data:`METRIC_FUNCS` log it every
  step, and :func:`reward_part_funcs` each function's unweighted sum (``rewards/<name>/mean``, as in the other modes).

TRL calls ``get_reward()`` without arguments, after every function of ``reward_funcs``. The functions of
:func:`reward_part_funcs` (which the recipe passes) hand each rollout's environment TRL's keyword arguments for its row
first, so the reward functions on its step rows get TRL's ``prompts`` (the dataset's prompt with ``reset``'s text
appended), ``completion_ids`` (the rollout's: TRL never says which tokens made which call), ``trainer_state``,
``log_metric`` and the dataset's columns; ``completions`` are the steps' own calls (``{"action_index": k}``). Without
them (``get_reward`` called directly) the environment passes what it knows: the same prompt and columns from
``reset``'s row, no ``completion_ids`` (``None``) and no trainer.

Bad model output at the other layers is TRL's to handle and never raises either: text that holds no parsable tool
call ends the loop (the episode is then cut, ``cut_by="no_tool_call"``), and a call TRL cannot bind (an unknown tool,
other argument names) is answered with an error by TRL and counted in its ``tools/failure_frequency``; it never
reaches the environment. A call whose reply would overflow ``max_completion_length`` or the context has been played
when TRL drops the reply and ends the loop: it counts in ``decisions`` and in the reward.

A model whose chat template renders no tool calls (the tiny model, SmolLM2: plain ChatML) gets
:data:`TOOL_CHAT_TEMPLATE` from :func:`tool_calling_tokenizer`: a one-tool dialect of ChatML in which a call of
``act`` is written as the contract's answer itself (``{"action_index": 4}``) and the tool's reply is the next user
turn, parsed back by :data:`TOOL_RESPONSE_TEMPLATE`. A model that answers the contract then calls the tool with no
further training, and the tool loop's texts are the rollouts' texts token for token (the contract's own
instructions in the system prompt: ``instructions=recruit_trl.contracts.INDEX_INSTRUCTIONS``).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from recruit_trl.contracts import ParsedAction, build_messages, digest, parse_action
from recruit_trl.protocol import Action, EnvInterface, Observation, get_env_interface
from recruit_trl.rollout.config import ROW_FIELDS, check_mode_rewards
from rewards import (
    DEFAULT_REWARD_WEIGHTS,
    DEFAULT_REWARDS,
    SUM_THEN_NORMALIZE,
    TRL_ARGUMENTS,
    RewardFunc,
    call_reward_funcs,
    check_row_aggregation,
    get_reward_funcs,
    unscorable_as_zero,
)

TOOL_NAME = "act"
#: Appended to the environment's system prompt (the ``index`` contract's instructions, as a tool call).
TOOL_INSTRUCTIONS = f'Call the tool {TOOL_NAME} with {{"action_index": N}} for each action, N a number from the list.'


class ToolEnvironment:
    """One environment episode driven by TRL's tool loop; :func:`environment_factory` makes the subclasses.

    TRL turns every public method except ``reset`` and ``get_reward`` into a tool, so this class has exactly one
    (``act``); the rest is attributes, properties and private methods.

    Attributes:
        interface: the environment interface (class attribute).
        default_task: the task when a row names none (class attribute; ``None``: the interface's first task).
        recent_k: recent actions shown in the state's digest (class attribute).
        max_tool_calls: the tool-call budget the trainer runs with, if known (class attribute): a rollout cut after
            that many calls is reported as ``cut_by="tool_call_budget"``.
        system_prompt: the environment's system prompt with :data:`TOOL_INSTRUCTIONS` (class attribute).
        reward_funcs, reward_weights: the reward functions and their weights that :meth:`get_reward` sums (class
            attributes).
        aggregation: the trainer's ``multi_objective_aggregation`` (class attribute; only ``"sum_then_normalize"``).
        task, seed: the episode's task and reset seed.
        obs, candidates: the current observation and its candidate actions.
        done: the episode has ended.
        decisions: environment steps played.
        tool_calls: calls of ``act`` received (also after the end).
        invalid_calls: calls whose ``action_index`` the contract's parser rejected (each played the fallback action).
        invalid_reasons: why, counted (``index_out_of_range``, ``index_not_int``, ``env_rejected``...).
        calls_after_end: calls received after the episode ended (nothing played).
        running_return: the sum of the environment's step rewards so far.
        final_score: the environment's final score once the episode ended, else ``None``.
        step_rows: one dict per step played, the reward functions' fields of that step.
        unscorable_steps: step rows that no reward function scored (every one returned ``None``): they count 0.
        cut_by: why a cut episode stopped: ``"tool_call_budget"``, or ``"no_tool_call"`` (the completion ended
            without a further call: the model answered in text, or the token budget or the context was reached);
            ``None`` when the episode ended.
    """

    interface: ClassVar[EnvInterface]
    default_task: ClassVar[str | None] = None
    recent_k: ClassVar[int] = 2
    max_tool_calls: ClassVar[int | None] = None
    system_prompt: ClassVar[str] = ""
    reward_funcs: ClassVar[tuple[RewardFunc, ...]] = ()
    reward_weights: ClassVar[tuple[float, ...]] = ()
    aggregation: ClassVar[str] = SUM_THEN_NORMALIZE

    def __init__(self) -> None:
        self._envs: dict[str, Any] = {}  # task -> environment, kept across resets
        self.env: Any = None
        self.task: str | None = None
        self.seed: int | None = None
        self.obs: Observation = {}
        self.candidates: list[Action] = []
        self.done = False
        self.decisions = self.tool_calls = self.invalid_calls = self.calls_after_end = 0
        self.invalid_reasons: Counter = Counter()
        self.running_return = 0.0
        self.final_score: float | None = None
        self.cut_by: str | None = None
        self.step_rows: list[dict[str, Any]] = []
        self.unscorable_steps = 0
        self._recent: list[str] = []
        self._last_info: dict = {}
        # TRL's reward-function keyword arguments for this rollout's row, values of the row (see _trl_row).
        self._row: dict[str, Any] = {}
        self._row_from_trl = False
        self._score: tuple[float, dict[str, float]] | None = None  # get_reward's, until a step or a new row

    def reset(self, task: str | None = None, seed: int | str | None = None, **row: Any) -> str:
        """Start an episode of ``task`` (default: :attr:`default_task`, else the environment's first task) from reset
        seed ``seed`` (``None``: the environment's own choice); every other column of the dataset row is ignored.

        Returns:
            The first state as text with its numbered candidate actions (the ``index`` contract's user message).
        """
        self.task = str(task) if task else (self.default_task or self.interface.tasks()[0])
        self.seed = None if seed is None or seed == "" else int(seed)
        if self.task not in self._envs:
            self._envs[self.task] = self.interface.make_env(self.task)
        self.env = self._envs[self.task]
        self.obs, self._last_info = self.env.reset(seed=self.seed)
        self.candidates = self.interface.candidate_actions(self.obs)
        self.done = False
        self.decisions = self.tool_calls = self.invalid_calls = self.calls_after_end = 0
        self.invalid_reasons = Counter()
        self.running_return = 0.0
        self.final_score = self.cut_by = None
        self.step_rows = []
        self.unscorable_steps = 0
        self._recent = []
        text = self._state_text()
        # What TRL will pass the reward functions for this row, as far as reset's arguments tell (the dataset's row).
        self._row = {name: value for name, value in (("task", task), ("seed", seed)) if value is not None}
        self._row.update({name: value for name, value in row.items() if name != "prompt"})
        self._row["prompts"] = trl_prompt(row.get("prompt"), text)
        self._row_from_trl, self._score = False, None
        return text

    def act(self, action_index: int) -> str:
        """Take one of the listed actions.

        Args:
            action_index: The number of the chosen action in the list of actions.

        Returns:
            The next state with its actions, or the result when the episode ends.
        """
        if self.env is None:
            raise RuntimeError("call reset() before act()")
        self.tool_calls += 1
        if self.done:
            self.calls_after_end += 1
            return f"The episode is over; nothing was played. {self._result_text()}"
        text = json.dumps({"action_index": action_index}, default=str)
        parsed = parse_action(text, "index", self.interface, self.obs, self.candidates)
        note = ""
        try:
            result = self.env.step(parsed.action)
        except ValueError as exc:  # the environment rejects a listed action: the fallback plays instead
            parsed = ParsedAction(self.interface.fallback_action(self.obs), False, f"env_rejected: {exc}"[:80])
            result = self.env.step(parsed.action)
        if not parsed.valid:
            self.invalid_calls += 1
            reason = parsed.error.split(":")[0] if parsed.error else "invalid"
            self.invalid_reasons[reason] += 1
            played = self.interface.describe_action(parsed.action)
            note = f"Invalid action_index ({reason}): played instead: {played}\n"
        obs, reward, terminated, truncated, info = result
        components = self.interface.step_components(self.obs, parsed.action, obs, reward, info)
        self.step_rows.append({
            **{name: float(components.get(name, 0.0)) for name in self.interface.reward_fields},
            "valid": 1.0 if parsed.valid else 0.0,
            "action_shaping": self.interface.action_shaping(self.obs, parsed.action) if parsed.valid else None,
            "final_score": self.interface.final_score(info) if terminated or truncated else None,
            "potential_change": self.interface.potential_change(self.obs, obs),
            "action_type": self.interface.action_type(parsed.action), "action_error": info.get("last_action_error"),
            "scored_steps": 1, "teacher_match": None, "text": text,
        })  # fmt: skip
        self._recent.append(digest(self.interface, self.decisions, parsed.action, info))
        del self._recent[: max(0, len(self._recent) - self.recent_k)]  # the digest shows the last recent_k
        self.decisions += 1
        self.running_return += float(reward)
        self._score = None
        self.obs, self._last_info = obs, info
        if terminated or truncated:
            self.done = True
            self.final_score = self.interface.final_score(info)
            self.candidates = []
            return note + self._result_text()
        self.candidates = self.interface.candidate_actions(obs)
        return note + self._state_text()

    def get_reward(self) -> float:
        """The reward functions' weighted sum over the rollout's step rows, a step that none scored counting 0 (0.0
        before any step: the rollout did nothing); a rollout the tool loop cut before the episode's end says why in
        :attr:`cut_by`."""
        if self.done:
            self.cut_by = None
        else:
            budget = self.max_tool_calls
            self.cut_by = "tool_call_budget" if budget is not None and self.tool_calls >= budget else "no_tool_call"
        return self._scored()[0]

    @property
    def reward_parts(self) -> dict[str, float]:
        """Each reward function's unweighted sum over the rollout's step rows (a ``None`` counts 0), by name."""
        return self._scored()[1]

    def _scored(self) -> tuple[float, dict[str, float]]:
        """``(get_reward, reward_parts)``: the reward functions called once on the step rows, then kept until the next
        step or TRL's row arrives (so a function's ``log_metric`` logs once per rollout)."""
        if self._score is None:
            self._score = self._score_steps()
        return self._score

    def _score_steps(self) -> tuple[float, dict[str, float]]:
        rows = self.step_rows
        if not rows:
            return 0.0, {getattr(f, "__name__", str(f)): 0.0 for f in self.reward_funcs}
        n = len(rows)
        # Every step row carries the rollout's row: TRL's arguments (or reset's) and the dataset's columns, which the
        # step's own fields override (as TRL merges a rollout's fields over the columns).
        fields = {name: [value] * n for name, value in self._row.items() if name not in TRL_ARGUMENTS}
        fields.update({name: [row[name] for row in rows] for name in (*self.interface.reward_fields, *ROW_FIELDS)})
        totals, parts = call_reward_funcs(
            self.reward_funcs,
            self.reward_weights,
            prompts=[self._row.get("prompts")] * n,
            completions=[row["text"] for row in rows],
            completion_ids=[self._row.get("completion_ids")] * n,
            fields=fields,
            trainer_state=self._row.get("trainer_state"),
            log_metric=self._row.get("log_metric"),  # not log_extra: TRL's completions table has a row per rollout
            environments=[self] * n,
            aggregation=self.aggregation,
        )
        steps, self.unscorable_steps = unscorable_as_zero(totals, f"{type(self).__name__}.get_reward")
        sums = {
            name: sum((float(v) for v in values if v is not None and not math.isnan(float(v))), 0.0)
            for name, values in parts.items()
        }
        return float(sum(steps)), sums

    def _trl_row(self, row: dict[str, Any]) -> None:
        """Take TRL's reward-function keyword arguments for this rollout's row (the row's values, the trainer's
        state and loggers), the first time they arrive in an episode."""
        if not self._row_from_trl:
            self._row, self._row_from_trl, self._score = dict(row), True, None

    @property
    def summary(self) -> dict[str, Any]:
        """The episode so far as a JSON-ready dict (for logs and tests)."""
        return {
            "task": self.task,
            "seed": self.seed,
            "done": self.done,
            "decisions": self.decisions,
            "tool_calls": self.tool_calls,
            "invalid_calls": self.invalid_calls,
            "invalid_reasons": dict(self.invalid_reasons),
            "calls_after_end": self.calls_after_end,
            "running_return": self.running_return,
            "final_score": self.final_score,
            "reward_parts": self.reward_parts,
            "unscorable_steps": self.unscorable_steps,
            "cut_by": self.cut_by,
        }

    def _state_text(self) -> str:
        return build_messages(self.interface, self.obs, self._recent, "index", self.candidates)[-1]["content"]

    def _result_text(self) -> str:
        score = "none" if self.final_score is None else f"{self.final_score:.6g}"
        return (
            f"Episode over after {self.decisions} decisions: {self.interface.outcome(self._last_info)}, "
            f"final score {score}."
        )


def environment_factory(
    name: str,
    *,
    task: str | None = None,
    recent_k: int = 2,
    max_tool_calls: int | None = None,
    instructions: str | None = None,
    interface: EnvInterface | None = None,
    reward_funcs: Sequence[str | RewardFunc] | None = None,
    reward_weights: Sequence[float] | None = None,
    aggregation: str = SUM_THEN_NORMALIZE,
) -> type[ToolEnvironment]:
    """A class for ``GRPOTrainer(environment_factory=...)`` that plays environment ``name`` through one tool.

    Args:
        name: a registered environment (``clinical``, ``conquest``), an installed ``recruit_trl.envs`` entry point,
            or ``package.module:attribute``.
        task: the task of rows that name none (default: the environment's first task).
        recent_k: recent actions shown in each state's digest (the rollouts' ``--recent_k``).
        max_tool_calls: the trainer's ``max_tool_calling_iterations``, so that a rollout cut by it says so.
        instructions: the answer format appended to the environment's system prompt (default
            :data:`TOOL_INSTRUCTIONS`; with :data:`TOOL_CHAT_TEMPLATE`, whose call of ``act`` is the contract's answer,
            the contract's own ``recruit_trl.contracts.INDEX_INSTRUCTIONS`` make the prompts the rollouts' exactly).
        interface: an interface object (overrides ``name``'s lookup).
        reward_funcs: what ``get_reward`` sums over the rollout's step rows: names of the ``rewards`` package,
            ``package.module:function`` or functions (default ``rewards.DEFAULT_REWARDS``).
        reward_weights: one weight per reward function (default: ``rewards.DEFAULT_REWARD_WEIGHTS`` with the default
            functions, else 1 each).
        aggregation: the trainer's ``multi_objective_aggregation``: ``get_reward`` sums one rollout's rewards on
            their own, so ``"normalize_then_sum"`` is refused (:func:`rewards.check_row_aggregation`).

    Raises:
        ValueError: an unknown environment or reward function, a reward function that cannot apply in the tool loop
            (``teacher_match_reward``; ``potential_reward`` for an environment without a potential), not one
            weight per function, or an aggregation other than ``"sum_then_normalize"``.

    Returns:
        A :class:`ToolEnvironment` subclass named after the environment (TRL logs ``get_reward`` under the class
        name, e.g. ``rewards/ConquestToolEnv/mean``); TRL calls it without arguments.
    """
    interface = interface or get_env_interface(name)
    if recent_k < 0:
        raise ValueError(f"recent_k must be >= 0, got {recent_k}")
    if max_tool_calls is not None and max_tool_calls < 1:
        raise ValueError(f"max_tool_calls must be >= 1 or None, got {max_tool_calls}")
    if task is not None and task not in interface.tasks():
        # Environments may accept tasks outside tasks() (variants); make_env is the judge, once, here.
        interface.make_env(task)
    if reward_funcs is None:
        reward_funcs = DEFAULT_REWARDS
        reward_weights = DEFAULT_REWARD_WEIGHTS if reward_weights is None else reward_weights
    names = [f if isinstance(f, str) else getattr(f, "__name__", str(f)) for f in reward_funcs]
    check_mode_rewards(names, "tool", interface.has_potential())
    funcs = tuple(get_reward_funcs([f])[0] if isinstance(f, str) else f for f in reward_funcs)
    weights = tuple(float(w) for w in reward_weights) if reward_weights is not None else (1.0,) * len(funcs)
    if len(weights) != len(funcs):
        raise ValueError(f"--reward_weights {list(weights)} must give one weight per --reward_funcs {names}")
    check_row_aggregation(aggregation)
    words = re.findall(r"[A-Za-z0-9]+", str(interface.name)) or ["Env"]
    class_name = "".join(w[:1].upper() + w[1:] for w in words) + "ToolEnv"
    attrs = {
        "interface": interface,
        "default_task": task,
        "recent_k": recent_k,
        "max_tool_calls": max_tool_calls,
        "system_prompt": f"{interface.system_prompt}\n{TOOL_INSTRUCTIONS if instructions is None else instructions}",
        "reward_funcs": funcs,
        "reward_weights": weights,
        "aggregation": aggregation,
        "__module__": __name__,
        "__doc__": f"TRL environment_factory class of {interface.name!r} (see {__name__}.ToolEnvironment).",
    }
    return type(class_name, (ToolEnvironment,), attrs)


def environment_dataset(factory: type[ToolEnvironment], tasks: Sequence[str], seeds: Iterable[int]):
    """The training rows for ``factory``: one per (task, seed), the prompt a system turn (the factory's system prompt)
    and an empty user turn that TRL fills with ``reset(task=..., seed=...)``'s text."""
    from datasets import Dataset

    pairs = [(task, int(seed)) for task in tasks for seed in seeds]
    prompt = [{"role": "system", "content": factory.system_prompt}, {"role": "user", "content": ""}]
    return Dataset.from_dict(
        {"prompt": [prompt] * len(pairs), "task": [t for t, _ in pairs], "seed": [s for _, s in pairs]}
    )


# --------------------------------------------------------------------------------------------- logged metrics
# Weight-0 reward functions: TRL logs each one's mean as rewards/<name>/mean (it passes the rollouts' environments).


def episode_ended(environments: Sequence[Any] | None = None, **kwargs: Any) -> list[float | None]:
    """1.0 when the rollout's episode ended (its last step row has the final score), 0.0 when the tool loop cut it."""
    return [float(e.done) if isinstance(e, ToolEnvironment) else None for e in environments or []]


def decisions(environments: Sequence[Any] | None = None, **kwargs: Any) -> list[float | None]:
    """Environment steps the rollout played."""
    return [float(e.decisions) if isinstance(e, ToolEnvironment) else None for e in environments or []]


def invalid_calls(environments: Sequence[Any] | None = None, **kwargs: Any) -> list[float | None]:
    """Calls whose ``action_index`` was rejected and answered with the fallback action."""
    return [float(e.invalid_calls) if isinstance(e, ToolEnvironment) else None for e in environments or []]


METRIC_FUNCS = (episode_ended, decisions, invalid_calls)


def reward_part_funcs(factory: type[ToolEnvironment]) -> list:
    """Weight-0 reward functions, one per reward function of ``factory`` and named after it, that log its unweighted
    sum over each rollout's step rows: TRL's ``rewards/<name>/mean``, as the other modes log it.

    Called as TRL calls them (one prompt per environment), they first hand each environment TRL's keyword arguments
    for its row, which its reward functions then get (TRL calls ``get_reward`` after them, without arguments)."""

    def part(name: str):
        def read(environments: Sequence[Any] | None = None, **kwargs: Any) -> list[float | None]:
            environments = list(environments or [])
            hand_trl_rows(environments, kwargs)
            return [e.reward_parts.get(name) if isinstance(e, factory) else None for e in environments]

        read.__name__ = read.__qualname__ = name
        return read

    return [part(getattr(f, "__name__", str(f))) for f in factory.reward_funcs]


def hand_trl_rows(environments: Sequence[Any], kwargs: dict[str, Any]) -> None:
    """Give each :class:`ToolEnvironment` of ``environments`` its row of TRL's reward-function keyword arguments
    ``kwargs``: each per-row list's value for it (``prompts``, ``completions``, ``completion_ids``, the dataset's
    columns), and the trainer's ``trainer_state``, ``log_extra`` and ``log_metric``. Nothing is handed when
    ``kwargs`` is not TRL's call for these environments (not one prompt per environment)."""
    prompts = kwargs.get("prompts")
    if prompts is None or len(prompts) != len(environments):
        return
    shared = ("trainer_state", "log_extra", "log_metric")
    for i, env in enumerate(environments):
        if isinstance(env, ToolEnvironment):
            env._trl_row({name: value if name in shared else value[i] for name, value in kwargs.items()})


def trl_prompt(prompt: Any, text: str) -> Any:
    """The prompt TRL passes the reward functions for a rollout of ``environment_factory``: the dataset's
    conversational ``prompt`` with ``reset``'s ``text`` appended to its last message (``None`` for another prompt)."""
    if not isinstance(prompt, list) or not prompt or not isinstance(prompt[-1], dict):
        return None
    # As trl/trainer/grpo_trainer.py:2391-2397 (TRL 1.16) builds it, for the text that reset returns.
    content = prompt[-1]["content"]
    observation: Any = [{"type": "text", "text": text}] if isinstance(content, list) else text
    return [*prompt[:-1], {**prompt[-1], "content": content + observation}]


# --------------------------------------------------------------------------------------------- chat template
#: ChatML in a one-tool dialect, for a model that answers the ``index`` contract but whose template renders no tool
#: calls (the tiny model, SmolLM2). A call of :data:`TOOL_NAME` is written as its bare arguments object, which is
#: exactly the contract's answer (``{"action_index": 4}``), and a tool's reply is the next user turn (the state text):
#: a conversation of ``act`` calls renders token for token like the rollouts' prompts, and a model that answers the
#: contract calls the tool without any training. A call of any other tool is written as
#: Qwen2.5 writes it (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``) but is not parsed back. No tool
#: schema is rendered: the system prompt states the one tool's contract. Without tools it renders exactly as the tiny
#: model's ChatML (``recruit_trl.workflow.tokenizer.CHAT_TEMPLATE``); assistant turns are in ``{% generation %}``.
TOOL_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}"
    "{{- message['content'] or '' }}"
    "{%- for tc in message['tool_calls'] or [] %}"
    "{%- if tc['function'] is defined %}{%- set tc = tc['function'] %}{%- endif %}"
    "{%- if tc['arguments'] is string %}{%- set arguments = tc['arguments'] %}"
    "{%- else %}{%- set arguments = tc['arguments'] | tojson %}{%- endif %}"
    "{%- if message['content'] or not loop.first %}{{- '\\n' }}{%- endif %}"
    "{%- if tc['name'] == '" + TOOL_NAME + "' %}{{- arguments }}"
    "{%- else %}{{- '<tool_call>\\n{\"name\": \"' + tc['name'] + '\", \"arguments\": ' + arguments }}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{{- '<|im_end|>' }}"
    "{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user\\n' }}"
    "{%- else %}{{- '\\n' }}{%- endif %}"
    "{{- message['content'] }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

#: How transformers' ``parse_response`` reads an assistant turn of :data:`TOOL_CHAT_TEMPLATE`: text, then a JSON object
#: up to ``<|im_end|>`` that is a call of :data:`TOOL_NAME` (its arguments). Anything else is text, and text that
#: does not parse (a cut object, a second object, text after it) leaves TRL with no call: the tool loop ends.
TOOL_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open_pattern": r"(?=\{)",
            "close_pattern": r"\s*(?=<\|im_end\|>)|\s*$",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": {"name": TOOL_NAME, "arguments": "{content}"}},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}


def tool_calling_tokenizer(tokenizer):
    """``tokenizer`` able to render and parse tool calls for TRL's tool loop; returned, changed in place.

    A template that already renders tool calls (TRL's ``supports_tool_calling``) is kept: TRL then sets its response
    template itself for the families it knows. A ChatML template without them (``<|im_end|>`` ends a turn, as with the
    tiny model and SmolLM2) is replaced by :data:`TOOL_CHAT_TEMPLATE`, and :data:`TOOL_RESPONSE_TEMPLATE` is set; both
    are saved with the tokenizer (``save_pretrained``).

    Raises:
        ValueError: for a template that renders no tool calls and is not ChatML.
    """
    from trl.chat_template_utils import supports_tool_calling

    if supports_tool_calling(tokenizer):
        return tokenizer
    if tokenizer.eos_token != "<|im_end|>" or "<|im_start|>" not in (tokenizer.chat_template or ""):
        raise ValueError(
            "the tokenizer's chat template renders no tool calls and is not ChatML: give it a tool-calling template "
            "(e.g. the model family's own) and a response_template before training with environment_factory"
        )
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    tokenizer.response_template = TOOL_RESPONSE_TEMPLATE
    return tokenizer

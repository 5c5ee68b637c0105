"""Evaluation harness: full episodes of any policy over a seed range and tasks, with the metrics that matter.

Policies:
    * any policy the environment registers (``random``, ``heuristic``, ``expert``, ...), called as
      ``policy(obs, rng)``; a policy object with ``act(env, obs=obs, rng=rng)`` is handed the live environment
      instead (planners that look ahead from the current state);
    * ``model:PATH``: a causal LM folder or a LoRA adapter folder (its base model is read from the adapter
      config). Model policies run all episodes in lock-step with batched generation, through the same
      prompt rendering, action contract, strict parser and safe fallback as the RL rollouts.

Metrics per (policy, task): final score mean and sample sd, episode length, strict-JSON rate (model output is
exactly one JSON object), valid-action rate (the decision parsed under the contract and the environment reported no
error), fallback rate, teacher match (the fraction of decisions equal to a named teacher policy's on the same
observation), the action-type distribution, and the interface's episode metrics: for each, ``<name>_mean`` (its
value at the episode's end), and for its ``curve_metrics`` also ``<name>_at_mean`` (after the days of
``metric_days``), ``<name>_peak_mean`` and ``<name>_by_day_mean`` (the mean curve over the days); e.g. the clinical
environment's ``enrolled_*`` and ``budget_left_mean``.

Episodes run in-process, or against an environment server (``env_url``) through the interface's ``remote_env``.

Per-decision trace (``recruit-trl eval --trace FILE``): one JSON line per decision with the policy, task, seed,
day, the action played and the teacher's action (both as the prompt describes them), whether they match, whether
the decision was valid (for a model's rejected answer also its ``text`` and the parser's ``error``), and its
outcome. Aggregates say *that* a model drifts; the trace shows where: e.g. a student that negotiates every day on
medium while the expert waits until the last scheduled dropout.
"""

from __future__ import annotations

import json
import platform
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from recruit_trl.anchors import AnchorState
from recruit_trl.contracts import (
    CONTRACTS,
    MAX_NEW_TOKENS,
    answer_texts,
    build_messages,
    digest,
    parse_action,
    parse_json_object,
)
from recruit_trl.files import read_json, save_figure_atomic, write_json_atomic, write_text_atomic
from recruit_trl.models import model_fingerprint
from recruit_trl.protocol import EnvInterface, episode_metrics, get_env_interface, policy_action, remote_env
from recruit_trl.traces import match_candidate, same_action, trace_row

# Bumped when the result rows gain fields, so that cached evaluations without them are redone.
EVAL_SCHEMA = 3
# Row fields named like an episode metric's mean (``<name>_mean``) that are not one; and what a curve metric adds.
FIXED_MEANS = ("final_score_mean", "episode_length_mean", "score_terms_mean")
CURVE_SUFFIXES = ("_at_mean", "_peak_mean", "_by_day_mean")


@dataclass
class EvalConfig:
    """What :func:`evaluate` runs: the environment (``env``, a name for ``get_env_interface``), its tasks (empty: the
    interface's ``tasks()``), reset seeds, the action contract and decoding of model policies, and more."""

    env: str = "clinical"
    tasks: Sequence[str] = ()
    seeds: Sequence[int] = tuple(range(20))
    contract: str = "index"
    recent_k: int = 2
    teacher: str | None = None
    env_url: str | None = None
    transport: str = "http"
    temperature: float = 0.0
    top_p: float = 1.0
    batch_size: int = 64
    policy_seed: int = 0
    max_new_tokens: int | None = None
    constrained: bool = False  # models answer only with a listed candidate (recruit_trl.generation, allowed=)
    # How models are loaded (recruit_trl.models.loading_config: dtype, attention, 4-bit), as in training.
    model_loading: dict = field(default_factory=dict)


@dataclass
class EpisodeLog:
    task: str
    seed: int
    final_score: float | None = None
    length: int = 0
    decisions: int = 0
    strict_json: int = 0
    valid: int = 0
    fallback: int = 0
    teacher_match: int = 0
    teacher_checked: int = 0
    action_types: Counter = field(default_factory=Counter)
    score_terms: dict[str, float] | None = None
    metrics: dict[str, list[float]] = field(default_factory=dict)  # each episode metric after every decision
    own_valid: int = 0  # decisions where the model's own answer was legal (free: it parsed; constrained: unchanged)
    own_checked: int = 0


class Evaluator:
    """Runs policies over ``config.tasks`` x ``config.seeds`` and aggregates :class:`EpisodeLog` records."""

    def __init__(self, config: EvalConfig, interface: EnvInterface | None = None) -> None:
        if config.contract not in CONTRACTS:
            raise ValueError(f"contract must be one of {CONTRACTS}")
        self.interface = interface or get_env_interface(config.env)
        self.config = with_tasks(config, self.interface)
        self.teacher = self.interface.get_policy(config.teacher) if config.teacher else None
        # When a list (and a teacher is set), model runs append one trace row per decision: the state the model
        # reached, labelled with the teacher's action (DAgger data; see recruit_trl.sft.dagger_rows).
        self.labelled_rows: list[dict[str, Any]] | None = None
        # When a list, every decision of every policy appends one trace record (see the module docstring).
        self.trace: list[dict[str, Any]] | None = None
        # Model runs keep the state of every episode on these days, with the actions that reached it
        # (recruit_trl.anchors.record_anchors): captured[(task, seed, day)] = AnchorState.
        self.capture_days: set[int] = set()
        self.captured: dict[tuple[str, int, int], AnchorState] = {}

    # ------------------------------------------------------------------ environments
    def make_env(self, task: str):
        if self.config.env_url:
            return remote_env(self.interface, self.config.env_url, task, self.config.transport)
        return self.interface.make_env(task)

    def _teacher_action(self, env, obs, rng: random.Random) -> dict | None:
        return None if self.teacher is None else policy_action(self.teacher, env, obs, rng)

    # ------------------------------------------------------------------ policies
    def run_policy(self, name: str, progress: Callable[[int], None] | None = None) -> list[EpisodeLog]:
        if name.startswith("model:"):
            return self.run_model(name[len("model:") :], progress)
        policy = self.interface.get_policy(name)
        logs = []
        for task in self.config.tasks:
            env = self.make_env(task)
            for seed in self.config.seeds:
                rng = random.Random(self.config.policy_seed * 1_000_003 + seed)
                teacher_rng = random.Random(seed)
                log = EpisodeLog(task, seed)
                obs, _ = env.reset(seed=seed)
                done = False
                while not done:
                    taught = self._teacher_action(env, obs, teacher_rng)
                    action = policy_action(policy, env, obs, rng)
                    obs, _, terminated, truncated, info = env.step(action)
                    done = terminated or truncated
                    self._record(log, action, obs, info, parsed_json=None, valid=True, taught=taught)
                self._finish(log, obs, info, env)
                logs.append(log)
                if progress:
                    progress(1)
            if hasattr(env, "close"):
                env.close()
        return logs

    def run_model(self, path: str, progress: Callable[[int], None] | None = None) -> list[EpisodeLog]:
        model, tokenizer = load_policy_model(path, self.config.model_loading)
        from transformers import GenerationConfig

        from recruit_trl.generation import answer_token_ids, encode_prompt, sample

        cfg = self.config
        do_sample = cfg.temperature > 0
        gen_config = GenerationConfig(
            do_sample=do_sample,
            temperature=cfg.temperature if do_sample else None,
            top_p=cfg.top_p if do_sample and cfg.top_p < 1.0 else None,
            top_k=None,
        )
        if do_sample:  # sampled runs repeat exactly for the same config (policy_seed, tasks, seeds, batch size)
            import torch

            torch.manual_seed(cfg.policy_seed)
        max_new = cfg.max_new_tokens or MAX_NEW_TOKENS[cfg.contract]
        episodes = [(task, seed) for task in cfg.tasks for seed in cfg.seeds]
        envs = [self.make_env(task) for task, _ in episodes]
        logs = [EpisodeLog(task, seed) for task, seed in episodes]
        obs = [env.reset(seed=seed)[0] for env, (_, seed) in zip(envs, episodes, strict=True)]
        recent: list[list[str]] = [[] for _ in episodes]
        played: list[list[dict]] = [[] for _ in episodes]  # the actions of each episode, kept with captured states
        rngs = [random.Random(seed) for _, seed in episodes]
        active = list(range(len(episodes)))
        while active:
            self._capture(envs, obs, recent, played, logs, active)
            candidates = {i: self.interface.candidate_actions(obs[i]) for i in active}
            prompts, messages_of = [], {}
            for i in active:
                shown = recent[i][len(recent[i]) - cfg.recent_k :] if cfg.recent_k > 0 else []
                messages = messages_of[i] = build_messages(self.interface, obs[i], shown, cfg.contract, candidates[i])
                prompts.append(encode_prompt(tokenizer, messages, enable_thinking=False))
            allowed = None
            if cfg.constrained:
                allowed = [answer_token_ids(tokenizer, answer_texts(cfg.contract, candidates[i])) for i in active]
            unchanged: list[bool | None] = []
            completions, _ = sample(
                model, tokenizer, prompts, gen_config, max_new, cfg.batch_size, allowed=allowed, unchanged=unchanged
            )
            texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
            still = []
            for i, text, same in zip(active, texts, unchanged, strict=True):
                parsed = parse_action(text, cfg.contract, self.interface, obs[i], candidates[i])
                own = parsed.valid if allowed is None else same
                if own is not None:
                    logs[i].own_checked += 1
                    logs[i].own_valid += int(own)
                taught = self._teacher_action(envs[i], obs[i], rngs[i])
                day = logs[i].length
                if self.labelled_rows is not None and taught is not None:
                    self._label(messages_of[i], candidates[i], taught, episodes[i], day)
                new_obs, _, terminated, truncated, info = envs[i].step(parsed.action)
                strict = parse_json_object(text)[0] is not None
                self._record(
                    logs[i],
                    parsed.action,
                    new_obs,
                    info,
                    parsed_json=strict,
                    valid=parsed.valid,
                    taught=taught,
                    error=parsed.error,
                    text=text,
                )
                recent[i].append(digest(self.interface, day, parsed.action, info))
                if self.capture_days:
                    played[i].append(parsed.action)
                obs[i] = new_obs
                if terminated or truncated:
                    self._finish(logs[i], new_obs, info, envs[i])
                    if progress:
                        progress(1)
                else:
                    still.append(i)
            active = still
        for env in envs:
            if hasattr(env, "close"):
                env.close()
        return logs

    # ------------------------------------------------------------------ bookkeeping
    def _capture(self, envs, obs, recent, played, logs: list[EpisodeLog], active: list[int]) -> None:
        if not self.capture_days:
            return
        k = self.config.recent_k
        for i in active:
            day = logs[i].length
            if day in self.capture_days:
                kept = tuple(recent[i][len(recent[i]) - k :] if k > 0 else ())
                state = AnchorState(envs[i].snapshot(), obs[i], kept, False, day, tuple(played[i]))
                self.captured[(logs[i].task, logs[i].seed, day)] = state

    def _label(self, messages, candidates, taught, episode: tuple[str, int], day: int) -> None:
        if self.config.contract == "index":
            k = match_candidate(self.interface, taught, candidates)
            if k is None:
                return  # the teacher's action is not listed: nothing the model could answer
            taught = candidates[k]
        task, seed = episode
        self.labelled_rows.append(
            trace_row(self.interface, messages, candidates, taught, self.config.contract, task, seed, day)
        )

    def _record(
        self,
        log: EpisodeLog,
        action,
        obs,
        info,
        parsed_json: bool | None,
        valid: bool,
        taught,
        error: str | None = None,
        text: str | None = None,
    ) -> None:
        if self.trace is not None:
            describe = self.interface.describe_action
            record = {
                "task": log.task,
                "seed": log.seed,
                "day": log.length,
                "action": describe(action),
                "teacher": describe(taught) if taught is not None else None,
                "match": same_action(self.interface, action, taught) if taught is not None else None,
                "valid": bool(valid and not info.get("last_action_error")),
                "outcome": self.interface.outcome(info),
            }
            if error is not None:  # a model's answer the parser rejected: what it wrote, and why
                record.update(error=error, text=text)
            self.trace.append(record)
        log.length += 1
        log.decisions += 1
        for name, value in episode_metrics(self.interface, obs, info).items():
            log.metrics.setdefault(name, []).append(value)
        log.action_types[self.interface.action_type(action)] += 1
        if parsed_json is not None:
            log.strict_json += int(parsed_json)
            log.fallback += int(not valid)
        log.valid += int(valid and not info.get("last_action_error"))
        if taught is not None:
            log.teacher_checked += 1
            log.teacher_match += int(same_action(self.interface, action, taught))

    def _finish(self, log: EpisodeLog, obs: dict, info: dict, env) -> None:
        log.final_score = self.interface.final_score(info)
        score_terms = getattr(self.interface, "score_terms", None)
        log.score_terms = score_terms(env) if score_terms is not None else None


def with_tasks(config: EvalConfig, interface: EnvInterface | None = None) -> EvalConfig:
    """``config`` with its tasks filled in: the interface's ``tasks()`` when it names none."""
    if config.tasks:
        return config
    return replace(config, tasks=tuple((interface or get_env_interface(config.env)).tasks()))


def aggregate(
    policy: str,
    logs: Sequence[EpisodeLog],
    is_model: bool,
    curve_metrics: Sequence[str] = (),
    metric_days: Sequence[int] = (),
) -> list[dict[str, Any]]:
    """One result row per task (the JSON schema of ``recruit-trl eval --json``).

    Args:
        policy: the policy's name in the rows.
        logs: its episodes.
        is_model: whether it is a model (strict-JSON and fallback rates apply).
        curve_metrics: episode metrics whose course is reported too (``<name>_at_mean``, ``_peak_mean``,
            ``_by_day_mean``); see the module docstring.
        metric_days: the days of ``<name>_at_mean``.

    Raises:
        ValueError: when an episode metric's field would overwrite another field of the row.
    """
    rows = []
    for task in dict.fromkeys(log.task for log in logs):
        group = [log for log in logs if log.task == task]
        scores = [log.final_score for log in group if log.final_score is not None]
        decisions = sum(log.decisions for log in group)
        types = Counter()
        for log in group:
            types.update(log.action_types)
        checked = sum(log.teacher_checked for log in group)
        terms = [log.score_terms for log in group]
        head = {
            "policy": policy,
            "task": task,
            "episodes": len(group),
            "final_score_mean": round(statistics.mean(scores), 4) if scores else None,
            "final_score_sd": round(statistics.stdev(scores), 4) if len(scores) > 1 else 0.0,
        }
        tail = {
            "episode_length_mean": round(statistics.mean(log.length for log in group), 2),
            "strict_json_rate": round(sum(log.strict_json for log in group) / decisions, 4) if is_model else None,
            "valid_action_rate": round(sum(log.valid for log in group) / max(1, decisions), 4),
            "fallback_rate": round(sum(log.fallback for log in group) / decisions, 4) if is_model else None,
            "teacher_match": round(sum(log.teacher_match for log in group) / checked, 4) if checked else None,
            # The model's own answers that were legal: free decoding, those that parsed; greedy constrained
            # decoding, those the constraint did not change (None for sampled constrained runs and policies).
            "own_answer_valid_rate": (
                round(sum(log.own_valid for log in group) / own, 4)
                if (own := sum(log.own_checked for log in group))
                else None
            ),
            "action_types": {k: round(v / max(1, decisions), 4) for k, v in sorted(types.items())},
            # Where the points come from: mean of each weighted part of the grade (when the interface says).
            "score_terms_mean": (
                {k: round(statistics.mean(t[k] for t in terms), 4) for k in terms[0]} if terms and all(terms) else None
            ),
        }
        metrics = _metric_fields(group, curve_metrics, metric_days)
        clash = sorted(set(metrics) & (set(head) | set(tail)))
        if clash:
            raise ValueError(f"episode metrics {clash} would overwrite result fields of the same name: rename them")
        rows.append({**head, **metrics, **tail})
    return rows


def _metric_fields(
    group: Sequence[EpisodeLog], curve_metrics: Sequence[str], metric_days: Sequence[int]
) -> dict[str, Any]:
    """The episode metrics' fields of one result row (``group``: the episodes of one task), in the metrics' order.

    Raises:
        ValueError: when two metrics make the same field (e.g. ``x_peak`` next to the curve metric ``x``).
    """
    out: dict[str, Any] = {}

    def put(key: str, value: Any) -> None:
        if key in out:
            raise ValueError(f"two episode metrics make the result field {key!r}: rename one")
        out[key] = value

    for name in group[0].metrics:
        series = [log.metrics[name] for log in group]
        put(f"{name}_mean", round(statistics.mean(s[-1] for s in series), 2))
        if name in curve_metrics:
            if metric_days:
                at = {str(d): round(statistics.mean(_value_at(s, d) for s in series), 2) for d in metric_days}
                put(f"{name}_at_mean", at)
            put(f"{name}_peak_mean", round(statistics.mean(max(s) for s in series), 2))
            put(f"{name}_by_day_mean", _mean_curve(series))
    return out


def _value_at(series: Sequence[float], day: int) -> float:
    """The value after ``day >= 1`` decisions (an episode that ended sooner keeps its last value)."""
    return series[min(day, len(series)) - 1]


def metric_names(row: Mapping[str, Any]) -> list[str]:
    """The episode metrics of a result row (its other ``<name>_mean`` fields), in the row's order."""
    derived = {f"{name}{suffix}" for name in curve_names(row) for suffix in CURVE_SUFFIXES}
    return [k[: -len("_mean")] for k in row if k.endswith("_mean") and k not in FIXED_MEANS and k not in derived]


def curve_names(row: Mapping[str, Any]) -> list[str]:
    """The curve metrics of a result row (those with a ``<name>_by_day_mean`` curve), in the row's order."""
    return [k[: -len("_by_day_mean")] for k in row if k.endswith("_by_day_mean")]


def _mean_curve(curves: Sequence[Sequence[int]]) -> list[float]:
    """Day-by-day mean over episodes; an episode that ended sooner keeps its last value."""
    length = max((len(c) for c in curves), default=0)
    padded = [list(c) + [c[-1] if c else 0] * (length - len(c)) for c in curves]
    return [round(statistics.mean(column), 2) for column in zip(*padded, strict=True)] if padded else []


def evaluate(
    policies: Sequence[str],
    config: EvalConfig,
    *,
    progress: bool = True,
    labels: Sequence[str] | None = None,
    trace_path: str | Path | None = None,
) -> dict[str, Any]:
    """Evaluate every policy; returns ``{"results": [...], "config": {...}, "versions": {...}}``.

    Args:
        policies: policy names or ``model:PATH``.
        config: tasks, seeds, contract, teacher, ...
        progress: show a progress bar over episodes.
        labels: names for the policies in the results (default: the names themselves).
        trace_path: write the per-decision trace (JSON lines, ``policy`` added to each record) here.
    """
    evaluator = Evaluator(config)
    config, interface = evaluator.config, evaluator.interface
    curves = {
        "curve_metrics": getattr(interface, "curve_metrics", ()),
        "metric_days": getattr(interface, "metric_days", ()),
    }
    trace: list[dict[str, Any]] = []
    results = []
    total = len(policies) * len(config.tasks) * len(config.seeds)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="evaluating", unit="episode", dynamic_ncols=True)
    timings = {}
    for k, name in enumerate(policies):
        label = labels[k] if labels else name
        start = time.perf_counter()
        evaluator.trace = [] if trace_path is not None else None
        logs = evaluator.run_policy(name, progress=bar.update if bar else None)
        timings[label] = round((time.perf_counter() - start) / max(1, len(logs)), 3)
        results.extend(aggregate(label, logs, name.startswith("model:"), **curves))
        trace += [{"policy": label, **record} for record in evaluator.trace or ()]
    if bar:
        bar.close()
    if trace_path is not None:
        write_text_atomic(trace_path, "".join(json.dumps(record) + "\n" for record in trace))
    cfg = {k: (list(v) if isinstance(v, tuple | range) else v) for k, v in config.__dict__.items()}
    cfg["policies"] = list(policies)
    cfg["seconds_per_episode"] = timings
    return {"results": results, "config": cfg, "versions": versions()}


def cached_evaluation(policy: str, config: EvalConfig, label: str, path: str | Path) -> dict[str, Any] | None:
    """The evaluation in the JSON file ``path`` if it was written for the same :func:`cache_key`, else ``None`` (also
    for a file that does not parse, with a warning)."""
    return _cached(path, cache_key(policy, config, label))


def _cached(path: str | Path, key: dict[str, Any]) -> dict[str, Any] | None:
    part = read_json(path)
    return part if isinstance(part, dict) and all(part.get(k) == v for k, v in key.items()) else None


def cache_key(policy: str, config: EvalConfig, label: str) -> dict[str, Any]:
    """Everything that decides the rows of ``evaluate([policy], config, labels=[label])``.

    The policy, its label in the rows, the fingerprint of a ``model:PATH`` policy's weights, configs and tokenizer
    (:func:`recruit_trl.models.model_fingerprint`: a re-run that trains further into the same folder is evaluated
    again), every setting of ``config`` but those that say where the episodes run (``env_url``, ``transport``), and
    the rows' :data:`EVAL_SCHEMA`. JSON values, compared with the file's top-level fields.
    """
    settings = {
        k: (list(v) if isinstance(v, tuple | range) else v)
        for k, v in with_tasks(config).__dict__.items()
        if k not in ("env_url", "transport")
    }
    weights = model_fingerprint(policy[len("model:") :]) if policy.startswith("model:") else None
    return {"policy": policy, "label": label, "weights": weights, **settings, "schema": EVAL_SCHEMA}


def evaluate_cached(
    policy: str, config: EvalConfig, label: str, path: str | Path, *, progress: bool = True
) -> dict[str, Any]:
    """``evaluate([policy], config, labels=[label])`` cached in the JSON file ``path``.

    The file is reused when it holds the same :func:`cache_key` (a re-run does not redo a finished evaluation, and
    never reports another policy's or another checkpoint's figures) and is written atomically (an interrupted run
    leaves no partial file). Returns the evaluation with its cache key.
    """
    key = cache_key(policy, config, label)
    part = _cached(path, key)
    if part is None:
        part = {**evaluate([policy], config, labels=[label], progress=progress), **key}
        write_json_atomic(path, part)
    return part


def evaluate_cached_runs(runs: Sequence[tuple[str, str, EvalConfig, str]]) -> None:
    """:func:`evaluate_cached` for each ``(label, policy, config, path)`` in turn (a background process's work)."""
    for label, policy, config, path in runs:
        evaluate_cached(policy, config, label, path, progress=False)


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("recruit_trl", "torch", "transformers", "trl", "peft"):
        try:
            module = __import__(name)
            out[name] = getattr(module, "__version__", "?")
        except ImportError:
            continue
    return out


def load_policy_model(path: str, loading: dict | None = None):
    """A causal LM (or a LoRA adapter on its base model) and its tokenizer, in eval mode, from a local folder, loaded
    as ``loading`` says (:func:`recruit_trl.models.loading_config`: dtype, attention, 4-bit)."""
    from recruit_trl.models import load_for_inference

    return load_for_inference(path, loading)


def format_table(results: Sequence[dict[str, Any]]) -> str:
    """The results as a plain-text table, with a column for each episode metric the rows carry."""
    metrics = list(dict.fromkeys(name for r in results for name in metric_names(r)))
    widths = {name: max(10, len(name) + 2) for name in metrics}
    columns = "".join(f"{name:>{widths[name]}}" for name in metrics)
    header = (
        f"{'policy':<22}{'task':<22}{'score':>16}{columns}{'len':>6}{'json':>7}{'valid':>7}{'fallbk':>7}{'teach':>7}"
        "  top action"
    )
    lines = [header, "-" * len(header)]

    def pct(x, digits=0):
        return "-" if x is None else f"{100 * x:.{digits}f}%"

    def number(x):  # tenths for small numbers (counts), whole units for large ones (e.g. money)
        return "-" if x is None else f"{x:.1f}" if abs(x) < 1000 else f"{x:.0f}"

    for r in results:
        top = max(r["action_types"], key=r["action_types"].get) if r["action_types"] else "-"
        score = "-" if r["final_score_mean"] is None else f"{r['final_score_mean']:.3f} ± {r['final_score_sd']:.3f}"
        values = "".join(f"{number(r.get(f'{name}_mean')):>{widths[name]}}" for name in metrics)
        lines.append(
            f"{r['policy'][:21]:<22}{r['task']:<22}{score:>16}{values}{r['episode_length_mean']:>6.0f}"
            f"{pct(r['strict_json_rate']):>7}{pct(r['valid_action_rate'], 1):>7}{pct(r['fallback_rate']):>7}"
            f"{pct(r['teacher_match']):>7}  {top} {pct(r['action_types'].get(top))}"
        )
    return "\n".join(lines)


def plot_results(
    results: Sequence[dict[str, Any]],
    path: str | Path,
    title: str = "Final score by policy",
    references: Mapping[str, float] | None = None,
) -> Path:
    """Grouped bars of the mean final score (± sd) per task and policy, with the tasks' ``references`` (e.g. the
    interface's ``reference_scores``) marked as dashed lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = list(dict.fromkeys(r["task"] for r in results))
    policies = list(dict.fromkeys(r["policy"] for r in results))
    width = 0.8 / max(1, len(policies))
    references = {task: score for task, score in (references or {}).items() if task in tasks}
    entries = len(policies) + bool(references)  # the policies and the reference line
    legend_cols = min(5, entries)
    legend_rows = -(-entries // legend_cols)
    fig, ax = plt.subplots(figsize=(1.8 + 2.2 * len(tasks), 4.2 + 0.25 * legend_rows))
    for k, policy in enumerate(policies):
        xs, ys, errs = [], [], []
        for t, task in enumerate(tasks):
            row = next((r for r in results if r["policy"] == policy and r["task"] == task), None)
            if row and row["final_score_mean"] is not None:
                xs.append(t + (k - (len(policies) - 1) / 2) * width)
                ys.append(row["final_score_mean"])
                errs.append(row["final_score_sd"])
        ax.bar(xs, ys, width, yerr=errs, capsize=2, label=policy)
    for t, task in enumerate(tasks):
        if task in references:
            ax.hlines(references[task], t - 0.45, t + 0.45, colors="black", linestyles="dashed")
    if references:
        ax.plot([], [], "k--", label="best reference policy")
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylabel("final grader score")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    # Below the axes: inside, it covers the tallest bars once there are more than a few policies.
    ax.legend(fontsize=8, ncols=legend_cols, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    fig.tight_layout()
    path = save_figure_atomic(fig, path, dpi=120)
    plt.close(fig)
    return path

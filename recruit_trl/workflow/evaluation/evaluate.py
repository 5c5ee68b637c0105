"""Evaluation harness: full episodes of any policy over a seed range and tasks.

Policies:
    * any policy the environment registers (``random``, ``heuristic``, ``expert``, ...), called as
      ``policy(obs, rng)``; a policy object with ``act(env, obs=obs, rng=rng)`` is handed the live environment
      instead (planners that look ahead from the current state);
    * ``model:PATH``: a causal LM folder or a LoRA adapter folder (its base model is read from the adapter
      config). Model policies run all episodes in lock-step with batched generation, through the same
      prompt rendering, action contract, strict parser and safe fallback as the RL rollouts.
    * ``planner:model:PATH``: the model proposes ``planner_candidates`` sampled actions at every decision and the
      one with the best continued grade is played (:mod:`recruit_trl.workflow.evaluation.planner`); its rows carry its
      cost per episode (``planner_cost``).

Each episode is recorded as an :class:`~recruit_trl.workflow.evaluation.metrics.EpisodeLog`, aggregated into one result
row per (policy, task) by :func:`recruit_trl.workflow.evaluation.metrics.aggregate` (the metrics are described there).
Episodes run in-process, or against an environment server (``env_url``) through the interface's ``remote_env``.

Per-decision trace (``recruit-trl eval --trace FILE``): one JSON line per decision with the policy, task, seed,
day, the action played and the teacher's action (both as the prompt describes them), whether they match, whether
the decision was valid (for a model's rejected answer also its ``text`` and the parser's ``error``), and its
outcome. Aggregates say *that* a model drifts; the trace shows where: e.g. a student that negotiates every day on
medium while the expert waits until the last scheduled dropout.

The result cache (:mod:`recruit_trl.workflow.evaluation.cache`), the metrics, the results table and plot
(:mod:`recruit_trl.workflow.evaluation.report`) and :func:`~recruit_trl.versions.versions` are importable from here
too.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from recruit_trl.contracts import (
    CONTRACTS,
    MAX_NEW_TOKENS,
    answer_texts,
    build_messages,
    digest,
    parse_action,
    parse_json_object,
)
from recruit_trl.files import write_text_atomic
from recruit_trl.models.loading import load_for_inference
from recruit_trl.protocol import EnvInterface, get_env_interface, policy_action
from recruit_trl.rollout.anchors import MODEL_PREFIX, Anchor, AnchorState
from recruit_trl.traces import match_candidate, same_action, trace_row
from recruit_trl.versions import versions
from recruit_trl.workflow.evaluation.metrics import (
    EpisodeLog,
    aggregate,
)
from recruit_trl.workflow.evaluation.planner import CandidateScorer, PlannerSettings, planned_model

BACKENDS = ("transformers", "vllm")


@dataclass
class EvalConfig:
    """What :func:`evaluate` runs: the environment (``env``, a name for ``get_env_interface``), its tasks (empty: the
    interface's ``tasks()``), reset seeds, the action contract and decoding of model policies, and more."""

    env: str = ""  # required: a name or "package.module:attribute"
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
    constrained: bool = False  # models answer only with a listed candidate (recruit_trl.models.generation, allowed=)
    # What model policies generate with: "transformers", or "vllm" (one engine per process,
    # recruit_trl.models.vllm_engine; needs workers = 1).
    backend: str = "transformers"
    # Processes that play the episodes, each every workers-th seed with one torch thread (1: this process). The
    # episodes are the same; a model's batches hold other episodes side by side.
    workers: int = 1
    # How models are loaded (recruit_trl.models.loading.loading_config: dtype, attention, 4-bit), as in training.
    model_loading: dict = field(default_factory=dict)
    # planner:model:PATH policies (recruit_trl.workflow.evaluation.planner.PlannerSettings): actions the model proposes
    # per decision, sampled at planner_temperature / planner_top_p; continuations scoring each distinct one; the policy
    # that plays them ("": the environment's RL continuation policy).
    planner_candidates: int = 8
    planner_continuations: int = 4
    planner_continuation: str = ""
    planner_temperature: float = 1.0
    planner_top_p: float = 1.0

    def planner_settings(self) -> PlannerSettings:
        return PlannerSettings(
            candidates=self.planner_candidates,
            continuations=self.planner_continuations,
            continuation_policy=self.planner_continuation,
            temperature=self.planner_temperature,
            top_p=self.planner_top_p,
        )


class Evaluator:
    """Runs policies over ``config.tasks`` x ``config.seeds`` and aggregates :class:`EpisodeLog` records."""

    def __init__(self, config: EvalConfig, interface: EnvInterface | None = None) -> None:
        if config.contract not in CONTRACTS:
            raise ValueError(f"contract must be one of {CONTRACTS}")
        if config.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {config.backend!r}")
        if config.backend == "vllm" and config.workers > 1:
            raise ValueError("the vllm backend runs one engine in one process: workers must be 1")
        if interface is None and not config.env:
            raise ValueError("EvalConfig.env: name the environment ('clinical', 'conquest' or 'package.module:attr')")
        config.planner_settings()  # refuses impossible planner settings before anything runs
        self.interface = interface or get_env_interface(config.env)
        self.config = with_tasks(config, self.interface)
        self.teacher = self.interface.get_policy(config.teacher) if config.teacher else None
        # When a list (and a teacher is set), model runs append one trace row per decision: the state the model
        # reached, labelled with the teacher's action (DAgger data; see recruit_trl.workflow.sft_data.dagger_rows).
        self.labelled_rows: list[dict[str, Any]] | None = None
        # When a list, every decision of every policy appends one trace record (see the module docstring).
        self.trace: list[dict[str, Any]] | None = None
        # Model runs keep the state of every episode on these days, with the actions that reached it
        # (recruit_trl.workflow.evaluation.evaluate.record_anchors): captured[(task, seed, day)] = AnchorState.
        self.capture_days: set[int] = set()
        self.captured: dict[tuple[str, int, int], AnchorState] = {}

    # ------------------------------------------------------------------ environments
    def make_env(self, task: str):
        if self.config.env_url:
            return self.interface.remote_env(self.config.env_url, task, self.config.transport)
        return self.interface.make_env(task)

    def _teacher_action(self, env, obs, rng: random.Random) -> dict | None:
        return None if self.teacher is None else policy_action(self.teacher, env, obs, rng)

    # ------------------------------------------------------------------ policies
    def run_policy(self, name: str, progress: Callable[[int], None] | None = None) -> list[EpisodeLog]:
        planned = planned_model(name)
        if planned is not None:
            if self.config.env_url:
                raise ValueError("the planner restores snapshots of the environment: evaluate it in-process, not "
                                 "against --env_url")  # fmt: skip
            return self.run_model(planned, progress, planner=self.config.planner_settings())
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

    def run_model(
        self, path: str, progress: Callable[[int], None] | None = None, planner: PlannerSettings | None = None
    ) -> list[EpisodeLog]:
        """``path``'s episodes, all in lock-step; with ``planner``, each decision is the best of the model's
        ``planner.candidates`` proposals (:class:`~recruit_trl.workflow.evaluation.planner.CandidateScorer`)."""
        if self.config.backend == "vllm":
            from recruit_trl.models.vllm_engine import policy_from_folder

            model, tokenizer = policy_from_folder(path, self.config.model_loading)
        else:
            model, tokenizer = load_for_inference(path, self.config.model_loading)
        from transformers import GenerationConfig

        from recruit_trl.models.generation import answer_token_ids, encode_prompt, sample

        cfg = self.config
        temperature, top_p = (planner.temperature, planner.top_p) if planner else (cfg.temperature, cfg.top_p)
        proposals = planner.candidates if planner else 1  # answers sampled per decision
        scorer = CandidateScorer(self.interface, planner, cfg.policy_seed) if planner and proposals > 1 else None
        do_sample = temperature > 0
        gen_config = GenerationConfig(
            do_sample=do_sample,
            temperature=temperature if do_sample else None,
            top_p=top_p if do_sample and top_p < 1.0 else None,
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
                prompts += [encode_prompt(tokenizer, messages, enable_thinking=False)] * proposals
            allowed = None
            if cfg.constrained:
                allowed = [
                    answer_token_ids(tokenizer, answer_texts(cfg.contract, candidates[i]))
                    for i in active
                    for _ in range(proposals)
                ]
            unchanged: list[bool | None] = []
            completions, _ = sample(
                model, tokenizer, prompts, gen_config, max_new, cfg.batch_size, allowed=allowed, unchanged=unchanged
            )
            all_texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
            still = []
            for j, i in enumerate(active):
                texts = all_texts[j * proposals : (j + 1) * proposals]
                proposed = [parse_action(text, cfg.contract, self.interface, obs[i], candidates[i]) for text in texts]
                chosen = 0
                if scorer is not None:
                    choice = scorer.choose(envs[i], [p.action for p in proposed], *episodes[i], logs[i].length)
                    chosen = choice.index
                    logs[i].planner_scored += choice.scored
                    logs[i].planner_env_steps += choice.env_steps
                    logs[i].planner_seconds += choice.seconds
                text, parsed, same = texts[chosen], proposed[chosen], unchanged[j * proposals + chosen]
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
        k = match_candidate(self.interface, taught, candidates)
        if k is None:
            return  # the teacher's action is not listed: nothing the model could answer
        task, seed = episode
        self.labelled_rows.append(
            trace_row(self.interface, messages, candidates, candidates[k], self.config.contract, task, seed, day)
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
        for name, value in self.interface.episode_metrics(obs, info).items():
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
        log.score_terms = self.interface.score_terms(env)


def run_in_workers(config: EvalConfig, name: str, progress: Callable[[int], None] | None = None) -> list[EpisodeLog]:
    """``name``'s episodes over ``config``'s tasks and seeds, played by ``config.workers`` spawned processes (one torch
    thread each, every workers-th seed), in task and seed order."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    seeds = list(config.seeds)
    shares = [tuple(seeds[i :: config.workers]) for i in range(min(config.workers, len(seeds)))]
    logs: list[EpisodeLog] = []
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(shares), mp_context=context) as pool:
        futures = [pool.submit(_play_share, replace(config, seeds=share, workers=1), name) for share in shares]
        for future in as_completed(futures):
            part = future.result()
            logs.extend(part)
            if progress:
                progress(len(part))
    order = {task: k for k, task in enumerate(config.tasks)}
    return sorted(logs, key=lambda log: (order[log.task], seeds.index(log.seed)))


def _play_share(config: EvalConfig, name: str) -> list[EpisodeLog]:
    """One worker's episodes (:func:`run_in_workers`)."""
    import torch

    torch.set_num_threads(1)
    return Evaluator(config).run_policy(name)


def planner_cost_of(logs: Sequence[EpisodeLog]) -> dict[str, float]:
    """A planner's scoring work per episode: distinct candidates scored, their environment steps and seconds."""
    n = max(1, len(logs))
    decisions = max(1, sum(log.decisions for log in logs))
    return {
        "candidates_scored_per_decision": round(sum(log.planner_scored for log in logs) / decisions, 3),
        "env_steps_per_episode": round(sum(log.planner_env_steps for log in logs) / n, 1),
        "scoring_seconds_per_episode": round(sum(log.planner_seconds for log in logs) / n, 3),
    }


def with_tasks(config: EvalConfig, interface: EnvInterface | None = None) -> EvalConfig:
    """``config`` with its tasks filled in: the interface's ``tasks()`` when it names none."""
    if config.tasks:
        return config
    return replace(config, tasks=tuple((interface or get_env_interface(config.env)).tasks()))


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
        "curve_metrics": interface.curve_metrics,
        "metric_days": interface.metric_days,
        "rate_metrics": interface.rate_metrics,
    }
    trace: list[dict[str, Any]] = []
    results = []
    total = len(policies) * len(config.tasks) * len(config.seeds)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=total, desc="evaluating", unit="episode", dynamic_ncols=True)
    timings, planner_cost = {}, {}
    for k, name in enumerate(policies):
        label = labels[k] if labels else name
        start = time.perf_counter()
        evaluator.trace = [] if trace_path is not None else None
        if config.workers > 1 and trace_path is None:
            logs = run_in_workers(config, name, progress=bar.update if bar else None)
        else:
            logs = evaluator.run_policy(name, progress=bar.update if bar else None)
        timings[label] = round((time.perf_counter() - start) / max(1, len(logs)), 3)
        planner = planned_model(name) is not None
        results.extend(aggregate(label, logs, planner or name.startswith("model:"), **curves))
        if planner:
            planner_cost[label] = {"seconds_per_episode": timings[label], **planner_cost_of(logs)}
        trace += [{"policy": label, **record} for record in evaluator.trace or ()]
    if bar:
        bar.close()
    if trace_path is not None:
        write_text_atomic(trace_path, "".join(json.dumps(record) + "\n" for record in trace))
    cfg = {k: (list(v) if isinstance(v, tuple | range) else v) for k, v in config.__dict__.items()}
    cfg["policies"] = list(policies)
    cfg["seconds_per_episode"] = timings
    if planner_cost:
        cfg["planner_cost"] = planner_cost
    return {"results": results, "config": cfg, "versions": versions()}


def record_anchors(
    interface: EnvInterface,
    model_path: str,
    tasks: Sequence[str],
    seeds: Iterable[int],
    days: Iterable[int],
    *,
    label: str = "model:student",
    contract: str = "index",
    recent_k: int = 2,
    temperature: float = 1.0,
    top_p: float = 1.0,
    policy_seed: int = 0,
    model_loading: dict | None = None,
    progress: bool = True,
) -> dict[Anchor, AnchorState]:
    """Play ``model_path`` (sampled at ``temperature`` / ``top_p``, seeded by ``policy_seed``) on every task x seed
    and keep the states on ``days`` (those the episode reaches), keyed by anchors whose policy is ``label``.

    Deterministic for the same arguments on the same machine (the evaluator's seeded lock-step sampling).
    """
    if not label.startswith(MODEL_PREFIX):
        raise ValueError(f"a recorded anchor's label starts with {MODEL_PREFIX!r} (got {label!r})")
    config = EvalConfig(
        env=interface.name,
        tasks=tuple(tasks),
        seeds=tuple(seeds),
        contract=contract,
        recent_k=recent_k,
        temperature=temperature,
        top_p=top_p,
        policy_seed=policy_seed,
        model_loading=dict(model_loading or {}),  # loaded as trained (recruit_trl.models.loading.loading_config)
    )
    evaluator = Evaluator(config, interface)
    evaluator.capture_days = set(days)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(config.tasks) * len(config.seeds), desc="recording anchors", unit="episode")
    evaluator.run_model(model_path, progress=bar.update if bar else None)
    if bar:
        bar.close()
    return {
        Anchor(task, seed, day, label, policy_seed): state
        for (task, seed, day), state in sorted(evaluator.captured.items())
    }

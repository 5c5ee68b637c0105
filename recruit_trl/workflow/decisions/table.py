"""The benchmark table of the decision-level report: one policy's answers to a decision set, scored and counted.

:func:`benchmark_table` scores the answers (one per decision) as strict JSON, valid under the action contract, equal to
the teacher's action, and counts the invalid ones and the parser's reasons, next to the majority baseline (what always
giving the teacher's most common answer would score); :func:`format_benchmark` prints several policies' tables as one
aligned text table. Neither needs a model or a rollout: only the decisions, the answers and the interface.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recruit_trl.contracts import parse_action, parse_json_object
from recruit_trl.protocol import EnvInterface
from recruit_trl.rollout.anchors import MODEL_PREFIX
from recruit_trl.traces import same_action
from recruit_trl.workflow.decisions.decision_set import Decision


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
        the contract (a listed index); ``teacher_match``: share that are valid and do what the teacher does
        (:func:`recruit_trl.traces.same_action`); ``invalid``: count of rows not valid; ``errors``: the parser's
        reasons, counted; ``majority_baseline``: share of the teacher's most
        common answer (``majority_answer``), i.e. the teacher match of always giving it; with
        ``constrained_answers``, ``teacher_match_constrained``; ``teacher_match_by_type``: ``[teacher match,
        rows]`` per teacher's action type; ``predicted_types``: the valid answers' action types, counted; with
        ``by_task``, the same per task (``by_task``).
    """
    n = len(decisions)
    strict = valid = match = 0
    hits: list[int] = []
    errors: Counter = Counter()
    predicted: Counter = Counter()  # the valid answers' action types: a collapse onto one shows here
    for d, text in zip(decisions, answers, strict=True):
        strict += int(parse_json_object(text)[0] is not None)
        parsed = parse_action(text, d.contract, interface, d.state.obs, d.candidates)
        valid += int(parsed.valid)
        if parsed.valid:
            predicted[interface.action_type(parsed.action)] += 1
        hits.append(int(parsed.valid and same_action(interface, parsed.action, d.teacher_action)))
        match += hits[-1]
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
    by_type: dict[str, list[int]] = {}  # the teacher's action type -> [matches, rows]
    for d, hit in zip(decisions, hits, strict=True):
        cell = by_type.setdefault(interface.action_type(d.teacher_action), [0, 0])
        cell[0] += hit
        cell[1] += 1
    table["teacher_match_by_type"] = {t: [_share(m, r), r] for t, (m, r) in sorted(by_type.items())}
    table["predicted_types"] = dict(sorted(predicted.items()))
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


def policy_label(policy: str, width: int = 27) -> str:
    """A policy's name for a table column: a model by its folder's name (the whole path is in the JSON)."""
    if policy.startswith(MODEL_PREFIX):
        policy = MODEL_PREFIX + Path(policy[len(MODEL_PREFIX) :]).name
    return policy if len(policy) <= width else policy[: width - 1] + "~"


def format_number(x: float | None, spec: str = ".3f") -> str:
    """A table cell: ``x`` formatted by ``spec``, ``-`` for a missing value."""
    return "-" if x is None else format(x, spec)


def format_benchmark(benchmark: Mapping[str, dict[str, Any]]) -> str:
    """Benchmark tables (:func:`benchmark_table`, keyed by policy) as aligned text, a row per policy: rows, strict
    JSON, valid, teacher match, invalid count, constrained teacher match, majority baseline."""
    header = (
        f"{'policy':<28}{'rows':>6}{'json':>8}{'valid':>8}{'teacher':>9}{'invalid':>9}{'constr.':>9}{'majority':>10}"
    )
    lines = [header, "-" * len(header)]
    for policy, t in benchmark.items():
        lines.append(
            f"{policy_label(policy):<28}{t['rows']:>6}{format_number(t['strict_json']):>8}"
            f"{format_number(t['valid']):>8}{format_number(t['teacher_match']):>9}{t['invalid']:>9}"
            f"{format_number(t.get('teacher_match_constrained')):>9}{format_number(t['majority_baseline']):>10}"
        )
    return "\n".join(lines)

"""SFT warm start: its settings, its data (teacher traces as a chat dataset, balanced by action type, with a
held-out split), the DAgger rows, the choice of round and the held-out report.

The rows are TRL conversational prompt/completion rows rendered exactly like the RL rollouts (same system
prompt, state rendering, candidate list and action contract), so the adapter trained here is the starting
policy of the GRPO and REINFORCE recipes. The split is by reset seed (no episode is in both parts).

Action-type balancing caps every action type at ``max_type_fraction`` of the training rows by subsampling the
over-represented types: the reference's own SFT collapsed to 100% ``adjust_strategy``; a model trained on
balanced data cannot win by always predicting the majority action. There is no cap unless one is asked for
(``sft_max_type_fraction``; the configs in ``recipes/configs``: clinical 0.35, conquest 0.25): a cap chosen for
one environment's action types can discard most rows of another, whose teacher plays one or two types most of the
time.

The training loop itself (``SFTTrainer``, DAgger rounds, caching) is :mod:`recruit_trl.workflow.warm_start`.
"""

from __future__ import annotations

import random
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recruit_trl.contracts import MAX_NEW_TOKENS, parse_index, parse_json_object
from recruit_trl.protocol import EnvInterface
from recruit_trl.traces import TraceStats, collect_traces
from recruit_trl.workflow.evaluation.evaluate import EvalConfig, Evaluator
from recruit_trl.workflow.evaluation.metrics import aggregate


def balance_action_types(
    rows: list[dict[str, Any]], max_type_fraction: float, seed: int = 0, group_by: str | None = None
) -> list[dict[str, Any]]:
    """Subsample over-represented action types so none exceeds ``max_type_fraction`` of the result.

    Rows of each type are kept in their original order (a random subset of the capped types). With ``group_by``
    (e.g. ``"task"``) the cap holds within every group of rows sharing that field. A cap below an equal share (fewer
    types than ``1 / max_type_fraction``, e.g. a teacher that plays one or two types) cannot be met and is raised to
    the equal share. When the result keeps less than half of the rows, a warning says so, with the counts.
    """
    if not 0 < max_type_fraction <= 1:
        raise ValueError("max_type_fraction must be in (0, 1]")
    if group_by is not None:
        groups: dict[Any, list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault(r[group_by], []).append(r)
        kept_ids = {id(r) for g in groups.values() for r in _balanced(g, max_type_fraction, seed)}
        out = [r for r in rows if id(r) in kept_ids]
    else:
        out = _balanced(rows, max_type_fraction, seed)
    if len(out) < len(rows) / 2:
        counts = dict(Counter(r["action_type"] for r in rows))
        warnings.warn(
            f"SFT balancing by action type kept {len(out)} of {len(rows)} rows (max_type_fraction "
            f"{max_type_fraction}; the teacher's action types: {counts}); raise --sft_max_type_fraction (1: no cap) "
            "to keep more",
            stacklevel=2,
        )
    return out


def kept_rows_warning(kept: int, raw: int, max_type_fraction: float | None = None) -> str | None:
    """The warning a summary line carries when balancing by action type kept less than half of the ``raw`` teacher
    rows (``None`` otherwise): the counts, the cap (when known) and the flag that sets it."""
    if kept >= raw / 2:
        return None
    cap = "" if max_type_fraction is None else f" {max_type_fraction}"
    return (
        f"WARNING: the cap on any action type's share of the rows (--sft_max_type_fraction{cap}) kept only {kept} of "
        f"{raw} teacher rows; raise it (1: no cap) to keep more"
    )


def _balanced(rows: list[dict[str, Any]], max_type_fraction: float, seed: int) -> list[dict[str, Any]]:
    counts = Counter(r["action_type"] for r in rows)
    if counts:
        max_type_fraction = max(max_type_fraction, 1 / len(counts))
    kept = dict(counts)
    # Lower the largest types until each is within the cap of the (shrinking) total.
    for _ in range(len(kept) * 4):
        total = sum(kept.values())
        cap = int(max_type_fraction * total)
        over = {t: n for t, n in kept.items() if n > max(cap, 1)}
        if not over:
            break
        for t in over:
            others = total - kept[t]
            # n <= f * (others + n)  <=>  n <= f * others / (1 - f)
            kept[t] = (
                max(1, int(max_type_fraction * others / (1 - max_type_fraction))) if max_type_fraction < 1 else kept[t]
            )
    rng = random.Random(seed)
    chosen: set[int] = set()
    by_type: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_type.setdefault(r["action_type"], []).append(i)
    for t, idx in by_type.items():
        chosen.update(idx if kept[t] >= len(idx) else rng.sample(idx, kept[t]))
    return [rows[i] for i in sorted(chosen)]


def to_conversational(rows: Sequence[dict[str, Any]]):
    """Trace rows -> a ``datasets.Dataset`` with ``prompt``/``completion`` message lists plus metadata columns."""
    from datasets import Dataset

    return Dataset.from_list(
        [
            {
                "prompt": r["messages"],
                "completion": [{"role": "assistant", "content": r["completion"]}],
                "task": r["task"],
                "seed": r["seed"],
                "day": r["day"],
                "action_type": r["action_type"],
                "candidate_types": r["candidate_types"],
            }
            for r in rows
        ]
    )


def build_sft_datasets(
    interface: EnvInterface,
    tasks: Sequence[str],
    train_seeds: Sequence[int],
    heldout_seeds: Sequence[int],
    *,
    teacher: str,
    contract: str = "index",
    recent_k: int = 2,
    epsilon: float = 0.0,
    max_type_fraction: float = 1.0,
    balance_by: str | None = None,
    seed: int = 0,
) -> tuple[Any, Any, dict[str, Any]]:
    """Teacher traces -> (train Dataset, held-out Dataset, stats); the training part is balanced by action type
    (:func:`balance_action_types`: ``max_type_fraction`` 1, the default, keeps every row), the held-out part kept
    whole. The stats hold the row counts before and after balancing and the cap applied."""
    if set(train_seeds) & set(heldout_seeds):
        raise ValueError("train and held-out seeds overlap")
    train_stats, heldout_stats = TraceStats(), TraceStats()
    common = {"teacher": teacher, "contract": contract, "recent_k": recent_k}
    train_rows = collect_traces(
        interface, tasks, train_seeds, epsilon=epsilon, stats=train_stats, rng_seed=seed, **common
    )
    heldout_rows = collect_traces(interface, tasks, heldout_seeds, stats=heldout_stats, rng_seed=seed + 1, **common)
    balanced = balance_action_types(train_rows, max_type_fraction, seed, group_by=balance_by)
    stats = {
        "teacher": teacher,
        "train_rows_raw": len(train_rows),
        "train_rows": len(balanced),
        "max_type_fraction": max_type_fraction,
        "heldout_rows": len(heldout_rows),
        "skipped_unlisted_teacher_actions": train_stats.skipped + heldout_stats.skipped,
        "train_action_types_raw": dict(Counter(r["action_type"] for r in train_rows)),
        "train_action_types": dict(Counter(r["action_type"] for r in balanced)),
        "heldout_action_types": dict(Counter(r["action_type"] for r in heldout_rows)),
    }
    return to_conversational(balanced), to_conversational(heldout_rows), stats


def teacher_set_datasets(
    interface: EnvInterface, config: Any, root: str | Path, progress: bool = True
) -> tuple[Any, Any, dict[str, Any]]:
    """The teacher decision sets of ``config`` (a :class:`recruit_trl.workflow.decisions.teacher_sets.SetConfig`, built
    under ``root`` or reused) as SFT data: (train Dataset, held-out Dataset, stats), the ``train`` and ``heldout``
    splits as conversational rows with the trace rows' columns (a row's ``day`` is its decision number)."""
    from recruit_trl.workflow.decisions.teacher_sets import teacher_sets

    sets, metadata = teacher_sets(interface, config, root, progress=progress)

    def rows(split: str) -> list[dict[str, Any]]:
        return [{**row, "day": row["decision"]} for row in sets[split]]

    train, heldout = rows("train"), rows("heldout")
    stats = {
        "data": "teacher_sets",
        "teacher": config.teacher,
        "train_rows_raw": len(train),
        "train_rows": len(train),
        "heldout_rows": len(heldout),
        "train_action_types": dict(Counter(r["action_type"] for r in train)),
        "heldout_action_types": dict(Counter(r["action_type"] for r in heldout)),
        "sets": {"path": str(Path(root) / config.key()), **metadata},
    }
    return to_conversational(train), to_conversational(heldout), stats


def dagger_rows(
    policy_path: str,
    interface: EnvInterface,
    tasks: Sequence[str],
    seeds: Sequence[int],
    *,
    teacher: str | None,
    contract: str = "index",
    recent_k: int = 2,
    env: str | None = None,
    model_loading: dict | None = None,
    progress: bool = True,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """DAgger data: the model at ``policy_path`` plays full episodes (greedy, lock-step batched, as in evaluation)
    and every state it reaches is labelled with ``teacher``'s action there (``None``: no labels, only the scores).

    Behaviour cloning sees only the teacher's own states; once the student errs it reaches states the teacher
    never showed it and drifts further (compounding errors). These rows teach it how to recover from its own
    mistakes. ``model_loading`` loads the student as it was trained
    (:func:`recruit_trl.models.loading.loading_config`).

    Returns:
        ``(rows, results)``: trace rows (as :func:`recruit_trl.traces.collect_traces` makes them) and the
        evaluation rows of the student's episodes (final scores, teacher match, action types).
    """
    config = EvalConfig(
        env=env or interface.name, tasks=tuple(tasks), seeds=tuple(seeds), contract=contract, recent_k=recent_k,
        teacher=teacher, model_loading=dict(model_loading or {}),
    )  # fmt: skip
    evaluator = Evaluator(config, interface)
    evaluator.labelled_rows = [] if teacher is not None else None
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(tasks) * len(seeds), desc="DAgger: student episodes", unit="episode")
    logs = evaluator.run_model(policy_path, progress=bar.update if bar else None)
    if bar:
        bar.close()
    return evaluator.labelled_rows or [], aggregate("student", logs, is_model=True)


def best_round(scores: Sequence[dict[str, float]]) -> int:
    """The DAgger round to keep: the one whose student scored the highest final score averaged over the tasks,
    the latest on ties.

    ``scores[r]`` maps each task to the mean final score of round ``r``'s student playing its own episodes. A
    round's extra data can make the student worse: on the main job's medium task the student sometimes settles
    on paying for strategy changes every day and enrols nobody (a drop of 0.2-0.3 on that task), depending on
    little more than the order of the batches.
    """
    if not scores:
        raise ValueError("best_round needs the scores of at least one round")
    return max(range(len(scores)), key=lambda r: (mean_over_tasks(scores[r]), r))


def mean_over_tasks(scores: dict[str, float]) -> float:
    """The mean of one round's per-task scores (0 for none): what :func:`best_round` ranks rounds by."""
    return sum(scores.values()) / max(1, len(scores))


def heldout_report(model, tokenizer, dataset, contract: str = "index", batch_size: int = 64) -> dict[str, Any]:
    """Greedy predictions on held-out rows: teacher match, strict JSON, valid action, action-type distributions.

    A prediction is valid when it parses under the contract (an index in range). ``teacher_match_by_type`` breaks the
    teacher match down by task and the teacher's action type (``[rate, rows]``): an overall match can hide a task or
    an action type the warm start misses.
    """
    from transformers import GenerationConfig

    from recruit_trl.models.generation import encode_prompt, sample

    prompts = [encode_prompt(tokenizer, row["prompt"]) for row in dataset]
    config = GenerationConfig(do_sample=False)
    completions, _ = sample(model, tokenizer, prompts, config, MAX_NEW_TOKENS[contract], batch_size)
    texts = tokenizer.batch_decode(completions, skip_special_tokens=True)
    match = strict = valid = 0
    by_type: dict[str, dict[str, list[int]]] = {}  # task -> teacher's action type -> [matches, rows]
    predicted_types: Counter = Counter()
    for row, text in zip(dataset, texts, strict=True):
        target = row["completion"][0]["content"]
        hit = int(text.strip() == target.strip())
        match += hit
        cell = by_type.setdefault(row.get("task", "all"), {}).setdefault(row["action_type"], [0, 0])
        cell[0] += hit
        cell[1] += 1
        strict += int(parse_json_object(text)[0] is not None)
        k, _ = parse_index(text, len(row["candidate_types"]))
        predicted = row["candidate_types"][k] if k is not None else None
        valid += int(predicted is not None)
        if predicted is not None:
            predicted_types[predicted] += 1
    teacher_types: Counter = Counter()
    for cells in by_type.values():
        teacher_types.update({kind: rows for kind, (_, rows) in cells.items()})
    n = max(1, len(texts))
    total_pred = max(1, sum(predicted_types.values()))
    return {
        "rows": len(texts),
        "teacher_match": round(match / n, 4),
        "strict_json_rate": round(strict / n, 4),
        "valid_action_rate": round(valid / n, 4),
        "predicted_action_types": {k: round(v / total_pred, 4) for k, v in sorted(predicted_types.items())},
        "teacher_action_types": {k: round(v / n, 4) for k, v in sorted(teacher_types.items())},
        "teacher_match_by_type": {
            task: {kind: [round(hits / rows, 4), rows] for kind, (hits, rows) in sorted(cells.items())}
            for task, cells in sorted(by_type.items())
        },
    }

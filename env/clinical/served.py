"""The clinical environment as the server serves it and a client reads it (:data:`CLINICAL`, ``--env clinical``).

Everything here follows the public reference (spec sections 5, 8, 10.5 and 13): its app name, its tasks document,
the JSON schemas of the action, the observation and the state, 422 details in FastAPI's shape for schema
violations, and ``reward_breakdown`` repeated at the top of a step's ``metadata``. The reference's step reply
carries only ``done``, so clients derive ``terminated`` / ``truncated`` with :func:`split_done`, as the local env
decides them; that also works against the reference's own server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from env.clinical.core import ClinicalRecruitmentEnv
from env.clinical.models import Action, validate_action
from env.clinical.observation import OBSERVATION_FIELDS
from env.clinical.tasks import TASKS, get_task
from env.server.served import ActionError, ServedEnv, pydantic_errors

__all__ = ["APP_NAME", "CLINICAL", "OBSERVATION_FIELDS", "observation_schema", "split_done", "state_schema"]

APP_NAME = "adaptive-clinical-recruitment"
README = Path(__file__).resolve().parents[2] / "README.md"
STOP_ACTION = "stop_recruitment"


def parse_action(payload: Any) -> dict[str, Any]:
    """A step payload as a complete action dict (:func:`env.clinical.models.validate_action`'s fast path for plain
    dicts); anything else is validated by :class:`Action` (attributes included, as FastAPI does for a body that is
    not JSON), whose errors become :class:`ActionError`."""
    if isinstance(payload, dict):
        try:
            return validate_action(payload)
        except (ValueError, OverflowError):  # OverflowError: an integer confidence too large for a float
            pass
    try:
        return Action.model_validate(payload, from_attributes=True).model_dump()
    except ValidationError as exc:
        raise ActionError(pydantic_errors(exc)) from None


def split_done(obs: dict[str, Any], done: bool, action_type: str | None) -> tuple[bool, bool]:
    """``(terminated, truncated)`` from a reply's ``done`` the way the local env decides them: truncated when the
    last day ended the episode, the action was not a stop, budget is left and the target is not reached."""
    if not done:
        return False, False
    truncated = (
        action_type != STOP_ACTION
        and obs["timestamp"] >= obs["max_steps"]
        and obs["budget_remaining"] > 0
        and obs["enrolled_so_far"] < obs["target_enrollment"]
    )
    return not truncated, truncated


def _split_done(obs: dict[str, Any], done: bool, action: dict[str, Any]) -> tuple[bool, bool]:
    return split_done(obs, done, action.get("action_type"))


def _reset_info(obs: dict[str, Any]) -> dict[str, Any]:
    return {"task": obs["task_id"], "difficulty": obs["difficulty"]}


def _resolve_task(task_id: str) -> str:
    return get_task(task_id).task_id


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
    """JSON schema of ``GET /state`` (spec section 10.5 + the server's ``episode_id`` and ``step_count``)."""
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


def tasks_document() -> dict[str, Any]:
    """``GET /tasks``: every public task by id, with its name, description, difficulty, length, budget and target."""
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


CLINICAL = ServedEnv(
    name="clinical",
    app_name=APP_NAME,
    title="Adaptive Clinical Trial Recruitment",
    description="Adaptive clinical trial recruitment: screen, recontact and allocate patients over 180 simulated days "
    "under budget, site capacity, dropout and regulatory pressure.",
    make_env=ClinicalRecruitmentEnv,
    tasks=tasks_document(),
    default_task="easy_bench",
    parse_action=parse_action,
    action_schema=Action.model_json_schema(),
    observation_schema=observation_schema(),
    state_schema=state_schema(),
    resolve_task=_resolve_task,
    metadata_keys=("reward_breakdown",),
    split_done=_split_done,
    observation_fields=OBSERVATION_FIELDS,
    reset_info=_reset_info,
    readme=README,
    api_description="Reference-compatible HTTP API and OpenEnv WebSocket protocol for the clinical recruitment env.",
)

"""The action contract: the typed :class:`Action` model and a fast validator for the step hot path.

An action is a dict (or :class:`Action`) with the reference's fields. ``action_type`` is required and must
be one of :data:`ACTION_TYPES`; the string fields are optional; ``confidence`` is a float in [0, 1]
(default 0.5); ``token_cost`` an optional int >= 0. Extra fields are ignored, and ``hypothesis`` accepts any
string. A schema violation raises ``ValueError`` naming the field; semantic failures (unknown patient, no
budget, ...) are not errors here: the environment reports them in ``info["last_action_error"]``.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

ActionType = Literal[
    "screen_patient",
    "recontact",
    "allocate_to_site",
    "adjust_strategy",
    "plan_next_phase",
    "summarize_and_index",
    "retrieve_relevant_history",
    "stop_recruitment",
]
ACTION_TYPES: tuple[str, ...] = get_args(ActionType)
HYPOTHESES = ("noise_dominant", "dropout_dominant", "site_bias", "confounding", "unknown")
PLAN_PHASES = ("screening", "conversion", "allocation", "retention", "recovery")
STRING_FIELDS = (
    "patient_id",
    "site_id",
    "strategy_change",
    "hypothesis",
    "plan_id",
    "plan_summary",
    "target_phase",
    "memory_key",
    "memory_query",
    "memory_payload",
)
# An Action as the simulator sees it: a plain dict with every field present (validated).
ActionDict = dict[str, Any]


class Action(BaseModel):
    """One day's decision. Field names and constraints are the reference's (spec section 5)."""

    model_config = ConfigDict(extra="ignore")

    action_type: ActionType
    patient_id: str | None = None
    site_id: str | None = None
    strategy_change: str | None = None
    hypothesis: str | None = None
    plan_id: str | None = None
    plan_summary: str | None = None
    target_phase: str | None = None
    memory_key: str | None = None
    memory_query: str | None = None
    memory_payload: str | None = None
    confidence: float = Field(default=0.5, ge=0.0, le=1.0)
    # Below 2**63: the env sums token costs and turns the total into a float, which overflows for huge integers.
    token_cost: int | None = Field(default=None, ge=0, lt=2**63)


_ACTION_TYPE_SET = frozenset(ACTION_TYPES)


def validate_action(action: Any) -> ActionDict:
    """Return a complete, validated action dict.

    Plain dicts with exact types take a fast path; anything else goes through :class:`Action`, so
    coercions (e.g. ``"0.7"`` for confidence) follow pydantic's rules exactly.

    Raises:
        ValueError: naming the offending field when the action violates the schema.
    """
    # The dict test comes first: it is the common case, and isinstance() against a pydantic model is slow.
    if isinstance(action, dict):
        out = _fast_validate(action)
        if out is not None:
            return out
    elif isinstance(action, Action):
        return action.model_dump()
    else:
        raise ValueError(f"action must be a dict or Action, got {type(action).__name__}")
    try:
        return Action.model_validate(action).model_dump()
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "action"
        raise ValueError(f"invalid action field '{field}': {err['msg']} (got {err.get('input')!r})") from None


# The complete action with every optional field at its default (the fast path's starting point).
_DEFAULT_ACTION: ActionDict = {
    "action_type": None,
    **dict.fromkeys(STRING_FIELDS),
    "confidence": 0.5,
    "token_cost": None,
}
_STRING_OR_NONE = frozenset({str, type(None)})


def _fast_validate(action: dict) -> ActionDict | None:
    """Validate the common case without pydantic; ``None`` means "let pydantic decide"."""
    out = {**_DEFAULT_ACTION, **action}
    if len(out) != len(_DEFAULT_ACTION):  # extra fields, which are ignored
        out = {name: action.get(name, default) for name, default in _DEFAULT_ACTION.items()}
    action_type = out["action_type"]
    if type(action_type) is not str or action_type not in _ACTION_TYPE_SET:
        return None
    if not _STRING_OR_NONE.issuperset(map(type, map(out.__getitem__, STRING_FIELDS))):
        return None
    confidence = out["confidence"]
    if type(confidence) is int:
        if not 0 <= confidence <= 1:  # float() of a huge integer overflows: let pydantic report it
            return None
        confidence = out["confidence"] = float(confidence)
    if type(confidence) is not float or not 0.0 <= confidence <= 1.0:
        return None
    token_cost = out["token_cost"]
    if token_cost is not None and (type(token_cost) is not int or not 0 <= token_cost < 2**63):
        return None
    return out

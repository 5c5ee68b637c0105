"""The reference's 37-feature numeric observation vector (spec section 12), for non-LLM baselines and analysis.

Same order, divisors and missing-key defaults as the reference's training-side extractor: divisors are fixed
across tasks, so values are not guaranteed to lie in [0, 1].
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

FEATURE_NAMES: tuple[str, ...] = (
    "time_fraction",
    "budget_fraction",
    "deadline_fraction",
    "enrolled_over_150",
    "target_over_150",
    "uncertainty_level",
    "dropout_rate_7d",
    "screening_backlog_over_10",
    "milestone_potential",
    "token_efficiency_score",
    "hypothesis_accuracy",
    "available_patients_over_5",
    "funnel_screened_over_200",
    "funnel_eligible_over_150",
    "funnel_consented_over_100",
    "funnel_enrolled_over_100",
    "funnel_dropped_over_50",
    "milestone_25pct",
    "milestone_50pct",
    "milestone_75pct",
    "milestone_100pct",
    "regulatory_hold_days_over_10",
    "competitor_pressure",
    "sentiment_pressure",
    "sponsor_pressure",
    "backlog_pressure",
    "site_bottleneck",
    "uncertainty_patient_pool",
    "uncertainty_site_operations",
    "uncertainty_policy",
    "high_priority_candidates_over_20",
    "eligible_pending_consent_over_20",
    "consented_pending_allocation_over_20",
    "at_risk_enrolled_over_20",
    "followup_due_over_10",
    "allocate_gain_estimate",
    "recontact_gain_estimate",
)
STATE_DIM = len(FEATURE_NAMES)


def features(obs: Mapping[str, Any]) -> np.ndarray:
    """Map an observation dict to the 37-dim float32 vector of the reference's extractor."""
    get = obs.get
    timestamp = get("timestamp", 0)
    time_left = get("time_to_deadline_days", 180)
    max_steps = max(1, get("max_steps") or timestamp + time_left)
    initial_budget = get("initial_budget") or 150_000.0
    target = get("target_enrollment") or 100
    funnel = get("current_funnel") or {}
    milestones = get("milestones") or {}
    constraints = get("active_constraints") or {}
    components = get("uncertainty_components") or {}
    memory = get("patient_memory_summary") or {}
    rollout = get("counterfactual_rollout") or {}
    values = (
        timestamp / max_steps,
        get("budget_remaining", 0.0) / initial_budget,
        time_left / max_steps,
        get("enrolled_so_far", 0) / 150,
        target / 150,
        get("uncertainty_level", 0.0),
        get("dropout_rate_7d", 0.0),
        get("screening_backlog", 0) / 10,
        get("milestone_potential", 0.0),
        get("token_efficiency_score", 1.0),
        get("hypothesis_accuracy", 0.0),
        len(get("available_patients") or ()) / 5,
        funnel.get("screened", 0) / 200,
        funnel.get("eligible", 0) / 150,
        funnel.get("consented", 0) / 100,
        funnel.get("enrolled", 0) / 100,
        funnel.get("dropped", 0) / 50,
        float(bool(milestones.get("25pct", False))),
        float(bool(milestones.get("50pct", False))),
        float(bool(milestones.get("75pct", False))),
        float(bool(milestones.get("100pct", False))),
        constraints.get("regulatory_hold_days", 0) / 10,
        constraints.get("competitor_pressure", 0.0),
        constraints.get("sentiment_pressure", 0.0),
        float(bool(constraints.get("sponsor_pressure", False))),
        float(bool(constraints.get("backlog_pressure", False))),
        float(bool(constraints.get("site_bottleneck", False))),
        components.get("patient_pool", 0.0),
        components.get("site_operations", 0.0),
        components.get("policy", 0.0),
        memory.get("high_priority_candidates", 0) / 20,
        memory.get("eligible_pending_consent", 0) / 20,
        memory.get("consented_pending_allocation", 0) / 20,
        memory.get("at_risk_enrolled", 0) / 20,
        memory.get("followup_due", 0) / 10,
        rollout.get("allocate_gain_estimate", 0.0),
        rollout.get("recontact_gain_estimate", 0.0),
    )
    return np.asarray(values, dtype=np.float32)

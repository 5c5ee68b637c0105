"""The observation the agent sees after each step, and the texts and summaries built from the state for it."""

from __future__ import annotations

import functools
from bisect import bisect_left
from itertools import chain
from typing import Any

from env.clinical.reward import HYPOTHESIS_WORLD
from env.clinical.rounding import R2, R3
from env.clinical.tasks import TaskSpec
from env.clinical.world import get_world

Observation = dict[str, Any]


def hypothesis_accuracy(hypothesis: str, world_type: str) -> float:
    """The observation's ``hypothesis_accuracy`` of ``hypothesis`` in a world of ``world_type``."""
    if HYPOTHESIS_WORLD.get(hypothesis) == world_type:
        return 1.0
    if hypothesis == "unknown":
        return 0.0
    if hypothesis == "confounding" and world_type in ("noise", "dropout"):
        return 0.3
    return 0.1


@functools.cache
def patient_cards(task_id: str) -> tuple[dict[str, Any], ...]:
    """Every patient's ``available_patients`` entry (static; observations get copies)."""
    world = get_world(task_id)
    return tuple(
        {"id": pid, "age": age, "eligibility_score": elig, "dropout_risk": drisk}
        for pid, age, elig, drisk in zip(
            world.patient_ids, world.ages, world.eligibility, world.dropout_risk, strict=True
        )
    )


@functools.lru_cache(maxsize=1 << 14)
def _causal_insight(driver: str, dropout_7d: float, uncertainty: float) -> str:
    """The observation's ``causal_insight`` (memoised: the float formatting costs more than the lookup, and the
    same values come back across steps and episodes; the arguments are never ``-0.0``)."""
    return f"Dominant driver looks like {driver}; 7-day dropout rate {dropout_7d:.2f}, uncertainty {uncertainty:.2f}."


OBSERVATION_FIELDS = (
    "timestamp", "budget_remaining", "time_to_deadline_days", "enrolled_so_far", "target_enrollment", "task_id",
    "max_steps", "initial_budget", "current_funnel", "available_patients", "recontact_candidates",
    "allocation_candidates", "site_performance", "recent_events", "uncertainty_level", "difficulty",
    "dropout_rate_7d", "screening_backlog", "causal_insight", "hypothesis_accuracy", "world_type", "milestones",
    "active_constraints", "delayed_effects_pending", "uncertainty_components", "patient_memory_summary",
    "counterfactual_hint", "current_plan", "indexed_memory_summary", "retrieved_memory_context",
    "milestone_potential", "active_milestone", "hindsight_available", "token_budget_remaining",
    "token_usage_so_far", "token_efficiency_score", "counterfactual_rollout",
)  # fmt: skip


def observation_template(task: TaskSpec, hide_world_type: bool) -> Observation:
    """Every observation field in order, with the values fixed for the task (the others are ``None``)."""
    template = dict.fromkeys(OBSERVATION_FIELDS)
    template["target_enrollment"] = task.target
    template["task_id"] = task.task_id
    template["max_steps"] = task.max_steps
    template["initial_budget"] = round(task.budget, 2)
    template["difficulty"] = task.difficulty
    template["world_type"] = "hidden" if hide_world_type else task.world_type
    return template


class ObservationBuilder:
    """The observation of :class:`env.clinical.core.ClinicalRecruitmentEnv` (a mixin).

    Reads ``self.s``, ``self.task``, ``self.world``, ``self.patient_cards``, ``self.site_ids``,
    ``self.hide_world_type``, ``self.accuracy`` and ``self.observation_template`` (:func:`observation_template`);
    changes nothing but the cached ``top_cards`` and ``best_site``. Every observation is made of new containers,
    so a caller may change it freely.
    """

    def _candidate_cards(self, i: int) -> tuple[dict[str, Any], dict[str, Any]]:
        """Active patient ``i``'s ``recontact_candidates`` and ``allocation_candidates`` entries, remembered in
        ``candidate_cards`` until the patient leaves the indexes (observations get copies)."""
        s, world = self.s, self.world
        pid, age, drisk, followup = world.patient_ids[i], world.ages[i], world.dropout_risk[i], s.followup[i]
        recontact = {
            "id": pid,
            "age": age,
            "eligible": s.eligible[i],
            "consented": s.consented[i],
            "dropout_risk": drisk,
            "followup_due_day": followup,
        }
        allocation = {"id": pid, "age": age, "dropout_risk": drisk, "followup_due_day": followup}
        cards = s.candidate_cards[i] = (recontact, allocation)
        return cards

    def _counterfactual_hint(self) -> str:
        """The refresh's one-line suggestion (computed on demand: it only reads state the refresh left)."""
        s = self.s
        hold = s.constraints["regulatory_hold_days"]
        followup = s.summary["followup_due"]
        consented = s.summary["consented_pending_allocation"]
        patient_pool = s.uncertainty_components["patient_pool"]
        if hold > 0:
            text = "a regulatory hold blocks screening: recontact pending patients or negotiate with a site."
        elif followup > 0:
            text = f"recontact the {followup} patient(s) with follow-ups due before their consent windows close."
        elif consented > 0:
            k = self._best_site_cached()
            site = self.site_ids[k] if k is not None else "no site"
            text = f"allocate the {consented} consented patient(s) to the current best site {site}."
        elif s.constraints["site_bottleneck"]:
            text = "sites are bottlenecked: negotiate capacity or refocus on a better site."
        elif patient_pool > 0.4:
            text = "patient-pool uncertainty is high: tighten criteria to stabilise screening."
        else:
            enrolled, budget, _ = s.pareto_best
            text = f"aim for the best trade-off seen so far: {enrolled} enrolled with ${budget:.0f} left."
        return "Counterfactual: " + text

    def _dropout_rate_7d(self) -> float:
        s = self.s
        # recent_dropouts is in step order: the last week's dropouts are its tail.
        recent = len(s.recent_dropouts) - bisect_left(s.recent_dropouts, s.t - 7)
        if not recent:
            return 0.0
        return R3[min(1.0, recent / max(1, s.enrolled))]

    def _plan_view(self) -> dict[str, Any]:
        plan = self.s.plan
        if plan is None:
            return {}
        return {
            "plan_id": plan["plan_id"],
            "target_phase": plan["target_phase"],
            "summary": plan["summary"],
            "created_step": plan["created_step"],
            "last_followthrough_step": plan["last_followthrough_step"],
        }

    def _memory_summary(self) -> dict[str, int]:
        return dict(self.s.memory_view)

    def _hindsight(self) -> dict[str, Any]:
        s, task = self.s, self.task
        counts: dict[str, int] = {}
        for h in s.history:
            counts[h["action"]] = counts.get(h["action"], 0) + 1
        dominant = max(counts, key=counts.__getitem__) if counts else "none"
        progress = s.enrolled / task.target
        return {
            "dominant_action": dominant,
            "phase_followthrough_steps": s.followthroughs,
            "memory_hits": s.memory_hits,
            "milestone_potential_final": s.potential,
            "token_efficiency_score": s.token_eff,
            "token_usage_so_far": s.tokens_used,
            "weakest_milestone": s.active_milestone,
            "recovery_suggestion": self._counterfactual_hint()[len("Counterfactual: ") :],
            "score_proxy": round(
                max(0.0, min(1.0, 0.6 * progress + 0.01 * s.followthroughs + 0.01 * s.memory_hits)), 3
            ),
            "epistemic": round(min(1.0, 0.55 * s.U + 0.015 * s.backlog), 3),
            "aleatoric": round(min(1.0, 0.45 * s.U + 0.4 * self._dropout_rate_7d()), 3),
        }

    # ------------------------------------------------------------------ observation
    def _observation(self) -> Observation:
        s, task, world = self.s, self.task, self.world
        t = s.t
        top = s.top_cards
        if top is None:
            cards = self.patient_cards
            top = s.top_cards = tuple(cards[i] for _, i in s.available[:5])
        available = list(map(dict.copy, top))
        cards = s.candidate_cards
        recontact = [(cards.get(i) or self._candidate_cards(i))[0].copy() for _, _, _, i in s.recontact_keys[:5]]
        allocation = [(cards.get(i) or self._candidate_cards(i))[1].copy() for _, _, i in s.consented_keys[:5]]
        sites = {site_id: card.copy() for site_id, card in s.site_cards.items()}
        recent = list(chain.from_iterable(s.recent_tags))
        recent.extend(world.events.get(t - 1 if t > 1 else 0, ())[:3])
        dropout_7d = self._dropout_rate_7d()
        U = s.U
        if dropout_7d > 0.3:
            driver = "patient dropout"
        elif U > 0.3:
            driver = "screening noise"
        elif s.conversion_spread > 0.2:
            driver = "site-performance bias"
        else:
            driver = "possible confounding"
        accuracy = 0.0 if self.hide_world_type else self.accuracy.get(s.last_hypothesis, 0.1)
        summary = s.summary
        allocate_gain = 0.35 * summary["consented_pending_allocation"]
        allocate_gain = R3[allocate_gain if allocate_gain < 1.0 else 1.0] if allocate_gain else 0.0
        recontact_gain = 0.25 * summary["followup_due"]
        recontact_gain = R3[recontact_gain if recontact_gain < 1.0 else 1.0] if recontact_gain else 0.0
        tokens_left = task.token_budget - s.tokens_used
        # A copy of the template (every field in order, the task's constants filled in) with the step's values
        # stored into it: about half the cost of a 37-field dict display.
        obs = self.observation_template.copy()
        obs["timestamp"] = t
        obs["budget_remaining"] = R2[s.budget]
        obs["time_to_deadline_days"] = task.max_steps - t if t < task.max_steps else 0
        obs["enrolled_so_far"] = s.enrolled
        obs["current_funnel"] = s.funnel.copy()
        obs["available_patients"] = available
        obs["recontact_candidates"] = recontact
        obs["allocation_candidates"] = allocation
        obs["site_performance"] = sites
        obs["recent_events"] = recent[-5:]
        obs["uncertainty_level"] = R3[U]
        obs["dropout_rate_7d"] = dropout_7d
        obs["screening_backlog"] = s.backlog
        obs["causal_insight"] = _causal_insight(driver, dropout_7d, U)
        obs["hypothesis_accuracy"] = accuracy
        obs["milestones"] = s.milestones.copy()
        obs["active_constraints"] = s.constraints.copy()
        obs["delayed_effects_pending"] = len(s.queue)
        obs["uncertainty_components"] = s.uncertainty_components.copy()
        obs["patient_memory_summary"] = summary.copy()
        obs["counterfactual_hint"] = self._counterfactual_hint()
        obs["current_plan"] = self._plan_view()
        obs["indexed_memory_summary"] = s.memory_view.copy()
        obs["retrieved_memory_context"] = s.retrieved
        obs["milestone_potential"] = s.potential
        obs["active_milestone"] = s.active_milestone
        obs["hindsight_available"] = s.done
        obs["token_budget_remaining"] = tokens_left if tokens_left > 0 else 0
        obs["token_usage_so_far"] = s.tokens_used
        obs["token_efficiency_score"] = s.token_eff
        obs["counterfactual_rollout"] = {
            "allocate_gain_estimate": allocate_gain,
            "recontact_gain_estimate": recontact_gain,
        }
        return obs

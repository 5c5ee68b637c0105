"""The derived state: milestones, milestone potential, the environment's own plan, token efficiency, the
patient summary and the uncertainty components, recomputed from the episode state after each change."""

from __future__ import annotations

from bisect import bisect_right

from env.clinical.rounding import R3, clamp01
from env.clinical.state import INF, MILESTONES

PHASE_SUMMARIES = {
    "screening": "Screen high-priority patients to refill the funnel.",
    "conversion": "Recontact eligible patients before their consent windows close.",
    "allocation": "Allocate consented patients to the best available site.",
    "retention": "Protect enrolled patients at risk of dropping out.",
    "recovery": "Recover from holds and bottlenecks with a strategy change.",
}


def active_milestone(progress: float) -> str:
    """The first milestone above ``progress`` (``"complete"`` past the last)."""
    for name, threshold, _ in MILESTONES:
        if threshold > progress:
            return name
    return "complete"


class DerivedState:
    """The derived-state refresh of :class:`env.clinical.core.ClinicalRecruitmentEnv` (a mixin).

    Reads ``self.s``, ``self.task`` and ``self.site_ids``; writes the derived fields of the state (``potential``,
    ``plan``, ``token_eff``, ``pareto_best``, ``oversight_alerts``, ``summary``, ``uncertainty_components``,
    the constraint flags, the milestones).
    """

    def _update_milestones(self, progress: float) -> float:
        """Mark the milestones ``progress`` reached and set the active one; return the bonus of the new ones."""
        s = self.s
        bonus = 0.0
        # Milestones are reached in order, so none is new below the next one's threshold.
        if progress >= s.next_milestone:
            s.next_milestone = INF
            for name, threshold, milestone_bonus in MILESTONES:
                if progress >= threshold:
                    if not s.milestones[name]:
                        s.milestones[name] = True
                        bonus += milestone_bonus
                elif s.next_milestone == INF:
                    s.next_milestone = threshold
        s.active_milestone = active_milestone(progress)
        return bonus

    def _refresh(self, final: bool) -> None:
        """Recompute the derived state: milestone potential, plan, token efficiency, Pareto best, oversight.

        A step refreshes twice, after its action (``final=False``: the reward reads the potential and token
        efficiency) and after its end-of-day updates (``final=True``: also the observation's flags, uncertainty
        components and patient summary, which only the observation reads).
        """
        s, task = self.s, self.task
        c, t = s.constraints, s.t
        hold = c["regulatory_hold_days"]
        # Patient counts, from the indexes: only screened patients carry follow-ups, consents and enrolments.
        consented = len(s.consented_keys)
        followup = bisect_right(s.recontact_keys, (False, t + 2, INF))  # follow-up set, due by t + 2
        eligible = s.active_eligible - consented  # a consented patient is always eligible
        if final:
            self._refresh_observed(eligible, consented, followup)

        progress = s.enrolled / task.target
        readiness = 0.03 * consented + 0.02 * followup + 0.015 * s.high_priority
        readiness = readiness if readiness < 0.55 else 0.55
        pace = progress - t / task.max_steps
        pace_bonus = 0.5 * (pace if pace > 0 else 0)
        pace_bonus = pace_bonus if pace_bonus < 0.20 else 0.20
        backlog_penalty = 0.01 * s.backlog
        backlog_penalty = backlog_penalty if backlog_penalty < 0.15 else 0.15
        penalties = 0.05 * hold + 0.10 * c["competitor_pressure"] + 0.08 * c["sentiment_pressure"] + backlog_penalty
        s.potential = R3[clamp01(0.20 + 0.35 * progress + readiness + pace_bonus - penalties)]

        if s.active_milestone == "complete":
            s.plan = None
        else:
            self._maintain_plan(hold, consented, followup, eligible)

        followthrough_bonus = 0.01 * s.followthroughs + 0.015 * s.memory_hits
        followthrough_bonus = followthrough_bonus if followthrough_bonus < 0.18 else 0.18
        eff = 1 - 0.65 * s.tokens_used / task.token_budget + 0.25 * progress + followthrough_bonus
        s.token_eff = R3[clamp01(eff)]

        # Only the best (enrolled, budget, token efficiency) point is ever read (the counterfactual hint), and
        # only the number of oversight alerts, at most 8 (the patient summary).
        point = (s.enrolled, s.budget, s.token_eff)
        if point > s.pareto_best:
            s.pareto_best = point
        if (hold > 0 or s.backlog >= 4) and s.oversight_alerts < 8:
            s.oversight_alerts += 1

    def _refresh_observed(self, eligible: int, consented: int, followup: int) -> None:
        """The part of the derived state that only the observation reads: flags, uncertainty, patient summary."""
        s, task = self.s, self.task
        c, t = s.constraints, s.t
        avg_wait, low_cap = s.avg_wait, s.low_capacity_sites
        c["backlog_pressure"] = s.backlog >= 4
        c["site_bottleneck"] = low_cap > 0 or avg_wait >= 7.0
        c["sponsor_pressure"] = s.enrolled / task.target + 0.05 < (t + 1) / task.max_steps
        c["focused_site"] = s.focused_site or ""
        pool = s.U + 0.4 * c["competitor_pressure"]
        operations = avg_wait / 15 + 0.5 * low_cap / len(self.site_ids)
        policy = 0.1 * (c["protocol_version"] - 1) + 0.15 * c["regulatory_hold_days"] + c["sentiment_pressure"]
        policy = policy if policy < 1.0 else 1.0
        s.uncertainty_components = {
            "patient_pool": R3[pool if pool < 1.0 else 1.0],
            "site_operations": R3[operations if operations < 1.0 else 1.0],
            "policy": R3[policy] if policy else policy,  # usually 0.0, which rounds to itself
        }
        s.summary = {
            "high_priority_candidates": s.high_priority,
            "eligible_pending_consent": eligible,
            "consented_pending_allocation": consented,
            "at_risk_enrolled": s.at_risk,
            "followup_due": followup,
            "dropped": s.dropped_count,
            "high_recontact_pressure": s.pressure_open,
            "oversight_alerts": s.oversight_alerts,
        }

    def _maintain_plan(self, hold: int, consented: int, followup: int, eligible: int) -> None:
        """Replace a stale plan by the environment's own plan for the current phase (milestones not complete)."""
        s, t = self.s, self.s.t
        if hold > 0:
            phase = "recovery"
        elif consented > 0:
            phase = "allocation"
        elif followup > 0 or eligible > 0:
            phase = "conversion"
        elif s.at_risk > 0 and self.task.task_id == "hard_bench":
            phase = "retention"
        else:
            phase = "screening"
        plan = s.plan
        if plan is not None:
            age = t - plan["created_step"]
            if plan["autogenerated"]:
                if age <= 18 and plan["target_phase"] == phase:
                    return
            elif age <= 24:
                return
        s.plan = {
            "plan_id": f"autoplan-{t}-{phase}",
            "target_phase": phase,
            "summary": PHASE_SUMMARIES[phase],
            "created_step": t,
            "last_followthrough_step": None,
            "autogenerated": True,
        }

"""The agent's actions: one handler per action type, each returning an error code or ``None``.

A handler checks its preconditions first (budget, hold, known patient, ...) and returns the reference's error
code without changing anything when one fails (some errors still charge money, as in the reference). The
handlers draw from the step RNG in the reference's order.
"""

from __future__ import annotations

from bisect import bisect_right

from env.clinical.derived import PHASE_SUMMARIES
from env.clinical.models import PLAN_PHASES
from env.clinical.state import HIGH_PRIORITY, UNKNOWN, StepEffects

MEMORY_TAGS = ("screening", "conversion", "allocation", "retention", "recovery", "site", "dropout", "milestone")


class ActionHandlers:
    """The action handlers of :class:`env.clinical.core.ClinicalRecruitmentEnv` (a mixin).

    Reads ``self.s``, ``self.task``, ``self.world``, ``self.rng``, ``self.fixes``, ``self.patient_index``,
    ``self.site_ids`` and ``self.site_index``; changes patients, sites and the calendar through the other parts.
    """

    def _apply_action(self, a: dict, fx: StepEffects) -> str | None:
        kind = a["action_type"]
        if kind == "screen_patient":
            return self._screen(a, fx)
        if kind == "recontact":
            return self._recontact(a, fx)
        if kind == "allocate_to_site":
            return self._allocate(a, fx)
        if kind == "adjust_strategy":
            return self._adjust_strategy(a)
        if kind == "plan_next_phase":
            return self._plan(a, fx)
        if kind == "summarize_and_index":
            return self._summarize(a)
        if kind == "retrieve_relevant_history":
            return self._retrieve(a, fx)
        fx.stopped = True
        return None

    def _screen(self, a: dict, fx: StepEffects) -> str | None:
        s, task, world = self.s, self.task, self.world
        c = s.constraints
        if c["regulatory_hold_days"] > 0:
            s.backlog += 1
            return "regulatory_hold_active"
        if s.budget < task.screening_cost:
            return "insufficient_budget"
        i = self.patient_index.get(a["patient_id"])
        if i is None:
            return "patient_not_found"
        if s.screened[i]:
            return "already_screened"
        s.budget -= task.screening_cost
        s.screened[i] = True
        pos = bisect_right(s.available, (-s.prio[i], i)) - 1
        del s.available[pos]
        s.top_cards = None
        if s.prio[i] >= HIGH_PRIORITY:
            s.high_priority -= 1
        self._activate(i)
        s.funnel["contacted"] += 1
        s.funnel["screened"] += 1
        p_eligible = min(0.99, world.eligibility[i] * (1 + (s.om - 1) * 0.15) / s.cs)
        if self.rng.random() < p_eligible:
            s.eligible[i] = True
            s.active_eligible += 1
            s.funnel["eligible"] += 1
            fx.screen_success = True
            pressure = max(0.55, 1 - c["sentiment_pressure"] - 0.5 * c["competitor_pressure"])
            p_consent = s.will[i] * (1 - 0.3 * s.U) * min(1.2, 0.9 + 0.1 * s.om) * pressure
            p_consent = max(0.05, min(0.95, p_consent))
            if self.rng.random() < p_consent:
                self._consent(i, window=5)
            else:
                self._set_followup(i, s.t + 3)
                self._schedule("patient_cools_off", 3, i)
        else:
            s.backlog += 1
            if "screen_failures_leave_recontact" in self.fixes:
                self._deactivate(i)
        return None

    def _recontact(self, a: dict, fx: StepEffects) -> str | None:
        s, task, world = self.s, self.task, self.world
        if s.budget < task.recontact_cost:
            return "insufficient_budget"
        i = self.patient_index.get(a["patient_id"])
        if i is None:
            return "patient_not_found"
        if s.is_enrolled[i]:
            return "already_enrolled"
        if s.dropped[i]:
            return "patient_dropped"
        s.budget -= task.recontact_cost
        s.attempts[i] += 1
        if s.attempts[i] == 2:
            s.pressure.add(i)
            s.pressure_open += 1
        c = s.constraints
        pressure = max(0.55, 1 - c["competitor_pressure"] - 0.5 * c["sentiment_pressure"])
        due = 1.1 if s.followup[i] is not None else 1.0
        if s.consented[i]:
            p = 0.6 * s.will[i] * (1 - world.dropout_risk[i]) * pressure * due
            p = max(0.05, min(0.95, p))
            if self.rng.random() < p and s.budget >= task.enrollment_cost:
                s.budget -= task.enrollment_cost
                self._enrol(i, None, fx)
        elif s.eligible[i]:
            p = max(0.05, min(0.90, 0.5 * s.will[i] * pressure * due))
            if self.rng.random() < p:
                self._consent(i, window=4)
            else:
                self._set_followup(i, s.t + 2)
        return None

    def _allocate(self, a: dict, fx: StepEffects) -> str | None:
        s, task, world = self.s, self.task, self.world
        i = self.patient_index.get(a["patient_id"])
        if i is None:
            return "patient_not_found"
        if not s.consented[i]:
            return "patient_not_consented"
        if s.is_enrolled[i]:
            return "already_enrolled"
        if s.dropped[i] and "no_realloc_after_dropout" in self.fixes:
            return "patient_dropped"
        k = self.site_index.get(a["site_id"])
        if k is None:
            k = self._best_site_cached()
            if k is None:
                return "no_site_available"
        if s.site_cap[k] <= 0:
            return "site_at_capacity"
        if s.budget < task.enrollment_cost:
            return "insufficient_budget"
        site = world.sites[k]
        drisk = world.dropout_risk[i]
        p = (
            s.site_conv[k]
            * (1 - 0.3 * drisk)
            * max(0.55, 1 - s.site_wait[k] / 20)
            * (0.8 + 0.25 * site.retention_rate)
        )
        if self.site_ids[k] == s.focused_site:
            p *= 1.15
        p *= max(0.7, 1 - s.constraints["sentiment_pressure"])
        p = max(0.05, min(0.98, p))
        if self.rng.random() < p:
            s.budget -= task.enrollment_cost
            self._enrol(i, k, fx)
        elif self.rng.random() < 0.3 * drisk:
            if not s.dropped[i]:
                s.dropped_count += 1
                if i in s.pressure:
                    s.pressure_open -= 1  # it was neither enrolled (checked above) nor dropped
            s.dropped[i] = True
            self._deactivate(i)
            s.funnel["dropped"] += 1
            fx.dropout = True
        return None

    def _adjust_strategy(self, a: dict) -> str | None:
        s, task = self.s, self.task
        if s.budget < task.strategy_cost:
            return "insufficient_budget"
        s.budget -= task.strategy_cost
        strategy = a["strategy_change"] or ""
        if strategy == "increase_outreach":
            s.om = min(2.0, s.om + 0.2)
            self._schedule("outreach_wave", 2, 0.06)
        elif strategy == "relax_criteria":
            s.cs = max(0.6, s.cs - 0.15)
            self._schedule("criteria_relax_tail_risk", 4)
        elif strategy == "tighten_criteria":
            s.cs = min(1.5, s.cs + 0.15)
            self._schedule("criteria_tighten_stability", 3)
        elif strategy.startswith("focus_site_"):
            site_id = strategy[len("focus_") :]
            if site_id not in self.site_index:
                return "site_not_found"
            s.focused_site = site_id
            s.best_site = UNKNOWN  # the focused site scores higher
        elif strategy.startswith("negotiate_site_"):
            site_id = strategy[len("negotiate_") :]
            k = self.site_index.get(site_id)
            if k is None:
                return "site_not_found"
            s.negotiation[site_id]["offers_made"] += 1
            s.negotiation[site_id]["last_offer_step"] = s.t
            self._schedule("site_negotiation", 2, k)
        else:
            return "unknown_strategy"
        return None

    def _plan(self, a: dict, fx: StepEffects) -> str | None:
        s = self.s
        phase = (a["target_phase"] or "").strip().lower()
        if phase not in PLAN_PHASES:
            return "invalid_target_phase"
        summary = a["plan_summary"]
        s.plan = {
            "plan_id": a["plan_id"] or f"plan-{s.t}-{phase}",
            "target_phase": phase,
            "summary": summary[:180] if summary else PHASE_SUMMARIES[phase],
            "created_step": s.t,
            "last_followthrough_step": None,
            "autogenerated": False,
        }
        fx.plan_bonus += 0.005
        return None

    def _summarize(self, a: dict) -> str | None:
        s = self.s
        key = (a["memory_key"] or "").strip().lower()
        if not key:
            return "missing_memory_key"
        payload = a["memory_payload"] or self._default_memory_payload(key)
        text = f"{key} {payload}".lower()
        tags = [tag for tag in MEMORY_TAGS if tag in text] or ["general"]
        s.memory[key] = {"key": key, "summary": payload[:220], "tags": tags, "step": s.t}
        view = {"entries": len(s.memory)}
        for entry in s.memory.values():
            for tag in entry["tags"]:
                view[tag] = view.get(tag, 0) + 1
        s.memory_view = view
        return None

    def _default_memory_payload(self, key: str) -> str:
        s = self.s
        if "site" in key:
            k = self._best_site_cached()
            if k is None:
                return "Best site snapshot: no site has capacity left."
            return (
                f"Best site {self.site_ids[k]}: conversion {s.site_conv[k]:.2f}, "
                f"wait {s.site_wait[k]:.1f} days, capacity {s.site_cap[k]}"
            )
        if "retention" in key or "dropout" in key:
            return (
                f"Retention snapshot: at_risk_enrolled={s.summary['at_risk_enrolled']} "
                f"dropout_rate_7d={self._dropout_rate_7d():.3f}"
            )
        return (
            f"Pipeline snapshot: followup_due={s.summary['followup_due']} "
            f"consented_pending={s.summary['consented_pending_allocation']} milestone={s.active_milestone}"
        )

    def _retrieve(self, a: dict, fx: StepEffects) -> str | None:
        s = self.s
        query = (a["memory_query"] or "").lower()
        if not query:
            return "missing_memory_query"
        terms = query.replace("_", " ").split()
        ranked = []
        for entry in s.memory.values():
            haystack = f"{entry['key']} {entry['summary']} {' '.join(entry['tags'])}".lower()
            overlap = sum(1 for term in terms if term in haystack)
            if overlap > 0:
                ranked.append((overlap, entry["step"], entry["summary"]))
        if ranked:
            ranked.sort(key=lambda x: (x[0], x[1]), reverse=True)
            s.retrieved = " | ".join(r[2] for r in ranked[:2])[:280]
            fx.memory_bonus += 0.005
            fx.memory_hit = True
        else:
            s.retrieved = f"No indexed memory matched '{query}' at step {s.t}."
            fx.memory_bonus -= 0.01
        return None

"""The event calendar and the delayed effects: what the world does to the trial, day by day.

A day's calendar events (:attr:`env.clinical.world.World.events`) fire first; some act at once, others schedule
a delayed effect. Actions schedule delayed effects too (outreach waves, negotiations, consent windows). The
queue is a heap of ``(due day, number, kind, argument)`` items, ``number`` counting the effects scheduled so far:
the effects due on a day fire in the order they were scheduled. An effect is due one day or more after it was
scheduled and every step fires all effects due by its day, so the due items of a step all fall on that day.
"""

from __future__ import annotations

from heapq import heappop, heappush
from typing import Any

from env.clinical.state import StepEffects


class Calendar:
    """Calendar events and delayed effects of :class:`env.clinical.core.ClinicalRecruitmentEnv` (a mixin).

    Reads ``self.s``, ``self.world``, ``self.rng`` (the step RNG: ``choice`` draws), ``self.site_ids`` and
    ``self.site_index``; changes patients and sites through :class:`env.clinical.patients.PatientPipeline` and
    :class:`env.clinical.sites.SiteBook`.
    """

    def _schedule(self, kind: str, delay: int, arg: Any = None) -> None:
        s = self.s
        s.queue_seq += 1
        heappush(s.queue, (s.t + max(1, delay), s.queue_seq, kind, arg))

    def _calendar_event(self, event: str, fx: StepEffects) -> None:
        s, c = self.s, self.s.constraints
        if event == "patient_dropout":
            if s.enrolled_ids:
                self._drop_enrolled(self.rng.choice(s.enrolled_ids), fx)
        elif event in ("site_delay", "site_audit"):
            k = self.site_index[self.rng.choice(self.site_ids)]
            s.site_wait[k] += 2.0
            self._site_changed(k)
            if event == "site_audit":
                c["site_bottleneck"] = True
            self._schedule("site_recovery", 4 if event == "site_delay" else 5, k)
        elif event == "site_capacity_reduced":
            k = self.site_index[self.rng.choice(self.site_ids)]
            s.site_cap[k] = max(0, s.site_cap[k] - 3)
            self._site_changed(k)
            self._schedule("capacity_recovery", 6, k)
        elif event == "regulatory_hold":
            s.backlog += 3
            c["regulatory_hold_days"] = max(c["regulatory_hold_days"], 2)
        elif event == "irb_delay":
            c["regulatory_hold_days"] = max(c["regulatory_hold_days"], 3)
        elif event == "consent_form_revision":
            self._schedule("consent_form_revision", 2)
        elif event == "new_competitor_trial":
            self._schedule("competitor_pressure", 3, 0.12)
        elif event == "patient_complaint":
            self._schedule("sentiment_pressure", 2, 0.08)
        elif event == "screening_backlog":
            s.backlog += 2
        elif event == "protocol_amendment":
            self._schedule("protocol_shift", 1)
        elif event == "seasonal_slowdown":
            s.om = max(0.5, s.om - 0.1)
            c["sentiment_pressure"] = min(0.4, c["sentiment_pressure"] + 0.03)

    def _fire_due_effects(self, fx: StepEffects) -> None:
        s = self.s
        t, queue = s.t, s.queue
        # The effects fired here schedule new ones for later days only, so they are not popped in this loop.
        while queue and queue[0][0] <= t:
            _, _, kind, arg = heappop(queue)
            fx.delayed += 1
            self._delayed_effect(kind, arg)

    def _delayed_effect(self, kind: str, arg: Any) -> None:
        s, c, t = self.s, self.s.constraints, self.s.t
        if kind == "patient_cools_off":
            i = arg
            f = s.followup[i]
            if s.eligible[i] and not s.consented[i] and not s.is_enrolled[i] and f is not None and f <= t:
                self._set_willingness(i, round(max(0.1, s.will[i] - 0.12), 3))
                self._set_followup(i, None)
        elif kind == "consent_window_closes":
            i = arg
            f = s.followup[i]
            if s.consented[i] and not s.is_enrolled[i] and f is not None and f <= t:
                active = i in s.active
                if active:
                    self._unindex(i)
                s.consented[i] = False
                s.funnel["consented"] = max(0, s.funnel["consented"] - 1)
                s.followup[i] = t + 2
                if active:
                    self._index(i)
                self._schedule("patient_cools_off", 2, i)
        elif kind == "competitor_pressure":
            c["competitor_pressure"] = round(min(0.6, c["competitor_pressure"] + arg), 3)
        elif kind == "sentiment_pressure":
            c["sentiment_pressure"] = round(min(0.4, c["sentiment_pressure"] + arg), 3)
        elif kind == "consent_form_revision":
            c["sentiment_pressure"] = round(min(0.4, c["sentiment_pressure"] + 0.04), 3)
        elif kind == "protocol_shift":
            c["protocol_version"] += 1
            s.cs = min(1.4, s.cs + 0.05)
            s.backlog += 1
            s.U = min(1.0, s.U + 0.04)
            c["schema_delta"] = "eligibility tightened"
        elif kind == "site_negotiation":
            k = arg
            s.negotiation[self.site_ids[k]]["counteroffers"] += 1
            s.site_conv[k] = round(min(0.98, s.site_conv[k] + 0.04), 3)
            s.site_wait[k] = round(max(1, s.site_wait[k] - 1), 1)
            s.site_cap[k] = min(self.world.sites[k].capacity_total, max(s.site_cap[k] + 2, 1))
            self._site_changed(k)
        elif kind == "criteria_relax_tail_risk":
            s.U = min(1.0, s.U + 0.05)
        elif kind == "criteria_tighten_stability":
            s.U = max(0.0, s.U - 0.04)
        elif kind == "outreach_wave":
            for _, i in s.available[:3]:
                self._set_willingness(i, round(min(0.95, s.will[i] + arg), 3))
        elif kind == "site_recovery":
            s.site_wait[arg] = round(max(1, s.site_wait[arg] - 1), 1)
            self._site_changed(arg)
        elif kind == "capacity_recovery":
            s.site_cap[arg] = min(self.world.sites[arg].capacity_total, s.site_cap[arg] + 1)
            self._site_changed(arg)

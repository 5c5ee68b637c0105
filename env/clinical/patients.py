"""The patient pipeline: moving patients between stages while keeping the state's sorted indexes exact.

A patient goes available -> screened (``active``) -> eligible -> consented -> enrolled, and may drop out. Every
change of a patient's follow-up day, priority or consent goes through these methods, which take the patient out
of the candidate indexes before the change and put it back after, so the indexes always equal what a full scan
would find (see :class:`env.clinical.state.EpisodeState`).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

from env.clinical.state import HIGH_PRIORITY, StepEffects


class PatientPipeline:
    """Patient transitions of :class:`env.clinical.core.ClinicalRecruitmentEnv` (a mixin).

    Reads ``self.s`` (the :class:`env.clinical.state.EpisodeState`), ``self.world`` and ``self.site_ids``; calls
    ``self._schedule`` (:class:`env.clinical.events.Calendar`) and ``self._site_changed``
    (:class:`env.clinical.sites.SiteBook`).
    """

    def _index(self, i: int) -> None:
        """Enter active patient ``i`` in the candidate indexes (after its follow-up, priority or consent changed)."""
        s = self.s
        f = s.followup[i]
        insort(s.recontact_keys, (f is None, f or 0, -s.prio[i], i))
        if s.consented[i]:
            insort(s.consented_keys, (-s.prio[i], self.world.dropout_risk[i], i))

    def _unindex(self, i: int) -> None:
        """Take active patient ``i`` out of the candidate indexes (before a change of its follow-up, priority or
        consent, or when it leaves ``active``)."""
        s = self.s
        f = s.followup[i]
        keys = s.recontact_keys
        del keys[bisect_left(keys, (f is None, f or 0, -s.prio[i], i))]
        s.candidate_cards.pop(i, None)
        if s.consented[i]:
            keys = s.consented_keys
            del keys[bisect_left(keys, (-s.prio[i], self.world.dropout_risk[i], i))]

    def _activate(self, i: int) -> None:
        """Just-screened patient ``i`` enters the pipeline (no follow-up, no consent yet)."""
        self.s.active.add(i)
        self._index(i)

    def _deactivate(self, i: int) -> None:
        """Patient ``i`` leaves the pipeline (enrolled, dropped, or screen-failed under a fix), if it was in it."""
        s = self.s
        if i in s.active:
            self._unindex(i)
            s.active.discard(i)
            if s.eligible[i]:
                s.active_eligible -= 1

    def _set_followup(self, i: int, day: int | None) -> None:
        s = self.s
        if i in s.active:
            self._unindex(i)
            s.followup[i] = day
            self._index(i)
        else:
            s.followup[i] = day

    def _set_willingness(self, i: int, value: float) -> None:
        s, world = self.s, self.world
        old_key = (-s.prio[i], i)
        active = i in s.active
        if active:
            self._unindex(i)
        s.will[i] = value
        s.prio[i] = round(world.eligibility[i] * value * (1 - world.dropout_risk[i]), 3)
        if active:
            self._index(i)
        if not s.screened[i]:
            pos = bisect_right(s.available, old_key) - 1
            del s.available[pos]
            insort(s.available, (-s.prio[i], i))
            s.top_cards = None
            s.high_priority += (s.prio[i] >= HIGH_PRIORITY) - (-old_key[0] >= HIGH_PRIORITY)

    def _drop_enrolled(self, i: int, fx: StepEffects) -> None:
        """An enrolled patient drops out (calendar event or natural dropout); logged for the 7-day rate."""
        s = self.s
        s.dropped[i] = True
        s.is_enrolled[i] = False
        del s.enrolled_ids[bisect_left(s.enrolled_ids, i)]
        if self.world.dropout_risk[i] >= 0.35:
            s.at_risk -= 1
        s.dropped_count += 1
        s.enrolled -= 1
        s.funnel["dropped"] += 1
        s.funnel["enrolled"] = max(0, s.funnel["enrolled"] - 1)
        s.recent_dropouts.append(s.t)
        fx.dropout = True

    def _consent(self, i: int, window: int) -> None:
        """Patient ``i`` consents; the consent lapses unless acted on within ``window`` days."""
        s = self.s
        active = i in s.active
        if active:
            self._unindex(i)
        s.consented[i] = True
        s.funnel["consented"] += 1
        s.followup[i] = s.t + window
        if active:
            self._index(i)
        self._schedule("consent_window_closes", window, i)

    def _enrol(self, i: int, site: int | None, fx: StepEffects) -> None:
        s = self.s
        if not s.dropped[i] and i in s.pressure:
            s.pressure_open -= 1  # it was neither enrolled (the callers check) nor dropped
        self._deactivate(i)
        s.is_enrolled[i] = True
        s.followup[i] = None
        if not s.dropped[i]:
            insort(s.enrolled_ids, i)
            if self.world.dropout_risk[i] >= 0.35:
                s.at_risk += 1
        if site is not None:
            s.site_assigned[i] = self.site_ids[site]
            s.site_cap[site] -= 1
            self._site_changed(site)
        s.enrolled += 1
        s.funnel["enrolled"] += 1
        fx.enrolled = True

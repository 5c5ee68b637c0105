"""The sites: their observation cards, the aggregates the derived state reads, and the best site to allocate to."""

from __future__ import annotations

import operator
from typing import Any

from env.clinical.state import UNKNOWN


class SiteBook:
    """Site bookkeeping of :class:`env.clinical.core.ClinicalRecruitmentEnv` (a mixin).

    Reads ``self.s``, ``self.world``, ``self.site_ids`` and ``self.low_capacity``. Every change of a site's
    conversion, wait or capacity must be followed by :meth:`_site_changed`.
    """

    def _best_site(self) -> int | None:
        s, sites = self.s, self.world.sites
        best, best_score = None, None
        for k, site in enumerate(sites):
            rem = s.site_cap[k]
            if rem <= 0:
                continue
            score = (
                s.site_conv[k]
                * site.retention_rate
                * (0.5 + rem / max(1, site.capacity_total))
                / max(1, s.site_wait[k])
            )
            if self.site_ids[k] == s.focused_site:
                score *= 1.1
            if best_score is None or score > best_score:
                best, best_score = k, score
        return best

    def _best_site_cached(self) -> int | None:
        """:meth:`_best_site`, remembered until a site or the focused site changes."""
        s = self.s
        if s.best_site == UNKNOWN:
            s.best_site = self._best_site()
        return s.best_site

    def _site_card(self, k: int) -> dict[str, Any]:
        """Site ``k``'s ``site_performance`` entry (observations get copies)."""
        s = self.s
        return {
            "conversion_rate": s.site_conv[k],
            "avg_wait_days": float(s.site_wait[k]),
            "capacity_remaining": float(s.site_cap[k]),
            "retention_rate": self.world.sites[k].retention_rate,
        }

    def _site_changed(self, k: int) -> None:
        """Site ``k``'s conversion, wait or capacity changed: renew its card and the site aggregates, and forget
        the best site."""
        s = self.s
        s.site_cards[self.site_ids[k]] = self._site_card(k)
        s.best_site = UNKNOWN
        self._site_aggregates()

    def _site_aggregates(self) -> None:
        s = self.s
        s.avg_wait = sum(s.site_wait) / len(self.site_ids)
        s.low_capacity_sites = sum(map(operator.le, s.site_cap, self.low_capacity))  # at or below their low mark
        conv = s.site_conv
        s.conversion_spread = max(conv) - min(conv) if len(conv) > 1 else 0.0

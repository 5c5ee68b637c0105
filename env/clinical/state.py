"""The mutable state of one episode (:class:`EpisodeState`), its snapshot and the record of one step's effects.

Patients are stored as parallel lists indexed like the world's patient tuples, plus sorted indexes and counters
that let a step avoid scanning all patients (see :class:`EpisodeState`). Everything here is plain data: the
environment's parts (:mod:`env.clinical.patients`, :mod:`env.clinical.events`, ...) change it.
"""

from __future__ import annotations

import functools

from env.clinical.tasks import TaskSpec
from env.clinical.world import World, get_world

HIGH_PRIORITY = 0.35  # an available patient at or above this priority counts as a high-priority candidate
MILESTONES = (("25pct", 0.25, 0.02), ("50pct", 0.5, 0.03), ("75pct", 0.75, 0.04), ("100pct", 1.0, 0.06))
# Above any day and any negated priority (a bisect probe, and the due day of an empty queue).
INF = float("inf")
UNKNOWN = -1  # a site index not computed yet


class EpisodeState:
    """Everything that changes during an episode. Patients are stored as parallel lists (fast to copy).

    Besides the patient lists, the state keeps sorted indexes so that no step scans all patients:
    ``available`` holds ``(-priority, i)`` of unscreened patients; ``recontact_keys`` holds
    ``(followup is None, followup or 0, -priority, i)`` and ``consented_keys`` ``(-priority, dropout_risk, i)``
    of the patients in ``active`` (screened, not enrolled, still in the pipeline; the consented ones for the
    second); ``enrolled_ids`` is the sorted list of enrolled patients who have not dropped out. Counters:
    ``active_eligible`` (eligible patients in ``active``), ``at_risk`` (enrolled with dropout risk >= 0.35),
    ``pressure_open`` (patients in ``pressure`` neither enrolled nor dropped), ``high_priority`` (available
    patients with priority >= 0.35). ``queue`` is the heap of delayed effects (:mod:`env.clinical.events`) and
    ``queue_seq`` the number of effects scheduled so far. ``top_cards`` holds the cards of the first five
    available patients (``None`` until needed again); ``site_cards`` maps each site id to the site's observation
    entry (renewed when the site changes, with ``avg_wait``, ``low_capacity_sites``, the number of sites low on
    capacity, and ``conversion_spread``, the best minus the worst conversion rate); ``best_site`` is the index
    :meth:`env.clinical.sites.SiteBook._best_site` found (``UNKNOWN`` until it is needed again).
    ``candidate_cards`` maps an active patient shown as a candidate to its ``(recontact card, allocation card)``
    (made by the observation, dropped when the patient leaves the indexes: its follow-up or consent is about to
    change, or it leaves ``active``; its eligibility changes only on the day it enters them, before any
    observation).
    """

    __slots__ = (
        "t", "done", "total_reward", "history", "budget", "U", "enrolled", "funnel", "backlog", "om", "cs",
        "focused_site", "switches", "last_hypothesis", "last_confidence", "milestones", "next_milestone",
        "constraints", "queue", "memory", "memory_view", "plan", "retrieved", "hindsight", "negotiation",
        "oversight_alerts", "pareto_best", "tokens_used", "token_eff", "recent_dropouts", "recent_tags", "will",
        "prio", "screened", "eligible", "consented", "is_enrolled", "dropped", "site_assigned", "followup",
        "attempts", "available", "active", "recontact_keys", "consented_keys", "active_eligible", "enrolled_ids",
        "at_risk", "pressure", "pressure_open", "dropped_count", "site_conv", "site_wait", "site_cap", "site_cards",
        "avg_wait", "low_capacity_sites", "conversion_spread", "best_site", "top_cards", "high_priority",
        "queue_seq", "potential", "summary", "active_milestone", "uncertainty_components", "followthroughs",
        "memory_hits", "candidate_cards",
    )  # fmt: skip

    @classmethod
    def initial(cls, task: TaskSpec, world: World) -> EpisodeState:
        """The state at reset: nothing screened, the task's budget, no events fired. ``site_cards``,
        ``avg_wait``, ``low_capacity_sites`` and the derived state (``summary``, ``plan``, ...) are left for
        the environment to compute."""
        s = cls.__new__(cls)
        s.t, s.done, s.total_reward, s.history = 0, False, 0.0, []
        s.budget, s.U, s.enrolled, s.backlog = task.budget, 0.0, 0, 0
        s.funnel = {"contacted": 0, "screened": 0, "eligible": 0, "consented": 0, "enrolled": 0, "dropped": 0}
        s.om, s.cs, s.focused_site = 1.0, 1.0, None
        s.switches, s.last_hypothesis, s.last_confidence = 0, "unknown", 0.5
        s.milestones = {"25pct": False, "50pct": False, "75pct": False, "100pct": False}
        s.constraints = {
            "regulatory_hold_days": 0,
            "competitor_pressure": 0.0,
            "sentiment_pressure": 0.0,
            "protocol_version": 1,
            "sponsor_pressure": False,
            "backlog_pressure": False,
            "site_bottleneck": False,
            "focused_site": "",
        }
        s.queue, s.memory, s.plan, s.retrieved, s.hindsight = [], {}, None, "", None
        s.negotiation = {
            site.site_id: {"offers_made": 0, "last_offer_step": None, "counteroffers": 0} for site in world.sites
        }
        s.oversight_alerts, s.pareto_best = 0, (-INF,)  # below any (enrolled, budget, efficiency) point
        s.tokens_used, s.token_eff, s.recent_dropouts, s.recent_tags = 0, 1.0, [], []
        s.next_milestone, s.active_milestone, s.memory_view = MILESTONES[0][1], MILESTONES[0][0], {"entries": 0}
        n = world.n_patients
        prio, available, s.high_priority = initial_priorities(task.task_id)
        s.will, s.prio, s.available = list(world.willingness), list(prio), list(available)
        s.screened, s.eligible, s.consented = [False] * n, [False] * n, [False] * n
        s.is_enrolled, s.dropped, s.site_assigned = [False] * n, [False] * n, [None] * n
        s.followup, s.attempts = [None] * n, [0] * n
        s.active, s.recontact_keys, s.consented_keys, s.active_eligible = set(), [], [], 0
        s.enrolled_ids, s.at_risk, s.pressure, s.pressure_open, s.dropped_count = [], 0, set(), 0, 0
        s.site_conv = [site.conversion_rate for site in world.sites]
        s.site_wait = [site.avg_wait_days for site in world.sites]
        s.site_cap = [site.capacity_total for site in world.sites]
        s.best_site, s.top_cards, s.queue_seq = UNKNOWN, None, 0
        s.potential, s.followthroughs, s.memory_hits, s.candidate_cards = 0.0, 0, 0, {}
        return s

    def clone(self) -> EpisodeState:
        """An independent copy (what :class:`EnvSnapshot` holds)."""
        new = EpisodeState.__new__(EpisodeState)
        for name in _SCALARS:
            setattr(new, name, getattr(self, name))
        for name in _LISTS:
            setattr(new, name, getattr(self, name)[:])
        for name in _DICTS:
            setattr(new, name, getattr(self, name).copy())
        for name in _SETS:
            setattr(new, name, set(getattr(self, name)))
        new.negotiation = {k: v.copy() for k, v in self.negotiation.items()}
        new.plan = None if self.plan is None else self.plan.copy()
        return new


# History entries, memory entries, queue items and tuples are never mutated after creation, so shallow copies of
# their containers are enough for an exact snapshot. ``summary``, ``uncertainty_components``, ``memory_view`` and
# the site cards are replaced, never changed in place, so a snapshot shares them.
_LISTS = (
    "history", "queue", "recent_dropouts", "recent_tags", "will", "prio", "screened", "eligible",
    "consented", "is_enrolled", "dropped", "site_assigned", "followup", "attempts", "available", "recontact_keys",
    "consented_keys", "enrolled_ids", "site_conv", "site_wait", "site_cap",
)  # fmt: skip
_DICTS = ("funnel", "milestones", "constraints", "memory", "site_cards", "candidate_cards")
_SETS = ("active", "pressure")
_SCALARS = tuple(n for n in EpisodeState.__slots__ if n not in _LISTS + _DICTS + _SETS + ("negotiation", "plan"))


@functools.cache
def initial_priorities(task_id: str) -> tuple[tuple[float, ...], tuple[tuple[float, int], ...], int]:
    """Every patient's priority at reset, the sorted ``available`` index built from it and its number of high
    priorities (all fixed by the world)."""
    world = get_world(task_id)
    elig, will, drisk = world.eligibility, world.willingness, world.dropout_risk
    prio = tuple(round(elig[i] * will[i] * (1 - drisk[i]), 3) for i in range(world.n_patients))
    return prio, tuple(sorted((-p, i) for i, p in enumerate(prio))), sum(1 for p in prio if p >= HIGH_PRIORITY)


class EnvSnapshot:
    """An opaque, reusable copy of an episode (state and step RNG). Restore it any number of times."""

    __slots__ = ("task_id", "state", "rng_state")

    def __init__(self, task_id: str, state: EpisodeState, rng_state: tuple) -> None:
        self.task_id = task_id
        self.state = state
        self.rng_state = rng_state


class StepEffects:
    """What happened during one step (flags the reward and the history entry read).

    The class attributes are the defaults: a step sets only what happened on the instance, so creating one runs
    no ``__init__`` (a step creates one).
    """

    screen_success = enrolled = dropout = memory_hit = stopped = False
    plan_bonus = memory_bonus = 0.0
    delayed = 0

"""Public, fixed facts of a task and the base policy's day plan for it (:func:`task_facts`).

Everything here follows from the task parameters (:mod:`env.clinical.tasks`) and the event calendar
(:mod:`env.clinical.world`), which is the same for every reset seed, never from an environment's state or RNG. The
per-task knobs (:data:`DEFAULTS`, :data:`TUNING`) time enrolment and stops against the calendar's scheduled dropouts;
:func:`task_facts` turns them into a day-by-day chore schedule and projects the criteria strictness and outreach it
leads to, which :class:`env.clinical.heuristic.GraderHeuristic` follows.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from env.clinical.graders import BUDGET_RESERVE
from env.clinical.tasks import TaskSpec, get_task
from env.clinical.world import curriculum_windows, get_world, hold_days_of, scheduled_dropout_days

MODES = ("score", "enrolment")
RESERVE_MARGIN = 50.0  # dollars kept above the grader's reserve

# The day plan of each (base task, mode); every number was chosen by measuring reset seeds 0..19.
#   enrol_after_dropout: k > 0 enrols only from the k-th last scheduled patient_dropout day on (0: from day 0)
#   stop_before_dropout: k > 0 stops the episode the day before the k-th last scheduled dropout (score mode)
#   bank: keep one consent for after the last scheduled dropout while enrolling (recovery needs an enrolment
#       after it)
#   cs_goal / om_goal: criteria strictness / outreach multiplier wanted when a screening period starts
#   prep_days: how many days before a screening period the relax / outreach actions may be placed
#   negotiate_days: negotiations may start this many days before enrolment starts
#   conv_goal: negotiate with the target site while its conversion rate is below this
#   convert_first: recontact eligible patients with a follow-up due before screening new ones
DEFAULTS: dict[str, Any] = {
    "enrol_after_dropout": 0,
    "stop_before_dropout": 0,
    "bank": False,
    "cs_goal": 0.7,
    "om_goal": 1.2,
    "prep_days": 6,
    "negotiate_days": 30,
    "conv_goal": 0.9,
    "wait_goal": 3.0,
    "convert_first": False,
    "risk_weight": 0.5,
    "rank_weight": 0.05,
    "all_sites": False,
    "variety": False,
    "maintain": False,
}
TUNING: dict[tuple[str, str], dict[str, Any]] = {
    ("easy_bench", "score"): {"cs_goal": 0.6, "om_goal": 1.0, "prep_days": 4, "convert_first": True},
    ("easy_bench", "enrolment"): {"cs_goal": 0.6, "om_goal": 2.0, "prep_days": 8},
    ("medium_bench", "score"): {"enrol_after_dropout": 1, "cs_goal": 0.7, "om_goal": 2.0, "prep_days": 12,
                                "negotiate_days": 80, "all_sites": True, "variety": True},
    ("medium_bench", "enrolment"): {"enrol_after_dropout": 5, "maintain": True, "cs_goal": 0.7, "om_goal": 1.5,
                                    "prep_days": 10, "risk_weight": 1.0},
    ("hard_bench", "score"): {"enrol_after_dropout": 5, "stop_before_dropout": 3, "bank": True, "cs_goal": 0.65,
                              "om_goal": 1.2, "prep_days": 12, "negotiate_days": 40, "wait_goal": 2.0},
    ("hard_bench", "enrolment"): {"enrol_after_dropout": 13, "stop_before_dropout": 3, "maintain": True,
                                  "cs_goal": 0.65, "om_goal": 1.2, "prep_days": 10, "wait_goal": 2.0},
}  # fmt: skip


CALENDAR_KNOBS = ("enrol_after_dropout", "stop_before_dropout", "bank")
# Day plans of policies that never stop early (``early_stop=False``): hard then enrols in the last days instead.
NO_STOP_TUNING: dict[tuple[str, str], dict[str, Any]] = {
    ("hard_bench", "score"): {"enrol_after_dropout": 2},
    ("hard_bench", "enrolment"): {"enrol_after_dropout": 10},
}


def tuning(base: str, mode: str, full_length: bool = True) -> dict[str, Any]:
    """The knobs of a task family and mode. The calendar-timed knobs were chosen for the full 180-day tasks;
    stage tasks (shorter calendars) keep the defaults for those."""
    knobs = {**DEFAULTS, **TUNING.get((base, mode), {})}
    if not full_length:
        knobs.update({k: DEFAULTS[k] for k in CALENDAR_KNOBS})
    return knobs


@dataclass(frozen=True)
class TaskFacts:
    """Public, seed-independent facts of a task and the base policy's fixed day plan for it.

    ``schedule`` maps a day to a chore (``("relax",)``, ``("outreach",)``, ``("focus",)``, ``("plan", phase)``,
    ``("summarize",)``, ``("retrieve",)``); ``cs``/``om`` are the criteria strictness and outreach multiplier
    projected for each day when the schedule is followed (the calendar's protocol shifts and seasonal
    slowdowns are fixed), used to predict eligibility.
    """

    task: TaskSpec
    base: str
    mode: str
    horizon: int
    blocked: frozenset[int]
    dropout_days: tuple[int, ...]
    curriculum: frozenset[int]
    reserve: float
    enrol_from: int
    early_stop: bool
    stop_at: int | None
    bank_after: int | None
    screen_days: frozenset[int]
    convert_from: int
    negotiate_from: int
    schedule: dict[int, tuple[str, ...]]
    cs: tuple[float, ...]
    om: tuple[float, ...]
    knobs: dict[str, Any]
    capacity: dict[str, int]


def _project(events: Mapping[int, tuple[str, ...]], schedule: Mapping[int, tuple[str, ...]], horizon: int):
    """Criteria strictness and outreach multiplier in force when day ``d``'s action runs, for every day."""
    cs, om = 1.0, 1.0
    cs_days, om_days = [], []
    for day in range(horizon):
        if "seasonal_slowdown" in events.get(day, ()):
            om = max(0.5, om - 0.1)
        if day >= 1 and "protocol_amendment" in events.get(day - 1, ()):
            cs = min(1.4, cs + 0.05)
        cs_days.append(cs)
        om_days.append(om)
        chore = schedule.get(day, ("",))[0]
        if chore == "relax":
            cs = max(0.6, cs - 0.15)
        elif chore == "outreach":
            om = min(2.0, om + 0.2)
    return tuple(cs_days), tuple(om_days)


@functools.lru_cache(maxsize=64)
def task_facts(task_id: str, mode: str = "score", early_stop: bool = True) -> TaskFacts:
    """The :class:`TaskFacts` of a task (public or stage id) for a policy mode (cached). ``early_stop=False``
    gives the day plan of a policy that never sends ``stop_recruitment``."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    task = get_task(task_id)
    world = get_world(task.task_id)
    events = world.events
    horizon = task.max_steps
    base = task.base_task
    knobs = tuning(base, mode, full_length=horizon == get_task(base).max_steps)
    if not early_stop:
        knobs.update(NO_STOP_TUNING.get((base, mode), {}), stop_before_dropout=0)
    score = mode == "score"
    blocked = hold_days_of(events, horizon)
    dropout_days = scheduled_dropout_days(task.task_id)
    windows = curriculum_windows(task.task_id)
    curriculum = frozenset(d for s, e in windows for d in range(s, e + 1))

    back = knobs["enrol_after_dropout"]
    enrol_from = dropout_days[-back] if 0 < back <= len(dropout_days) else 0
    enrol_from = min(enrol_from, max(0, horizon - 8))
    back = knobs["stop_before_dropout"]
    stop_at = dropout_days[-back] - 1 if 0 < back <= len(dropout_days) else None
    if stop_at is not None and stop_at < enrol_from + 8:
        stop_at = None
    end = horizon if stop_at is None else stop_at
    inside = [d for d in dropout_days if enrol_from < d < end]
    bank_after = inside[-1] if knobs["bank"] and inside else None
    convert_from = max(0, enrol_from - 3)  # a recontact consent lasts 4 days
    screen_from = max(0, enrol_from - 4)  # a screening consent lasts 5 days
    if base == "hard_bench" and score:
        screen_days = set(curriculum) | set(range(max(0, enrol_from - 14), end))
    else:
        screen_days = set(range(screen_from, end))
    screen_days -= blocked

    schedule: dict[int, tuple[str, ...]] = {}

    def put(days, chore) -> int | None:
        for d in days:
            if 0 <= d < horizon and d not in schedule:
                schedule[d] = chore
                return d
        return None

    def prep(start: int, slack: float = 0.0) -> None:
        """Relax the criteria and raise the outreach (blocked days first) until the projection at ``start``
        meets the goals; with ``slack``, only act when a projection misses its goal by more than that."""
        if not 0 <= start < horizon:
            return
        cs_days, om_days = _project(events, schedule, horizon)
        if cs_days[start] <= knobs["cs_goal"] + slack + 1e-9 and om_days[start] >= knobs["om_goal"] - slack - 1e-9:
            return
        window = range(max(0, start - knobs["prep_days"]), start)
        pool = [d for d in window if d in blocked] + [d for d in window if d not in blocked]
        for _ in range(16):
            cs_days, om_days = _project(events, schedule, horizon)
            if cs_days[start] > knobs["cs_goal"] + 1e-9:
                chore = ("relax",)
            elif om_days[start] < knobs["om_goal"] - 1e-9:
                chore = ("outreach",)
            else:
                return
            if put(pool, chore) is None:
                return

    def maintain(start: int) -> None:
        """Keep the projections near their goals during a screening period (protocol amendments tighten the
        criteria, seasonal slowdowns cut the outreach)."""
        for day in range(start + 10, end, 10):
            prep(day, slack=0.1)

    holds = sorted(blocked)
    if base == "easy_bench":
        if score:
            put([0], ("plan", "screening"))
        start = knobs["prep_days"]
        prep(start)
        if score:
            chores = [d for d in holds if d >= 40] or list(range(horizon - 12, horizon - 2))
            for chore in (("summarize",), ("retrieve",), ("retrieve",), ("retrieve",)):
                put(chores, chore)
    elif base == "medium_bench":
        if score:
            put([0], ("plan", "recovery"))
            put([1], ("summarize",))
        start = screen_from
        prep(start)
        put(range(max(0, start - knobs["prep_days"] - 2), start), ("focus",))
    else:
        if score:
            put(holds[:1] or [0], ("summarize",))
            for _ in range(3):
                put(holds[1:] or list(range(1, horizon)), ("retrieve",))
            for s, _e in windows:
                prep(s)
                before = list(range(s - 1, max(-1, s - 8), -1))
                put([d for d in before if d in blocked] + before, ("plan", "screening"))
        start = max(0, enrol_from - 14) if score else screen_from
        prep(start)
        focus_days = [d for d in range(enrol_from - 12, enrol_from) if d in blocked] or range(enrol_from, horizon)
        put(focus_days, ("focus",))
    if knobs["maintain"]:
        maintain(start)
    cs, om = _project(events, schedule, horizon)
    return TaskFacts(
        task=task,
        base=base,
        mode=mode,
        horizon=horizon,
        blocked=blocked,
        dropout_days=dropout_days,
        curriculum=curriculum,
        reserve=BUDGET_RESERVE.get(base, 0.0) * task.budget + RESERVE_MARGIN if score else 0.0,
        enrol_from=enrol_from,
        early_stop=early_stop,
        stop_at=stop_at,
        bank_after=bank_after,
        screen_days=frozenset(screen_days),
        convert_from=convert_from,
        negotiate_from=max(0, enrol_from - knobs["negotiate_days"]),
        schedule=schedule,
        cs=cs,
        om=om,
        knobs=knobs,
        capacity={site.site_id: site.capacity_total for site in world.sites},
    )

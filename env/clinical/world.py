"""World generation: patients, sites and the event calendar of a task, built from its fixed world seed.

The draws follow the reference's exact call order on one ``random.Random(world_seed)`` per base task
(all patients, then all sites, then the calendar), so the worlds are bit-identical. A world does not
depend on the reset seed; stage tasks share their base task's world with the calendar cut at the horizon.
Worlds are immutable after construction and cached, so every environment instance shares them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from dataclasses import dataclass

from env.clinical.tasks import TaskSpec, get_task

EVENT_TYPES = (
    "patient_dropout",
    "site_delay",
    "regulatory_hold",
    "site_audit",
    "irb_delay",
    "consent_form_revision",
    "new_competitor_trial",
    "patient_complaint",
    "screening_backlog",
    "site_capacity_reduced",
    "protocol_amendment",
    "seasonal_slowdown",
)
_SITE_CONVERSION = (0.70, 0.55, 0.40, 0.60, 0.50)
_SITE_WAIT = (5.0, 3.0, 8.0, 4.0, 6.0)
_SITE_CAPACITY = (40, 30, 50, 35, 25)
_CALENDAR_DAYS = 180


def _clamp(x: float, lo: float, hi: float) -> float:
    return max(lo, min(hi, x))


@dataclass(frozen=True)
class Site:
    site_id: str
    conversion_rate: float
    avg_wait_days: float
    capacity_total: int
    retention_rate: float


@dataclass(frozen=True)
class World:
    """The static part of a task: patient attributes (as parallel tuples), sites, calendar, curriculum."""

    patient_ids: tuple[str, ...]
    ages: tuple[int, ...]
    eligibility: tuple[float, ...]
    dropout_risk: tuple[float, ...]
    willingness: tuple[float, ...]
    sites: tuple[Site, ...]
    events: dict[int, tuple[str, ...]]

    @property
    def n_patients(self) -> int:
        return len(self.patient_ids)


def generate_base_world(task: TaskSpec) -> World:
    """Draw a base task's world from ``random.Random(task.world_seed)`` in the reference's order."""
    rng = random.Random(task.world_seed)
    ids, ages, elig, drisk, will = [], [], [], [], []
    noise = task.patient_noise
    for i in range(task.n_patients):
        ages.append(rng.randint(18, 80))
        base_e = rng.uniform(0.30, 0.95)
        elig.append(round(_clamp(base_e + rng.gauss(0, noise), 0.05, 0.99), 3))
        base_d = rng.uniform(0.05, 0.55)
        drisk.append(round(_clamp(base_d + rng.gauss(0, noise * 0.5), 0.01, 0.90), 3))
        will.append(round(rng.uniform(0.20, 0.90), 3))
        ids.append(f"P-{1000 + i}")
    sites = []
    v = task.site_variance
    for i in range(task.n_sites):
        conv = round(_clamp(_SITE_CONVERSION[i % 5] + rng.gauss(0, v), 0.15, 0.95), 3)
        wait = round(max(1.0, _SITE_WAIT[i % 5] + rng.gauss(0, 3 * v)), 1)
        cap = max(10, int(_SITE_CAPACITY[i % 5] + rng.gauss(0, 10 * v)))
        retention = round(_clamp(0.85 + rng.gauss(0, v), 0.50, 0.98), 3)
        sites.append(Site(f"site_{chr(ord('A') + i)}", conv, wait, cap, retention))
    events: dict[int, tuple[str, ...]] = {}
    for day in range(_CALENDAR_DAYS):
        todays = tuple(ev for ev in EVENT_TYPES if rng.random() < task.event_density)
        if todays:
            events[day] = todays
    return World(tuple(ids), tuple(ages), tuple(elig), tuple(drisk), tuple(will), tuple(sites), events)


@functools.cache
def get_world(task_id: str) -> World:
    """The (cached) world of any task id; stage tasks drop calendar days at or beyond their horizon."""
    task = get_task(task_id)
    base = _base_world(task.base_task)
    if task.max_steps >= _CALENDAR_DAYS:
        return base
    events = {day: evs for day, evs in base.events.items() if day < task.max_steps}
    return World(
        base.patient_ids, base.ages, base.eligibility, base.dropout_risk, base.willingness, base.sites, events
    )


def hold_days_of(events: dict[int, tuple[str, ...]], horizon: int) -> frozenset[int]:
    """Days on which a regulatory hold is in force when that day's action runs (screening is blocked).

    Calendar events fire at the start of a step, before the action, and the hold counter goes down at its end
    (spec 6.1, 6.3): a ``regulatory_hold`` on day d blocks d and d+1, an ``irb_delay`` d, d+1 and d+2.
    """
    hold, out = 0, set()
    for day in range(horizon):
        for event in events.get(day, ()):
            if event == "regulatory_hold":
                hold = max(hold, 2)
            elif event == "irb_delay":
                hold = max(hold, 3)
        if hold > 0:
            out.add(day)
            hold -= 1
    return frozenset(out)


@functools.cache
def hold_days(task_id: str) -> frozenset[int]:
    """:func:`hold_days_of` for a task's fixed calendar (the same for every reset seed)."""
    return hold_days_of(get_world(task_id).events, get_task(task_id).max_steps)


@functools.cache
def scheduled_dropout_days(task_id: str) -> tuple[int, ...]:
    """Days of a task's fixed calendar with a ``patient_dropout`` event (each deletes an enrolled patient).

    The world's calendar holds only days inside the task's horizon (:func:`get_world`), so none is filtered here.
    """
    events = get_world(task_id).events
    return tuple(day for day in sorted(events) if "patient_dropout" in events[day])


def curriculum_windows(task_id: str) -> tuple[tuple[int, int], ...]:
    """A task's curriculum windows as ``(first, last)`` days, both in curriculum (spec 3.4); a stage task's windows
    are already clipped to its horizon (:func:`env.clinical.tasks.stage_task`)."""
    return tuple((start, start + duration) for start, duration in get_task(task_id).curriculum)


@functools.cache
def _base_world(base_task_id: str) -> World:
    return generate_base_world(get_task(base_task_id))


def world_trace(task_id: str) -> dict:
    """The world as the reference's trace dict (the shape its fingerprint is computed over)."""
    task = get_task(task_id)
    w = get_world(task_id)
    patients = [
        {
            "id": w.patient_ids[i],
            "age": w.ages[i],
            "eligibility_score": w.eligibility[i],
            "dropout_risk": w.dropout_risk[i],
            "willingness": w.willingness[i],
            "contacted": False,
            "screened": False,
            "eligible": False,
            "consented": False,
            "enrolled": False,
            "dropped": False,
            "site_assigned": None,
        }
        for i in range(w.n_patients)
    ]
    sites = {
        s.site_id: {
            "conversion_rate": s.conversion_rate,
            "avg_wait_days": s.avg_wait_days,
            "capacity_total": s.capacity_total,
            "capacity_remaining": s.capacity_total,
            "retention_rate": s.retention_rate,
        }
        for s in w.sites
    }
    return {
        "budget": task.budget,
        "target_enrollment": task.target,
        "deadline_days": task.max_steps,
        "screening_cost": task.screening_cost,
        "enrollment_cost": task.enrollment_cost,
        "recontact_cost": task.recontact_cost,
        "strategy_cost": task.strategy_cost,
        "dropout_base_rate": task.dropout_base_rate,
        "uncertainty_growth": task.uncertainty_growth,
        "world_type": task.world_type,
        "patients": patients,
        "sites": sites,
        "events": {day: list(evs) for day, evs in w.events.items()},
        "curriculum": [{"start_day": s, "duration": d, "type": "easy_pool_reset"} for s, d in task.curriculum],
    }


def world_fingerprint(task_id: str) -> str:
    """``sha256(json.dumps(trace, sort_keys=True))[:16]``, as published for the reference's worlds."""
    return hashlib.sha256(json.dumps(world_trace(task_id), sort_keys=True).encode()).hexdigest()[:16]

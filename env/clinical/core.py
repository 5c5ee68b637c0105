"""The clinical-trial recruitment simulator: a Gymnasium-style environment, bit-exact with the reference.

One step is one simulated day. Each step runs, in order: curriculum relief, the day's calendar events,
due delayed effects, the agent's action, backlog drain, natural dropout, uncertainty growth, milestones,
derived-state refresh, plan follow-through and the shaped reward (:mod:`env.clinical.reward`). On the terminal step
the task's grader (:mod:`env.clinical.graders`) turns the final observation and the history into ``final_score``.

Reward: the reference's shaped per-step reward, rounded to 4 decimals (see :func:`env.clinical.reward.step_reward`).

Invalid actions: a schema violation (unknown ``action_type``, wrong types, ``confidence`` outside [0, 1])
raises ``ValueError`` naming the field and consumes nothing. A semantic failure (unknown patient, no
budget, regulatory hold, ...) follows the reference: the day is consumed, the action has no effect (some
still charge money, as in the reference), no extra penalty is given, and ``info["last_action_error"]``
holds the error code.

All randomness of a step comes from one ``random.Random`` (seeded by ``reset``) drawn in the reference's
order: calendar ``choice`` calls, then the action's draws, then one natural-dropout draw per enrolled
patient. ``snapshot()``/``restore()`` capture that RNG too, so a restored episode continues exactly.
"""

from __future__ import annotations

import functools
import operator
import random
from bisect import bisect_left, bisect_right, insort
from itertools import chain
from typing import Any

from env.clinical.graders import grade, grade_terms
from env.clinical.models import HYPOTHESES, PLAN_PHASES, validate_action
from env.clinical.reward import HYPOTHESIS_WORLD, progress_bonus, step_reward, token_penalty
from env.clinical.tasks import TaskSpec, get_task
from env.clinical.world import World, get_world

Observation = dict[str, Any]
Info = dict[str, Any]

DEFAULT_TOKEN_COST = {
    "screen_patient": 18,
    "recontact": 20,
    "allocate_to_site": 22,
    "adjust_strategy": 26,
    "plan_next_phase": 55,
    "summarize_and_index": 42,
    "retrieve_relevant_history": 36,
    "stop_recruitment": 12,
}
PHASE_SUMMARIES = {
    "screening": "Screen high-priority patients to refill the funnel.",
    "conversion": "Recontact eligible patients before their consent windows close.",
    "allocation": "Allocate consented patients to the best available site.",
    "retention": "Protect enrolled patients at risk of dropping out.",
    "recovery": "Recover from holds and bottlenecks with a strategy change.",
}
PHASE_ACTION = {
    "screening": "screen_patient",
    "conversion": "recontact",
    "allocation": "allocate_to_site",
    "retention": "recontact",
    "recovery": "adjust_strategy",
}
RECOVERY_STRATEGY_PREFIXES = ("tighten_criteria", "negotiate_site_", "focus_site_", "increase_outreach")
MEMORY_TAGS = ("screening", "conversion", "allocation", "retention", "recovery", "site", "dropout", "milestone")
HIGH_PRIORITY = 0.35  # an available patient at or above this priority counts as a high-priority candidate
MILESTONES = (("25pct", 0.25, 0.02), ("50pct", 0.5, 0.03), ("75pct", 0.75, 0.04), ("100pct", 1.0, 0.06))
NO_PLAN_CHECK = frozenset({"plan_next_phase", "summarize_and_index", "retrieve_relevant_history", "stop_recruitment"})
KNOWN_FIXES = frozenset({"hide_world_type", "screen_failures_leave_recontact", "no_realloc_after_dropout"})
# Above any day and any negated priority (a bisect probe, and the due day of an empty queue).
_INF = float("inf")
_UNKNOWN = -1  # a site index not computed yet
_DUE_DAY = operator.itemgetter(0)  # of a delayed-effect queue item (due day, kind, argument)


class _Rounded(dict):
    """``round(x, ndigits)`` for floats, memoised: ``R3[x] == round(x, 3)``, bit for bit.

    ``round`` with digits costs about half a microsecond (it goes through the decimal digits of ``x``) and a
    step rounds a few dozen values, most of them seen before (budgets, uncertainty levels, potentials), so a
    dict lookup pays. Zeros are not stored: ``0.0`` and ``-0.0`` are one dict key but round to different
    signs. Only floats may be looked up (``1`` and ``1.0`` are one key too). The memo is emptied when full.
    """

    def __init__(self, ndigits: int, limit: int = 1 << 16) -> None:
        super().__init__()
        self.ndigits = ndigits
        self.limit = limit

    def __missing__(self, x: float) -> float:
        if not x:
            return x  # a zero rounds to itself, sign included
        value = round(x, self.ndigits)
        if len(self) >= self.limit:
            self.clear()
        self[x] = value
        return value


R2, R3, R4 = _Rounded(2), _Rounded(3), _Rounded(4)


def _active_milestone(progress: float) -> str:
    """The first milestone above ``progress`` (``"complete"`` past the last)."""
    for name, threshold, _ in MILESTONES:
        if threshold > progress:
            return name
    return "complete"


def _accuracy(hypothesis: str, world_type: str) -> float:
    """The observation's ``hypothesis_accuracy`` of ``hypothesis`` in a world of ``world_type``."""
    if HYPOTHESIS_WORLD.get(hypothesis) == world_type:
        return 1.0
    if hypothesis == "unknown":
        return 0.0
    if hypothesis == "confounding" and world_type in ("noise", "dropout"):
        return 0.3
    return 0.1


# The per-step code clamps with conditional expressions, written to give exactly what the builtins give
# (``min(hi, x)`` is ``x if x < hi else hi``): in Python 3.11 each min() or max() call parses keyword arguments
# and costs several times more than the comparison.
def _clamp01(x: float) -> float:
    """``max(0.0, min(1.0, x))``."""
    x = x if x < 1.0 else 1.0
    return x if x > 0.0 else 0.0


class EpisodeState:
    """Everything that changes during an episode. Patients are stored as parallel lists (fast to copy).

    Besides the patient lists, the state keeps sorted indexes so that no step scans all patients:
    ``available`` holds ``(-priority, i)`` of unscreened patients; ``recontact_keys`` holds
    ``(followup is None, followup or 0, -priority, i)`` and ``consented_keys`` ``(-priority, dropout_risk, i)``
    of the patients in ``active`` (screened, not enrolled, still in the pipeline; the consented ones for the
    second); ``enrolled_ids`` is the sorted list of enrolled patients who have not dropped out. Counters:
    ``active_eligible`` (eligible patients in ``active``), ``at_risk`` (enrolled with dropout risk >= 0.35),
    ``pressure_open`` (patients in ``pressure`` neither enrolled nor dropped), ``high_priority`` (available
    patients with priority >= 0.35). ``queue_next`` is the earliest due day in ``queue``, ``top_cards`` the
    cards of the first five available patients (``None`` until needed again); ``site_cards`` holds each site's
    observation entry (renewed when the site changes, with ``avg_wait`` and ``low_capacity_sites``, the number
    of sites low on capacity) and ``best_site`` the index
    :meth:`ClinicalRecruitmentEnv._best_site` found (``_UNKNOWN`` until it is needed again).
    """

    __slots__ = (
        "t", "done", "total_reward", "history", "budget", "U", "enrolled", "funnel", "backlog", "om", "cs",
        "focused_site", "switches", "last_hypothesis", "last_confidence", "milestones", "next_milestone",
        "constraints", "queue", "memory", "memory_view", "plan", "retrieved", "hindsight", "negotiation",
        "oversight_alerts", "pareto_best", "tokens_used", "token_eff", "recent_dropouts", "recent_tags", "will",
        "prio", "screened", "eligible", "consented", "is_enrolled", "dropped", "site_assigned", "followup",
        "attempts", "available", "active", "recontact_keys", "consented_keys", "active_eligible", "enrolled_ids",
        "at_risk", "pressure", "pressure_open", "dropped_count", "site_conv", "site_wait", "site_cap", "site_cards",
        "avg_wait", "low_capacity_sites", "best_site", "top_cards", "high_priority", "queue_next", "potential",
        "summary", "active_milestone", "uncertainty_components", "followthroughs", "memory_hits",
    )  # fmt: skip

    def clone(self) -> EpisodeState:
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
    "consented_keys", "enrolled_ids", "site_conv", "site_wait", "site_cap", "site_cards",
)  # fmt: skip
_DICTS = ("funnel", "milestones", "constraints", "memory")
_SETS = ("active", "pressure")
_SCALARS = tuple(n for n in EpisodeState.__slots__ if n not in _LISTS + _DICTS + _SETS + ("negotiation", "plan"))


@functools.cache
def _initial_priorities(task_id: str) -> tuple[tuple[float, ...], tuple[tuple[float, int], ...], int]:
    """Every patient's priority at reset, the sorted ``available`` index built from it and its number of high
    priorities (all fixed by the world)."""
    world = get_world(task_id)
    elig, will, drisk = world.eligibility, world.willingness, world.dropout_risk
    prio = tuple(round(elig[i] * will[i] * (1 - drisk[i]), 3) for i in range(world.n_patients))
    return prio, tuple(sorted((-p, i) for i, p in enumerate(prio))), sum(1 for p in prio if p >= HIGH_PRIORITY)


@functools.cache
def _patient_cards(task_id: str) -> tuple[dict[str, Any], ...]:
    """Every patient's ``available_patients`` entry (static; observations get copies)."""
    world = get_world(task_id)
    return tuple(
        {"id": pid, "age": age, "eligibility_score": elig, "dropout_risk": drisk}
        for pid, age, elig, drisk in zip(
            world.patient_ids, world.ages, world.eligibility, world.dropout_risk, strict=True
        )
    )


class EnvSnapshot:
    """An opaque, reusable copy of an episode (state and step RNG). Restore it any number of times."""

    __slots__ = ("task_id", "state", "rng_state")

    def __init__(self, task_id: str, state: EpisodeState, rng_state: tuple) -> None:
        self.task_id = task_id
        self.state = state
        self.rng_state = rng_state


class ClinicalRecruitmentEnv:
    """Adaptive clinical-trial recruitment, 180 simulated days (fewer for stage tasks).

    Contract (Gymnasium-style):
        ``obs, info = env.reset(seed=None, options=None)``: ``options={"task": id}`` switches task. The seed
        only seeds the step RNG (``None`` means the task's default seed); the world is fixed per task.
        ``obs, reward, terminated, truncated, info = env.step(action)``: ``action`` is a dict with the
        reference's fields or an :class:`env.clinical.models.Action`. ``terminated`` when the agent stops, the budget
        hits 0 or the target is reached; ``truncated`` when the step limit ends the episode. ``info`` has
        ``step``, ``reward_breakdown``, ``last_action_error`` and, on the last step, ``hindsight_summary``,
        ``final_score`` and ``grader_task``.
        ``snap = env.snapshot()`` / ``env.restore(snap)`` copy and restore the whole episode, RNG included.
        ``env.state()`` is the reference's ``State`` as a dict.

    Args:
        task: a task id from :data:`env.TASKS` or a stage id such as ``"hard_bench_stage_30"``.
        fixes: opt-in corrections of reference quirks, all off by default (the published numbers depend on
            the quirks): ``"hide_world_type"`` (the observation no longer leaks the ground-truth world type or
            the hypothesis accuracy), ``"screen_failures_leave_recontact"`` (screen-failed patients leave
            ``recontact_candidates``), ``"no_realloc_after_dropout"`` (allocating a patient who dropped out
            fails with ``patient_dropped``).
    """

    def __init__(self, task: str = "easy_bench", fixes: tuple[str, ...] | frozenset[str] = ()) -> None:
        unknown = set(fixes) - KNOWN_FIXES
        if unknown:
            raise ValueError(f"Unknown fixes {sorted(unknown)}; known: {sorted(KNOWN_FIXES)}")
        self.fixes = frozenset(fixes)
        self._set_task(task)
        self.rng = random.Random()
        self.s: EpisodeState | None = None

    # ------------------------------------------------------------------ public API
    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[Observation, Info]:
        if options and options.get("task") is not None:
            self._set_task(options["task"])
        task, world = self.task, self.world
        self.seed = seed
        self.rng = random.Random(task.default_seed if seed is None else seed)
        s = EpisodeState.__new__(EpisodeState)
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
        s.oversight_alerts, s.pareto_best = 0, (-_INF,)  # below any (enrolled, budget, efficiency) point
        s.tokens_used, s.token_eff, s.recent_dropouts, s.recent_tags = 0, 1.0, [], []
        s.next_milestone, s.active_milestone, s.memory_view = MILESTONES[0][1], MILESTONES[0][0], {"entries": 0}
        n = world.n_patients
        prio, available, s.high_priority = _initial_priorities(task.task_id)
        s.will, s.prio, s.available = list(world.willingness), list(prio), list(available)
        s.screened, s.eligible, s.consented = [False] * n, [False] * n, [False] * n
        s.is_enrolled, s.dropped, s.site_assigned = [False] * n, [False] * n, [None] * n
        s.followup, s.attempts = [None] * n, [0] * n
        s.active, s.recontact_keys, s.consented_keys, s.active_eligible = set(), [], [], 0
        s.enrolled_ids, s.at_risk, s.pressure, s.pressure_open, s.dropped_count = [], 0, set(), 0, 0
        s.site_conv = [site.conversion_rate for site in world.sites]
        s.site_wait = [site.avg_wait_days for site in world.sites]
        s.site_cap = [site.capacity_total for site in world.sites]
        s.best_site, s.top_cards, s.queue_next = _UNKNOWN, None, _INF
        s.potential, s.followthroughs, s.memory_hits = 0.0, 0, 0
        self.s = s
        s.site_cards = [self._site_card(k) for k in range(len(world.sites))]
        self._site_aggregates()
        self._refresh(final=True)
        return self._observation(), {"task": task.task_id, "difficulty": task.difficulty}

    def step(self, action: Any) -> tuple[Observation, float, bool, bool, Info]:
        s = self.s
        if s is None:
            raise RuntimeError("Call reset() before step().")
        if s.done:
            raise RuntimeError("Episode is done. Call reset() first.")
        a = validate_action(action)
        task = self.task
        t = s.t
        kind = a["action_type"]
        potential_before = s.potential
        confidence = a["confidence"]

        hypothesis = a["hypothesis"] or "unknown"
        if s.history and s.last_hypothesis != hypothesis:
            s.switches += 1
        s.last_hypothesis, s.last_confidence = hypothesis, confidence

        token_cost = max(0, int(a["token_cost"])) if a["token_cost"] is not None else DEFAULT_TOKEN_COST[kind]
        s.tokens_used += token_cost

        in_curriculum = t in self.curriculum_days
        if in_curriculum:
            u = s.U - 0.15
            s.U = u if u > 0.0 else 0.0

        fx = _StepEffects()
        events = self.world.events.get(t)
        if events:
            for event in events:
                self._calendar_event(event, fx)
        self._fire_due_effects(fx)

        error = self._apply_action(a, fx)

        s.backlog = s.backlog - 2 if s.backlog > 2 else 0
        if s.enrolled_ids:
            # One draw per enrolled patient in index order; the patients are dropped after all the draws, which
            # changes nothing (a dropout does not move the threshold) but keeps the list still while it is read.
            threshold = task.dropout_base_rate + 0.05 * s.U
            draw, drisk = self.rng.random, self.world.dropout_risk
            dropouts = [i for i in s.enrolled_ids if draw() < threshold * drisk[i] * 0.1]
            for i in dropouts:
                self._drop_enrolled(i, fx)
        u = s.U + task.uncertainty_growth + 0.01 * s.constraints["competitor_pressure"]
        s.U = u if u < 1.0 else 1.0

        progress = s.enrolled / task.target
        milestone_bonus = 0.0
        # Milestones are reached in order, so none is new below the next one's threshold.
        if progress >= s.next_milestone:
            s.next_milestone = _INF
            for name, threshold, bonus in MILESTONES:
                if progress >= threshold:
                    if not s.milestones[name]:
                        s.milestones[name] = True
                        milestone_bonus += bonus
                elif s.next_milestone == _INF:
                    s.next_milestone = threshold
        s.active_milestone = _active_milestone(progress)

        self._refresh(final=False)
        potential_delta = R4[s.potential - potential_before] if s.potential != potential_before else 0.0

        plan_followthrough = False
        if s.plan is not None and kind not in NO_PLAN_CHECK:
            phase = s.plan["target_phase"]
            strategy = a["strategy_change"]
            if phase == "recovery" and strategy:
                plan_followthrough = strategy.startswith(RECOVERY_STRATEGY_PREFIXES)
            else:
                plan_followthrough = PHASE_ACTION[phase] == kind
            if plan_followthrough:
                fx.plan_bonus += 0.015
                s.plan["last_followthrough_step"] = t
            else:
                fx.plan_bonus -= 0.005

        hypothesis_correct = HYPOTHESIS_WORLD.get(hypothesis) == task.world_type
        reward = step_reward(
            screen_success=fx.screen_success,
            enrolled_new=fx.enrolled,
            dropout=fx.dropout,
            budget=s.budget,
            initial_budget=task.budget,
            enrolled=s.enrolled,
            target=task.target,
            t=t,
            max_steps=task.max_steps,
            in_curriculum=in_curriculum,
            uncertainty=s.U,
            milestone_bonus=milestone_bonus,
            action_type=kind,
            plan_bonus=fx.plan_bonus,
            memory_bonus=fx.memory_bonus,
            potential_delta=potential_delta,
            token_cost=token_cost,
            token_efficiency=s.token_eff,
            memory_hit=fx.memory_hit,
            hypothesis_correct=hypothesis_correct,
            switches=s.switches,
            confidence=confidence,
        )
        s.total_reward += reward
        productive = fx.enrolled or fx.screen_success or fx.memory_hit
        penalty = token_penalty(token_cost)
        token_bonus = R4[progress_bonus(s.token_eff) - penalty] if productive else -R4[penalty]
        rounded = R4[reward]
        # Most steps have no milestone or memory bonus: zeros skip the memo (they round to themselves).
        milestone_bonus = R3[milestone_bonus] if milestone_bonus else milestone_bonus
        plan_bonus = R3[fx.plan_bonus] if fx.plan_bonus else fx.plan_bonus
        memory_bonus = R3[fx.memory_bonus] if fx.memory_bonus else fx.memory_bonus
        budget = R2[s.budget]
        s.history.append(
            {
                "step": t,
                "action": kind,
                "patient_id": a["patient_id"],
                "site_id": a["site_id"],
                "strategy": a["strategy_change"],
                "hypothesis": hypothesis,
                "confidence": R3[confidence],
                "plan_id": a["plan_id"],
                "plan_target_phase": a["target_phase"],
                "memory_key": a["memory_key"],
                "memory_query": a["memory_query"],
                "enrolled": s.enrolled,
                "budget": budget,
                "reward": rounded,
                "dropout": fx.dropout,
                "screen_success": fx.screen_success,
                "curriculum": in_curriculum,
                "milestone_bonus": milestone_bonus,
                "plan_bonus": plan_bonus,
                "memory_bonus": memory_bonus,
                "plan_followthrough": plan_followthrough,
                "memory_hit": fx.memory_hit,
                "token_cost": token_cost,
                "token_bonus": token_bonus,
                "token_efficiency_score": s.token_eff,
                "milestone_potential": s.potential,
                "milestone_potential_delta": potential_delta,
                "active_milestone": s.active_milestone,
                "delayed_effects_triggered": fx.delayed,
                "error": error,
            }
        )
        # The observation's recent_events lists these tags of the last five history entries.
        if fx.dropout or fx.delayed or milestone_bonus > 0 or error:
            tags = []
            if fx.dropout:
                tags.append("patient_dropout")
            if fx.delayed:
                tags.append("delayed_effect")
            if milestone_bonus > 0:
                tags.append("enrollment_milestone")
            if error:
                tags.append("error:" + error)
            s.recent_tags.append(tuple(tags))
        else:
            s.recent_tags.append(())
        if len(s.recent_tags) > 5:
            del s.recent_tags[0]
        s.followthroughs += plan_followthrough
        s.memory_hits += fx.memory_hit

        c = s.constraints
        if c["regulatory_hold_days"] > 0:
            c["regulatory_hold_days"] -= 1
        # round(0.0, 3) is 0.0: a pressure at zero stays there without rounding.
        if c["competitor_pressure"]:
            x = c["competitor_pressure"] - 0.01
            c["competitor_pressure"] = R3[x] if x > 0.0 else 0.0
        if c["sentiment_pressure"]:
            x = c["sentiment_pressure"] - 0.01
            c["sentiment_pressure"] = R3[x] if x > 0.0 else 0.0

        s.t = t + 1
        stopped = fx.stopped
        terminated = stopped or s.budget <= 0 or s.enrolled >= task.target
        truncated = not terminated and s.t >= task.max_steps
        s.done = terminated or truncated
        self._refresh(final=True)
        if s.done:
            s.hindsight = self._hindsight()
        obs = self._observation()
        breakdown = {
            "total": rounded,
            "screen_success": fx.screen_success,
            "enrolled_new": fx.enrolled,
            "dropout": fx.dropout,
            "in_curriculum": in_curriculum,
            "milestone_bonus": milestone_bonus,
            "plan_bonus": plan_bonus,
            "memory_bonus": memory_bonus,
            "token_cost": token_cost,
            "token_bonus": token_bonus,
            "milestone_potential_delta": potential_delta,
            "delayed_effects_triggered": fx.delayed,
        }
        info: Info = {"step": s.t, "reward_breakdown": breakdown, "last_action_error": error}
        if s.done:
            info["hindsight_summary"] = dict(s.hindsight)
            info["final_score"] = max(0.001, min(0.999, self._grade(obs)))
            info["grader_task"] = task.base_task
        return obs, rounded, terminated, truncated, info

    def snapshot(self) -> EnvSnapshot:
        """A copy of the whole episode (state and step RNG) that :meth:`restore` can return to."""
        if self.s is None:
            raise RuntimeError("Call reset() before snapshot().")
        return EnvSnapshot(self.task.task_id, self.s.clone(), self.rng.getstate())

    def restore(self, snap: EnvSnapshot) -> None:
        """Return to ``snap`` (taken from any environment of the same code); the snapshot stays reusable."""
        if not isinstance(snap, EnvSnapshot):
            raise TypeError(f"restore() takes an EnvSnapshot, got {type(snap).__name__}")
        if snap.task_id != self.task.task_id:
            self._set_task(snap.task_id)
        self.s = snap.state.clone()
        self.rng.setstate(snap.rng_state)

    def reseed(self, seed: int) -> None:
        """Re-seed the step RNG (e.g. every branch of a group continues with the same random stream)."""
        self.rng.seed(seed)

    @property
    def done(self) -> bool:
        return self.s is not None and self.s.done

    @property
    def history(self) -> list[dict[str, Any]]:
        """The per-step history entries the graders read (do not mutate)."""
        return self.s.history if self.s is not None else []

    def state(self) -> dict[str, Any]:
        """The reference's ``State`` model as a dict (history limited to the last 10 entries)."""
        s, task = self._require_state(), self.task
        return {
            "task": task.task_id,
            "step": s.t,
            "max_steps": task.max_steps,
            "time_to_deadline_days": max(0, task.max_steps - s.t),
            "done": s.done,
            "enrolled_so_far": s.enrolled,
            "target_enrollment": task.target,
            "initial_budget": round(task.budget, 2),
            "budget_remaining": round(s.budget, 2),
            "total_reward": round(s.total_reward, 4),
            "history": [dict(h) for h in s.history[-10:]],
            "milestones": dict(s.milestones),
            "active_constraints": dict(s.constraints),
            "delayed_effects_pending": len(s.queue),
            "uncertainty_components": dict(s.uncertainty_components),
            "current_plan": self._plan_view(),
            "indexed_memory_summary": self._memory_summary(),
            "retrieved_memory_context": s.retrieved,
            "milestone_potential": s.potential,
            "active_milestone": s.active_milestone,
            "hindsight_summary": dict(s.hindsight) if s.hindsight else {},
            "token_budget_remaining": max(0, task.token_budget - s.tokens_used),
            "token_usage_so_far": s.tokens_used,
            "token_efficiency_score": s.token_eff,
        }

    def final_score(self) -> float | None:
        """The grader's score once the episode is over, else ``None``."""
        s = self._require_state()
        if not s.done:
            return None
        return self._grade(self._observation())

    def grade_terms(self) -> dict[str, float] | None:
        """The weighted parts of the final grade (:func:`env.clinical.graders.grade_terms`); episode over only."""
        s = self._require_state()
        if not s.done:
            return None
        return grade_terms(self.task.base_task, self._graded(self._observation()), s.history)

    def _grade(self, obs: Observation) -> float:
        return grade(self.task.base_task, self._graded(obs), self.s.history)

    def _graded(self, obs: Observation) -> Observation:
        # The grader scores hypotheses against the true world type, even when the observation hides it.
        return {**obs, "world_type": self.task.world_type}

    # ------------------------------------------------------------------ internals
    def _set_task(self, task_id: str) -> None:
        self.task: TaskSpec = get_task(task_id)
        self.world: World = get_world(self.task.task_id)
        self.site_ids = [site.site_id for site in self.world.sites]
        self.site_index = {sid: k for k, sid in enumerate(self.site_ids)}
        self.patient_index = {pid: i for i, pid in enumerate(self.world.patient_ids)}
        self.patient_cards = _patient_cards(self.task.task_id)
        self.initial_budget = round(self.task.budget, 2)
        self.hide_world_type = "hide_world_type" in self.fixes
        # The observation's hypothesis_accuracy of each named hypothesis (any other string scores 0.1).
        self.accuracy = {hypothesis: _accuracy(hypothesis, self.task.world_type) for hypothesis in HYPOTHESES}
        self.curriculum_days = frozenset(
            day for start, duration in self.task.curriculum for day in range(start, start + duration + 1)
        )
        # A site counts as low on capacity at or below this many places (the refresh's site_bottleneck).
        self.low_capacity = [max(2, int(0.1 * site.capacity_total)) for site in self.world.sites]
        self.s = None

    def _require_state(self) -> EpisodeState:
        if self.s is None:
            raise RuntimeError("Call reset() first.")
        return self.s

    def _schedule(self, kind: str, delay: int, arg: Any = None) -> None:
        s = self.s
        due = s.t + max(1, delay)
        s.queue.append((due, kind, arg))
        if due < s.queue_next:
            s.queue_next = due

    # ------------------------------------------------------------------ patient indexes
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

    def _drop_enrolled(self, i: int, fx: _StepEffects) -> None:
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

    def _calendar_event(self, event: str, fx: _StepEffects) -> None:
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

    def _fire_due_effects(self, fx: _StepEffects) -> None:
        s = self.s
        t = s.t
        if s.queue_next > t:
            return
        due = [e for e in s.queue if e[0] <= t]
        s.queue = [e for e in s.queue if e[0] > t]
        s.queue_next = min(map(_DUE_DAY, s.queue)) if s.queue else _INF  # the effects below may lower it
        for _, kind, arg in due:
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

    # ------------------------------------------------------------------ actions
    def _apply_action(self, a: dict, fx: _StepEffects) -> str | None:
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

    def _screen(self, a: dict, fx: _StepEffects) -> str | None:
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

    def _recontact(self, a: dict, fx: _StepEffects) -> str | None:
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

    def _enrol(self, i: int, site: int | None, fx: _StepEffects) -> None:
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
        if s.best_site == _UNKNOWN:
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
        s.site_cards[k] = self._site_card(k)
        s.best_site = _UNKNOWN
        self._site_aggregates()

    def _site_aggregates(self) -> None:
        s = self.s
        s.avg_wait = sum(s.site_wait) / len(self.site_ids)
        s.low_capacity_sites = sum(map(operator.le, s.site_cap, self.low_capacity))  # at or below their low mark

    def _allocate(self, a: dict, fx: _StepEffects) -> str | None:
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
            s.best_site = _UNKNOWN  # the focused site scores higher
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

    def _plan(self, a: dict, fx: _StepEffects) -> str | None:
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

    def _retrieve(self, a: dict, fx: _StepEffects) -> str | None:
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

    # ------------------------------------------------------------------ derived state
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
        followup = bisect_right(s.recontact_keys, (False, t + 2, _INF))  # follow-up set, due by t + 2
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
        s.potential = R3[_clamp01(0.20 + 0.35 * progress + readiness + pace_bonus - penalties)]

        if s.active_milestone == "complete":
            s.plan = None
        else:
            self._maintain_plan(hold, consented, followup, eligible)

        followthrough_bonus = 0.01 * s.followthroughs + 0.015 * s.memory_hits
        followthrough_bonus = followthrough_bonus if followthrough_bonus < 0.18 else 0.18
        eff = 1 - 0.65 * s.tokens_used / task.token_budget + 0.25 * progress + followthrough_bonus
        s.token_eff = R3[_clamp01(eff)]

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
        ids, ages, drisk = world.patient_ids, world.ages, world.dropout_risk
        top = s.top_cards
        if top is None:
            cards = self.patient_cards
            top = s.top_cards = tuple(cards[i] for _, i in s.available[:5])
        available = list(map(dict.copy, top))
        followup, eligible, consented = s.followup, s.eligible, s.consented
        recontact = [
            {
                "id": ids[i],
                "age": ages[i],
                "eligible": eligible[i],
                "consented": consented[i],
                "dropout_risk": drisk[i],
                "followup_due_day": followup[i],
            }
            for _, _, _, i in s.recontact_keys[:5]
        ]
        allocation = [
            {"id": ids[i], "age": ages[i], "dropout_risk": drisk[i], "followup_due_day": followup[i]}
            for _, _, i in s.consented_keys[:5]
        ]
        sites = dict(zip(self.site_ids, map(dict.copy, s.site_cards), strict=True))
        recent = list(chain.from_iterable(s.recent_tags))
        recent.extend(world.events.get(t - 1 if t > 1 else 0, ())[:3])
        dropout_7d = self._dropout_rate_7d()
        U = s.U
        if dropout_7d > 0.3:
            driver = "patient dropout"
        elif U > 0.3:
            driver = "screening noise"
        elif len(s.site_conv) > 1 and max(s.site_conv) - min(s.site_conv) > 0.2:
            driver = "site-performance bias"
        else:
            driver = "possible confounding"
        if self.hide_world_type:
            world_type, accuracy = "hidden", 0.0
        else:
            world_type, accuracy = task.world_type, self.accuracy.get(s.last_hypothesis, 0.1)
        summary = s.summary
        allocate_gain = 0.35 * summary["consented_pending_allocation"]
        allocate_gain = R3[allocate_gain if allocate_gain < 1.0 else 1.0] if allocate_gain else 0.0
        recontact_gain = 0.25 * summary["followup_due"]
        recontact_gain = R3[recontact_gain if recontact_gain < 1.0 else 1.0] if recontact_gain else 0.0
        tokens_left = task.token_budget - s.tokens_used
        return {
            "timestamp": t,
            "budget_remaining": R2[s.budget],
            "time_to_deadline_days": task.max_steps - t if t < task.max_steps else 0,
            "enrolled_so_far": s.enrolled,
            "target_enrollment": task.target,
            "task_id": task.task_id,
            "max_steps": task.max_steps,
            "initial_budget": self.initial_budget,
            "current_funnel": s.funnel.copy(),
            "available_patients": available,
            "recontact_candidates": recontact,
            "allocation_candidates": allocation,
            "site_performance": sites,
            "recent_events": recent[-5:],
            "uncertainty_level": R3[U],
            "difficulty": task.difficulty,
            "dropout_rate_7d": dropout_7d,
            "screening_backlog": s.backlog,
            "causal_insight": (
                f"Dominant driver looks like {driver}; 7-day dropout rate {dropout_7d:.2f}, uncertainty {U:.2f}."
            ),
            "hypothesis_accuracy": accuracy,
            "world_type": world_type,
            "milestones": s.milestones.copy(),
            "active_constraints": s.constraints.copy(),
            "delayed_effects_pending": len(s.queue),
            "uncertainty_components": s.uncertainty_components.copy(),
            "patient_memory_summary": summary.copy(),
            "counterfactual_hint": self._counterfactual_hint(),
            "current_plan": self._plan_view(),
            "indexed_memory_summary": s.memory_view.copy(),
            "retrieved_memory_context": s.retrieved,
            "milestone_potential": s.potential,
            "active_milestone": s.active_milestone,
            "hindsight_available": s.done,
            "token_budget_remaining": tokens_left if tokens_left > 0 else 0,
            "token_usage_so_far": s.tokens_used,
            "token_efficiency_score": s.token_eff,
            "counterfactual_rollout": {
                "allocate_gain_estimate": allocate_gain,
                "recontact_gain_estimate": recontact_gain,
            },
        }


class _StepEffects:
    """What happened during one step (flags the reward and the history entry read)."""

    __slots__ = (
        "screen_success",
        "enrolled",
        "dropout",
        "memory_hit",
        "stopped",
        "plan_bonus",
        "memory_bonus",
        "delayed",
    )

    def __init__(self) -> None:
        self.screen_success = self.enrolled = self.dropout = self.memory_hit = self.stopped = False
        self.plan_bonus = self.memory_bonus = 0.0
        self.delayed = 0

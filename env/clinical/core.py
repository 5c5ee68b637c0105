"""The clinical-trial recruitment simulator: a Gymnasium-style environment, bit-exact with the reference.

One step is one simulated day. Each step runs, in order: curriculum relief, the day's calendar events,
due delayed effects (:mod:`env.clinical.events`), the agent's action (:mod:`env.clinical.actions`), backlog
drain, natural dropout, uncertainty growth, milestones, derived-state refresh (:mod:`env.clinical.derived`),
plan follow-through and the shaped reward (:mod:`env.clinical.reward`), then the observation
(:mod:`env.clinical.observation`). On the terminal step the task's grader (:mod:`env.clinical.graders`) turns the
final observation and the history into ``final_score``.

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

import random
from typing import Any

from env.clinical.actions import ActionHandlers
from env.clinical.derived import DerivedState
from env.clinical.events import Calendar
from env.clinical.graders import grade, grade_terms
from env.clinical.models import HYPOTHESES, validate_action
from env.clinical.observation import (
    Observation,
    ObservationBuilder,
    hypothesis_accuracy,
    observation_template,
    patient_cards,
)
from env.clinical.patients import PatientPipeline
from env.clinical.reward import HYPOTHESIS_WORLD, progress_bonus, step_reward, token_penalty
from env.clinical.rounding import R2, R3, R4
from env.clinical.sites import SiteBook
from env.clinical.state import EnvSnapshot, EpisodeState, StepEffects
from env.clinical.tasks import TaskSpec, get_task
from env.clinical.world import World, get_world

__all__ = ["KNOWN_FIXES", "ClinicalRecruitmentEnv", "EnvSnapshot", "EpisodeState", "Info", "Observation"]

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
PHASE_ACTION = {
    "screening": "screen_patient",
    "conversion": "recontact",
    "allocation": "allocate_to_site",
    "retention": "recontact",
    "recovery": "adjust_strategy",
}
RECOVERY_STRATEGY_PREFIXES = ("tighten_criteria", "negotiate_site_", "focus_site_", "increase_outreach")
NO_PLAN_CHECK = frozenset({"plan_next_phase", "summarize_and_index", "retrieve_relevant_history", "stop_recruitment"})
KNOWN_FIXES = frozenset({"hide_world_type", "screen_failures_leave_recontact", "no_realloc_after_dropout"})

# The fields of a history entry, in order (the graders read them).
HISTORY_FIELDS = (
    "step", "action", "patient_id", "site_id", "strategy", "hypothesis", "confidence", "plan_id",
    "plan_target_phase", "memory_key", "memory_query", "enrolled", "budget", "reward", "dropout",
    "screen_success", "curriculum", "milestone_bonus", "plan_bonus", "memory_bonus", "plan_followthrough",
    "memory_hit", "token_cost", "token_bonus", "token_efficiency_score", "milestone_potential",
    "milestone_potential_delta", "active_milestone", "delayed_effects_triggered", "error",
)  # fmt: skip
_HISTORY_TEMPLATE = dict.fromkeys(HISTORY_FIELDS)


class ClinicalRecruitmentEnv(ActionHandlers, Calendar, PatientPipeline, SiteBook, DerivedState, ObservationBuilder):
    """Adaptive clinical-trial recruitment, 180 simulated days (fewer for stage tasks).

    The day's pipeline is here (:meth:`step`); its parts are mixed in from one module each: the action
    handlers, the calendar and delayed effects, the patient pipeline, the sites, the derived state and the
    observation. The episode state is one :class:`env.clinical.state.EpisodeState` (``self.s``).

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
        Every observation and ``info`` is made of new containers (none is shared with the environment or with
        another observation), so a caller may change them without affecting the episode.

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
        task = self.task
        self.seed = seed
        self.rng = random.Random(task.default_seed if seed is None else seed)
        s = self.s = EpisodeState.initial(task, self.world)
        s.site_cards = {site_id: self._site_card(k) for k, site_id in enumerate(self.site_ids)}
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

        # The day: curriculum relief, calendar events and due effects, the action, then the end-of-day updates.
        in_curriculum = t in self.curriculum_days
        if in_curriculum:
            u = s.U - 0.15
            s.U = u if u > 0.0 else 0.0
        fx = StepEffects()
        events = self.world.events.get(t)
        if events:
            for event in events:
                self._calendar_event(event, fx)
        self._fire_due_effects(fx)
        error = self._apply_action(a, fx)
        self._end_of_day(fx)

        progress = s.enrolled / task.target
        milestone_bonus = self._update_milestones(progress)
        self._refresh(final=False)
        potential_delta = R4[s.potential - potential_before] if s.potential != potential_before else 0.0
        plan_followthrough = self._follow_plan(a, fx)

        reward = step_reward(  # by position, in the signature's order
            fx.screen_success,
            fx.enrolled,
            fx.dropout,
            s.budget,
            task.budget,
            s.enrolled,
            task.target,
            t,
            task.max_steps,
            in_curriculum,
            s.U,
            milestone_bonus,
            kind,
            fx.plan_bonus,
            fx.memory_bonus,
            potential_delta,
            token_cost,
            s.token_eff,
            fx.memory_hit,
            HYPOTHESIS_WORLD.get(hypothesis) == task.world_type,  # hypothesis_correct
            s.switches,
            confidence,
        )
        s.total_reward += reward
        productive = fx.enrolled or fx.screen_success or fx.memory_hit
        penalty = token_penalty(token_cost)
        token_bonus = R4[progress_bonus(s.token_eff) - penalty] if productive else -R4[penalty]
        rounded = round(reward, 4)  # rewards rarely repeat: the memo would only miss
        # Most steps have no milestone or memory bonus: zeros skip the memo (they round to themselves).
        milestone_bonus = R3[milestone_bonus] if milestone_bonus else milestone_bonus
        plan_bonus = R3[fx.plan_bonus] if fx.plan_bonus else fx.plan_bonus
        memory_bonus = R3[fx.memory_bonus] if fx.memory_bonus else fx.memory_bonus
        # A copy of the template and one store per field: cheaper than a dict display of 30 fields.
        entry = _HISTORY_TEMPLATE.copy()
        entry["step"] = t
        entry["action"] = kind
        entry["patient_id"] = a["patient_id"]
        entry["site_id"] = a["site_id"]
        entry["strategy"] = a["strategy_change"]
        entry["hypothesis"] = hypothesis
        entry["confidence"] = R3[confidence]
        entry["plan_id"] = a["plan_id"]
        entry["plan_target_phase"] = a["target_phase"]
        entry["memory_key"] = a["memory_key"]
        entry["memory_query"] = a["memory_query"]
        entry["enrolled"] = s.enrolled
        entry["budget"] = R2[s.budget]
        entry["reward"] = rounded
        entry["dropout"] = fx.dropout
        entry["screen_success"] = fx.screen_success
        entry["curriculum"] = in_curriculum
        entry["milestone_bonus"] = milestone_bonus
        entry["plan_bonus"] = plan_bonus
        entry["memory_bonus"] = memory_bonus
        entry["plan_followthrough"] = plan_followthrough
        entry["memory_hit"] = fx.memory_hit
        entry["token_cost"] = token_cost
        entry["token_bonus"] = token_bonus
        entry["token_efficiency_score"] = s.token_eff
        entry["milestone_potential"] = s.potential
        entry["milestone_potential_delta"] = potential_delta
        entry["active_milestone"] = s.active_milestone
        entry["delayed_effects_triggered"] = fx.delayed
        entry["error"] = error
        s.history.append(entry)
        self._remember_tags(fx, milestone_bonus, error)
        s.followthroughs += plan_followthrough
        s.memory_hits += fx.memory_hit
        self._ease_constraints()

        s.t = t + 1
        terminated = fx.stopped or s.budget <= 0 or s.enrolled >= task.target
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
        self.patient_cards = patient_cards(self.task.task_id)
        self.hide_world_type = "hide_world_type" in self.fixes
        self.observation_template = observation_template(self.task, self.hide_world_type)
        # The observation's hypothesis_accuracy of each named hypothesis (any other string scores 0.1).
        world_type = self.task.world_type
        self.accuracy = {hypothesis: hypothesis_accuracy(hypothesis, world_type) for hypothesis in HYPOTHESES}
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

    # ------------------------------------------------------------------ parts of a step
    def _end_of_day(self, fx: StepEffects) -> None:
        """After the action: backlog drain, natural dropout (one RNG draw per enrolled patient), uncertainty growth."""
        s, task = self.s, self.task
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

    def _follow_plan(self, a: dict, fx: StepEffects) -> bool:
        """Whether the action follows the current plan (a bonus if so, a small penalty if not)."""
        s = self.s
        kind = a["action_type"]
        if s.plan is None or kind in NO_PLAN_CHECK:
            return False
        phase = s.plan["target_phase"]
        strategy = a["strategy_change"]
        if phase == "recovery" and strategy:
            followed = strategy.startswith(RECOVERY_STRATEGY_PREFIXES)
        else:
            followed = PHASE_ACTION[phase] == kind
        if followed:
            fx.plan_bonus += 0.015
            s.plan["last_followthrough_step"] = s.t
        else:
            fx.plan_bonus -= 0.005
        return followed

    def _remember_tags(self, fx: StepEffects, milestone_bonus: float, error: str | None) -> None:
        """Keep the step's event tags: the observation's ``recent_events`` lists those of the last five steps."""
        s = self.s
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

    def _ease_constraints(self) -> None:
        """End of day: a regulatory hold counts down, competitor and sentiment pressure fade by 0.01."""
        c = self.s.constraints
        if c["regulatory_hold_days"] > 0:
            c["regulatory_hold_days"] -= 1
        # round(0.0, 3) is 0.0: a pressure at zero stays there without rounding.
        if c["competitor_pressure"]:
            x = c["competitor_pressure"] - 0.01
            c["competitor_pressure"] = R3[x] if x > 0.0 else 0.0
        if c["sentiment_pressure"]:
            x = c["sentiment_pressure"] - 0.01
            c["sentiment_pressure"] = R3[x] if x > 0.0 else 0.0

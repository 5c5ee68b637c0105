"""The lookahead expert :class:`ExpertPolicy`, its registration, :func:`play` and a command line.

On a decision day the planner plays the base policy's action and a few alternatives, each followed by the base policy
(:class:`env.clinical.heuristic.GraderHeuristic`), in re-seeded copies of the current state, and keeps the base
action unless an alternative is clearly better. Importing the module registers ``expert`` and ``expert_enrolment``
(objectives ``"score"`` and ``"enrolment"``), and, through :mod:`env.clinical.heuristic`, ``grader_heuristic`` and
``enrolment_heuristic``. ``python -m env.clinical.expert --seeds 0-19`` prints each policy's score and enrolment per
task (the figures are in docs/results.md).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from env.clinical.core import ClinicalRecruitmentEnv
from env.clinical.graders import grade
from env.clinical.heuristic import (
    MEMORY_KEY,
    Action,
    GraderHeuristic,
    Obs,
    best_site,
    consent_expiry,
    hypothesis_for,
    p_eligible,
    target_site,
)
from env.clinical.policies import register_policy
from env.clinical.task_facts import task_facts

# ---------------------------------------------------------------------------------------------- the planner
OBJECTIVES = ("score", "enrolment")


class ExpertPolicy:
    """Lookahead planner over environment snapshots, on top of a stateless base policy.

    A decision day is every ``every`` days and every day of the last ``tail`` days before the base policy's end. On
    one the planner scores every candidate action (:meth:`candidates`: the base action first, then up to
    ``candidates - 1`` alternatives: allocate the most urgent consent to the best site, recontact an eligible
    patient, screen the most eligible or the lowest-risk patient, stop, recall memory, negotiate) by playing it, then
    the base policy, in ``futures`` copies of the current state. A copy is played to the end of the episode, or for
    ``horizon`` days when that is set (then scored by the grader applied to the partial episode, a proxy). An
    alternative replaces the base action only when its mean paired gain over the base action is above ``margin``,
    above ``z`` standard errors, and at least ``support`` more futures favour it than disfavour it.

    Getting the state: the observation is not the state (hidden willingness, criteria strictness, outreach level, the
    delayed-effect queue...), so the planner reads the environment. Bind it once, ``expert =
    ExpertPolicy().bind(env)``, and call ``expert(obs, rng)`` as usual, or call ``expert.act(env, rng)``. The
    environment is only read (``env.snapshot()``, restored into the planner's own simulator), never stepped or
    changed. Unbound, or bound to an environment that is not at the observation's day or task, ``expert(obs, rng)``
    returns the base policy's action, so the registered ``expert`` is always a valid ``policy(obs, rng)``; callers
    that step an environment bind it to get the planner (:func:`play` does). The registered instances are module
    singletons: bind your own ``ExpertPolicy()`` when several callers share the process.

    Not clairvoyant: a snapshot carries the true step RNG, i.e. the future. The planner discards it and re-seeds
    every simulated day of every copy (``env.reseed``) from a seed drawn from its own ``rng`` (one per future) and
    the day number. The same seeds serve every candidate (common random numbers), and because each day has its own
    stream the candidates keep facing the same randomness on later days even after they consumed different numbers
    of draws.

    Args:
        objective: ``"score"``, the final grader score (``info["final_score"]``), or ``"enrolment"``, net patients
            enrolled when the episode ends (within the budget: the environment never lets it go negative). The
            grade pays for much besides patients, so the two disagree.
        candidates: actions compared on a decision day, the base action included (1 = the base policy).
        futures: re-seeded simulated futures per candidate.
        horizon: days simulated per future (``None``: to the end of the episode).
        margin: how much better (in objective units) an alternative must be; default 0.003 (score) or 0.25
            patients (enrolment).
        every: plan every ``every`` days (day 0, every, 2*every...) ...
        tail: ... and every day of the last ``tail`` days before the base policy's end (where outcomes are
            decided and playouts are short).
        z: required gain in standard errors of the paired differences.
        support: required (#futures favouring - #futures disfavouring); default ``max(1, futures // 3)``.
        early_stop: let the base policy and the planner use ``stop_recruitment`` (see :class:`GraderHeuristic`).
        base: the continuation policy (default: :class:`GraderHeuristic` in the objective's mode); it must be
            a function of the observation only, since it continues from restored snapshots.
        seed: seeds the planner's own RNG, used when ``__call__``/``act`` get ``rng=None``.

    Attributes:
        stats: counts of decision days, deviations from the base action and simulated steps.
        log: set it to a list to record ``(day, base action, chosen action, estimated gain)`` per deviation.
    """

    def __init__(
        self,
        objective: str = "score",
        *,
        candidates: int = 5,
        futures: int = 8,
        horizon: int | None = None,
        margin: float | None = None,
        every: int = 60,
        tail: int = 20,
        z: float = 1.5,
        support: int | None = None,
        early_stop: bool = True,
        base: Callable[[Obs, random.Random], Action] | None = None,
        seed: int = 0,
    ) -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        if candidates < 1 or futures < 1 or every < 1 or tail < 0 or (horizon is not None and horizon < 1):
            raise ValueError("candidates, futures, every and horizon must be >= 1 and tail >= 0")
        self.objective = objective
        self.n_candidates = candidates
        self.futures = futures
        self.horizon = horizon
        self.margin = (0.003 if objective == "score" else 0.25) if margin is None else margin
        self.every = every
        self.tail = tail
        self.base = base or GraderHeuristic("score" if objective == "score" else "enrolment", early_stop=early_stop)
        self.stop = early_stop
        self.rng = random.Random(seed)
        self.env: ClinicalRecruitmentEnv | None = None
        self._sims: dict[tuple[str, frozenset[str]], ClinicalRecruitmentEnv] = {}
        self.z = z
        self.support = max(1, futures // 3) if support is None else support
        self.log: list | None = None
        self.stats = {"decisions": 0, "deviations": 0, "simulated_steps": 0}

    def __repr__(self) -> str:
        return (
            f"ExpertPolicy({self.objective!r}, candidates={self.n_candidates}, futures={self.futures}, "
            f"horizon={self.horizon}, margin={self.margin}, every={self.every}, tail={self.tail})"
        )

    # ------------------------------------------------------------------ policy protocol
    def bind(self, env: ClinicalRecruitmentEnv | None) -> ExpertPolicy:
        """Plan from ``env``'s state when called as ``policy(obs, rng)`` (``None`` unbinds). Returns self."""
        self.env = env
        return self

    def __call__(self, obs: Obs, rng: random.Random | None = None) -> Action:
        env = self.env
        if env is None or env.s is None or env.done or env.task.task_id != obs.get("task_id"):
            return self.base(obs, rng)
        if env.s.t != obs.get("timestamp"):
            return self.base(obs, rng)
        return self.act(env, rng, obs)

    def act(self, env: ClinicalRecruitmentEnv, rng: random.Random | None = None, obs: Obs | None = None) -> Action:
        """The planner's action for ``env``'s current state. ``env`` is only read (snapshot), never stepped."""
        rng = self.rng if rng is None else rng
        if obs is None:
            obs = env._observation()
        base_action = self.base(obs, rng)
        if self.n_candidates < 2 or env.done or not self.is_decision_day(obs):
            return base_action
        options = self.candidates(obs, base_action)
        if len(options) < 2:
            return base_action
        seeds = [rng.getrandbits(64) for _ in range(self.futures)]
        snap = env.snapshot()
        sim = self._simulator(env)
        values = [self._value(sim, snap, action, seeds) for action in options]
        self.stats["decisions"] += 1
        best, best_gain = 0, 0.0
        for k in range(1, len(options)):
            diffs = [v - b for v, b in zip(values[k], values[0], strict=True)]
            gain = statistics.fmean(diffs)
            noise = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0
            support = sum(d > 0 for d in diffs) - sum(d < 0 for d in diffs)
            if gain > self.margin and gain > self.z * noise and support >= self.support and gain > best_gain:
                best, best_gain = k, gain
        if best:
            self.stats["deviations"] += 1
            if self.log is not None:
                self.log.append((obs["timestamp"], base_action, options[best], round(best_gain, 4)))
            return options[best]
        return base_action

    # ------------------------------------------------------------------ planning pieces
    def is_decision_day(self, obs: Obs) -> bool:
        """Every ``every`` days, and every day of the last ``tail`` days before the base policy's end (its
        planned stop day, else the step limit)."""
        t = obs["timestamp"]
        end = obs["max_steps"]
        if isinstance(self.base, GraderHeuristic):
            stop_at = self.base.facts(obs["task_id"]).stop_at
            end = end if stop_at is None else stop_at + 1
        return 0 <= end - t <= self.tail or t % self.every == 0

    def candidates(self, obs: Obs, base_action: Action) -> list[Action]:
        """The base action, then sensible alternatives (most promising first), without duplicates."""
        f = self.base.facts(obs["task_id"]) if isinstance(self.base, GraderHeuristic) else task_facts(obs["task_id"])
        task = f.task
        hyp = hypothesis_for(obs)

        def act(kind: str, **fields: Any) -> Action:
            return {"action_type": kind, "hypothesis": hyp, "confidence": 0.5, **fields}

        budget = obs["budget_remaining"]
        hold = obs["active_constraints"]["regulatory_hold_days"] > 0
        out: list[Action] = [base_action]
        consented = sorted(obs["allocation_candidates"], key=lambda p: (consent_expiry(p), p["dropout_risk"]))
        if consented and budget >= task.enrollment_cost:
            patient = consented[0]
            site = best_site(obs, patient["dropout_risk"])
            if site is not None:
                out.append(act("allocate_to_site", patient_id=patient["id"], site_id=site))
        eligible = [p for p in obs["recontact_candidates"] if p["eligible"] and not p["consented"]]
        if eligible and budget >= task.recontact_cost:
            out.append(act("recontact", patient_id=eligible[0]["id"]))
        available = obs["available_patients"]
        if available and not hold and budget >= task.screening_cost:
            cs, om = f.cs[obs["timestamp"]], f.om[obs["timestamp"]]
            ranked = sorted(
                enumerate(available),
                key=lambda item: -p_eligible(item[1]["eligibility_score"], cs, om) * (1 - 0.05 * item[0]),
            )
            out.append(act("screen_patient", patient_id=ranked[0][1]["id"]))
            low_risk = min(available, key=lambda p: p["dropout_risk"])
            out.append(act("screen_patient", patient_id=low_risk["id"]))
        if self.stop:
            out.append(act("stop_recruitment", confidence=round(min(1.0, obs["enrolled_so_far"] / task.target), 3)))
        if obs["indexed_memory_summary"]["entries"]:
            out.append(act("retrieve_relevant_history", memory_query=MEMORY_KEY))
        site = target_site(obs)
        if site is not None and budget >= task.strategy_cost:
            out.append(act("adjust_strategy", strategy_change=f"negotiate_{site}"))
        unique: list[Action] = []
        seen: set[tuple] = set()
        for action in out:
            key = tuple(sorted((k, v) for k, v in action.items() if k not in ("confidence",)))
            if key not in seen:
                seen.add(key)
                unique.append(action)
        return unique[: self.n_candidates]

    def _simulator(self, env: ClinicalRecruitmentEnv) -> ClinicalRecruitmentEnv:
        key = (env.task.task_id, env.fixes)
        sim = self._sims.get(key)
        if sim is None:
            sim = self._sims[key] = ClinicalRecruitmentEnv(env.task.task_id, fixes=env.fixes)
        return sim

    def _value(self, sim: ClinicalRecruitmentEnv, snap, action: Action, seeds: list[int]) -> list[float]:
        """The objective after ``action`` + base continuation, once per future (seed)."""
        out = []
        base = self.base
        for seed in seeds:
            sim.restore(snap)
            day = 0
            # Never the true future: the snapshot's RNG state is discarded, and every simulated day draws from
            # its own stream derived from the planner's seed, so a day's randomness is the same whatever the
            # candidate did before (common random numbers that stay aligned).
            sim.reseed(_day_seed(seed, day))
            rng = random.Random(seed)
            obs, _, terminated, truncated, info = sim.step(action)
            while not (terminated or truncated) and (self.horizon is None or day + 1 < self.horizon):
                day += 1
                sim.reseed(_day_seed(seed, day))
                obs, _, terminated, truncated, info = sim.step(base(obs, rng))
            self.stats["simulated_steps"] += day + 1
            out.append(self._outcome(sim, obs, info, terminated or truncated))
        return out

    def _outcome(self, sim: ClinicalRecruitmentEnv, obs: Obs, info: Mapping[str, Any], done: bool) -> float:
        if self.objective == "enrolment":
            return float(obs["enrolled_so_far"])
        if done:
            return float(info["final_score"])
        # Proxy for a cut-off playout: the grade of the partial episode (documented in the class docstring).
        return grade(sim.task.base_task, {**obs, "world_type": sim.task.world_type}, sim.history)


def _day_seed(seed: int, day: int) -> int:
    return (seed * 1_000_003 + day * 7_919) & 0xFFFFFFFFFFFFFFFF


expert = register_policy("expert")(ExpertPolicy("score"))
expert_enrolment = register_policy("expert_enrolment")(ExpertPolicy("enrolment"))


# ---------------------------------------------------------------------------------------------- evaluation
def play(
    env: ClinicalRecruitmentEnv, policy: Callable[[Obs, random.Random], Action], seed: int, policy_seed: int = 0
) -> dict[str, Any]:
    """Play one full episode of ``env``'s task (binding ``env`` when the policy is an :class:`ExpertPolicy`).

    Returns ``{final_score, enrolled, steps, seconds}``."""
    rng = random.Random(policy_seed)
    start = time.perf_counter()
    obs, _ = env.reset(seed=seed)
    bound = isinstance(policy, ExpertPolicy)
    if bound:
        policy.bind(env)
    try:
        steps, info, done = 0, {}, False
        while not done:
            obs, _, terminated, truncated, info = env.step(policy(obs, rng))
            steps += 1
            done = terminated or truncated
    finally:
        if bound:
            policy.bind(None)
    return {
        "final_score": info["final_score"],
        "enrolled": obs["enrolled_so_far"],
        "steps": steps,
        "seconds": time.perf_counter() - start,
    }


def _parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m env.clinical.expert --seeds 0-19``: score and enrolment of the base and expert policies."""
    parser = argparse.ArgumentParser(prog="python -m env.clinical.expert", description=main.__doc__)
    parser.add_argument("--seeds", default="0-19", help="reset seeds, e.g. 0-19 or 0,3,5-7 (default 0-19)")
    parser.add_argument("--tasks", default="easy_bench,medium_bench,hard_bench")
    parser.add_argument(
        "--policies",
        default="grader_heuristic,expert,expert_enrolment",
        help="comma list of grader_heuristic, enrolment_heuristic, expert, expert_enrolment",
    )
    parser.add_argument("--candidates", type=int, default=None)
    parser.add_argument("--futures", type=int, default=None)
    parser.add_argument("--horizon", type=int, default=None)
    parser.add_argument("--margin", type=float, default=None)
    parser.add_argument("--every", type=int, default=None)
    parser.add_argument("--tail", type=int, default=None)
    args = parser.parse_args(argv)
    seeds = _parse_seeds(args.seeds)
    knobs = {
        k: getattr(args, k)
        for k in ("candidates", "futures", "horizon", "margin", "every", "tail")
        if getattr(args, k) is not None
    }
    makers: dict[str, Callable[[], Callable[[Obs, random.Random], Action]]] = {
        "grader_heuristic": lambda: GraderHeuristic("score"),
        "enrolment_heuristic": lambda: GraderHeuristic("enrolment"),
        "expert": lambda: ExpertPolicy("score", **knobs),
        "expert_enrolment": lambda: ExpertPolicy("enrolment", **knobs),
    }
    names = [n.strip() for n in args.policies.split(",") if n.strip()]
    unknown = [n for n in names if n not in makers]
    if unknown:
        parser.error(f"unknown policies {unknown}; choose from {sorted(makers)}")
    print(f"reset seeds {args.seeds} ({len(seeds)} episodes per cell); expert knobs {knobs or 'default'}")
    print(f"{'policy':<20} {'task':<14} {'score mean ± sd':>17} {'enrolled':>9} {'s/episode':>10}")
    for name in names:
        for task in [t.strip() for t in args.tasks.split(",") if t.strip()]:
            env = ClinicalRecruitmentEnv(task)
            policy = makers[name]()
            rows = [play(env, policy, seed, policy_seed=seed) for seed in seeds]
            scores = [r["final_score"] for r in rows]
            sd = statistics.stdev(scores) if len(scores) > 1 else 0.0
            print(
                f"{name:<20} {task:<14} {statistics.fmean(scores):>8.3f} ± {sd:.3f} "
                f"{statistics.fmean(r['enrolled'] for r in rows):>9.1f} "
                f"{statistics.fmean(r['seconds'] for r in rows):>10.3f}",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

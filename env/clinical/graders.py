"""End-of-episode graders (spec section 11): pure functions of the final observation and the history.

Each task's grade is a weighted sum of parts (enrolment, budget kept, screening efficiency, retention,
site use, hypothesis consistency and accuracy, plan follow-through, memory use, milestone potential,
token efficiency, and on hard: recovery after dropouts, curriculum screening, strategy count). The result
is rounded to 4 decimals and clamped to [0.001, 0.999]. Quirks of the reference are kept on purpose: the
history's ``enrolled`` *count* is read as a "useful step" flag, and site use counts any action's site_id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from operator import itemgetter, ne
from typing import Any

from env.clinical.reward import HYPOTHESIS_WORLD

History = Sequence[Mapping[str, Any]]

# The graders count over the whole history at the end of every episode; map() and itemgetter() keep those passes
# out of the interpreter loop. Summing booleans counts the true ones.
_ACTION, _HYPOTHESIS = itemgetter("action"), itemgetter("hypothesis")
_FOLLOWTHROUGH, _MEMORY_HIT = itemgetter("plan_followthrough"), itemgetter("memory_hit")


def _consistency(history: History) -> float:
    if len(history) < 2:
        return 1.0
    hypotheses = list(map(_HYPOTHESIS, history))
    switches = sum(map(ne, hypotheses, hypotheses[1:]))
    if switches <= 1:
        return 1.0
    if switches <= 4:
        return 1 - 0.2 * (switches - 1)
    return 0.2


def _accuracy(history: History, world_type: str) -> float:
    last = history[-20:]
    if not last:
        return 0.0
    return sum(1 for h in last if HYPOTHESIS_WORLD.get(h["hypothesis"]) == world_type) / len(last)


def _plan_followthrough(history: History) -> float:
    plans = list(map(_ACTION, history)).count("plan_next_phase")
    if plans == 0:
        return 0.0
    return min(1.0, sum(map(_FOLLOWTHROUGH, history)) / (2 * plans))


def _memory_use(history: History) -> float:
    writes = list(map(_ACTION, history)).count("summarize_and_index")
    hits = sum(map(_MEMORY_HIT, history))
    if writes == 0 and hits == 0:
        return 0.0
    return min(1.0, (0.4 * writes + 0.6 * hits) / max(1, writes + 1))


def _milestone_potential(obs: Mapping[str, Any], history: History) -> float:
    gains = sum(max(0.0, h["milestone_potential_delta"]) for h in history)
    return min(1.0, 0.7 * obs["milestone_potential"] + min(0.3, 0.2 * gains))


def _hindsight_alignment(obs: Mapping[str, Any], history: History) -> float:
    if not obs.get("hindsight_available"):
        return 0.0
    follow = sum(map(_FOLLOWTHROUGH, history))
    hits = sum(map(_MEMORY_HIT, history))
    return min(1.0, 0.3 + 0.02 * follow + 0.03 * hits)


def _token_grade(obs: Mapping[str, Any], history: History) -> float:
    useful = sum(1 for h in history if h["screen_success"] or h["enrolled"] or h["memory_hit"])
    if obs["token_usage_so_far"] <= 0:
        return min(1.0, 0.4 + 0.02 * useful)
    return min(1.0, 0.8 * obs["token_efficiency_score"] + 0.2 * useful / max(1, len(history)))


def _budget_kept(screened: int, min_screened: int, bf: float, reserve: float) -> float:
    if screened < min_screened:
        return 0.0
    return 1.0 if bf >= reserve else bf / reserve


def _retention(funnel: Mapping[str, int], enrolled: int) -> float:
    denom = enrolled + funnel["dropped"]
    return 0.0 if denom == 0 else 1 - funnel["dropped"] / denom


def _finish(score: float) -> float:
    return max(0.001, min(0.999, round(score, 4)))


def terms_easy(obs: Mapping[str, Any], history: History) -> dict[str, float]:
    funnel = obs["current_funnel"]
    enrolled, target = obs["enrolled_so_far"], obs["target_enrollment"]
    horizon = _horizon(obs, history)
    bf = max(0.0, obs["budget_remaining"]) / max(1, obs["initial_budget"])
    screened = funnel["screened"]
    if enrolled >= target:
        timeline = max(0.0, 1 - len(history) / horizon)
    else:
        timeline = 0.5 * enrolled / target if len(history) < horizon else 0.0
    efficiency = min(1.0, (funnel["eligible"] / screened) / 0.7) if screened else 0.0
    return {
        "enrolment": 0.30 * min(1.0, enrolled / target),
        "budget_kept": 0.17 * _budget_kept(screened, 10, bf, BUDGET_RESERVE["easy_bench"]),
        "screening_efficiency": 0.17 * efficiency,
        "timeline": 0.10 * timeline,
        "hypothesis_consistency": 0.10 * _consistency(history),
        "hypothesis_accuracy": 0.05 * _accuracy(history, obs["world_type"]),
        "milestone_potential": 0.03 * _milestone_potential(obs, history),
        "plan_followthrough": 0.02 * _plan_followthrough(history),
        "memory_use": 0.03 * _memory_use(history),
        "token_efficiency": 0.03 * _token_grade(obs, history),
    }


def terms_medium(obs: Mapping[str, Any], history: History) -> dict[str, float]:
    funnel = obs["current_funnel"]
    enrolled, target = obs["enrolled_so_far"], obs["target_enrollment"]
    bf = max(0.0, obs["budget_remaining"]) / max(1, obs["initial_budget"])
    n_sites = len({h["site_id"] for h in history if h["site_id"]})
    sites = 1.0 if n_sites >= 3 else 0.7 if n_sites == 2 else 0.3 if n_sites == 1 else 0.0
    return {
        "enrolment": 0.25 * min(1.0, enrolled / target),
        "retention": 0.15 * _retention(funnel, enrolled),
        "site_variety": 0.15 * sites,
        "budget_kept": 0.10 * _budget_kept(funnel["screened"], 15, bf, BUDGET_RESERVE["medium_bench"]),
        "hypothesis_consistency": 0.10 * _consistency(history),
        "hypothesis_accuracy": 0.10 * _accuracy(history, obs["world_type"]),
        "plan_followthrough": 0.05 * _plan_followthrough(history),
        "milestone_potential": 0.05 * _milestone_potential(obs, history),
        "token_efficiency": 0.05 * _token_grade(obs, history),
    }


def terms_hard(obs: Mapping[str, Any], history: History) -> dict[str, float]:
    funnel = obs["current_funnel"]
    enrolled, target = obs["enrolled_so_far"], obs["target_enrollment"]
    bf = max(0.0, obs["budget_remaining"]) / max(1, obs["initial_budget"])
    drops = [i for i, h in enumerate(history) if h["dropout"]]
    if drops:
        n = len(history)
        recovered = sum(
            1
            for i in drops
            if any(history[j]["enrolled"] > history[i]["enrolled"] for j in range(i + 1, min(i + 10, n - 1) + 1))
        )
        recovery = recovered / len(drops)
    else:
        recovery = 0.0
    in_curr = [h for h in history if h["curriculum"]]
    if in_curr:
        good = sum(1 for h in in_curr if h["action"] == "screen_patient" and h["screen_success"])
        curric = min(1.0, good / (0.5 * len(in_curr)))
    else:
        curric = 0.0
    strategies = list(map(_ACTION, history)).count("adjust_strategy")
    strategy = 1.0 if strategies >= 3 else strategies / 3
    return {
        "enrolment": 0.15 * min(1.0, enrolled / target),
        "retention": 0.10 * _retention(funnel, enrolled),
        "budget_kept": 0.10 * _budget_kept(funnel["screened"], 20, bf, BUDGET_RESERVE["hard_bench"]),
        "dropout_recovery": 0.10 * recovery,
        "curriculum_screening": 0.10 * curric,
        "strategy_changes": 0.10 * strategy,
        "hypothesis_consistency": 0.10 * _consistency(history),
        "hypothesis_accuracy": 0.10 * _accuracy(history, obs["world_type"]),
        "memory_use": 0.04 * _memory_use(history),
        "milestone_potential": 0.03 * _milestone_potential(obs, history),
        "hindsight_alignment": 0.03 * _hindsight_alignment(obs, history),
        "token_efficiency": 0.05 * _token_grade(obs, history),
    }


#: The share of the initial budget each grader wants left at the end (its budget-kept term is full above it).
BUDGET_RESERVE = {"easy_bench": 0.20, "medium_bench": 0.15, "hard_bench": 0.10}


def _horizon(obs: Mapping[str, Any], history: History) -> int:
    return obs.get("max_steps") or len(history) + obs["time_to_deadline_days"]


TERMS = {"easy_bench": terms_easy, "medium_bench": terms_medium, "hard_bench": terms_hard}


def grade_terms(base_task: str, obs: Mapping[str, Any], history: History) -> dict[str, float]:
    """The weighted parts of ``base_task``'s grade, in the spec's order (their sum, rounded and clamped, is the
    grade): where an episode's points come from, and where they were lost."""
    return TERMS[base_task](obs, history)


def grade(base_task: str, obs: Mapping[str, Any], history: History) -> float:
    """Final score in [0.001, 0.999] for an episode of ``base_task`` (stage tasks use their base's grader)."""
    # sum() adds left to right from 0, exactly as the spec's single expression does: the grade is bit-exact.
    return _finish(sum(grade_terms(base_task, obs, history).values()))

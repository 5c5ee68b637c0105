"""Baseline policies: plain functions ``policy(obs, rng) -> action dict``, registered by name.

* ``heuristic``: the reference README's quick-start loop (allocate the first allocation candidate to the
  first site, else recontact the first recontact candidate, else screen the first available patient with
  hypothesis ``noise_dominant`` at confidence 0.7, else ``adjust_strategy: increase_outreach``). It is
  deterministic and sends the same action dicts as the reference's loop, so its scores match the reference's.
* ``random``: uniform over the 7 non-stop action types, arguments drawn uniformly from the observation's
  candidates and sites; it never stops early.

Policies draw only from the ``rng`` they are given, never from the environment's step RNG.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from env.clinical.models import ACTION_TYPES, HYPOTHESES, PLAN_PHASES

Policy = Callable[[dict[str, Any], random.Random], dict[str, Any]]
POLICIES: dict[str, Policy] = {}
_MEMORY_WORDS = ("screening", "conversion", "allocation", "retention", "site", "dropout", "milestone")


def register_policy(name: str) -> Callable[[Policy], Policy]:
    """Decorator: make a policy available by name (CLI, evaluation, anchors)."""

    def wrap(fn: Policy) -> Policy:
        POLICIES[name] = fn
        return fn

    return wrap


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"Unknown policy: {name!r}. Registered: {sorted(POLICIES)}") from None


@register_policy("heuristic")
def heuristic_policy(obs: dict[str, Any], rng: random.Random | None = None) -> dict[str, Any]:
    """The reference README quick-start loop (first candidate of each list, fixed priority)."""
    sites = list(obs["site_performance"])
    if obs["allocation_candidates"] and sites:
        patient = obs["allocation_candidates"][0]["id"]
        return {"action_type": "allocate_to_site", "patient_id": patient, "site_id": sites[0], "confidence": 0.5}
    if obs["recontact_candidates"]:
        return {"action_type": "recontact", "patient_id": obs["recontact_candidates"][0]["id"], "confidence": 0.5}
    if obs["available_patients"]:
        return {
            "action_type": "screen_patient",
            "patient_id": obs["available_patients"][0]["id"],
            "hypothesis": "noise_dominant",
            "confidence": 0.7,
        }
    return {"action_type": "adjust_strategy", "strategy_change": "increase_outreach", "confidence": 0.5}


@register_policy("random")
def random_policy(obs: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """Uniform over the 7 non-stop action types, with uniformly drawn arguments."""
    kind = rng.choice(ACTION_TYPES[:-1])
    sites = list(obs["site_performance"])
    action: dict[str, Any] = {
        "action_type": kind,
        "hypothesis": rng.choice(HYPOTHESES),
        "confidence": rng.random(),
    }
    pool = {
        "screen_patient": obs["available_patients"],
        "recontact": obs["recontact_candidates"],
        "allocate_to_site": obs["allocation_candidates"],
    }.get(kind)
    if pool is not None:
        action["patient_id"] = rng.choice(pool)["id"] if pool else None
    if kind == "allocate_to_site":
        action["site_id"] = rng.choice(sites)
    elif kind == "adjust_strategy":
        options = ["increase_outreach", "relax_criteria", "tighten_criteria"]
        options += [f"focus_{s}" for s in sites] + [f"negotiate_{s}" for s in sites]
        action["strategy_change"] = rng.choice(options)
    elif kind == "plan_next_phase":
        action["target_phase"] = rng.choice(PLAN_PHASES)
    elif kind == "summarize_and_index":
        action["memory_key"] = rng.choice(_MEMORY_WORDS)
    elif kind == "retrieve_relevant_history":
        action["memory_query"] = rng.choice(_MEMORY_WORDS)
    return action


def run_episode(env, policy: Policy, seed: int | None, policy_seed: int = 0) -> dict[str, Any]:
    """Play one full episode; return ``{final_score, enrolled, steps, total_reward, budget_left}``."""
    rng = random.Random(policy_seed)
    obs, _ = env.reset(seed=seed)
    total, steps, info = 0.0, 0, {}
    done = False
    while not done:
        obs, reward, terminated, truncated, info = env.step(policy(obs, rng))
        total += reward
        steps += 1
        done = terminated or truncated
    return {
        "final_score": info["final_score"],
        "enrolled": obs["enrolled_so_far"],
        "steps": steps,
        "total_reward": total,
        "budget_left": obs["budget_remaining"],
    }

"""The clinical environment seen by an LLM agent: compact prompts, candidate actions and reward components.

This module implements recruit_trl's ``EnvInterface`` for :class:`env.ClinicalRecruitmentEnv` (a subclass of
:class:`recruit_trl.protocol.EnvInterface`, the one recruit_trl module ``env`` imports): :data:`CLINICAL`, which the
package declares as the entry point ``clinical`` of the ``recruit_trl.envs`` group (``pyproject.toml``). It is the
only place where the plugin meets clinical details, and it holds the environment's defaults for training.

* Rendering: one short block per decision (day, budget, enrolment vs target, funnel, pressures, what the
  fixed calendar still holds (see :func:`calendar_line`), sites, plan and memory, and a digest of the last
  actions). Patients appear in the candidate list with their visible attributes, so nothing is shown twice.
* Candidate actions (the ``index`` contract): every listed action is legal when it runs (budget, capacity, holds,
  including a hold that the fixed calendar starts today, and consents that lapse at the start of today are
  checked), ordered from most to least productive: allocate (the most urgent consent to every open site, best
  success chance first; other consents to their best site), recontact (only patients that can still consent or
  enrol), screen (every available patient), strategy changes (outreach, relaxed criteria, a focus on the best site
  unless it has it, then one negotiation: with the site that most needs one, see :func:`negotiation_order`);
  memory (one ``site`` entry) only on hold days, when nothing productive is legal, or when spending would eat
  into the budget reserve the grader rewards (free actions leave the state unchanged, and a weak policy that
  picks one in a normal state loops on it); plans (screening, recovery) then too, and on every day while the
  agent has no plan of its own (the graders pay for one); free actions at the head of the list; stop only in
  the last 20 days. The rest of the expert's decisions (memory chores and waiting on ordinary days, a
  negotiation with another site than the listed one) are not recorded in SFT traces. Every candidate carries
  the hypothesis that matches the observed world type (the reference exposes it; see quirk 6) so the model
  only chooses *what to do*.
* Safe fallback: the most productive legal candidate (the first that is neither free nor ``stop``), used when
  a model output cannot be parsed; such steps are counted as invalid by the rollout.
* Reward components per step: the environment reward, enrolment gain, screening successes, dropouts,
  milestone bonus, hypothesis accuracy; plus the reference's action shaping for the sampled action
  (+0.20 allocate, +0.15 recontact, +0.10 screen, -0.10 adjust_strategy while a productive action exists).
* Evaluation: enrolled and budget left after every day (the enrolment curve, its peak and its value after 15 and 30
  days), the reference's published figures to compare with, the remote client, the task table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from env.clinical.core import ClinicalRecruitmentEnv
from env.clinical.graders import BUDGET_RESERVE
from env.clinical.heuristic import MEMORY_KEY, consent_expiry, p_allocate, target_site
from env.clinical.models import ACTION_TYPES
from env.clinical.policies import get_policy, register_policy
from env.clinical.tasks import ALL_TASKS, PUBLIC_TASK_IDS, TASKS, get_task
from env.clinical.world import curriculum_windows, hold_days, scheduled_dropout_days
from recruit_trl.protocol import FALLBACK_POLICY, EnvInterface

WORLD_HYPOTHESIS = {"noise": "noise_dominant", "site_bias": "site_bias", "dropout": "dropout_dominant"}
SHAPING = {"allocate_to_site": 0.20, "recontact": 0.15, "screen_patient": 0.10}
# Actions that do not move the campaign: the free ones (plan, memory) and stop; never the safe fallback's choice.
PASSIVE_TYPES = frozenset({"plan_next_phase", "summarize_and_index", "retrieve_relevant_history", "stop_recruitment"})
# Strategy changes listed every day. Tightening the criteria is left out: it lowers eligibility (its one other effect
# is a small drop in uncertainty), the expert never uses it on any task, and students picked it by slips of the index.
STRATEGIES = ("increase_outreach", "relax_criteria")
# One memory entry, keyed "site": its default payload snapshots the best site, and recalling "site" finds it.
STOP_WINDOW = 20  # days before the deadline from which stop_recruitment is listed
MAX_LISTED = 3  # patients listed per action kind (the observation shows up to 5): keeps prompts under ~400 tokens
REWARD_FIELDS = (
    "env_return",
    "enrollment_gain",
    "screen_success",
    "dropout",
    "milestone_bonus",
    "hypothesis_accuracy",
)

# The fields that say what an action does (two actions equal on these are the same decision).
MATCH_FIELDS = (
    "action_type",
    "patient_id",
    "site_id",
    "strategy_change",
    "target_phase",
    "memory_key",
    "memory_query",
)

SYSTEM_PROMPT = "You run a clinical-trial recruitment campaign, one action per day. Enrol patients within budget."

# Published reference figures (docs/spec/reference-results.md): best reference policy per task, and its LLMs.
REFERENCE_BEST = {"easy_bench": 0.607, "medium_bench": 0.533, "hard_bench": 0.560}
# The reference's published LLM agents enrolled 3-5 patients per rollout, in rollouts of 15 steps (debug episodes)
# and of about 30 tool calls (the 180-day horizon never reached): enrolment after as many days compares with them.
REFERENCE_LLM_ENROLLED = (3, 5)
ENROLLED_AT_DAYS = (15, 30)


def hypothesis_for(obs: Mapping[str, Any]) -> str:
    """The hypothesis that matches the observed world type (``noise_dominant`` when it is hidden)."""
    return WORLD_HYPOTHESIS.get(obs.get("world_type", ""), "noise_dominant")


def allocation_chance(obs: Mapping[str, Any], patient: Mapping[str, Any], site_id: str) -> float:
    """The environment's allocation success probability (spec 5.3), computed from the observation alone."""
    return p_allocate(obs, site_id, patient["dropout_risk"])


def site_rank_key(stats: Mapping[str, float]) -> float:
    """Visible part of the environment's best-site score (capacity totals are not observable)."""
    return stats["conversion_rate"] * stats["retention_rate"] / max(1.0, stats["avg_wait_days"])


def calendar_line(task_id: str, day: int) -> str:
    """What the task's fixed calendar (the same for every reset seed, published in the spec) holds after ``day``:
    the scheduled dropouts still to come and the current or next curriculum window.

    Each scheduled dropout deletes an enrolled patient, so when to enrol is decided by the calendar: the expert
    enrols on medium only after the last one and on hard from the fifth last, and screens on hard inside the
    curriculum windows. A student that saw none of it enrolled early; with the line the SFT student's medium score
    rose from 0.581 to 0.663 (greedy, seeds 20..59), though on hard it still enrols early and nets well under one
    patient (the expert 4.2).
    """
    ahead = [d for d in scheduled_dropout_days(task_id) if d > day]
    text = f"Calendar: dropouts ahead {len(ahead)}" + (f" next d{ahead[0]}" if ahead else "")
    window = next(((first, last) for first, last in curriculum_windows(task_id) if last >= day), None)
    if window is not None:
        text += f" | curriculum d{window[0]}-{window[1]}" + (" now" if window[0] <= day else "")
    return text


def negotiation_order(obs: Mapping[str, Any]) -> list[str]:
    """Site ids from the one that most needs a negotiation to the one that least does: the ones that still need
    one first (conversion below 0.9, a wait above 2 days or under 3 places left), the target site (the focused
    one, else the best) first among equals, then the poorest converter first. Only the first is listed.

    With a negotiation per site (A, B, C...) a small model learnt "negotiate" as one position and kept
    negotiating with a site the expert never asked for. Measured on the expert's own episodes (4 seeds per task),
    the first site of this order is the one the expert negotiates with 100 / 67 / 100 % of the time on easy /
    medium / hard (the fixed order's first: 100 / 27 / 0 %); medium's other third goes to the sites the grade's
    site variety wants, which the allocations still reach.
    """
    sites = obs["site_performance"]
    target = target_site(obs)

    def settled(p: Mapping[str, float]) -> bool:
        return p["conversion_rate"] >= 0.9 and p["avg_wait_days"] <= 2.0 and p["capacity_remaining"] >= 3

    return sorted(sites, key=lambda sid: (settled(sites[sid]), sid != target, sites[sid]["conversion_rate"]))


class ClinicalInterface(EnvInterface):
    """:class:`recruit_trl.protocol.EnvInterface` for the clinical recruitment environment."""

    name = "clinical"
    continuation_policy = "grader_heuristic"
    system_prompt = SYSTEM_PROMPT
    reward_fields = REWARD_FIELDS
    terminal_action_types = frozenset({"stop_recruitment"})
    # Evaluation (see episode_metrics): the enrolment curve, and the reference's figures to compare with.
    curve_metrics = ("enrolled",)
    metric_days = ENROLLED_AT_DAYS
    reference_scores = REFERENCE_BEST
    reference_band = ("enrolled", "reference LLMs", *REFERENCE_LLM_ENROLLED)

    def __init__(self, fixes: Sequence[str] = ()) -> None:
        self.fixes = tuple(fixes)

    def make_env(self, task: str) -> ClinicalRecruitmentEnv:
        return ClinicalRecruitmentEnv(task, fixes=self.fixes)

    def tasks(self) -> Sequence[str]:
        return PUBLIC_TASK_IDS

    def action_types(self) -> Sequence[str]:
        return ACTION_TYPES

    def action_type(self, action: Mapping[str, Any]) -> str:
        return str(action.get("action_type"))

    def action_key(self, action: Mapping[str, Any]) -> tuple:
        """What an action does: its type and arguments; the hypothesis and confidence annotations are ignored."""
        return tuple(action.get(f) for f in MATCH_FIELDS)

    def get_policy(self, name: str):
        return super().get_policy(name) if name == FALLBACK_POLICY else get_policy(name)

    def remote_env(self, url: str, task: str, transport: str):
        """A client of a server of this environment (ours or the reference's), with the local environment's API."""
        from env.client import RemoteEnv  # needs the ``server`` extra (httpx), only for remote evaluation

        return RemoteEnv(url, task=task, transport=transport)

    def describe_tasks(self, all_tasks: bool = False) -> list[dict[str, Any]]:
        """The public tasks (``all_tasks``: also the progressive ``*_stage_{30,90,180}`` variants) with their size."""
        specs = ALL_TASKS if all_tasks else TASKS
        return [
            {
                "id": spec.task_id,
                "name": spec.name,
                "difficulty": f"{spec.difficulty} ({spec.difficulty_label})",
                "budget": spec.budget,
                "target": spec.target,
                "max_steps": spec.max_steps,
            }
            for spec in specs.values()
        ]

    def episode_metrics(self, obs: Mapping[str, Any], info: Mapping[str, Any]) -> dict[str, float]:
        """Enrolled patients and budget left after a step (result rows: ``enrolled_*``, ``budget_left_mean``)."""
        return {"enrolled": obs["enrolled_so_far"], "budget_left": obs["budget_remaining"]}

    # ------------------------------------------------------------------ rendering
    def render(self, obs: Mapping[str, Any], recent: Sequence[str]) -> str:
        funnel = obs["current_funnel"]
        c = obs["active_constraints"]
        sites = "; ".join(
            f"{sid.removeprefix('site_')} conv {_dec(p['conversion_rate'])} wait {p['avg_wait_days']:.1f} "
            f"cap {p['capacity_remaining']:.0f}"
            for sid, p in obs["site_performance"].items()
        )
        lines = [
            f"Day {obs['timestamp']}/{obs['max_steps']} | budget {_thousands(obs['budget_remaining'])}/"
            f"{_thousands(obs['initial_budget'])} | enrolled {obs['enrolled_so_far']}/{obs['target_enrollment']}",
            f"Funnel: screened {funnel['screened']} eligible {funnel['eligible']} consented {funnel['consented']} "
            f"dropped {funnel['dropped']} | backlog {obs['screening_backlog']}",
            f"Hold {c['regulatory_hold_days']} | competitor {_dec(c['competitor_pressure'])} | sentiment "
            f"{_dec(c['sentiment_pressure'])} | uncertainty {_dec(obs['uncertainty_level'])} | dropout7d "
            f"{_dec(obs['dropout_rate_7d'])}",
            calendar_line(obs["task_id"], obs["timestamp"]),
            f"Sites: {sites}",
            f"Plan {obs['current_plan'].get('target_phase', 'none')} | milestone {obs['active_milestone']} | "
            f"memory {obs['indexed_memory_summary']['entries']}",
        ]
        if recent:
            lines.append("Recent: " + "; ".join(recent))
        return "\n".join(lines)

    def describe_action(self, action: Mapping[str, Any], obs: Mapping[str, Any] | None = None) -> str:
        """One line per action; with ``obs``, patients carry their visible attributes (for candidate lists)."""
        kind = action.get("action_type")
        pid = action.get("patient_id")
        facts = _patient_facts(obs, kind, pid) if obs is not None else ""
        if kind == "screen_patient":
            return f"screen {pid}{facts}"
        if kind == "recontact":
            return f"recontact {pid}{facts}"
        if kind == "allocate_to_site":
            site = (action.get("site_id") or "best site").removeprefix("site_")
            return f"allocate {pid} to {site}{facts}"
        if kind == "adjust_strategy":
            strategy = str(action.get("strategy_change"))
            for prefix in ("focus_", "negotiate_"):
                if strategy.startswith(prefix):  # "negotiate_site_D" -> "negotiate D"
                    return f"{prefix[:-1]} {strategy[len(prefix) :].removeprefix('site_')}"
            return strategy.replace("_", " ")
        if kind == "plan_next_phase":
            return f"plan {action.get('target_phase')}"
        if kind == "summarize_and_index":
            return f"save memory {action.get('memory_key')}"
        if kind == "retrieve_relevant_history":
            return f"recall memory {action.get('memory_query')}"
        return f"stop (confidence {_dec(action.get('confidence', 0.5))})"

    def outcome(self, info: Mapping[str, Any]) -> str:
        error = info.get("last_action_error")
        if error:
            return error
        b = info.get("reward_breakdown", {})
        if b.get("enrolled_new"):
            return "enrolled"
        if b.get("dropout"):
            return "dropout"
        if b.get("screen_success"):
            return "eligible"
        return "ok"

    # ------------------------------------------------------------------ actions
    def candidate_actions(self, obs: Mapping[str, Any]) -> list[dict[str, Any]]:
        task = get_task(obs["task_id"])
        hyp = hypothesis_for(obs)
        budget = obs["budget_remaining"]
        t = obs["timestamp"]
        # Calendar events and due consent lapses fire before the day's action (spec 6.1-6.2): a hold that starts
        # today blocks screening, and a consent whose window closes today cannot be allocated. Both are known
        # from the fixed calendar and the observation, so every listed action stays legal.
        hold = obs["active_constraints"]["regulatory_hold_days"] > 0 or t in hold_days(obs["task_id"])

        def act(kind: str, **fields: Any) -> dict[str, Any]:
            return {"action_type": kind, "hypothesis": hyp, "confidence": 0.5, **fields}

        sites = obs["site_performance"]
        open_sites = [sid for sid, p in sites.items() if p["capacity_remaining"] > 0]
        out: list[dict[str, Any]] = []
        allocatable = [p for p in obs["allocation_candidates"] if consent_expiry(p) > t]
        if open_sites and allocatable and budget >= task.enrollment_cost:
            # The first patient may go to any open site (best success chance first); the others to their best.
            first = allocatable[0]
            for sid in sorted(open_sites, key=lambda sid: -allocation_chance(obs, first, sid)):
                out.append(act("allocate_to_site", patient_id=first["id"], site_id=sid))
            for p in allocatable[1:MAX_LISTED]:
                best = max(open_sites, key=lambda sid, p=p: allocation_chance(obs, p, sid))
                out.append(act("allocate_to_site", patient_id=p["id"], site_id=best))
        if budget >= task.recontact_cost:
            useful = [p for p in obs["recontact_candidates"] if p["eligible"] or p["consented"]]
            out += [act("recontact", patient_id=p["id"]) for p in useful[:MAX_LISTED]]
        if not hold and budget >= task.screening_cost:
            out += [act("screen_patient", patient_id=p["id"]) for p in obs["available_patients"]]
        if budget >= task.strategy_cost:
            out += [act("adjust_strategy", strategy_change=s) for s in STRATEGIES]
            best_site = max(sites, key=lambda sid: site_rank_key(sites[sid]), default=None)
            if len(sites) > 1 and obs["active_constraints"]["focused_site"] != best_site:
                out.append(act("adjust_strategy", strategy_change=f"focus_{best_site}"))
            out.append(act("adjust_strategy", strategy_change=f"negotiate_{negotiation_order(obs)[0]}"))
        # Free actions (plan, memory) leave the state almost unchanged, so a weak policy that picks one where a
        # productive action exists can loop on it forever: list them only when nothing productive is legal,
        # screening is on hold (when the expert uses them too), or any productive action would eat into the
        # budget the grader wants kept (a policy that cannot wait otherwise spends everything). Plans are the
        # exception: while the agent has no plan of its own they are always listed, because the graders pay for
        # one (plan follow-through: 5 % of medium's grade, which a student that could never plan on a productive
        # day lost entirely) and a plan of its own removes them again (the environment lets it lapse after 24 days).
        # Free actions come first, at fixed positions (recall, save, plans), because a small model finds an action
        # by its index more easily at the head of a list whose length varies than at its tail.
        productive = any(a["action_type"] in SHAPING for a in out)
        reserve = BUDGET_RESERVE.get(task.base_task, 0.0) * obs["initial_budget"]
        lean = budget - min(task.screening_cost, task.recontact_cost, task.enrollment_cost) < reserve

        def plans() -> list[dict[str, Any]]:
            # The two phases the expert ever plans (before a screening window; recovery on medium's day 0). A plan
            # of the current phase was listed too, never chosen by the expert, and taken by a student on a third
            # of hard's days in place of the expert's recall.
            return [act("plan_next_phase", target_phase=t) for t in ("screening", "recovery")]

        if hold or not productive or lean:
            free = []
            if obs["indexed_memory_summary"]["entries"]:
                free.append(act("retrieve_relevant_history", memory_query=MEMORY_KEY))
            free.append(act("summarize_and_index", memory_key=MEMORY_KEY))
            out = free + plans() + out
        elif not str(obs["current_plan"].get("plan_id", "")).startswith("plan-"):
            out = plans() + out  # no plan of the agent's own (none, or the environment's autoplan): offer to make one
        if obs["time_to_deadline_days"] <= STOP_WINDOW:  # stopping early is never worth it before the endgame
            progress = obs["enrolled_so_far"] / max(1, obs["target_enrollment"])
            out.append(act("stop_recruitment", confidence=round(min(1.0, progress), 3)))
        return out

    def fallback_action(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        """The most productive legal candidate: the first one that is neither free nor ``stop``."""
        candidates = self.candidate_actions(obs)
        return next((a for a in candidates if a["action_type"] not in PASSIVE_TYPES), candidates[0])

    # ------------------------------------------------------------------ rewards
    def step_components(
        self,
        obs_before: Mapping[str, Any],
        action: Mapping[str, Any],
        obs: Mapping[str, Any],
        reward: float,
        info: Mapping[str, Any],
    ) -> dict[str, float]:
        b = info["reward_breakdown"]
        return {
            "env_return": reward,
            "enrollment_gain": float(obs["enrolled_so_far"] - obs_before["enrolled_so_far"]),
            "screen_success": float(b["screen_success"]),
            "dropout": float(b["dropout"]),
            "milestone_bonus": float(b["milestone_bonus"]),
            "hypothesis_accuracy": float(obs["hypothesis_accuracy"]),
        }

    def action_shaping(self, obs: Mapping[str, Any], action: Mapping[str, Any]) -> float:
        kind = action.get("action_type")
        if kind in SHAPING:
            return SHAPING[kind]
        if kind == "adjust_strategy":
            productive = any(c["action_type"] in SHAPING for c in self.candidate_actions(obs))
            return -0.10 if productive else 0.0
        return 0.0

    def score_terms(self, env: Any) -> dict[str, float] | None:
        """The weighted parts of the finished episode's grade (``None`` for a remote environment)."""
        terms = getattr(env, "grade_terms", None)
        return terms() if terms is not None else None

    def final_score(self, info: Mapping[str, Any]) -> float | None:
        return info.get("final_score")


def _thousands(x: float) -> str:
    """``64100`` -> ``64.1k`` (budgets only need three significant digits in a prompt)."""
    return f"{x / 1000:.1f}".removesuffix(".0") + "k"


def _dec(x: float) -> str:
    """Two decimals without the leading zero (``.46``): fewer tokens, same information."""
    text = f"{x:.2f}"
    return text[1:] if text.startswith("0.") else text


def _patient_facts(obs: Mapping[str, Any], kind: str | None, pid: str | None) -> str:
    if kind == "screen_patient":
        for p in obs["available_patients"]:
            if p["id"] == pid:
                return f" elig {_dec(p['eligibility_score'])} risk {_dec(p['dropout_risk'])}"
    elif kind == "recontact":
        for p in obs["recontact_candidates"]:
            if p["id"] == pid:
                status = "consented" if p["consented"] else "eligible" if p["eligible"] else "failed"
                due = f" due {p['followup_due_day']}" if p["followup_due_day"] is not None else ""
                return f" {status}{due} risk {_dec(p['dropout_risk'])}"
    elif kind == "allocate_to_site":
        for p in obs["allocation_candidates"]:
            if p["id"] == pid:
                return f" risk {_dec(p['dropout_risk'])}"
    return ""


CLINICAL = ClinicalInterface()


@register_policy("safe")
def safe_policy(obs: Mapping[str, Any], rng=None) -> dict[str, Any]:
    """The safe agent as a policy: the most productive legal candidate (what the model's fallback plays)."""
    return CLINICAL.fallback_action(obs)

"""Run reports: training curves from a trainer's log history, plots, ``report.json`` and a one-screen summary.

Plots (PNG, written next to ``report.json``):
* ``training_curves.png``: mean reward and invalid-action / fallback rates per optimizer step;
* ``action_types.png``: the sampled action-type distribution per step (a collapse shows as one band taking over);
* ``final_scores.png``: held-out final score of every evaluated policy per task, with the best reference policy;
* ``score_terms.png``: the weighted parts of each task's grade per policy (when the environment reports them):
  where the points come from and where a policy loses them against another;
* ``enrolment.png``: mean enrolled over the days of the held-out episodes per policy and task, with the band of the
  reference's published LLM agents (3-5 enrolled in rollouts of 15-30 steps): when a policy enrols, and what the
  scheduled dropouts take away again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recruit_trl.evaluate import ENROLLED_AT_DAYS, REFERENCE_BEST, REFERENCE_LLM_ENROLLED, plot_results

ACTION_PREFIX = "rollout/action_type/"
CURVE_KEYS = (
    "reward",
    "reward_std",
    "frac_reward_zero_std",
    "rollout/invalid_action_rate",
    "rollout/fallback_rate",
    "rollout/action_entropy_normalized",
    "rollout/env_time_share",
    "step_time",
)


def training_curves(log_history: Sequence[dict[str, Any]]) -> dict[str, list]:
    """Per-step series (``step`` plus :data:`CURVE_KEYS` and every action-type share) from ``log_history``."""
    rows = [h for h in log_history if "reward" in h and "step" in h]
    curves: dict[str, list] = {"step": [h["step"] for h in rows]}
    keys = list(CURVE_KEYS) + sorted({k for h in rows for k in h if k.startswith(ACTION_PREFIX)})
    for key in keys:
        curves[key] = [h.get(key) for h in rows]
    return curves


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_training(curves: dict[str, list], path: str | Path) -> Path:
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True)
    steps = curves["step"]
    top.plot(steps, curves["reward"], label="mean reward")
    top.set_ylabel("reward")
    top.legend(loc="best", fontsize=8)
    rates = (
        ("rollout/invalid_action_rate", "invalid-action rate"),
        ("rollout/fallback_rate", "fallback rate"),
        ("frac_reward_zero_std", "zero-variance groups"),
    )
    for key, label in rates:
        if any(v is not None for v in curves.get(key, [])):
            bottom.plot(steps, curves[key], label=label)
    bottom.set_ylabel("fraction")
    bottom.set_xlabel("optimizer step")
    bottom.set_ylim(-0.02, 1.02)
    bottom.legend(loc="best", fontsize=8)
    fig.suptitle("GRPO training")
    fig.tight_layout()
    return _save(fig, plt, path)


def plot_action_types(curves: dict[str, list], path: str | Path) -> Path:
    plt = _pyplot()
    kinds = [k for k in curves if k.startswith(ACTION_PREFIX) and any(v for v in curves[k] if v)]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    if kinds:
        ax.stackplot(
            curves["step"],
            *[[v or 0.0 for v in curves[k]] for k in kinds],
            labels=[k[len(ACTION_PREFIX) :] for k in kinds],
        )
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    ax.set_ylim(0, 1)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("share of sampled actions")
    ax.set_title("Action types during training")
    fig.tight_layout()
    return _save(fig, plt, path)


def plot_score_terms(results: Sequence[dict[str, Any]], path: str | Path) -> Path | None:
    """One panel per task: every weighted part of the grade (rows) as bars per policy; ``None`` without terms."""
    rows = [r for r in results if r.get("score_terms_mean")]
    if not rows:
        return None
    n_terms = max(len(r["score_terms_mean"]) for r in rows)
    plt, tasks, fig, axes = _task_panels(rows, 1.2 + 0.42 * n_terms)
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    height = 0.8 / len(policies)
    for ax, task in zip(axes[0], tasks, strict=True):
        by_policy = {r["policy"]: r["score_terms_mean"] for r in rows if r["task"] == task}
        terms = list(next(iter(by_policy.values())))
        for k, policy in enumerate(policies):
            if policy in by_policy:
                ys = [t + (k - (len(policies) - 1) / 2) * height for t in range(len(terms))]
                ax.barh(ys, [by_policy[policy][term] for term in terms], height, label=policy)
        ax.set_yticks(range(len(terms)), terms, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("points of the final score")
        ax.set_title(task)
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Held-out grade by part (mean over seeds)")
    fig.tight_layout()
    return _save(fig, plt, path)


def plot_enrolment(results: Sequence[dict[str, Any]], path: str | Path) -> Path | None:
    """One panel per task: mean enrolled after each day per policy; ``None`` when no row has the curve."""
    rows = [r for r in results if r.get("enrolled_by_day_mean")]
    if not rows:
        return None
    plt, tasks, fig, axes = _task_panels(rows, 3.9)
    low, high = REFERENCE_LLM_ENROLLED
    for ax, task in zip(axes[0], tasks, strict=True):
        for r in rows:
            if r["task"] == task:
                curve = r["enrolled_by_day_mean"]
                ax.plot(range(1, len(curve) + 1), curve, label=r["policy"], linewidth=1.2)
        ax.fill_between([0, max(ENROLLED_AT_DAYS)], low, high, color="grey", alpha=0.3, label="reference LLMs")
        ax.set_xlabel("day")
        ax.set_title(task)
    axes[0][0].set_ylabel("enrolled (mean over seeds)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Held-out enrolment over the episode")
    fig.tight_layout()
    return _save(fig, plt, path)


def _task_panels(rows: Sequence[dict[str, Any]], height: float):
    """``(plt, tasks, fig, axes)``: one panel per task of ``rows``, side by side (``axes[0][k]`` is task ``k``)."""
    plt = _pyplot()
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.6 * len(tasks), height), squeeze=False)
    return plt, tasks, fig, axes


def _save(fig, plt, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(output_dir: str | Path, report: dict[str, Any]) -> dict[str, str]:
    """Write ``report.json`` and the plots into ``output_dir``; returns the written paths by name."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    curves = report.get("training", {}).get("curves")
    if curves and curves.get("step"):
        paths["training_curves"] = str(plot_training(curves, out / "training_curves.png"))
        paths["action_types"] = str(plot_action_types(curves, out / "action_types.png"))
    if report.get("results"):
        paths["final_scores"] = str(plot_results(report["results"], out / "final_scores.png", "Held-out final score"))
        terms_plot = plot_score_terms(report["results"], out / "score_terms.png")
        if terms_plot is not None:
            paths["score_terms"] = str(terms_plot)
        enrolment_plot = plot_enrolment(report["results"], out / "enrolment.png")
        if enrolment_plot is not None:
            paths["enrolment"] = str(enrolment_plot)
    report = {**report, "plots": paths}
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    paths["report"] = str(out / "report.json")
    return paths


def summary(report: dict[str, Any]) -> str:
    """The one-screen summary printed at the end of a run."""
    results = report.get("results", [])
    tasks = list(dict.fromkeys(r["task"] for r in results))
    policies = list(dict.fromkeys(r["policy"] for r in results))
    by_key = {(r["policy"], r["task"]): r for r in results}
    # "own": the model's own answers that were legal, when constrained decoding made every answer legal.
    own_col = any(r.get("own_answer_valid_rate") is not None and r["fallback_rate"] == 0 for r in results)
    head = f"{'policy':<12}" + "".join(f"{t:>24}" for t in tasks) + f"{'valid':>8}" + (f"{'own':>8}" * own_col)
    seeds = report.get("config", {}).get("eval_seeds", "?")
    lines = [f"held-out final score (mean ± sd) and (enrolled), seeds {seeds}", head, "-" * len(head)]
    for policy in policies:
        cells, valid, own = [], [], []
        for task in tasks:
            r = by_key.get((policy, task))
            if r is None or r["final_score_mean"] is None:
                cells.append(f"{'-':>24}")
                continue
            cells.append(
                f"{r['final_score_mean']:>.3f} ± {r['final_score_sd']:.3f} ({r['enrolled_mean']:>4.1f})".rjust(24)
            )
            valid.append(r["valid_action_rate"])
            if r.get("own_answer_valid_rate") is not None:
                own.append(r["own_answer_valid_rate"])
        v = f"{100 * min(valid):.1f}%" if valid else "-"  # tenths: 98.7 % is not the 99 % target
        o = (f"{100 * min(own):.1f}%" if own else "-").rjust(8) if own_col else ""
        lines.append(f"{policy:<12}" + "".join(cells) + f"{v:>8}" + o)
    ref = "".join(f"{REFERENCE_BEST.get(t, float('nan')):>24.3f}" for t in tasks)
    lines.append(f"{'reference':<12}{ref}")
    days = " / ".join(f"day {d}" for d in ENROLLED_AT_DAYS)
    low, high = REFERENCE_LLM_ENROLLED
    lines += ["", f"enrolled after {days} / peak / end (reference LLMs: {low}-{high} in rollouts of 15-30 steps)"]
    for policy in policies:
        cells = []
        for task in tasks:
            r = by_key.get((policy, task)) or {}
            at = r.get("enrolled_at_mean")
            if not at:
                cells.append(f"{'-':>24}")
                continue
            numbers = [at[str(d)] for d in ENROLLED_AT_DAYS] + [r["enrolled_peak_mean"], r["enrolled_mean"]]
            cells.append(" / ".join(f"{x:.1f}" for x in numbers).rjust(24))
        lines.append(f"{policy:<12}" + " |".join(cells))
    for key in ("seconds", "output_dir"):
        if key in report:
            lines.append(f"{key}: {report[key]}")
    return "\n".join(lines)

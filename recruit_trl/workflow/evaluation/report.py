"""Run reports: training curves from a trainer's log history, plots, ``report.json``, a one-screen summary and the
evaluation results as a plain-text table (:func:`format_results`).

Plots (PNG, written next to ``report.json``):
* ``training_curves.png``: mean reward and invalid-action / fallback rates per optimizer step;
* ``action_types.png``: the sampled action-type distribution per step (a collapse shows as one band taking over);
* ``final_scores.png``: held-out final score of every evaluated policy per task, with the environment's reference
  scores (its ``reference_scores``);
* ``score_terms.png``: the weighted parts of each task's grade per policy (when the environment reports them):
  where the points come from and where a policy loses them against another;
* ``<metric>_by_day.png`` for each curve metric of the environment (its ``curve_metrics``): the metric's mean over
  the days of the held-out episodes per policy and task, with its ``reference_band`` (e.g. the clinical
  ``enrolled_by_day.png``: when a policy enrols, and what the scheduled dropouts take away again, against the
  reference's published LLM agents' 3-5 enrolled in rollouts of 15-30 steps).

The environment's reference figures come from its interface (``write_report(..., interface=...)``); without one the
report has none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recruit_trl.files import save_figure_atomic, write_json_atomic
from recruit_trl.protocol import EnvInterface
from recruit_trl.workflow.evaluation.metrics import curve_names, metric_names, rate_names

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
    "kl",
)
EPISODE_PREFIX = "episode/"  # episode mode: the policy's own play (recruit_trl.rollout.rollout_funcs.EpisodeRollout)


def is_rate_curve(key: str) -> bool:
    """A logged rate metric of the rollouts' games (``rollout/<metric>_rate``, e.g. ``rollout/win_rate``)."""
    return key.startswith("rollout/") and key.endswith("_rate") and key not in CURVE_KEYS


def training_curves(log_history: Sequence[dict[str, Any]]) -> dict[str, list]:
    """Per-step series (``step`` plus :data:`CURVE_KEYS`, every action-type share, rate and ``episode/`` metric) from
    ``log_history``."""
    rows = [h for h in log_history if "reward" in h and "step" in h]
    curves: dict[str, list] = {"step": [h["step"] for h in rows]}
    extra = {k for h in rows for k in h if k.startswith((ACTION_PREFIX, EPISODE_PREFIX)) or is_rate_curve(k)}
    keys = list(CURVE_KEYS) + sorted(extra)
    for key in keys:
        curves[key] = [h.get(key) for h in rows]
    return curves


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def format_results(results: Sequence[dict[str, Any]]) -> str:
    """The results as a plain-text table, with a column for each episode metric the rows carry (rates in %)."""
    rates = list(dict.fromkeys(name for r in results for name in rate_names(r)))
    metrics = list(dict.fromkeys(name for r in results for name in metric_names(r)))
    widths = {name: max(10, len(name) + 2) for name in rates + metrics}
    columns = "".join(f"{name:>{widths[name]}}" for name in rates + metrics)
    header = (
        f"{'policy':<22}{'task':<22}{'score':>16}{columns}{'len':>6}{'json':>7}{'valid':>7}{'fallbk':>7}{'teach':>7}"
        "  top action"
    )
    lines = [header, "-" * len(header)]

    def pct(x, digits=0):
        return "-" if x is None else f"{100 * x:.{digits}f}%"

    def number(x):  # tenths for small numbers (counts), whole units for large ones (e.g. money)
        return "-" if x is None else f"{x:.1f}" if abs(x) < 1000 else f"{x:.0f}"

    for r in results:
        top = max(r["action_types"], key=r["action_types"].get) if r["action_types"] else "-"
        score = "-" if r["final_score_mean"] is None else f"{r['final_score_mean']:.3f} ± {r['final_score_sd']:.3f}"
        values = "".join(f"{pct(r.get(f'{name}_rate'), 1):>{widths[name]}}" for name in rates)
        values += "".join(f"{number(r.get(f'{name}_mean')):>{widths[name]}}" for name in metrics)
        lines.append(
            f"{r['policy'][:21]:<22}{r['task']:<22}{score:>16}{values}{r['episode_length_mean']:>6.0f}"
            f"{pct(r['strict_json_rate']):>7}{pct(r['valid_action_rate'], 1):>7}{pct(r['fallback_rate']):>7}"
            f"{pct(r['teacher_match']):>7}  {top} {pct(r['action_types'].get(top))}"
        )
    return "\n".join(lines)


def plot_results(
    results: Sequence[dict[str, Any]],
    path: str | Path,
    title: str = "Final score by policy",
    references: Mapping[str, float] | None = None,
) -> Path:
    """Grouped bars of the mean final score (± sd) per task and policy, with the tasks' ``references`` (e.g. the
    interface's ``reference_scores``) marked as dashed lines."""
    plt = _pyplot()
    tasks = list(dict.fromkeys(r["task"] for r in results))
    policies = list(dict.fromkeys(r["policy"] for r in results))
    width = 0.8 / max(1, len(policies))
    references = {task: score for task, score in (references or {}).items() if task in tasks}
    entries = len(policies) + bool(references)  # the policies and the reference line
    legend_cols = min(5, entries)
    legend_rows = -(-entries // legend_cols)
    fig, ax = plt.subplots(figsize=(1.8 + 2.2 * len(tasks), 4.2 + 0.25 * legend_rows))
    for k, policy in enumerate(policies):
        xs, ys, errs = [], [], []
        for t, task in enumerate(tasks):
            row = next((r for r in results if r["policy"] == policy and r["task"] == task), None)
            if row and row["final_score_mean"] is not None:
                xs.append(t + (k - (len(policies) - 1) / 2) * width)
                ys.append(row["final_score_mean"])
                errs.append(row["final_score_sd"])
        ax.bar(xs, ys, width, yerr=errs, capsize=2, label=policy)
    for t, task in enumerate(tasks):
        if task in references:
            ax.hlines(references[task], t - 0.45, t + 0.45, colors="black", linestyles="dashed")
    if references:
        ax.plot([], [], "k--", label="best reference policy")
    ax.set_xticks(range(len(tasks)), tasks)
    ax.set_ylabel("final grader score")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    # Below the axes: inside, it covers the tallest bars once there are more than a few policies.
    ax.legend(fontsize=8, ncols=legend_cols, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    fig.tight_layout()
    return _save(fig, plt, path)


def plot_training(curves: dict[str, list], path: str | Path) -> Path:
    plt = _pyplot()
    has_kl = any(v for v in curves.get("kl", []) if v)
    fig, axes = plt.subplots(3 if has_kl else 2, 1, figsize=(7, 7.5 if has_kl else 5.5), sharex=True)
    top, bottom = axes[0], axes[1]
    steps = curves["step"]
    episodes = "episode/outcome" in curves  # episode mode: the rows' reward is their episode's, so show that
    top.plot(steps, curves["reward"], label="mean reward of the trained rows")
    for key, label in (("episode/outcome", "outcome of its own episodes"), ("episode/final_score", "final score")):
        if any(v is not None for v in curves.get(key, [])):
            top.plot(steps, curves[key], label=label)
    top.set_ylabel("reward")
    top.legend(loc="best", fontsize=8)
    rates = (
        ("rollout/invalid_action_rate", "invalid-action rate"),
        ("rollout/fallback_rate", "fallback rate"),
        ("episode/zero_variance_groups" if episodes else "frac_reward_zero_std", "zero-variance groups"),
        ("episode/step_matched_share", "decisions in a step group"),
    )
    outcomes = tuple((k, f"{k[len('rollout/') :]} of the scored games") for k in curves if is_rate_curve(k))
    own = tuple(
        (k, f"{k[len(EPISODE_PREFIX) : -len('_rate')]} rate of its own episodes")
        for k in curves
        if k.startswith(EPISODE_PREFIX) and k.endswith("_rate")
    )
    for key, label in (*rates, *outcomes, *own):
        if any(v is not None for v in curves.get(key, [])):
            bottom.plot(steps, curves[key], label=label)
    bottom.set_ylabel("fraction")
    bottom.set_ylim(-0.02, 1.02)
    bottom.legend(loc="best", fontsize=8)
    if has_kl:
        axes[2].plot(steps, curves["kl"], label="KL to the reference")
        axes[2].set_ylabel("KL")
        axes[2].legend(loc="best", fontsize=8)
    axes[-1].set_xlabel("optimizer step")
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


def plot_curve(
    results: Sequence[dict[str, Any]],
    metric: str,
    path: str | Path,
    band: tuple[str, str, float, float] | None = None,
) -> Path | None:
    """One panel per task: the curve metric's mean after each day per policy (``<metric>_by_day_mean``), and the
    ``band`` ``(metric, label, low, high)`` shaded up to the last day of ``<metric>_at_mean`` when it is this
    metric's; ``None`` when no row has the curve."""
    rows = [r for r in results if r.get(f"{metric}_by_day_mean")]
    if not rows:
        return None
    plt, tasks, fig, axes = _task_panels(rows, 3.9)
    # The band covers the days it was published for (the last of metric_days), else the whole episode.
    days = [int(d) for r in rows for d in r.get(f"{metric}_at_mean") or ()]
    extent = max(days, default=max(len(r[f"{metric}_by_day_mean"]) for r in rows))
    for ax, task in zip(axes[0], tasks, strict=True):
        for r in rows:
            if r["task"] == task:
                curve = r[f"{metric}_by_day_mean"]
                ax.plot(range(1, len(curve) + 1), curve, label=r["policy"], linewidth=1.2)
        if band is not None and band[0] == metric:
            _, label, low, high = band
            ax.fill_between([0, extent], low, high, color="grey", alpha=0.3, label=label)
        ax.set_xlabel("day")
        ax.set_title(task)
    axes[0][0].set_ylabel(f"{metric} (mean over seeds)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"Held-out {metric} over the episode")
    fig.tight_layout()
    return _save(fig, plt, path)


def _task_panels(rows: Sequence[dict[str, Any]], height: float):
    """``(plt, tasks, fig, axes)``: one panel per task of ``rows``, side by side (``axes[0][k]`` is task ``k``)."""
    plt = _pyplot()
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    fig, axes = plt.subplots(1, len(tasks), figsize=(4.6 * len(tasks), height), squeeze=False)
    return plt, tasks, fig, axes


def _save(fig, plt, path: str | Path) -> Path:
    path = save_figure_atomic(fig, path, dpi=120)
    plt.close(fig)
    return path


def plot_decisions(result: dict[str, Any], path: str | Path) -> Path:
    """The decision-level report (:func:`recruit_trl.workflow.decisions.report.evaluate_decisions`) as two panels per
    policy: strict JSON, valid action and teacher match (the majority answer's share as a line), then the state value ±
    its standard error (paired differences are in the JSON and the summary)."""
    plt = _pyplot()
    bench, values = result["benchmark"], result.get("state_value") or {}
    policies = list(bench)
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.27
    for i, (key, label) in enumerate(
        (("strict_json", "strict JSON"), ("valid", "valid"), ("teacher_match", "teacher"))
    ):
        left.bar([x + (i - 1) * width for x in range(len(policies))], [bench[p][key] or 0 for p in policies], width,
                 label=label)  # fmt: skip
    majority = next(iter(bench.values()))["majority_baseline"] if bench else None
    if majority is not None:
        left.axhline(majority, color="black", linestyle="dashed", linewidth=1, label="majority answer")
    left.set_xticks(range(len(policies)), policies, rotation=20, fontsize=8)
    left.set_ylim(0, 1.25)  # room for the legend above the bars
    left.set_title(f"Benchmark table ({next(iter(bench.values()))['rows'] if bench else 0} held-out decisions)")
    left.legend(fontsize=7, loc="upper center", ncol=4)
    named = [p for p in policies if p in values]
    right.errorbar(range(len(named)), [values[p]["mean"] for p in named], yerr=[values[p]["se"] for p in named],
                   fmt="o", capsize=4)  # fmt: skip
    right.set_xticks(range(len(named)), named, rotation=20, fontsize=8)
    right.set_title("State value of the policy's action (mean ± se)")
    fig.tight_layout()
    path = save_figure_atomic(fig, path, dpi=110)
    plt.close(fig)
    return path


def write_report(
    output_dir: str | Path, report: dict[str, Any], interface: EnvInterface | None = None
) -> dict[str, str]:
    """Write ``report.json`` and the plots into ``output_dir``; returns the written paths by name.

    Args:
        output_dir: the folder.
        report: ``{"results": [...], "training": {"curves": ...}, ...}``.
        interface: the environment's interface, for its reference figures (``reference_scores``,
            ``reference_band``); none without it.
    """
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    curves = report.get("training", {}).get("curves")
    if curves and curves.get("step"):
        paths["training_curves"] = str(plot_training(curves, out / "training_curves.png"))
        paths["action_types"] = str(plot_action_types(curves, out / "action_types.png"))
    results = report.get("results")
    if results:
        references = interface.reference_scores if interface is not None else None
        paths["final_scores"] = str(
            plot_results(results, out / "final_scores.png", "Held-out final score", references)
        )
        terms_plot = plot_score_terms(results, out / "score_terms.png")
        if terms_plot is not None:
            paths["score_terms"] = str(terms_plot)
        band = interface.reference_band if interface is not None else None
        for metric in dict.fromkeys(name for r in results for name in curve_names(r)):
            paths[f"{metric}_by_day"] = str(plot_curve(results, metric, out / f"{metric}_by_day.png", band))
    if report.get("decisions") and report["decisions"].get("benchmark"):
        paths["decisions"] = str(plot_decisions(report["decisions"], out / "decisions.png"))
    report = {**report, "plots": paths}
    write_json_atomic(out / "report.json", report)
    paths["report"] = str(out / "report.json")
    return paths


def paired_differences(results: Sequence[dict[str, Any]], reference: str) -> dict[str, dict[str, dict[str, Any]]]:
    """Each policy minus ``reference`` on the same tasks and seeds, episode by episode (the rows' ``per_episode``):
    ``{task: {policy: {measure: {"diff", "se", "n"}}}}`` for the final score and every rate metric (e.g. win), the se
    that of the mean of the paired differences. Policies without the reference's seeds are left out."""
    by_key = {(r["policy"], r["task"]): r.get("per_episode") for r in results}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (policy, task), episodes in by_key.items():
        base = by_key.get((reference, task))
        if policy == reference or not episodes or not base or episodes["seed"] != base["seed"]:
            continue
        cells = {}
        for measure in (k for k in episodes if k != "seed" and k in base):
            pairs = [(a, b) for a, b in zip(episodes[measure], base[measure], strict=True) if None not in (a, b)]
            if len(pairs) < 2:
                continue
            diffs = [a - b for a, b in pairs]
            mean = sum(diffs) / len(diffs)
            var = sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1)
            cells[measure] = {"diff": round(mean, 4), "se": round((var / len(diffs)) ** 0.5, 4), "n": len(diffs)}
        out.setdefault(task, {})[policy] = cells
    return out


def summary(report: dict[str, Any], interface: EnvInterface | None = None, sections: Sequence[str] = ()) -> str:
    """The one-screen summary printed at the end of a run.

    Per policy and task the final score (mean ± sd) with the first episode metric's mean at the end in parentheses,
    the interface's reference scores (``reference_scores``) below, then for each curve metric its values after the
    days of ``<metric>_at_mean``, its peak and its end (with the interface's ``reference_band`` when it is this
    metric's), then ``sections`` (e.g. the decision level's tables), then the run's time and folder.
    """
    results = report.get("results", [])
    tasks = list(dict.fromkeys(r["task"] for r in results))
    policies = list(dict.fromkeys(r["policy"] for r in results))
    by_key = {(r["policy"], r["task"]): r for r in results}
    headline = next((names[0] for r in results if (names := metric_names(r))), None)
    # "own": the model's own answers that were legal, when constrained decoding made every answer legal.
    own_col = any(r.get("own_answer_valid_rate") is not None and r["fallback_rate"] == 0 for r in results)
    head = f"{'policy':<12}" + "".join(f"{t:>24}" for t in tasks) + f"{'valid':>8}" + (f"{'own':>8}" * own_col)
    seeds = report.get("config", {}).get("eval_seeds", "?")
    shown = f" and ({headline})" if headline else ""
    lines = [f"held-out final score (mean ± sd){shown}, seeds {seeds}", head, "-" * len(head)]
    for policy in policies:
        cells, valid, own = [], [], []
        for task in tasks:
            r = by_key.get((policy, task))
            if r is None or r["final_score_mean"] is None:
                cells.append(f"{'-':>24}")
                continue
            cell = f"{r['final_score_mean']:>.3f} ± {r['final_score_sd']:.3f}"
            if headline is not None and r.get(f"{headline}_mean") is not None:
                cell += f" ({r[f'{headline}_mean']:>4.1f})"
            cells.append(cell.rjust(24))
            valid.append(r["valid_action_rate"])
            if r.get("own_answer_valid_rate") is not None:
                own.append(r["own_answer_valid_rate"])
        v = f"{100 * min(valid):.1f}%" if valid else "-"  # tenths: 98.7 % is not the 99 % target
        o = (f"{100 * min(own):.1f}%" if own else "-").rjust(8) if own_col else ""
        lines.append(f"{policy:<12}" + "".join(cells) + f"{v:>8}" + o)
    if any(rate_names(r) for r in results):  # outcomes such as a win: every row's rates, lengths and action mix
        lines += ["", format_results(results)]
    for task, policies_diff in (report.get("paired") or {}).items():
        reference = report.get("paired_reference", "?")
        for policy, cells in policies_diff.items():
            shown = ", ".join(f"{m} {c['diff']:+.3f} ± {c['se']:.3f}" for m, c in cells.items())
            lines.append(f"{policy} minus {reference} on {task}, same seeds (n={next(iter(cells.values()))['n']}): "
                         f"{shown}" if cells else f"{policy} minus {reference} on {task}: -")  # fmt: skip
    references = interface.reference_scores if interface is not None else None
    if references:
        lines.append(f"{'reference':<12}" + "".join(f"{references.get(t, float('nan')):>24.3f}" for t in tasks))
    band = interface.reference_band if interface is not None else None
    for metric in dict.fromkeys(name for r in results for name in curve_names(r)):
        days = list(next((r[f"{metric}_at_mean"] for r in results if r.get(f"{metric}_at_mean")), {}))
        title = f"{metric} after " + "".join(f"day {d} / " for d in days) + "peak / end"
        if band is not None and band[0] == metric:
            title += f" ({band[1]}: {band[2]:g}-{band[3]:g})"
        lines += ["", title]
        for policy in policies:
            cells = []
            for task in tasks:
                r = by_key.get((policy, task)) or {}
                if f"{metric}_by_day_mean" not in r:
                    cells.append(f"{'-':>24}")
                    continue
                at = r.get(f"{metric}_at_mean") or {}
                numbers = [at[d] for d in days] + [r[f"{metric}_peak_mean"], r[f"{metric}_mean"]]
                cells.append(" / ".join(f"{x:.1f}" for x in numbers).rjust(24))
            lines.append(f"{policy:<12}" + " |".join(cells))
    for section in sections:
        if section:
            lines += ["", section]
    for key in ("seconds", "output_dir"):
        if key in report:
            lines.append(f"{key}: {report[key]}")
    return "\n".join(lines)

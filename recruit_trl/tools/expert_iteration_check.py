"""``recruit-trl learning-check expert_iteration``: expert iteration's treatment against its two controls.

The expert-iteration recipe (``recipes/expert_iteration.py``, :mod:`recruit_trl.workflow.expert_iteration`) learns
from the planner's labels. Its claim counts beside two controls that run the same loop, states, rows and epochs
from the same start, and differ only in the labels (``--labels``):

* ``treatment`` (``planner``): the best proposal of the planner at each kept state;
* ``self``: the model's own greedy choice (what training on its own states and the replayed data does by itself);
* ``shuffled``: the best of the planner's values permuted among the scored proposals (labels that move the model
  as far, at random).

1. Checks: the recipe flags, parsed by the recipe's own ``parse_args`` with the flags the check sets
   (``--labels``, ``--seed``, ``--output_dir``: refused among the recipe flags); the start (``--start``) must hold a
   model; held-out seeds that the rounds play (their ``--train_seeds`` blocks) are refused.
2. Every training seed in the three arms, seed by seed, each a fresh ``python RECIPE`` process into
   ``<output_dir>/<arm>_seed<k>`` (log ``train.log`` there). A finished run (its ``expert_iteration.json``) made by
   the same code (:func:`recruit_trl.tools.learning_check.stale_reason`: a hash of the files that run) is reused;
   one made by other code is moved aside, never deleted, and trained again. ``report_only`` trains nothing and
   reports the finished runs there, whatever code made them (each run's record, its commit and code hash, is in
   the JSON).
3. Greedy evaluation on the held-out seeds of the start, the planner on the start's proposals (``planner:model:``,
   the ceiling) and every round's model of every run, each cached beside the model
   (:func:`recruit_trl.workflow.evaluation.cache.evaluate_cached`).
4. The summary (:func:`summarize`), per task and for the mean over tasks: each arm's last round, mean +- SE across
   training seeds; by training seed, the treatment minus the start and minus each control, and each control minus
   the start, with their t on n-1 degrees of freedom; per round, each arm's share of the start -> planner gap closed
   (``(round - start) / (planner - start)``, mean across seeds). Then the JSON and a PNG of the score by round.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from tqdm.auto import tqdm

from recruit_trl.files import read_json, save_figure_atomic, write_json_atomic
from recruit_trl.models.loading import is_trained, loading_config
from recruit_trl.protocol import get_env_interface
from recruit_trl.tools.learning_check import (
    FLAGS_FILE,
    LOG_FILE,
    RUN_RECORD,
    LearningCheckError,
    call_parse_args,
    clear_if_stale,
    code_state,
    describe_code,
    format_arm,
    format_paired,
    format_table,
    format_value,
    mean_over_tasks,
    mean_se,
    minus_start,
    own_flags_in,
    paired_differences,
    pick_metric,
    run_logged,
    seed_list,
    short_range,
    write_record,
)
from recruit_trl.versions import versions
from recruit_trl.workflow.arguments import ReportArguments
from recruit_trl.workflow.evaluation.cache import evaluate_cached
from recruit_trl.workflow.evaluation.evaluate import EvalConfig
from recruit_trl.workflow.run_report import eval_workers

# The arms and the --labels each runs with; the treatment first, then its controls.
ARMS = {"treatment": "planner", "self": "self", "shuffled": "shuffled"}
CONTROLS = ("self", "shuffled")
OWN_FLAGS = ("seed", "labels", "output_dir")  # set by the check for every run
SUMMARY_FILE = "expert_iteration.json"  # written last by the recipe: the run is finished
CHECK_JSON = "learning_check.json"
ROUNDS_PNG = "rounds.png"
DEFAULT_EVAL_SEEDS = "20-39"


def is_expert_iteration_recipe(module: ModuleType) -> bool:
    """Whether the recipe module is built on :class:`~recruit_trl.workflow.expert_iteration.ExpertIterationArguments`
    (its ``parse_args`` returns them)."""
    return hasattr(module, "ExpertIterationArguments") and hasattr(module, "parse_args")


# --------------------------------------------------------------------------------------------------
# statistics (pure)


def summarize(
    rows: Sequence[Mapping[str, Any]],
    start: Mapping[str, float | None],
    planner: Mapping[str, float | None],
    tasks: Sequence[str],
    rounds: int,
) -> dict[str, dict[str, Any]]:
    """The check's summary from its result rows.

    Args:
        rows: ``{"arm", "seed", "round", "task", "value"}`` per round's model and task.
        start, planner: ``{task: value}`` of the start and of the planner on its proposals.
        tasks: the tasks in order; ``"mean"`` (the mean over tasks, for models with a value on every task) is added.
        rounds: rounds per run; the last one is the run's model.

    Returns:
        ``{task: cell}`` (tasks in order, ``"mean"`` last), a cell ``{arm: {"n", "mean", "se", "values": {seed:
        value}}, "start", "planner", "treatment_minus_start", "treatment_minus_<control>", "<control>_minus_start",
        "gap_closed": {arm: [share per round]}}``; the differences ``{"seeds", "diffs", "n", "mean", "se", "t",
        "df"}`` by training seed (:func:`~recruit_trl.tools.learning_check.paired_differences`). A round's share is
        the mean over seeds of ``(value - start) / (planner - start)`` (``None`` without a gap).
    """
    values: dict[tuple[str, str, int], dict[int, float]] = {}  # (task, arm, round) -> {seed: value}
    for r in rows:
        if r["value"] is not None:
            values.setdefault((r["task"], r["arm"], r["round"]), {})[r["seed"]] = r["value"]
    start, planner = dict(start), dict(planner)
    for arm in ARMS:
        for k in range(rounds):
            values[("mean", arm, k)] = mean_over_tasks([values.get((task, arm, k), {}) for task in tasks])
    for scores in (start, planner):
        if tasks and all(scores.get(task) is not None for task in tasks):
            scores["mean"] = sum(scores[task] for task in tasks) / len(tasks)
    out = {}
    for task in [*tasks, "mean"]:
        last = {arm: dict(sorted(values.get((task, arm, rounds - 1), {}).items())) for arm in ARMS}
        cell: dict[str, Any] = {arm: {**mean_se(list(by_seed.values())), "values": by_seed}
                                for arm, by_seed in last.items()}  # fmt: skip
        cell["start"], cell["planner"] = start.get(task), planner.get(task)
        cell["treatment_minus_start"] = minus_start(last["treatment"], cell["start"])
        for control in CONTROLS:
            cell[f"treatment_minus_{control}"] = paired_differences(last["treatment"], last[control])
            cell[f"{control}_minus_start"] = minus_start(last[control], cell["start"])
        gap = None if cell["start"] is None or cell["planner"] is None else cell["planner"] - cell["start"]
        cell["gap_closed"] = {
            arm: [None if not gap or not values.get((task, arm, k)) else
                  mean_se([(v - cell["start"]) / gap for v in values[(task, arm, k)].values()])["mean"]
                  for k in range(rounds)]
            for arm in ARMS
        }  # fmt: skip
        out[task] = cell
    return out


def format_summary(summary: Mapping[str, Mapping[str, Any]], metric: str) -> str:
    """The summary as a plain-text table: each arm's last round (mean +- SE, n), the start and the planner, then by
    training seed the treatment minus the start and minus each control (mean +- SE, t), and the treatment's share of
    the gap closed per round."""

    def shares(values: Sequence[float | None]) -> str:
        return " / ".join("-" if v is None else f"{v:.2f}" for v in values)

    headers = ["task", "treatment", "self", "shuffled", "start", "planner", "treatment-start",
               "treatment-self", "treatment-shuffled", "gap closed by round"]  # fmt: skip
    rows = [
        [task, *(format_arm(c[arm]) for arm in ARMS), format_value(c["start"]), format_value(c["planner"]),
         *(format_paired(c[f"treatment_minus_{other}"]) for other in ("start", *CONTROLS)),
         shares(c["gap_closed"]["treatment"])]
        for task, c in summary.items()
    ]  # fmt: skip
    return format_table(f"{metric}, greedy (differences by training seed):", headers, rows)


# --------------------------------------------------------------------------------------------------
# the plan


@dataclass
class ExpertIterationPlan:
    """Everything an expert-iteration check runs, decided (and checked) before anything trains."""

    recipe: Path
    flags: list[str]
    seeds: list[int]
    output_dir: Path
    json_path: Path
    start: str
    rounds: int
    tasks: list[str]
    eval_config: EvalConfig
    metric: str | None = None
    report_only: bool = False

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.output_dir / f"{arm}_seed{seed}"

    def run_command(self, arm: str, seed: int) -> list[str]:
        own = ["--labels", ARMS[arm], "--seed", str(seed), "--output_dir", str(self.run_dir(arm, seed))]
        return [sys.executable, str(self.recipe), *self.flags, *own]


def make_expert_iteration_plan(
    recipe: Path,
    module: ModuleType,
    flags: Sequence[str],
    seeds: str = "0-2",
    eval_seeds: str | None = None,
    output_dir: str | None = None,
    json_path: str | None = None,
    metric: str | None = None,
    report_only: bool = False,
) -> ExpertIterationPlan:
    """Check everything the check needs and decide what it runs; nothing is written.

    Args:
        recipe, module: the recipe's file and its module (:func:`~recruit_trl.tools.learning_check.load_recipe`).
        flags: the recipe flags, the same for every run (not ``--labels``, ``--seed`` or ``--output_dir``).
        seeds: training seeds, each run in every arm.
        eval_seeds: held-out reset seeds (default :data:`DEFAULT_EVAL_SEEDS`).
        output_dir: the check's folder (default ``outputs/learning_check/<recipe>``).
        json_path: the JSON file (default ``<output_dir>/learning_check.json``).
        metric: the result rows' field compared (default ``win_rate`` when they carry it, else ``final_score_mean``).
        report_only: train nothing; report the finished runs in ``output_dir``.

    Raises:
        LearningCheckError: with a one-line message.
    """
    train_seeds = seed_list(seeds, "--seeds")
    held_out = seed_list(eval_seeds or DEFAULT_EVAL_SEEDS, "--eval_seeds")
    if own := own_flags_in(flags, OWN_FLAGS):
        raise LearningCheckError(f"the check sets {', '.join(dict.fromkeys(own))} for every run itself: drop it from "
                                 "the recipe flags (--seeds, --output_dir of learning-check)")  # fmt: skip
    out = Path(output_dir or Path("outputs", "learning_check", recipe.stem)).resolve()
    probe = [*flags, "--labels", "planner", "--seed", str(train_seeds[0]), "--output_dir", str(out / "probe")]
    script_args, iteration, _, model_args = call_parse_args(module, probe)
    if not is_trained(iteration.start):
        raise LearningCheckError(f"--start {iteration.start}: no trained model there")
    played = {s for r in range(iteration.rounds) for s in iteration.round_seeds(r)}
    if seen := sorted(played & set(held_out)):
        raise LearningCheckError(f"--eval_seeds {short_range(held_out)} holds seeds the rounds play "
                                 f"({short_range(seen)} of --train_seeds {iteration.train_seeds})")  # fmt: skip
    previous = read_json(out / FLAGS_FILE)
    if previous is not None and (previous.get("recipe"), previous.get("flags")) != (str(recipe), list(flags)):
        raise LearningCheckError(f"{out} holds a learning check of {previous.get('recipe')} with the flags "
                                 f"{previous.get('flags')}: give another --output_dir")  # fmt: skip
    interface = get_env_interface(script_args.env_name)
    report = ReportArguments()  # the main job's report evaluates so: constrained, one worker per core on CPU
    config = EvalConfig(
        env=script_args.env_name, tasks=tuple(script_args.tasks or interface.tasks()), seeds=tuple(held_out),
        contract=script_args.contract, recent_k=script_args.recent_k, constrained=report.eval_constrained,
        workers=eval_workers(report), model_loading=loading_config(model_args),
    )  # fmt: skip
    return ExpertIterationPlan(
        recipe=recipe, flags=list(flags), seeds=train_seeds, output_dir=out,
        json_path=Path(json_path).resolve() if json_path else out / CHECK_JSON, start=str(iteration.start),
        rounds=iteration.rounds, tasks=list(config.tasks), eval_config=config, metric=metric, report_only=report_only,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------------
# the check


def run_expert_iteration_check(plan: ExpertIterationPlan, progress: bool = True) -> int:
    """Train every arm on every seed (unless ``report_only``), evaluate, print the summary, write the JSON and the
    PNG. Returns 0 when everything ran, 1 when something failed or is missing (the JSON then holds what finished)."""
    out = plan.output_dir
    out.mkdir(parents=True, exist_ok=True)
    if not (out / FLAGS_FILE).is_file():
        write_json_atomic(out / FLAGS_FILE, {"recipe": str(plan.recipe), "flags": plan.flags})
    code = code_state()
    print(f"code at {describe_code(code)}", flush=True)
    failures: list[str] = []
    runs = train_runs(plan, failures, progress, code)
    rows, start, planner, evaluations = evaluate_models(plan, runs, failures, progress)
    metric = pick_metric(start, plan.metric)
    scores = {name: {r["task"]: r.get(metric) for r in part}
              for name, part in (("start", start), ("planner", planner))}  # fmt: skip
    value_rows = [{k: r[k] for k in ("arm", "seed", "round", "task")} | {"value": r["result"].get(metric)}
                  for r in rows]  # fmt: skip
    summary = summarize(value_rows, scores["start"], scores["planner"], plan.tasks, plan.rounds)
    print(f"\nlearning check: {plan.recipe.name}, {metric} on held-out seeds {short_range(plan.eval_config.seeds)}, "
          f"training seeds {short_range(plan.seeds)}, start {plan.start}")  # fmt: skip
    print(format_summary(summary, metric))
    png = plot_rounds(summary["mean"], value_rows, plan, metric, out / ROUNDS_PNG)
    report = {
        "recipe": str(plan.recipe), "recipe_flags": plan.flags, **code, "report_only": plan.report_only,
        "output_dir": str(out), "start": plan.start, "tasks": plan.tasks, "seeds": plan.seeds,
        "eval_seeds": list(plan.eval_config.seeds), "rounds": plan.rounds, "metric": metric, "decoding": "greedy",
        "eval_config": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.eval_config.__dict__.items()},
        "start_scores": scores["start"], "planner_scores": scores["planner"], "rows": value_rows,
        "summary": summary, "runs": runs, "evaluations": evaluations, "failures": failures,
        "png": str(png) if png else None, "versions": versions(),
    }  # fmt: skip
    write_json_atomic(plan.json_path, report)
    print(f"\nwrote {plan.json_path}" + (f" and {png}" if png else ""))
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    return 1 if failures else 0


def train_runs(plan: ExpertIterationPlan, failures: list[str], progress: bool, code: Mapping[str, Any]) -> list[dict]:
    """Every arm on every seed, seed by seed (an interrupted check still has whole seeds), each in its own process;
    see the module docstring for what is reused. Returns a record per run (status, its folder's record, seconds)."""
    runs = []
    jobs = [(arm, seed) for seed in plan.seeds for arm in ARMS]
    bar = tqdm(jobs, desc="training runs", unit="run", disable=not progress or plan.report_only, dynamic_ncols=True)
    for arm, seed in bar:
        folder, argv = plan.run_dir(arm, seed), plan.run_command(arm, seed)
        run: dict[str, Any] = {"arm": arm, "seed": seed, "output_dir": str(folder), "command": shlex.join(argv)}
        if not plan.report_only:
            clear_if_stale(folder, code, f"{arm} seed {seed}", "trained", "training again")
        if (folder / SUMMARY_FILE).is_file():
            run["status"] = "finished before"
        elif plan.report_only:
            run["status"] = "missing"
            failures.append(f"{arm} seed {seed}: no finished run in {folder}")
        else:
            write_record(folder, code, argv)  # before training: an interrupted run resumes only at the same code
            bar.set_postfix_str(f"{arm} seed {seed}")
            started = time.perf_counter()
            returncode = run_logged(argv, folder / LOG_FILE)
            run.update(returncode=returncode, seconds=round(time.perf_counter() - started, 1))
            run["status"] = "trained" if returncode == 0 and (folder / SUMMARY_FILE).is_file() else "failed"
            tqdm.write(f"{arm} seed {seed}: {run['status']} in {run['seconds']:.0f} s (log: {folder / LOG_FILE})")
            if run["status"] == "failed":
                failures.append(f"{arm} seed {seed}: training failed (exit status {returncode}); see "
                                f"{folder / LOG_FILE}")  # fmt: skip
        run["record"] = read_json(folder / RUN_RECORD)  # the code that made it (None: made outside a check)
        summary = read_json(folder / SUMMARY_FILE)
        run["rounds"] = summary["rounds"] if isinstance(summary, dict) else None
        runs.append(run)
    bar.close()
    return runs


def evaluate_models(
    plan: ExpertIterationPlan, runs: Sequence[Mapping[str, Any]], failures: list[str], progress: bool
) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    """Greedy evaluation of the start, the planner on its proposals, and every round's model of every finished run,
    each cached beside the model (the start's and the planner's in ``<output_dir>/start/eval``).

    Returns:
        ``(rows, start, planner, evaluations)``: ``{"arm", "seed", "round", "task", "result"}`` per round's model and
        task, the start's and the planner's result rows, and a record per evaluation.
    """
    cache = plan.output_dir / "start" / "eval"
    models = [("start", None, None, f"model:{plan.start}", cache / "start_greedy.json"),
              ("planner", None, None, f"planner:model:{plan.start}", cache / "planner_greedy.json")]  # fmt: skip
    for run in runs:
        if run["status"] in ("missing", "failed"):
            continue
        for k in range(plan.rounds):
            folder = Path(run["output_dir"]) / f"round-{k}"
            cached = folder / "eval" / "learning_check_greedy.json"
            models.append((run["arm"], run["seed"], k, f"model:{folder}", cached))
    rows: list[dict] = []
    parts: dict[str, list[dict]] = {"start": [], "planner": []}
    evaluations = []
    bar = tqdm(models, desc="evaluations", unit="model", disable=not progress, dynamic_ncols=True)
    for arm, seed, k, policy, path in bar:
        label = arm if seed is None else f"{arm}_seed{seed}_round{k}"
        bar.set_postfix_str(label)
        try:
            part = evaluate_cached(policy, plan.eval_config, label, path, progress=False)
        except Exception as exc:  # a model that cannot be evaluated is reported; the others still are
            failures.append(f"{label}: evaluation failed: {type(exc).__name__}: {exc}")
            tqdm.write(f"error: {failures[-1]}")
            continue
        evaluations.append({"policy": policy, "label": label, "file": str(path)})
        if seed is None:
            parts[arm] = part["results"]
        else:
            rows += [{"arm": arm, "seed": seed, "round": k, "task": r["task"], "result": r} for r in part["results"]]
    bar.close()
    return rows, parts["start"], parts["planner"], evaluations


def plot_rounds(
    cell: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], plan: ExpertIterationPlan, metric: str, path: Path
) -> Path | None:
    """The mean over tasks by round: a thin line per run from the start, a thick one per arm's mean, and the start's
    and the planner's scores as dashed lines. ``None`` when nothing was evaluated."""
    if cell["start"] is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_run: dict[tuple[str, int], dict[int, list[float]]] = {}
    for r in rows:
        if r["value"] is not None:
            per_run.setdefault((r["arm"], r["seed"]), {}).setdefault(r["round"] + 1, []).append(r["value"])
    fig, ax = plt.subplots(figsize=(7, 4))
    for color, arm in zip(("tab:green", "tab:blue", "tab:orange"), ARMS, strict=True):
        runs = [{k: sum(v) / len(v) for k, v in by_round.items() if len(v) == len(plan.tasks)}
                for (a, _), by_round in per_run.items() if a == arm]  # fmt: skip
        for run in runs:
            ax.plot([0, *sorted(run)], [cell["start"], *(run[k] for k in sorted(run))], color=color, lw=0.7,
                    alpha=0.4)  # fmt: skip
        rounds = [k for k in range(1, plan.rounds + 1) if any(k in run for run in runs)]
        means = [mean_se([run[k] for run in runs if k in run])["mean"] for k in rounds]
        if runs:
            ax.plot([0, *rounds], [cell["start"], *means], color=color, lw=2, marker="o",
                    label=f"{arm} (mean of {len(runs)} seeds)")  # fmt: skip
    ax.axhline(cell["start"], color="grey", ls="--", lw=1, label="start")
    if cell["planner"] is not None:
        ax.axhline(cell["planner"], color="black", ls=":", lw=1, label="planner (ceiling)")
    ax.set_xticks(range(plan.rounds + 1))
    ax.set_xlabel("round (0: the start)")
    ax.set_ylabel(f"{metric}, greedy")
    ax.set_title(f"Expert iteration, held-out seeds {short_range(plan.eval_config.seeds)}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = save_figure_atomic(fig, path, dpi=120)
    plt.close(fig)
    return path

"""``recruit-trl learning-check RECIPE``: an RL recipe's credit against its control, across training seeds.

A learning claim counts only beside its control: the same run with the advantages permuted among the rows of each
optimizer batch (``--shuffle_advantages true``: the same values, zero expected gradient on-policy). This module runs
both arms from one shared start and compares them on held-out episodes:

1. Checks: the recipe (a file or a name in ``recipes/``), the seed ranges, and the recipe flags, parsed by the
   recipe's own ``parse_args`` (its config file, ``--config`` or its own, under the flags) together with the flags
   the check adds (so a flag the recipe refuses stops the check before anything trains). The flags the check sets
   itself (``--seed``, ``--shuffle_advantages``, ``--output_dir``) are refused among the recipe flags. The runs make
   no report (``--report_config none`` after the recipe flags): the check's evaluation takes its held-out seeds,
   constrained decoding and workers from the report config the recipe flags name (``--report_config``, else the
   recipe's config file's; ``none``: the defaults of :class:`~recruit_trl.workflow.arguments.ReportArguments`).
   Held-out seeds (the check's ``--eval_seeds``, else the report config's ``eval_seeds``) that overlap seeds
   training used, as the recipe parsed them (defaults included), are refused: its ``--anchor_seeds``, and with a
   warm start its SFT config's ``sft_train_seeds`` and, with DAgger rounds, ``dagger_seeds`` (:func:`seen_seeds`).
2. The start, built once in ``<output_dir>/start`` by a subprocess (:func:`build_start`): the recipe's warm start
   (the SFT config ``--sft_config`` names: :func:`recruit_trl.workflow.warm_start.run_warm_start`, trained into
   ``start/sft``), a given ``--sft_adapter``, or the base model itself (``--sft_config none``). Every run then starts
   from it (``--sft_adapter <start> --sft_config none`` after a warm start).
3. Every training seed in both arms, ``credit`` (``--shuffle_advantages false``) and ``control`` (``true``), each a
   fresh ``python RECIPE`` process into ``<output_dir>/<arm>_seed<k>`` with its output in ``train.log`` there; a
   crash is reported and the check goes on. A finished run (its ``run_info.json``, written last) is not run again
   when it was trained at the same code (below).
4. Held-out evaluation of the start and every trained model on the same reset seeds, every task of the run, greedy
   and sampled at the training ``--temperature`` / ``--top_p``; each model's evaluation is cached in
   ``<folder>/eval/learning_check_<decoding>.json`` (:func:`recruit_trl.workflow.evaluation.cache.evaluate_cached`).
5. The summary (:func:`summarize`): per task and for the mean over tasks, each arm's mean +- SE across training
   seeds, and three differences by training seed, each with its mean, SE and t on n-1 degrees of freedom and the
   per-seed values: credit minus the start (what the credit arm learnt, printed beside credit minus control), credit
   minus control, and control minus the start (how far the control moved on its own: a control that falls below the
   start makes credit minus control large without credit learning anything). The start is one model evaluated once,
   so each seed's difference from it is ``arm_seed - start``, and its own evaluation noise is in no SE. Then the JSON
   file (rows per arm, seed, task and decoding, the start's rows, the summary, the commit, the commands, versions)
   and a PNG of both arms' training curves (``episode/outcome`` in episode mode, else ``reward``, from each run's
   ``trainer_state.json``).

The code that runs (:func:`code_state`: the hash of the plugin's, environments', rewards' and recipes' files,
:func:`recruit_trl.versions.code_hash`, beside the checkout's commit and whether its tree was dirty) is in the JSON
(``code``, ``commit``, ``dirty``) and, before anything is made there, in the start's and each run's folder
(``learning_check_run.json``: ``code``, ``commit``, ``dirty``, ``command``). A folder is reused (its finished run, its
start, its cached evaluations) when its record names the same code hash, whatever the commit (a docs-only commit, an
untracked file outside the code's folders change nothing that runs); a record from before the hash is reused only at
the same commit with both trees clean. Any other folder is moved aside, never deleted (``<name>.stale``,
``<name>.stale-2``, ...), and made again, with one line in the log (``credit seed 1: trained at abc1234 (code
0123abcd), now def5678 (code 4567cdef): training again; what it held is in credit_seed1.stale``). The check's folder
belongs in an ignored folder (the default ``outputs/`` is).

This module imports no torch at import time: the recipe (and with it TRL) is loaded when the check runs.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from tqdm.auto import tqdm

from recruit_trl.files import read_json, save_figure_atomic, write_json_atomic
from recruit_trl.models.loading import is_trained, loading_config
from recruit_trl.protocol import get_env_interface
from recruit_trl.ranges import parse_int_ranges
from recruit_trl.versions import code_commit, code_hash, versions
from recruit_trl.workflow.arguments import NONE, ReportArguments, ScriptArguments, WarmStartArguments
from recruit_trl.workflow.configs import read_report_config, read_warm_start
from recruit_trl.workflow.evaluation.cache import evaluate_cached
from recruit_trl.workflow.evaluation.evaluate import EvalConfig
from recruit_trl.workflow.model_setup import model_init_kwargs, run_tasks, setup_run
from recruit_trl.workflow.run_report import eval_backend, rl_finished

# The two arms and the --shuffle_advantages value each runs with.
ARMS = {"credit": "false", "control": "true"}
# Flags the check sets for every run itself: the recipe flags may not set them.
OWN_FLAGS = ("seed", "shuffle_advantages", "output_dir")
# The recipes shipped with the repository (a name is looked up in ./recipes first, then here).
REPO_RECIPES = Path(__file__).resolve().parents[1] / "recipes"
START_DIR = "start"
START_FILE = "start.json"  # written last by build_start: the start model's path
FLAGS_FILE = "learning_check_flags.json"  # the recipe and flags this output folder was started with
LOG_FILE = "train.log"
RUN_RECORD = "learning_check_run.json"  # in the start's and every run's folder: the commit it was made at
TRAINER_STATE = "trainer_state.json"
CURVES_PNG = "learning_curves.png"
METRICS = ("win_rate", "final_score_mean")  # the first one the start's rows carry, unless --metric names one


class LearningCheckError(ValueError):
    """A learning check that cannot start: a bad recipe, seed range or recipe flag (a one-line message)."""


# --------------------------------------------------------------------------------------------------
# statistics (pure)


def mean_se(values: Sequence[float]) -> dict[str, Any]:
    """``{"n", "mean", "se"}`` of ``values``: the mean and its standard error (sample sd over sqrt(n), on n-1
    degrees of freedom); ``mean`` is ``None`` without values, ``se`` ``None`` below two."""
    n = len(values)
    if n == 0:
        return {"n": 0, "mean": None, "se": None}
    mean = sum(values) / n
    if n < 2:
        return {"n": n, "mean": mean, "se": None}
    variance = sum((v - mean) ** 2 for v in values) / (n - 1)
    return {"n": n, "mean": mean, "se": math.sqrt(variance / n)}


def paired_differences(first: Mapping[int, float], second: Mapping[int, float]) -> dict[str, Any]:
    """``first`` minus ``second`` paired by training seed (e.g. credit minus control): ``d_k = first_k - second_k``
    over the seeds both have.

    Returns:
        ``{"seeds", "diffs", "n", "mean", "se", "t", "df"}``: the seeds and their differences, the mean difference,
        its standard error, ``t = mean / se`` on ``df = n - 1`` degrees of freedom. ``t`` and ``df`` are ``None``
        below two pairs, ``t`` also when the differences do not vary (se 0).
    """
    seeds = sorted(set(first) & set(second))
    diffs = [first[k] - second[k] for k in seeds]
    stats = mean_se(diffs)
    # Differences equal on every seed have se 0, or a rounding residue of it: no t either way.
    varies = stats["se"] is not None and stats["se"] > 1e-12 * max(1.0, *(abs(d) for d in diffs))
    t = stats["mean"] / stats["se"] if varies else None
    return {"seeds": seeds, "diffs": diffs, **stats, "t": t, "df": stats["n"] - 1 if stats["n"] >= 2 else None}


def minus_start(values: Mapping[int, float], start: float | None) -> dict[str, Any]:
    """An arm minus the start by training seed, ``d_k = arm_k - start``: :func:`paired_differences` against the start
    on every seed (no seed when the start has no value).

    The start is one model evaluated once, so every seed's difference is from the same value, and the SE and t are
    the spread across training seeds only: the start's own evaluation noise is in none of them.
    """
    return paired_differences(values, {} if start is None else dict.fromkeys(values, start))


def mean_over_tasks(per_task: Sequence[Mapping[int, float]]) -> dict[int, float]:
    """``{seed: value}`` of each task -> ``{seed: mean over the tasks}``, for the seeds that have every task."""
    seeds = set.intersection(*(set(v) for v in per_task)) if per_task else set()
    return {k: sum(v[k] for v in per_task) / len(per_task) for k in sorted(seeds)}


def summarize(
    rows: Sequence[Mapping[str, Any]], start_rows: Sequence[Mapping[str, Any]], tasks: Sequence[str]
) -> dict[str, dict[str, dict[str, Any]]]:
    """The learning check's summary from its result rows.

    Args:
        rows: ``{"arm", "seed", "task", "decoding", "value"}`` per trained model, task and decoding.
        start_rows: ``{"task", "decoding", "value"}`` of the start model.
        tasks: the run's tasks, in order; the summary adds ``"mean"``, the mean over tasks of each model (only for
            models with a value on every task).

    Returns:
        ``{decoding: {task: {arm: {"n", "mean", "se", "values": {seed: value}}, "start": value,
        "credit_minus_start", "credit_minus_control", "control_minus_start"}}}`` for each decoding of the rows, tasks
        in order and ``"mean"`` last. The three differences are by training seed, each ``{"seeds", "diffs", "n",
        "mean", "se", "t", "df"}``: :func:`minus_start` of each arm, :func:`paired_differences` of the arms.
    """
    decodings = list(dict.fromkeys([r["decoding"] for r in start_rows] + [r["decoding"] for r in rows]))
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for decoding in decodings:
        values: dict[tuple[str, str], dict[int, float]] = {}  # (task, arm) -> {seed: value}
        for r in rows:
            if r["decoding"] == decoding and r["value"] is not None:
                values.setdefault((r["task"], r["arm"]), {})[r["seed"]] = r["value"]
        start = {r["task"]: r["value"] for r in start_rows if r["decoding"] == decoding and r["value"] is not None}
        for arm in ARMS:
            values[("mean", arm)] = mean_over_tasks([values.get((task, arm), {}) for task in tasks])
        if tasks and all(task in start for task in tasks):
            start["mean"] = sum(start[task] for task in tasks) / len(tasks)
        cells = {}
        for task in [*tasks, "mean"]:
            cell: dict[str, Any] = {}
            for arm in ARMS:
                by_seed = dict(sorted(values.get((task, arm), {}).items()))
                cell[arm] = {**mean_se(list(by_seed.values())), "values": by_seed}
            cell["start"] = start.get(task)
            credit, control = values.get((task, "credit"), {}), values.get((task, "control"), {})
            cell["credit_minus_start"] = minus_start(credit, cell["start"])
            cell["credit_minus_control"] = paired_differences(credit, control)
            cell["control_minus_start"] = minus_start(control, cell["start"])
            cells[task] = cell
        out[decoding] = cells
    return out


def format_arm(cell: Mapping[str, Any]) -> str:
    """An arm's ``{"n", "mean", "se"}`` as ``0.650 ± 0.010 (n 2)`` (``-`` without a value)."""
    if cell["mean"] is None:
        return "-"
    se = f" ± {cell['se']:.3f}" if cell["se"] is not None else ""
    return f"{cell['mean']:.3f}{se} (n {cell['n']})"


def format_paired(p: Mapping[str, Any], none: str = "-") -> str:
    """A :func:`paired_differences` as ``+0.110 ± 0.030  t = 3.67 (df 1)`` (``none`` without a pair)."""
    if p["n"] == 0:
        return none
    if p["n"] < 2:
        return f"{p['mean']:+.3f} (n 1: no SE, no t)"
    t = "no t (no spread)" if p["t"] is None else f"t = {p['t']:.2f} (df {p['df']})"
    return f"{p['mean']:+.3f} ± {p['se']:.3f}  {t}"


def format_value(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def format_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``title``, then the rows under their headers in left-aligned columns."""
    widths = [max(len(str(x)) for x in column) for column in zip(headers, *rows, strict=True)]
    lines = [title]
    for cells in [headers, ["-" * w for w in widths], *rows]:
        lines.append("  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
    return "\n".join(lines)


def format_summary(summary: Mapping[str, Mapping[str, Mapping[str, Any]]], metric: str) -> str:
    """The summary as plain-text tables, one per decoding: each arm's mean +- SE across training seeds, the start,
    then by training seed (mean +- SE, t on n-1 degrees of freedom) credit minus the start and credit minus control
    side by side, and control minus the start (how far the control itself moved)."""
    headers = ["task", "credit", "control", "start", "credit-start (by seed)", "credit-control (by seed)",
               "control-start (by seed)"]  # fmt: skip
    blocks, no_pair = [], "no seed with both arms"
    for decoding, cells in summary.items():
        rows = [
            [task, format_arm(c["credit"]), format_arm(c["control"]), format_value(c["start"]),
             format_paired(c["credit_minus_start"]), format_paired(c["credit_minus_control"], no_pair),
             format_paired(c["control_minus_start"])]
            for task, c in cells.items()
        ]  # fmt: skip
        blocks.append(format_table(f"{metric}, {decoding}:", headers, rows))
    return "\n\n".join(blocks)


# --------------------------------------------------------------------------------------------------
# checks and the plan


@dataclass
class Plan:
    """Everything a learning check runs, decided (and checked) before anything trains."""

    recipe: Path
    flags: list[str]  # the recipe flags given after "--"
    seeds: list[int]
    eval_seeds: list[int]
    output_dir: Path
    json_path: Path
    metric: str | None  # None: win_rate when the rows carry it, else final_score_mean
    env: str
    tasks: list[str]
    mode: str
    # whether the start trains the warm start the recipe's --sft_config names (else: --sft_adapter or the base model)
    warm_start: bool
    eval_config: EvalConfig  # greedy; the sampled one is its copy at the training temperature
    sampling: dict[str, float]  # the training --temperature and --top_p
    # The start when nothing builds it: the --sft_adapter, or a base model folder used as it is (None: the start's
    # process trains the warm start, or resolves a built model's name such as tiny or smollm2).
    known_start: str | None = None
    greedy_only: bool = False  # skip the sampled evaluation (half the evaluation's time)

    @property
    def start_dir(self) -> Path:
        return self.output_dir / START_DIR

    def run_dir(self, arm: str, seed: int) -> Path:
        return self.output_dir / f"{arm}_seed{seed}"

    def decodings(self) -> dict[str, EvalConfig]:
        """``{"greedy": config, "sampled": config}``; greedy only when training did not sample (temperature 0) or
        the check was asked for greedy only."""
        out = {"greedy": self.eval_config}
        if self.sampling["temperature"] > 0 and not self.greedy_only:
            out["sampled"] = replace(self.eval_config, **self.sampling)
        return out


def find_recipe(name: str) -> Path:
    """The recipe file ``name`` names: a path to it, or a recipe's name (``grpo_clinical``, ``grpo_clinical.py``) in
    ``./recipes`` or the repository's ``recipes/``.

    Raises:
        LearningCheckError: no such file.
    """
    path = Path(name)
    if path.is_file():
        return path.resolve()
    stem = path.stem if path.suffix == ".py" else path.name
    for folder in (Path.cwd() / "recipes", REPO_RECIPES):
        if (folder / f"{stem}.py").is_file():
            return (folder / f"{stem}.py").resolve()
    known = sorted(p.stem for p in REPO_RECIPES.glob("*.py"))
    raise LearningCheckError(f"unknown recipe {name!r}: give a recipe file or a name in recipes/ ({', '.join(known)})")


def own_flags_in(flags: Sequence[str], own: Sequence[str] = OWN_FLAGS) -> list[str]:
    """The flags among ``flags`` that the check sets itself, ``own`` (``--seed``, ``--output-dir=...``, ...)."""
    found = []
    for flag in flags:
        if flag.startswith("--"):
            name = flag[2:].split("=", 1)[0].replace("-", "_")
            if name in own:
                found.append(f"--{name}")
    return found


def load_recipe(path: Path) -> ModuleType:
    """The recipe file as a module (registered in ``sys.modules``: its dataclasses look their module up), without
    what TRL and bitsandbytes print when they are imported."""
    name = f"recruit_trl_recipe_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    with contextlib.redirect_stdout(io.StringIO()):
        spec.loader.exec_module(module)
    if not callable(getattr(module, "parse_args", None)):
        raise LearningCheckError(f"{path} has no parse_args(argv): not a recipe")
    return module


def parse_recipe_flags(recipe: ModuleType, flags: Sequence[str]) -> tuple[Any, Any, Any]:
    """``(script_args, training_args, model_args)`` of the recipe's own ``parse_args(flags)``.

    Raises:
        LearningCheckError: the recipe is not an RL recipe of :func:`recruit_trl.workflow.pipeline.run_rl`, or refuses
            the flags (the parser's own error line; a config file that is not there).
    """
    name = Path(recipe.__file__).name
    parsed = call_parse_args(recipe, flags)
    if not (isinstance(parsed, tuple) and len(parsed) == 3 and isinstance(parsed[0], ScriptArguments)):
        raise LearningCheckError(f"{name} is not an RL recipe of recruit_trl.workflow.pipeline (no ScriptArguments)")
    return parsed


def call_parse_args(recipe: ModuleType, flags: Sequence[str]) -> Any:
    """The recipe's own ``parse_args(flags)``.

    Raises:
        LearningCheckError: the recipe refuses the flags (the parser's own error line; a config file that is not
            there).
    """
    name = Path(recipe.__file__).name
    captured = io.StringIO()
    try:
        # argparse prints its usage over many lines before exiting: keep only its error line.
        with contextlib.redirect_stderr(captured):
            return recipe.parse_args(list(flags))
    except SystemExit:
        lines = [line for line in captured.getvalue().splitlines() if line.strip()]
        error = next((line for line in reversed(lines) if "error:" in line), lines[-1] if lines else "refused")
        error = error.split("error:", 1)[-1].strip()
        raise LearningCheckError(f"{name} refuses the recipe flags: {error}") from None
    except (ValueError, FileNotFoundError) as exc:
        raise LearningCheckError(f"{name} refuses the recipe flags: {' '.join(str(exc).split())}") from exc


def seed_list(spec: str, what: str) -> list[int]:
    """``parse_int_ranges(spec)``, refused when malformed or empty."""
    try:
        seeds = parse_int_ranges(spec)
    except ValueError as exc:
        raise LearningCheckError(f"{what}: {exc}") from exc
    if not seeds:
        raise LearningCheckError(f"{what}: {spec!r} names no seed")
    return seeds


def make_plan(
    recipe: str,
    flags: Sequence[str],
    seeds: str = "0-2",
    eval_seeds: str | None = None,
    output_dir: str | None = None,
    json_path: str | None = None,
    metric: str | None = None,
    greedy_only: bool = False,
    module: ModuleType | None = None,
) -> Plan:
    """Check everything a learning check needs and decide what it runs; nothing is written.

    Args:
        recipe: a recipe file or name (:func:`find_recipe`).
        flags: the recipe flags, the same for every run (not ``--seed``, ``--shuffle_advantages`` or
            ``--output_dir``: the check sets them; ``--report_config`` names the evaluation's settings).
        seeds: training seeds, e.g. ``0-2``.
        eval_seeds: held-out reset seeds of the evaluation (default: the ``eval_seeds`` of the report config the
            recipe flags name, else :class:`~recruit_trl.workflow.arguments.ReportArguments`' default).
        output_dir: the check's folder (default ``outputs/learning_check/<recipe>``).
        json_path: the JSON file (default ``<output_dir>/learning_check.json``).
        metric: a result row's field to compare (default: ``win_rate`` when the rows carry it, else
            ``final_score_mean``).
        greedy_only: evaluate greedy only, not also sampled at the training temperature.
        module: the recipe's module when the caller loaded it (:func:`load_recipe`).

    Raises:
        LearningCheckError: with a one-line message.
    """
    path = find_recipe(recipe)
    train_seeds = seed_list(seeds, "--seeds")
    held_out = seed_list(eval_seeds, "--eval_seeds") if eval_seeds is not None else None
    if own := own_flags_in(flags):
        raise LearningCheckError(
            f"the check sets {', '.join(dict.fromkeys(own))} for every run itself: drop it "
            "from the recipe flags (--seeds, --eval_seeds, --output_dir of learning-check)"
        )
    out = Path(output_dir or Path("outputs", "learning_check", path.stem)).resolve()
    module = module or load_recipe(path)
    given = parse_recipe_flags(module, flags)[0]  # an RL recipe that takes the flags as given (its report config too)
    # Parsed again with the check's own flags, as a run will be, so that every flag is checked now (the start's flags
    # name fields every RL recipe has).
    probe = [*flags, *own_run_flags(train_seeds[0], "control", out / f"control_seed{train_seeds[0]}")]
    script_args, training_args, model_args = parse_recipe_flags(module, probe)
    # The evaluation's settings: the report config's (the runs make none), else the report's defaults.
    report = read_report_config(given.report_config)
    named = "the report config's eval_seeds" if report is not None else "the report's default eval_seeds"
    report = report or ReportArguments()
    if held_out is None:
        held_out = seed_list(report.eval_seeds, named)
        shown = f"{named} {report.eval_seeds}"
    else:
        shown = f"learning-check --eval_seeds {eval_seeds}"
    warm_start = read_warm_start(script_args.sft_config, script_args, model_args)
    refuse_seen_seeds(held_out, shown, script_args, warm_start.warm if warm_start is not None else None)
    previous = read_json(out / FLAGS_FILE)
    if previous is not None and (previous.get("recipe"), previous.get("flags")) != (str(path), list(flags)):
        raise LearningCheckError(f"{out} holds a learning check of {previous.get('recipe')} with the flags "
                                 f"{previous.get('flags')}: give another --output_dir")  # fmt: skip
    tasks = run_tasks(script_args, get_env_interface(script_args.env_name))
    config = EvalConfig(
        env=script_args.env_name,
        tasks=tuple(tasks),
        seeds=tuple(held_out),
        contract=script_args.contract,
        recent_k=script_args.recent_k,
        constrained=report.eval_constrained,
        model_loading=loading_config(model_args),  # the models are evaluated loaded as they were trained
        **eval_backend(report, training_args),
    )
    return Plan(
        recipe=path,
        flags=list(flags),
        seeds=train_seeds,
        eval_seeds=list(config.seeds),
        output_dir=out,
        json_path=Path(json_path).resolve() if json_path else out / "learning_check.json",
        metric=metric,
        env=script_args.env_name,
        tasks=tasks,
        mode=script_args.mode,
        warm_start=script_args.sft_adapter is None and script_args.sft_config != NONE,
        known_start=known_start(script_args, model_args),
        eval_config=config,
        sampling={"temperature": float(training_args.temperature), "top_p": float(training_args.top_p)},
        greedy_only=greedy_only,
    )


def seen_seeds(script_args: ScriptArguments, warm: WarmStartArguments | None) -> dict[str, str]:
    """``{setting: range}``: the seeds (as parsed: defaults included) that train the models the check evaluates or
    choose among them, each named by where it is set (``the recipe's --anchor_seeds``, ``the SFT config's
    sft_train_seeds``).

    RL's ``--anchor_seeds`` always; with a warm start, the SFT config's ``sft_train_seeds``, and ``dagger_seeds``
    when there are DAgger rounds (their students play them; the best round is chosen on them). ``warm`` is that
    config's :class:`~recruit_trl.workflow.arguments.WarmStartArguments`
    (:func:`recruit_trl.workflow.configs.read_warm_start`), ``None`` with ``--sft_config none``; for an
    ``--sft_adapter`` given, the SFT config is the best guess of how it was trained. Not the seeds of held-out
    reports that neither train nor choose (``sft_heldout_seeds``, ``sft_fixed_seeds``, the report config's
    ``decision_seeds``).
    """
    seen = {"the recipe's --anchor_seeds": script_args.anchor_seeds}
    if warm is not None:
        seen["the SFT config's sft_train_seeds"] = warm.sft_train_seeds
        if warm.dagger_rounds > 0:
            seen["the SFT config's dagger_seeds"] = warm.dagger_seeds
    return seen


def refuse_seen_seeds(
    held_out: Sequence[int], shown: str, script_args: ScriptArguments, warm: WarmStartArguments | None
) -> None:
    """Refuse held-out evaluation seeds that training saw (:func:`seen_seeds`): such episodes are not held out.

    Args:
        held_out: the held-out seeds.
        shown: their setting and range as the message names them (``learning-check --eval_seeds 0-9``).
        script_args: the recipe's parsed arguments.
        warm: the warm start's settings, its SFT config's (``None``: no SFT config).

    Raises:
        LearningCheckError: one line naming the held-out seeds' setting, each training setting they overlap and the
            seeds in common.
    """
    overlaps = []
    for setting, spec in seen_seeds(script_args, warm).items():
        common = sorted(set(held_out) & set(parse_int_ranges(spec)))
        if common:
            overlaps.append(f"{setting} {spec} on {short_range(common)}")
    if overlaps:
        raise LearningCheckError(f"{shown} overlap {'; '.join(overlaps)}: held-out episodes must be on seeds no "
                                 "training saw")  # fmt: skip


def known_start(script_args: Any, model_args: Any) -> str | None:
    """The start when no process has to build it: the ``--sft_adapter``, or with ``--sft_config none`` a model folder
    or hub id (what :func:`recruit_trl.workflow.model_setup.resolve_model` returns unchanged); ``None`` otherwise."""
    if script_args.sft_adapter:
        return script_args.sft_adapter
    name = model_args.model_name_or_path
    if script_args.sft_config == NONE and name.strip().lower() not in ("tiny", "smollm2"):
        return str(Path(name).resolve()) if Path(name).exists() else name
    return None


# --------------------------------------------------------------------------------------------------
# the start and the runs


def own_run_flags(seed: int, arm: str, output_dir: Path) -> list[str]:
    """The flags the check adds to a run: its seed, arm and folder, no report (the check evaluates itself)."""
    return ["--seed", str(seed), "--shuffle_advantages", ARMS[arm], "--output_dir", str(output_dir),
            "--report_config", NONE]  # fmt: skip


def start_flags(output_dir: Path, warm_start: bool) -> list[str]:
    """The flags that start a run from the warm start trained once in ``<output_dir>/start/sft``, and train none of
    its own (none when the recipe has no warm start to train: the run starts from its ``--sft_adapter`` or base
    model, as the start)."""
    if not warm_start:
        return []
    return ["--sft_adapter", str(output_dir / START_DIR / "sft"), "--sft_config", NONE]


def start_command(plan: Plan) -> list[str]:
    """The process that builds the start (:func:`build_start`)."""
    return [sys.executable, "-m", "recruit_trl.tools.learning_check", str(plan.recipe), str(plan.start_dir), "--",
            *plan.flags]  # fmt: skip


def run_command(plan: Plan, arm: str, seed: int) -> list[str]:
    """The process that trains ``arm`` with training seed ``seed``: the recipe, as a script, with the recipe flags,
    the check's own flags and the start's."""
    own = own_run_flags(seed, arm, plan.run_dir(arm, seed))
    return [sys.executable, str(plan.recipe), *plan.flags, *own, *start_flags(plan.output_dir, plan.warm_start)]


def build_start(recipe: str, start_dir: str, flags: Sequence[str]) -> dict[str, Any]:
    """Build the start every run trains from (run in its own process by the check; see :func:`start_command`).

    The recipe's pipeline up to its warm start (:func:`recruit_trl.workflow.pipeline.run_rl` steps 1-3): the
    environment and tasks, the base model resolved (``tiny`` built and cached), then without an ``--sft_adapter`` the
    warm start its ``--sft_config`` names trained into ``<start_dir>/sft`` (cached there), else the ``--sft_adapter``
    or (``--sft_config none``) the base model as it is.
    Writes ``<start_dir>/start.json`` last and returns it: ``{"start": path, "base_model": path, "warm_start_trained",
    "seed"}``.
    """
    import torch

    from recruit_trl.workflow.warm_start import run_warm_start

    module = load_recipe(Path(recipe))
    script_args, training_args, model_args = parse_recipe_flags(
        module, [*flags, "--output_dir", str(start_dir), "--report_config", NONE]
    )
    if not torch.cuda.is_available():  # as the pipeline: every core for this one process
        torch.set_num_threads(max(1, os.cpu_count() or 2))
    setup = setup_run(script_args, model_args.model_name_or_path)
    model_path = setup.model_path
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)
    warm_start = read_warm_start(script_args.sft_config, script_args, model_args)
    trained = script_args.sft_adapter is None and warm_start is not None
    if trained:
        start = run_warm_start(script_args, warm_start, training_args, model_args, setup)
    else:
        start = script_args.sft_adapter or model_path
    info = {"start": str(start), "base_model": model_path, "warm_start_trained": trained, "seed": training_args.seed}
    write_json_atomic(Path(start_dir) / START_FILE, info)
    return info


def start_built(plan: Plan) -> dict[str, Any] | None:
    """The start's ``start.json`` when the start is built (a trained warm start: its weights open)."""
    info = read_json(plan.start_dir / START_FILE)
    if not isinstance(info, dict) or not info.get("start"):
        return None
    return None if info.get("warm_start_trained") and not is_trained(info["start"]) else info


def run_logged(argv: Sequence[str], log: Path) -> int:
    """Run ``argv`` with its output appended to ``log`` (the command first); returns its exit status."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as stream:
        stream.write(f"$ {shlex.join(argv)}\n")
        stream.flush()
        return subprocess.run(list(argv), stdout=stream, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode


def code_state() -> dict[str, Any]:
    """The code that runs: ``{"commit", "dirty"}`` (:func:`recruit_trl.versions.code_commit`) and ``"code"``, the
    hash of its files (:func:`recruit_trl.versions.code_hash`)."""
    return {**code_commit(), "code": code_hash()}


def describe_code(code: Mapping[str, Any]) -> str:
    """``abc1234 (code 0123abcd)``, ``abc1234 with uncommitted changes (code ...)``, or ``an unknown commit (no git
    checkout)``; the code's hash where it is known."""
    if code.get("commit") is None:
        described = "an unknown commit (no git checkout)"
    else:
        described = code["commit"][:7] + (" with uncommitted changes" if code.get("dirty") else "")
    return described + (f" (code {code['code'][:8]})" if code.get("code") else "")


def stale_reason(folder: Path, code: Mapping[str, Any], made: str) -> str | None:
    """Why what ``folder`` holds (a run, or the start, with their evaluations) may not be reused with the code
    ``code`` (:func:`code_state`); ``None`` when it may, or when the folder holds nothing.

    It may be reused when its :data:`RUN_RECORD` names the same code hash; a record without one (made before the
    hash was recorded) only when it names the current commit and both it and the current tree are clean. ``made`` is
    the verb of the message (``trained``, ``built``, ``evaluated``).
    """
    if not folder.is_dir() or not any(folder.iterdir()):
        return None
    record = read_json(folder / RUN_RECORD)
    if not isinstance(record, dict) or "commit" not in record:
        return f"no record of the code it was {made} with"
    if record.get("code") is not None:
        if record["code"] == code.get("code"):
            return None
    elif code["commit"] is not None and not code["dirty"] and record.get("dirty") is False:
        if record["commit"] == code["commit"]:
            return None
    return f"{made} at {describe_code(record)}, now {describe_code(code)}"


def clear_if_stale(folder: Path, code: Mapping[str, Any], what: str, made: str, again: str) -> None:
    """Move ``folder`` aside (``<name>.stale``, ``<name>.stale-2``, ...) when :func:`stale_reason` refuses what it
    holds, saying so in one line (``credit seed 1: trained at abc1234 (code ...), now def5678 (code ...): training
    again; what it held is in credit_seed1.stale``). Nothing is deleted."""
    reason = stale_reason(folder, code, made)
    if reason is not None:
        # Moved, not trained into: the recipe would resume its checkpoints and reuse its anchor states, and the
        # evaluations cached there are the other code's.
        aside, n = folder.with_name(f"{folder.name}.stale"), 1
        while aside.exists():
            n += 1
            aside = folder.with_name(f"{folder.name}.stale-{n}")
        folder.rename(aside)
        tqdm.write(f"{what}: {reason}: {again}; what it held is in {aside.name}")


def write_record(folder: Path, code: Mapping[str, Any], argv: Sequence[str] | None) -> None:
    """Write the folder's :data:`RUN_RECORD` before anything is made in it: the code's hash, the commit, whether the
    tree was dirty, and the command that makes it (``None`` for a start nothing builds)."""
    command = shlex.join(argv) if argv is not None else None
    record = {"code": code.get("code"), "commit": code["commit"], "dirty": code["dirty"], "command": command}
    write_json_atomic(folder / RUN_RECORD, record)


# --------------------------------------------------------------------------------------------------
# evaluation and curves


def eval_file(folder: Path, decoding: str) -> Path:
    return folder / "eval" / f"learning_check_{decoding}.json"


def pick_metric(rows: Sequence[Mapping[str, Any]], metric: str | None) -> str:
    """``metric``, else the first of :data:`METRICS` that the rows carry (``win_rate`` for conquest)."""
    if metric:
        return metric
    return next((m for m in METRICS if rows and all(r.get(m) is not None for r in rows)), METRICS[-1])


def curve_key(mode: str, history: Sequence[Mapping[str, Any]]) -> str:
    """The on-policy training curve: the episodes' outcome in episode mode (when logged), else the mean reward."""
    if mode == "episode" and any("episode/outcome" in h for h in history):
        return "episode/outcome"
    return "reward"


def training_curve(folder: Path, key: str) -> tuple[list[int], list[float]]:
    """``(steps, values)`` of ``key`` in the run's ``trainer_state.json`` log history."""
    state = read_json(folder / TRAINER_STATE) or {}
    rows = [h for h in state.get("log_history", []) if h.get(key) is not None and "step" in h]
    return [h["step"] for h in rows], [float(h[key]) for h in rows]


def plot_curves(curves: Mapping[str, Mapping[int, tuple[list[int], list[float]]]], key: str, path: Path) -> Path:
    """Both arms' training curves: a thin line per seed, a thick one for the mean across seeds at each step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for color, (arm, runs) in zip(("tab:blue", "tab:orange"), curves.items(), strict=False):
        by_step: dict[int, list[float]] = {}
        for steps, values in runs.values():
            ax.plot(steps, values, color=color, linewidth=0.7, alpha=0.35)
            for step, value in zip(steps, values, strict=True):
                by_step.setdefault(step, []).append(value)
        steps = sorted(by_step)
        means = [sum(by_step[s]) / len(by_step[s]) for s in steps]
        ax.plot(steps, means, color=color, linewidth=2, marker="o" if len(steps) < 3 else None,
                label=f"{arm} (mean of {len(runs)} seeds)")  # fmt: skip
    ax.set_xlabel("step")
    ax.set_ylabel(key)
    ax.set_title(f"Training curves, {key} (thin: each seed)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = save_figure_atomic(fig, path, dpi=120)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------------------------------
# the check


def run_learning_check(plan: Plan, progress: bool = True) -> int:
    """Build the start, train both arms on every seed, evaluate, print the summary, write the JSON and the PNG.

    Finished runs and evaluations are kept and skipped on a re-run; a run or an evaluation that fails is reported
    and the check goes on with the others. Returns 0 when everything ran, 1 when something failed (the summary and
    the JSON then hold what finished).
    """
    out = plan.output_dir
    out.mkdir(parents=True, exist_ok=True)
    if not (out / FLAGS_FILE).is_file():  # make_plan refused another check's folder: this one is ours
        write_json_atomic(out / FLAGS_FILE, {"recipe": str(plan.recipe), "flags": plan.flags})
    commands: list[dict[str, Any]] = []
    failures: list[str] = []
    code = code_state()
    print(f"code at {describe_code(code)}", flush=True)
    start = prepare_start(plan, commands, code)
    if start is None:
        print(f"error: the start failed; see {plan.start_dir / LOG_FILE}", file=sys.stderr)
        return 1
    runs = train_runs(plan, commands, failures, progress, code)
    rows, evaluations = evaluate_models(plan, start, runs, failures, progress)

    # The metric, the summary, the curves and the JSON.
    results = [r["result"] for r in rows]
    metric = pick_metric([r["result"] for r in rows if r["arm"] == "start"] or results, plan.metric)
    if results and all(r.get(metric) is None for r in results):  # e.g. a misspelt --metric
        numbers = sorted(k for k, v in results[0].items() if isinstance(v, int | float) and not isinstance(v, bool))
        failures.append(f"no result row carries the metric {metric!r}; the rows' numbers: {', '.join(numbers)}")
    start_rows = [{"task": r["task"], "decoding": r["decoding"], "value": r["result"].get(metric)} for r in rows
                  if r["arm"] == "start"]  # fmt: skip
    model_rows = [{"arm": r["arm"], "seed": r["seed"], "task": r["task"], "decoding": r["decoding"],
                   "value": r["result"].get(metric)} for r in rows if r["arm"] != "start"]  # fmt: skip
    summary = summarize(model_rows, start_rows, plan.tasks)
    print()
    print(f"learning check: {plan.recipe.name}, {metric} on held-out seeds {short_range(plan.eval_seeds)}, training "
          f"seeds {short_range(plan.seeds)}, start {start['start']}")  # fmt: skip
    print(format_summary(summary, metric))
    key, curves = training_curves([r for r in runs if r["status"] != "failed"], plan.mode)
    png = plot_curves(curves, key, out / CURVES_PNG) if any(curves.values()) else None
    decodings = plan.decodings()
    report = {
        "recipe": str(plan.recipe),
        "recipe_flags": plan.flags,
        "code": code["code"],
        "commit": code["commit"],
        "dirty": code["dirty"],
        "output_dir": str(out),
        "env": plan.env,
        "tasks": plan.tasks,
        "mode": plan.mode,
        "seeds": plan.seeds,
        "eval_seeds": plan.eval_seeds,
        "metric": metric,
        "decodings": {name: {"temperature": cfg.temperature, "top_p": cfg.top_p} for name, cfg in decodings.items()},
        "eval_config": {k: list(v) if isinstance(v, tuple) else v for k, v in plan.eval_config.__dict__.items()},
        "start": {**start, "rows": start_rows},
        "rows": model_rows,
        "summary": summary,
        "runs": runs,
        "evaluations": evaluations,
        "failures": failures,
        "curves": {
            "metric": key,
            "png": str(png) if png else None,
            "runs": {arm: {seed: {"step": s, "value": v} for seed, (s, v) in c.items()} for arm, c in curves.items()},
        },
        "commands": commands,
        "versions": versions(),
    }
    write_json_atomic(plan.json_path, report)
    print(f"\nwrote {plan.json_path}" + (f" and {png}" if png else ""))
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    return 1 if failures else 0


def prepare_start(plan: Plan, commands: list[dict[str, Any]], code: Mapping[str, Any]) -> dict[str, Any] | None:
    """The start's ``start.json``: read back when built before at the same code (else its folder is moved aside first:
    :func:`clear_if_stale`), written for a :attr:`Plan.known_start`, else built by :func:`build_start`'s process (its
    command appended to ``commands``); ``None`` when that failed. The folder's :data:`RUN_RECORD` is written before
    anything else in it."""
    if plan.known_start:  # the folder holds the start's evaluations only
        clear_if_stale(plan.start_dir, code, "start", "evaluated", "evaluating it again")
    else:
        clear_if_stale(plan.start_dir, code, "start", "built", "building it again")
    argv = start_command(plan)
    start = start_built(plan)
    if start is None:
        write_record(plan.start_dir, code, None if plan.known_start else argv)
        if plan.known_start:  # nothing to build: the given adapter or model folder
            start = {"start": plan.known_start, "base_model": None, "warm_start_trained": False}
            write_json_atomic(plan.start_dir / START_FILE, start)
    shown = shlex.join(argv) if plan.known_start is None else None  # no command builds a known start
    commands.append({"what": "start", "command": shown, "skipped": start is not None})
    if start is not None:
        print(f"start already built: {start['start']}", flush=True)
        return start
    print(f"building the start in {plan.start_dir} (log: {plan.start_dir / LOG_FILE})", flush=True)
    started = time.perf_counter()
    returncode = run_logged(argv, plan.start_dir / LOG_FILE)
    start = start_built(plan)
    if returncode == 0 and start is not None:
        print(f"start built in {time.perf_counter() - started:.0f} s: {start['start']}", flush=True)
    return start


def train_runs(
    plan: Plan, commands: list[dict[str, Any]], failures: list[str], progress: bool, code: Mapping[str, Any]
) -> list[dict]:
    """Train every seed in both arms, seed by seed (an interrupted check still has pairs), each in its own process;
    a run finished before at the same code is skipped (one made at other code is moved aside and trained again:
    :func:`clear_if_stale`), a failed one added to ``failures``. Returns a record per run (status, log, seconds)."""
    runs = []
    jobs = [(arm, seed) for seed in plan.seeds for arm in ARMS]
    bar = tqdm(jobs, desc="training runs", unit="run", disable=not progress, dynamic_ncols=True)
    for arm, seed in bar:
        folder, argv = plan.run_dir(arm, seed), run_command(plan, arm, seed)
        run = {"arm": arm, "seed": seed, "output_dir": str(folder), "log": str(folder / LOG_FILE)}
        clear_if_stale(folder, code, f"{arm} seed {seed}", "trained", "training again")
        if rl_finished(folder):
            run.update(status="skipped (finished before)", returncode=0)
        else:
            write_record(folder, code, argv)  # before training: an interrupted run resumes only at the same code
            bar.set_postfix_str(f"{arm} seed {seed}")
            started = time.perf_counter()
            returncode = run_logged(argv, folder / LOG_FILE)
            run.update(returncode=returncode, seconds=round(time.perf_counter() - started, 1))
            run["status"] = "trained" if returncode == 0 and rl_finished(folder) else "failed"
            tqdm.write(f"{arm} seed {seed}: {run['status']} in {run['seconds']:.0f} s (log: {run['log']})")
            if run["status"] == "failed":
                failures.append(f"{arm} seed {seed}: training failed (exit status {returncode}); see {run['log']}")
        skipped = run["status"].startswith("skipped")
        commands.append({"what": f"{arm} seed {seed}", "command": shlex.join(argv), "skipped": skipped})
        runs.append(run)
    bar.close()
    return runs


def evaluate_models(
    plan: Plan, start: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], failures: list[str], progress: bool
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Evaluate the start and every trained model, greedy and sampled, each cached in its folder
    (:func:`eval_file`); a model that cannot be evaluated is added to ``failures``.

    Returns:
        ``(rows, evaluations)``: ``{"arm" ("start" for the start), "seed", "task", "decoding", "result"}`` per result
        row, and a record per evaluation (model, label, decoding, file).
    """
    models = [("start", "start", None, plan.start_dir, start["start"])]
    models += [(f"{r['arm']}_seed{r['seed']}", r["arm"], r["seed"], Path(r["output_dir"]), r["output_dir"])
               for r in runs if r["status"] != "failed"]  # fmt: skip
    decodings = plan.decodings()
    rows, evaluations = [], []
    jobs = [(m, d) for m in models for d in decodings]
    bar = tqdm(jobs, desc="evaluations", unit="model", disable=not progress, dynamic_ncols=True)
    for (label, arm, seed, folder, model), decoding in bar:
        bar.set_postfix_str(f"{label} {decoding}")
        path = eval_file(folder, decoding)
        try:
            part = evaluate_cached(f"model:{model}", decodings[decoding], label, path, progress=False)
        except Exception as exc:  # a model that cannot be evaluated is reported; the others still are
            failures.append(f"{label} {decoding}: evaluation failed: {type(exc).__name__}: {exc}")
            tqdm.write(f"error: {failures[-1]}")
            continue
        evaluations.append({"model": model, "label": label, "decoding": decoding, "file": str(path)})
        rows += [{"arm": arm, "seed": seed, "task": r["task"], "decoding": decoding, "result": r}
                 for r in part["results"]]  # fmt: skip
    bar.close()
    return rows, evaluations


def training_curves(
    runs: Sequence[Mapping[str, Any]], mode: str
) -> tuple[str, dict[str, dict[int, tuple[list[int], list[float]]]]]:
    """``(key, {arm: {seed: (steps, values)}})``: the finished runs' on-policy training curves (:func:`curve_key`)."""
    histories = [(read_json(Path(r["output_dir"]) / TRAINER_STATE) or {}).get("log_history", []) for r in runs]
    key = curve_key(mode, [h for history in histories for h in history])
    curves = {arm: {r["seed"]: training_curve(Path(r["output_dir"]), key) for r in runs if r["arm"] == arm}
              for arm in ARMS}  # fmt: skip
    return key, curves


def short_range(seeds: Sequence[int]) -> str:
    """``[0, 1, 2]`` -> ``0-2``; a list that is not one run of consecutive seeds as ``3,7,9``."""
    if seeds and list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else str(seeds[0])
    return ",".join(map(str, seeds))


if __name__ == "__main__":  # the start's process: python -m recruit_trl.tools.learning_check RECIPE START_DIR -- FLAGS
    recipe_file, folder, separator, *recipe_flags = sys.argv[1:]
    if separator != "--":
        sys.exit("usage: python -m recruit_trl.tools.learning_check RECIPE START_DIR -- RECIPE_FLAGS")
    print(build_start(recipe_file, folder, recipe_flags))

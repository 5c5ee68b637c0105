"""Command line entry point: ``recruit-trl SUBCOMMAND ...``.

Each subcommand is a pair of functions: ``_add_<name>(subparsers)`` declares its arguments and
``cmd_<name>(args) -> int`` runs it and returns the exit status. To add one (``serve``, ``eval``,
``bench``, ``golden`` are planned), write the pair and list the adder in ``_SUBCOMMANDS``. Heavy
imports stay inside ``cmd_*`` so that ``recruit-trl --help`` stays fast.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Collection, Sequence

from recruit_trl import __version__

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
    p.add_argument(
        "--all",
        action="store_true",
        help="also list the progressive *_stage_{30,90,180} variants",
    )
    p.set_defaults(func=cmd_tasks)


def _format_money(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}"


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Collection[int] = ()) -> str:
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
    from env import tasks as env_tasks

    registry = env_tasks.ALL_TASKS if args.all else env_tasks.TASKS
    headers = ("id", "name", "difficulty", "budget", "target", "max_steps")
    rows = [
        (
            spec.task_id,
            spec.name,
            f"{spec.difficulty} ({spec.difficulty_label})",
            _format_money(spec.budget),
            str(spec.target),
            str(spec.max_steps),
        )
        for spec in registry.values()
    ]
    print(format_table(headers, rows, right={3, 4, 5}))
    return 0


# --------------------------------------------------------------------------------------------------
# eval


def _add_eval(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("eval", help="evaluate policies over full episodes (table, --json, --plot)")
    p.add_argument(
        "--policy", action="append", required=True, help="random | heuristic | expert | model:PATH; repeatable"
    )
    p.add_argument("--task", action="append", help="task id; repeatable (default: the three public tasks)")
    p.add_argument("--seeds", default="0-19", help="reset seeds, e.g. 0-19 or 0-99:10 (default 0-19)")
    p.add_argument("--env", default="env.agent:CLINICAL", help="environment interface (name or module:attribute)")
    p.add_argument("--env-url", help="evaluate against an environment server instead of in-process")
    p.add_argument("--transport", default="http", choices=("http", "ws"), help="transport with --env-url")
    p.add_argument("--contract", default="index", choices=("index", "json"), help="action contract of model policies")
    p.add_argument("--recent-k", type=int, default=2, help="recent actions in model prompts (as in training)")
    p.add_argument("--teacher", help="policy to compute teacher match against (e.g. expert)")
    p.add_argument("--temperature", type=float, default=0.0, help="model sampling temperature (0 = greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling with --temperature > 0 (1 = off)")
    p.add_argument(
        "--constrained", action="store_true", help="constrained decoding: models can only answer a listed candidate"
    )
    p.add_argument("--batch-size", type=int, default=64, help="episodes per batched generate() call")
    p.add_argument("--json", help="write {results, config, versions} to this file")
    p.add_argument("--plot", help="write a PNG comparing the policies' final scores")
    p.add_argument("--trace", help="write every decision (action, teacher's action, outcome) as JSON lines here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_eval)


def cmd_eval(args: argparse.Namespace) -> int:
    import json

    from recruit_trl.evaluate import EvalConfig, evaluate, format_table, plot_results
    from recruit_trl.training import parse_int_ranges

    config = EvalConfig(
        env=args.env,
        tasks=tuple(args.task or ("easy_bench", "medium_bench", "hard_bench")),
        seeds=tuple(parse_int_ranges(args.seeds)),
        contract=args.contract,
        recent_k=args.recent_k,
        teacher=args.teacher,
        env_url=args.env_url,
        transport=args.transport,
        temperature=args.temperature,
        top_p=args.top_p,
        batch_size=args.batch_size,
        constrained=args.constrained,
    )
    report = evaluate(args.policy, config, progress=not args.no_progress, trace_path=args.trace)
    print(format_table(report["results"]))
    if args.trace:
        print(f"wrote {args.trace}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=2)
        print(f"wrote {args.json}")
    if args.plot:
        print(f"wrote {plot_results(report['results'], args.plot)}")
    return 0


# --------------------------------------------------------------------------------------------------
# golden, bench: thin wrappers around the environment's own module CLIs (their --help is the reference)


def _delegating(name: str, module: str, help_text: str) -> Callable[[argparse._SubParsersAction], None]:
    def add(subparsers: argparse._SubParsersAction) -> None:
        p = subparsers.add_parser(name, help=help_text, add_help=False)
        p.add_argument("args", nargs=argparse.REMAINDER, help=f"arguments of python -m {module}")
        p.set_defaults(func=lambda args: _run_module_main(module, args.args))

    return add


def _run_module_main(module: str, argv: list[str]) -> int:
    import importlib

    return int(importlib.import_module(module).main(argv) or 0)


_DELEGATED = {"golden": "env.golden", "bench": "env.bench", "serve": "env.server"}
_add_golden = _delegating("golden", "env.golden", "replay golden-format episode files (python -m env.golden)")
_add_bench = _delegating("bench", "env.bench", "environment throughput benchmark (python -m env.bench)")
_add_serve = _delegating("serve", "env.server", "HTTP + WebSocket environment server (python -m env.server)")


# --------------------------------------------------------------------------------------------------
# parser


_SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    _add_tasks,
    _add_eval,
    _add_golden,
    _add_bench,
    _add_serve,
    _add_version,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="recruit-trl",
        description="TRL plugin for RL on long-horizon environments.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in _SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _DELEGATED:  # hand every remaining argument (even --help) to the module's CLI
        return _run_module_main(_DELEGATED[argv[0]], argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

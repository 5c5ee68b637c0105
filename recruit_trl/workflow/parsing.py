"""A recipe's command line, every value checked before any model is built; a user's mistake is one line on stderr and
exit status 2, as argparse reports its own.

The recipes (``recipes/*.py``) parse with :class:`RecipeParser`: TRL's ``TrlParser`` (the flags of several
dataclasses, ``--config file.yaml``) whose argparse errors (a value of the wrong type, a flag without its value) take
one line instead of the usage of several hundred flags, and which checks GRPO's group settings before ``GRPOConfig``
is built (:func:`check_generation_batch`). Each dataclass checks its own values as it is built (``__post_init__``);
:func:`recruit_trl.workflow.arguments.check_rl_arguments` and ``check_sft_arguments`` check what needs the environment
or several dataclasses. The recipes' entry points parse through :func:`parse_or_exit`, which turns a ``ValueError``
raised while parsing into ``<script>: error: <message>`` and exit status 2, without a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn, TypeVar

from trl import TrlParser

T = TypeVar("T")


class RecipeParser(TrlParser):
    """``TrlParser`` for the recipes: one-line argparse errors, GRPO's group settings checked before its config is
    built."""

    def error(self, message: str) -> NoReturn:
        # argparse prints its usage first: every flag of several dataclasses, hundreds of lines above the error.
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")

    def parse_known_args(
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        namespace, remaining = super().parse_known_args(args, namespace)
        check_generation_batch(namespace)  # the values exist here, before HfArgumentParser builds the dataclasses
        return namespace, remaining


def check_generation_batch(namespace: argparse.Namespace) -> None:
    """GRPO's group settings (when the namespace has them), checked before ``GRPOConfig`` is built: it divides by
    ``--num_generations`` while it is built (0 ends in a ZeroDivisionError). A group holds at least 2 samples, a device
    at least one row, and a generation batch whole groups; TRL checks the last itself when ``--generation_batch_size``
    or ``--steps_per_generation`` sets the batch.

    Raises:
        ValueError: naming the flags and their values.
    """
    if not hasattr(namespace, "num_generations"):
        return
    groups, rows = namespace.num_generations, namespace.per_device_train_batch_size
    if groups is None or groups < 2:
        raise ValueError(f"--num_generations must be >= 2 (a group compares samples from one prompt), not {groups}")
    if rows < 1:
        raise ValueError(f"--per_device_train_batch_size must be >= 1, not {rows}")
    if namespace.generation_batch_size is None and namespace.steps_per_generation is None:
        processes = int(os.environ.get("WORLD_SIZE", "1"))  # accelerate launch sets it for every process
        steps = namespace.gradient_accumulation_steps
        batch = rows * processes * steps
        if batch % groups:
            raise ValueError(
                f"--num_generations {groups} must divide the generation batch of {batch} rows "
                f"(--per_device_train_batch_size {rows} x {processes} process(es) x --gradient_accumulation_steps "
                f"{steps}): a batch holds whole groups"
            )


def parse_or_exit(parse_args: Callable[[], T]) -> T:
    """``parse_args()``, with a ``ValueError`` it raises (a value the user gave that the recipe cannot take; a config
    file that is not there) printed as ``<script>: error: <message>`` on one line of stderr and exit status 2, as
    argparse does, without a traceback."""
    try:
        return parse_args()
    except (ValueError, FileNotFoundError) as exc:
        message = " ".join(str(exc).split())  # one line, whatever the message's own layout
        print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
        raise SystemExit(2) from None

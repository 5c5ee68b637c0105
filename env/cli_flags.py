"""Flag spellings of the environments' command lines (``recruit-trl serve``, ``python -m env.loadtest``,
``python -m env.bench``): snake_case, as TRL's, the recipes' and ``recruit-trl``'s own flags are (``--max_sessions``).
The kebab-case spelling of each (``--max-sessions``) is refused on one line with its new name and exit status 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any


class Renamed(argparse.Action):
    """A flag's former spelling: its use is refused on one line naming the new one, with exit status 2 as argparse
    reports its own errors, without the usage. It takes a value or none, so that any use of it is refused."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str, **kwargs: Any) -> None:
        super().__init__(
            option_strings, argparse.SUPPRESS, nargs="?", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string=None) -> None:
        parser.exit(2, f"{parser.prog}: error: {option_string} was renamed {self.new}\n")


def refuse_kebab_spellings(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Refuse the kebab-case spelling of every snake_case flag of ``parser`` (``--max-sessions`` for
    ``--max_sessions``: ``--max-sessions was renamed --max_sessions``); called once every flag is declared. Returns
    ``parser``."""
    for action in list(parser._actions):
        for flag in action.option_strings:
            old = flag.replace("_", "-")
            if flag.startswith("--") and old != flag and old not in parser._option_string_actions:
                parser.add_argument(old, action=Renamed, new=flag)
    return parser

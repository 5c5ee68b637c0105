"""Every recipe's parsed arguments under a few command lines, as one JSON-able dict per (recipe, command line): the
values of every dataclass the recipe's ``parse_args`` returns, by field name. ``python tests/parsed_arguments.py``
writes them to ``tests/data/parsed_arguments.json`` (the snapshot :mod:`test_parsed_arguments` compares against)."""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from recipe_files import load_recipe  # noqa: E402

SNAPSHOT = Path(__file__).parent / "data" / "parsed_arguments.json"
# (recipe, command line); the command lines name the flags as the recipes took them when the snapshot was written.
CASES = [
    ("grpo_clinical", []),
    ("grpo_clinical", ["--model_name_or_path", "smollm2"]),
    ("grpo_clinical", ["--config", "recipes/grpo_clinical.yaml"]),
    ("grpo_clinical", ["--env", "conquest"]),
    (
        "grpo_clinical",
        "--sft_epsilon 0.2 --sft_train_seeds 300-303 --teacher heuristic --dagger_rounds 2 "
        "--sft_keep_best_round false --sft_max_steps 3".split(),
    ),
    ("reinforce_clinical", []),
    ("reinforce_clinical", ["--model_name_or_path", "smollm2"]),
    ("grpo_conquest", []),
    ("grpo_conquest", ["--model_name_or_path", "smollm2"]),
    ("grpo_conquest", ["--config", "recipes/grpo_conquest.yaml"]),
    ("sft_clinical", []),
    ("sft_clinical", ["--teacher", "expert", "--train_seeds", "300-347", "--epsilon", "0.2"]),
    ("sft_clinical", ["--env", "conquest"]),
    ("sft_conquest", []),
    ("sft_conquest", ["--model_name_or_path", "smollm2"]),
    ("sft_conquest", ["--config", "recipes/sft_conquest.yaml"]),
    ("grpo_environment_factory", []),
    ("grpo_environment_factory", ["--config", "recipes/grpo_environment_factory.yaml"]),
    ("bench_rollout", []),
    ("bench_rollout", ["--mode", "episode", "--env", "conquest"]),
]
# Fields whose value depends on the machine or the moment, not on the recipe's defaults.
VOLATILE = {"logging_dir"}


def plain(value):
    """``value`` as JSON holds it (enums and other objects by their text)."""
    return json.loads(json.dumps(value, default=lambda v: getattr(v, "value", str(v))))


def parsed(recipe: str, argv: list[str]) -> dict:
    """The values of every dataclass that ``parse_args(argv)`` of ``recipes/<recipe>.py`` (or of
    ``recruit_trl/tools/bench_rollout.py``) returns, by field name."""
    module = (
        importlib.import_module(f"recruit_trl.tools.{recipe}") if recipe == "bench_rollout" else load_recipe(recipe)
    )
    values = {}
    for args in module.parse_args(list(argv)):
        values.update({f.name: getattr(args, f.name) for f in dataclasses.fields(args) if f.name not in VOLATILE})
    return plain(values)


def snapshot() -> list[dict]:
    return [{"recipe": recipe, "argv": argv, "values": parsed(recipe, argv)} for recipe, argv in CASES]


if __name__ == "__main__":
    os.chdir(Path(__file__).parents[1])
    SNAPSHOT.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")

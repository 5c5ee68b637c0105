"""A new environment's SFT config that sets no cap keeps every teacher row in its warm start: the environment-neutral
``sft_max_type_fraction`` (the field's default) is no cap (the clinical and conquest configs set theirs), and a cap
that keeps less than half of the teacher's rows says so on the warm start's summary line, naming the flag."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from recipe_files import load_recipe
from toy_env import ToyInterface

from recruit_trl.protocol import register_env
from recruit_trl.ranges import parse_int_ranges
from recruit_trl.rollout.config import PromptConfig
from recruit_trl.workflow.configs import read_sft_file
from recruit_trl.workflow.decisions.teacher_sets import SPLITS
from recruit_trl.workflow.model_setup import RunSetup
from recruit_trl.workflow.sft_data import build_sft_datasets, kept_rows_warning, teacher_set_datasets
from recruit_trl.workflow.warm_start import data_summary, set_config, sft_datasets


class OneWayWalk(ToyInterface):
    """The toy walk (``tests/toy_env.py``) whose teacher, its fallback agent, steps right every day but the tenth,
    when it waits: 11 of an episode's 12 decisions are one action type. Like a new user's environment, it has few
    action types and no config of its own."""

    name = "one_way_walk"

    def fallback_action(self, obs: Mapping[str, Any]) -> dict[str, Any]:
        return {"kind": "wait" if obs["day"] % 10 == 9 else "right"}


ONE_WAY = OneWayWalk()
register_env(ONE_WAY.name, ONE_WAY)  # what --env names (a module path, e.g. mypkg.mod:ENV, resolves the same way)
PROMPTS = PromptConfig(env_name=ONE_WAY.name)
SETUP = RunSetup(interface=ONE_WAY, tasks=list(ONE_WAY.tasks()), model_path="")


def one_way_config(folder: Path, **settings: Any) -> str:
    """An SFT config for the walk that names its environment and ``settings`` only (the rest: the fields' defaults,
    environment-neutral; activation checkpointing left to its own, unset, name, as every config does), written into
    ``folder``; its path."""
    path = folder / "one_way_walk.yaml"
    path.write_text(yaml.safe_dump({"env_name": ONE_WAY.name, "gradient_checkpointing": None, **settings}))
    return str(path)


def warm_start_arguments(config: str, recipe: str | None = None):
    """The warm start's settings from the SFT config ``config``: as an RL recipe's warm start reads it (``None``), or
    as ``recipes/<recipe>.py`` parses it (``--config``)."""
    if recipe is None:
        return read_sft_file(config)[1]
    return load_recipe(recipe).parse_args(["--config", config])[1]


@pytest.mark.parametrize("recipe", [None, "sft_clinical"], ids=["warm-start", "sft-recipe"])
def test_only_a_config_that_sets_a_cap_caps(recipe, tmp_path):
    assert warm_start_arguments(one_way_config(tmp_path), recipe).sft_max_type_fraction == 1.0
    assert warm_start_arguments("sft_clinical.yaml", recipe).sft_max_type_fraction == 0.35  # clinical's config
    assert warm_start_arguments("sft_conquest.yaml", recipe).sft_max_type_fraction == 0.25
    capped = one_way_config(tmp_path, sft_max_type_fraction=0.5)
    assert warm_start_arguments(capped, recipe).sft_max_type_fraction == 0.5


def test_the_warm_start_keeps_every_teacher_row_by_default(tmp_path, recwarn):
    (tmp_path / "config").mkdir()
    warm = warm_start_arguments(one_way_config(tmp_path / "config"))
    train, _, stats = sft_datasets(PROMPTS, warm, SETUP, tmp_path, seed=0)
    types = Counter(stats["train_action_types_raw"])
    assert types["right"] >= 0.85 * stats["train_rows_raw"]  # a cap of 0.35 would keep about a sixth of the rows
    assert stats["train_rows"] == stats["train_rows_raw"] == len(train) > 200
    assert data_summary(stats) == f"SFT data: {len(train)} train rows ({len(train)} before balancing), 72 held out"
    assert not [w for w in recwarn if "sft_max_type_fraction" in str(w.message)]

    # The library's default is the same: no cap.
    seeds = parse_int_ranges(warm.sft_train_seeds), parse_int_ranges(warm.sft_heldout_seeds)
    _, _, library = build_sft_datasets(ONE_WAY, SETUP.tasks, *seeds, teacher=warm.teacher)
    assert library["train_rows"] == library["train_rows_raw"]

    # The teacher decision sets too: the train split holds every decision of the teacher's games.
    sets = replace(warm, sft_data="teacher_sets")
    config = set_config(PROMPTS, sets, SETUP.tasks)
    assert config.max_share == 1.0
    train, _, stats = teacher_set_datasets(ONE_WAY, config, tmp_path / "sets", progress=False)
    assert len(train) == len(SETUP.tasks) * len(config.train_seeds) * 12  # 12 days a walk, never stopped
    assert set(stats["sets"]["rows"]) == set(SPLITS)
    assert "--sft_max_type_fraction" not in data_summary(stats)


def test_a_cap_that_keeps_less_than_half_of_the_rows_says_so(tmp_path):
    (tmp_path / "config").mkdir()
    warm = warm_start_arguments(one_way_config(tmp_path / "config", sft_max_type_fraction=0.35))
    with pytest.warns(UserWarning, match=r"raise --sft_max_type_fraction"):
        train, _, stats = sft_datasets(PROMPTS, warm, SETUP, tmp_path, seed=0)
    kept, raw = stats["train_rows"], stats["train_rows_raw"]
    assert kept == len(train) < raw / 2
    first, second = data_summary(stats).splitlines()
    assert first == f"SFT data: {kept} train rows ({raw} before balancing), 72 held out"
    assert second.startswith("WARNING:") and f"(--sft_max_type_fraction 0.35) kept only {kept} of {raw} " in second


def test_the_warning_of_a_summary_line():
    assert kept_rows_warning(50, 100, 0.35) is None and kept_rows_warning(0, 0) is None
    assert "(--sft_max_type_fraction 0.25) kept only 49 of 100 teacher rows" in kept_rows_warning(49, 100, 0.25)
    assert "(--sft_max_type_fraction) kept only 3 of 10" in kept_rows_warning(3, 10)  # a cache that names no cap

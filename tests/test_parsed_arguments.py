"""Every recipe parses its command lines to the values it did before the warm start's settings became one dataclass
(:class:`recruit_trl.workflow.arguments.WarmStartArguments`): the snapshot ``tests/data/parsed_arguments.json`` was
written by ``tests/parsed_arguments.py`` from the code before that change, and only the flags renamed by it and the
changes listed here differ."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
from parsed_arguments import CASES, SNAPSHOT, parsed

from recruit_trl.workflow.arguments import WarmStartArguments

# The SFT recipes' flags that took the RL recipes' names (GRPOConfig has its own --epsilon, so one dataclass parsed by
# every recipe names them --sft_*).
SFT_RENAMED = {
    name: f"sft_{name}"
    for name in ("data", "train_seeds", "heldout_seeds", "fixed_seeds", "heldout_rows", "epsilon",
                 "max_type_fraction", "balance_by_task", "keep_best_round", "token_metrics", "length_buckets")
}  # fmt: skip
# Flags the RL recipes of recruit_trl.workflow.pipeline gained: their warm start takes the SFT recipe's loss choice
# too.
ADDED = {"sft_token_metrics": None}
# Settings removed on purpose: episode mode's optional centring (the trainer now centres the rows it trains, always),
# window mode's turns (the mode is gone: TRL's tool loop takes several decisions per completion) and the action
# contract (the index contract is the only one: a constant of the prompts, not a setting).
REMOVED = {"center_advantages", "window_turns", "contract"}
# Choices that were "decided by the model" when unset (None) and now default to what they resolved to: the tiny model
# built here trains every weight, plays whole episodes in the report and trains its warm start on the model's own
# cross-entropy (recruit_trl.workflow.defaults.TINY_DEFAULTS); any other model trains LoRA adapters, is measured at
# decision level and trains through TRL's loss.
MODEL_DECIDED = ("sft_full_finetune", "rl_full_finetune", "eval_episodes", "sft_token_metrics")
PIPELINE_RECIPES = ("grpo_clinical", "reinforce_clinical", "grpo_conquest")
# What later changes added or changed on purpose: bench_rollout's --profile, and the rewards that conquest's episodes
# and TRL's tool loop learn from (the environment's "rl/episode" defaults: the reward functions' one meaning in every
# mode).
EPISODE_REWARDS = {"reward_funcs": ["win_reward", "potential_reward"], "reward_weights": [1.0, 1.0]}


def intended_changes(recipe: str, argv: list[str]) -> dict:
    if recipe == "bench_rollout":
        return {"profile": False, **(EPISODE_REWARDS if "episode" in argv and "conquest" in argv else {})}
    if recipe == "grpo_environment_factory":
        return EPISODE_REWARDS
    return {}


def resolved(recipe: str, before: dict) -> dict:
    """The values the model-decided choices of ``before`` resolved to (``None`` then), and ``use_peft`` of an SFT
    recipe on conquest: ``sft_conquest.py`` turned it off for the tiny model after parsing, the game's ``sft:tiny``
    default now does, for ``sft_clinical.py --env conquest`` too (which trained a LoRA adapter on it)."""
    tiny = before["model_name_or_path"] == "tiny" and not (before["load_in_4bit"] or before["load_in_8bit"])
    out = {name: name != "sft_token_metrics" and tiny for name in MODEL_DECIDED if before.get(name, False) is None}
    if "sft_token_metrics" in out:
        out["sft_token_metrics"] = before["model_name_or_path"] != "tiny"
    if recipe.startswith("sft_") and before["env_name"] == "conquest":
        out["use_peft"] = not tiny
    return out


WARM_START = {f.name for f in fields(WarmStartArguments)}


def renamed_flags(recipe: str, argv: list[str]) -> list[str]:
    """``argv`` under today's flag names."""
    if not recipe.startswith("sft_"):
        return list(argv)
    return [f"--{SFT_RENAMED[arg[2:]]}" if arg.startswith("--") and arg[2:] in SFT_RENAMED else arg for arg in argv]


def test_the_snapshot_covers_every_case():
    snapshot = json.loads(SNAPSHOT.read_text())
    assert [(row["recipe"], row["argv"]) for row in snapshot] == [(recipe, list(argv)) for recipe, argv in CASES]


@pytest.mark.parametrize(("recipe", "argv"), CASES, ids=[f"{r}:{' '.join(a) or '-'}" for r, a in CASES])
def test_every_recipe_parses_as_before(recipe, argv, monkeypatch):
    monkeypatch.chdir(SNAPSHOT.parents[2])  # the command lines name recipes/*.yaml
    before = next(row["values"] for row in json.loads(SNAPSHOT.read_text()) if (row["recipe"], row["argv"]) == (
        recipe, list(argv)))  # fmt: skip
    if recipe.startswith("sft_"):
        before = {SFT_RENAMED.get(name, name): value for name, value in before.items()}
    now = parsed(recipe, renamed_flags(recipe, argv))
    if recipe == "bench_rollout":  # it parses the warm start's settings as the recipe does, and returns them not
        before = {name: value for name, value in before.items() if name not in WARM_START}
    elif recipe in PIPELINE_RECIPES:
        before = {**ADDED, **before}
    before = {**before, **intended_changes(recipe, list(argv)), **resolved(recipe, before)}
    before = {name: value for name, value in before.items() if name not in REMOVED}
    assert now == before, {k: (before.get(k, "-"), now.get(k, "-")) for k in before.keys() | now.keys()
                           if before.get(k, "-") != now.get(k, "-")}  # fmt: skip


@pytest.mark.parametrize("recipe", ["grpo_clinical", "grpo_conquest", "sft_conquest", "grpo_environment_factory"])
def test_a_recipe_yaml_holds_only_what_differs_from_the_recipe_defaults(recipe, monkeypatch):
    """``recipes/<recipe>.yaml`` parses, every key it sets reaches the arguments, and none repeats the value the
    recipe has without it (the defaults live in one place each: the dataclasses, recruit_trl/workflow/defaults.py,
    the environment's training_defaults.py)."""
    import yaml

    monkeypatch.chdir(SNAPSHOT.parents[2])
    path = f"recipes/{recipe}.yaml"
    written = yaml.safe_load(open(path).read())
    defaults, configured = parsed(recipe, []), parsed(recipe, ["--config", path])
    assert {key: configured[key] for key in written} == written
    assert not [key for key in written if defaults[key] == written[key]], f"{path} repeats a default"


def test_the_environment_and_the_model_are_read_by_the_parsers_first_pass(tmp_path):
    """:func:`recipe_choice` reads only ``--env`` / ``--env_name``, ``--model_name_or_path``, its quantisation and
    ``--mode`` (on the command line, else in the ``--config`` YAML), by TRL's parser: no abbreviation (``--mode`` is
    not ``--model_name_or_path``), the ``--flag=value`` form, and every other flag left to the second pass."""
    from recruit_trl.workflow.defaults import recipe_choice

    choice = recipe_choice(["--mode", "episode", "--env=conquest", "--tasks", "duel", "--load_in_4bit"])
    assert (choice.env_name, choice.model_name_or_path, choice.mode) == ("conquest", "", "episode")
    assert choice.load_in_4bit and not choice.load_in_8bit
    config = tmp_path / "run.yaml"
    config.write_text("env_name: conquest\nmodel_name_or_path: smollm2\nmax_steps: 3\n")
    assert recipe_choice(["--config", str(config)]).model_name_or_path == "smollm2"
    choice = recipe_choice(["--config", str(config), "--model_name_or_path", "tiny", "--env", "clinical"])
    assert (choice.env_name, choice.model_name_or_path) == ("clinical", "tiny")

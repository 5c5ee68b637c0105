"""The recipes' settings as config files (``recipes/configs``, :mod:`recruit_trl.workflow.configs`): every stage of
the RL recipes receives what it received when the settings came from six layers of defaults (the snapshot
``tests/data/stage_views.json``, see :mod:`stage_views`), the RL recipes take at most 25 flags of their own beside
TRL's ``GRPOConfig`` and ``ModelConfig``, and every config file parses with its recipe."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from recipe_files import load_recipe
from stage_views import SNAPSHOT, view

ROOT = Path(__file__).parents[1]
CONFIGS = ROOT / "recipes" / "configs"
RL_RECIPES = ("grpo_clinical", "grpo_conquest", "reinforce_clinical")
# (recipe, command line before, command line now): a named model's preset became its config file, conquest's
# episode-mode rewards flags of their own.
CASES = [
    ("grpo_clinical", [], []),
    ("grpo_clinical", ["--model_name_or_path", "smollm2"], ["--config", "grpo_clinical_smollm2.yaml"]),
    ("reinforce_clinical", [], []),
    ("grpo_conquest", [], []),
    ("grpo_conquest", ["--model_name_or_path", "smollm2"], ["--config", "grpo_conquest_smollm2.yaml"]),
    (
        "grpo_conquest",
        ["--mode", "episode"],
        ["--mode", "episode", "--reward_funcs", "win_reward", "potential_reward", "--reward_weights", "1", "1"],
    ),
    ("sft_clinical", [], []),
    ("sft_conquest", [], []),
    ("sft_conquest", ["--model_name_or_path", "smollm2"], ["--config", "sft_conquest_smollm2.yaml"]),
]
# Changed on purpose: an SFT recipe's own config is the RL recipes' warm start of its environment (before, the SFT
# recipes had defaults of their own: clinical's the safe agent with LoRA, no DAgger; SmolLM2's conquest SFT 60
# steps, now the 12 of its warm start).
WARM_START_CLINICAL = {"learning_rate": 0.0003, "dagger_epochs": 0.5, "dagger_rounds": 1, "dagger_seeds": "300-303",
                       "sft_heldout_seeds": "400", "sft_length_buckets": True, "sft_train_seeds": "300-307",
                       "teacher": "expert", "use_peft": False}  # fmt: skip
WARM_START_CONQUEST = {"learning_rate": 0.0003, "dagger_epochs": 0.5, "dagger_rounds": 1, "dagger_seeds": "0-7"}
INTENDED = {
    ("sft_clinical", ()): WARM_START_CLINICAL,
    ("sft_conquest", ()): WARM_START_CONQUEST,
    ("sft_conquest", ("--model_name_or_path", "smollm2")): {
        "max_steps": 12,
        "dagger_epochs": 0.5,
        "dagger_seeds": "0-7",
    },
}


def changed(before: dict, now: dict) -> dict:
    """``{field: value now}`` of every field whose value changed, flattened over the view's parts."""
    out = {}
    for part in before.keys() | now.keys():
        old, new = before.get(part) or {}, now.get(part) or {}
        if not isinstance(old, dict) or not isinstance(new, dict):
            if old != new:
                out[part] = new
            continue
        out.update(
            {name: new.get(name, "-") for name in old.keys() | new.keys() if old.get(name, "-") != new.get(name, "-")}
        )
    return out


@pytest.mark.parametrize(
    ("recipe", "before_argv", "argv"), CASES, ids=[f"{r}:{' '.join(a) or '-'}" for r, _, a in CASES]
)
def test_every_stage_receives_what_it_did_before(recipe, before_argv, argv):
    before = next(row["view"] for row in json.loads(SNAPSHOT.read_text()) if (row["recipe"], row["argv"]) == (
        recipe, before_argv))  # fmt: skip
    assert changed(before, view(recipe, argv)) == INTENDED.get((recipe, tuple(before_argv)), {})


@pytest.mark.parametrize("recipe", RL_RECIPES)
def test_an_rl_recipe_takes_at_most_25_flags_of_its_own(recipe):
    """Beside TRL's ``GRPOConfig`` and ``ModelConfig``, counted from what its parser returns."""
    from trl import GRPOConfig, ModelConfig

    parsed = load_recipe(recipe).parse_args([])
    own = [
        f.name for args in parsed if not isinstance(args, (GRPOConfig, ModelConfig)) for f in dataclasses.fields(args)
    ]
    assert len(parsed) == 3 and len(own) <= 25, own


# Keys TRL's configs turn into another form as they are built (e.g. report_to "none" into []).
NORMALISED = ("lora_target_modules", "report_to", "gradient_checkpointing")


def recipe_of(config: Path) -> str:
    """The recipe a config file is for: its name up to the model's suffix."""
    for recipe in (*RL_RECIPES, "sft_clinical", "sft_conquest", "grpo_environment_factory", "expert_iteration"):
        if config.stem == recipe or config.stem.startswith(f"{recipe}_"):
            return recipe
    raise AssertionError(f"{config.name} belongs to no recipe")


@pytest.mark.parametrize("config", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_config_file_parses_and_every_key_reaches_the_arguments(config):
    from recruit_trl.workflow.configs import read_report_config

    written = yaml.safe_load(config.read_text())
    if config.stem.startswith("report_"):
        parsed = [read_report_config(str(config))]
    else:
        parsed = load_recipe(recipe_of(config)).parse_args(["--config", str(config)])
    values = {f.name: getattr(args, f.name) for args in parsed for f in dataclasses.fields(args)}
    simple = {key: value for key, value in written.items() if key not in NORMALISED}
    assert {key: values[key] for key in simple} == {
        key: value if not isinstance(value, int | float) or isinstance(value, bool) else type(values[key])(value)
        for key, value in simple.items()
    }


def test_a_setting_that_moved_into_a_config_file_names_the_file(tmp_path):
    """An RL recipe refuses the warm start's and the report's settings, and the flags they replaced, on one line."""
    for flags, named in (
        (["--eval_seeds", "0-3"], "report config file --report_config names"),
        (["--dagger_rounds", "0"], "SFT config file --sft_config names"),
        (["--sft_max_steps", "3"], "the warm start's max_steps"),
        (["--warm_start", "none"], "replaced by --sft_config"),
        (["--report", "false"], "replaced by --report_config"),
        (["--model_name_or_path", "smollm2"], "--config grpo_clinical_smollm2.yaml"),
        (["--sft_config", "sft_conquest.yaml"], "its environment is 'conquest'"),
        (["--report_config", str(tmp_path / "missing.yaml")], "not found"),
    ):
        proc = subprocess.run([sys.executable, str(ROOT / "recipes" / "grpo_clinical.py"), *flags], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300)  # fmt: skip
        lines = [line for line in proc.stderr.splitlines() if "error:" in line]
        assert proc.returncode == 2 and len(lines) == 1 and named in lines[0], proc.stderr[-1500:]


def test_a_config_is_found_by_its_name_from_any_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script, training, model = load_recipe("grpo_clinical").parse_args(["--config", "grpo_clinical_smollm2.yaml"])
    assert (model.model_name_or_path, script.sft_config, training.max_steps) == (
        "smollm2",
        "sft_clinical_smollm2.yaml",
        12,
    )


def test_reinforce_config_is_the_main_jobs_with_reinforces_settings():
    """Written in full, the two files could drift: they differ by REINFORCE's settings and the output folder only."""
    from recruit_trl.training.trainer import REINFORCE_SETTINGS

    grpo = yaml.safe_load((CONFIGS / "grpo_clinical.yaml").read_text())
    reinforce = yaml.safe_load((CONFIGS / "reinforce_clinical.yaml").read_text())
    differ = {key for key in grpo.keys() | reinforce.keys() if grpo.get(key) != reinforce.get(key)}
    assert differ == {"output_dir", "scale_rewards", "loss_type", "num_iterations"}
    assert {key: reinforce.get(key, grpo.get(key)) for key in REINFORCE_SETTINGS} == REINFORCE_SETTINGS

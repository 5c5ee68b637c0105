"""What each stage of a recipe receives from its parsed arguments, as one JSON-able dict per (recipe, command line).

An RL recipe's view holds the rollout's and trainer's settings (``script``, ``training``, ``model``), whether RL trains
every weight (``rl_full``), the report's settings (``report``, ``None`` without one) and what the warm start trains
with (``warm``: the teacher and its data; ``sft``: the ``SFTConfig`` it builds; ``sft_model``: its ``ModelConfig``).
An SFT recipe's view holds its four dataclasses. ``tests/data/stage_views.json`` holds these views as the recipes gave
them before their settings moved into config files (``recipes/configs``), computed at commit 144f768 from the same
stages (the warm start's ``SFTConfig`` as ``run_warm_start`` built it); :mod:`test_recipe_configs` compares.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

from recipe_files import load_recipe

SNAPSHOT = Path(__file__).parent / "data" / "stage_views.json"
# Fields whose value depends on the machine or the folder, not on the recipe's settings.
VOLATILE = {"logging_dir", "output_dir"}
# ScriptArguments' fields that name the warm start and the report (their contents are the view's warm and report).
CONFIG_FIELDS = {"sft_config", "sft_adapter", "report_config"}


def plain(value):
    """``value`` as JSON holds it (enums and other objects by their text)."""
    return json.loads(json.dumps(value, default=lambda v: getattr(v, "value", str(v))))


def values(obj, skip=()) -> dict:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name not in VOLATILE | set(skip)}


def rl_view(recipe: str, argv: list[str]) -> dict:
    """The view of an RL recipe (``recipes/<recipe>.py``) under ``argv``; the warm start's trainer is not run."""
    import recruit_trl.workflow.warm_start as warm_start_module
    from recruit_trl.workflow.configs import read_report_config, read_warm_start
    from recruit_trl.workflow.model_setup import full_finetune, model_init_kwargs

    script, training, model = load_recipe(recipe).parse_args(list(argv))
    training.model_init_kwargs = model_init_kwargs(model, training)  # as the pipeline sets it
    report = read_report_config(script.report_config)
    view = {
        "script": values(script, CONFIG_FIELDS),
        "training": values(training),
        "model": values(model, {"use_peft"}),
        "report": values(report) if report else None,
        "rl_full": full_finetune(model),
        "warm": None,
    }
    captured = {}
    train_sft = warm_start_module.train_sft
    warm_start_module.train_sft = lambda prompts, warm, sft, sft_model, setup: captured.update(
        warm=warm, sft=sft, model=sft_model
    )
    try:
        warm_start = read_warm_start(script.sft_config, script, model)
        if warm_start is not None and not script.sft_adapter:
            setup = SimpleNamespace(model_path="MODEL", tasks=[])
            warm_start_module.run_warm_start(script, warm_start, training, model, setup)
    finally:
        warm_start_module.train_sft = train_sft
    if captured:
        view["warm"] = values(captured["warm"])
        view["sft"] = values(captured["sft"])
        view["sft_model"] = {
            **values(captured["model"], {"model_name_or_path"}),
            "use_peft": captured["model"].use_peft,
        }
    return plain(view)


def sft_view(recipe: str, argv: list[str]) -> dict:
    """The view of an SFT recipe: its four dataclasses."""
    script, warm, sft, model = load_recipe(recipe).parse_args(list(argv))
    return plain({"script": values(script), "warm": values(warm), "sft": values(sft), "model": values(model)})


def view(recipe: str, argv: list[str]) -> dict:
    return sft_view(recipe, argv) if recipe.startswith("sft_") else rl_view(recipe, argv)

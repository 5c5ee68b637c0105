"""The recipes (``recipes/*.py``, scripts outside any package) imported as modules, for tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

RECIPES = Path(__file__).parents[1] / "recipes"


def load_recipe(name: str) -> ModuleType:
    """``recipes/<name>.py`` as the module ``name`` (registered in ``sys.modules``: dataclasses look their module up
    while the class is created)."""
    spec = importlib.util.spec_from_file_location(name, RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def resolutions(monkeypatch) -> list[str]:
    """The names of the models resolved from now on: every call of ``recruit_trl.workflow.model_setup.resolve_model``,
    the one resolver every recipe resolves its model through (the tiny model's fingerprint plays an episode per task
    each time)."""
    import recruit_trl.workflow.model_setup as model_setup

    resolved, resolve = [], model_setup.resolve_model

    def counted(name, *args, **kwargs):
        resolved.append(name)
        return resolve(name, *args, **kwargs)

    monkeypatch.setattr(model_setup, "resolve_model", counted)
    return resolved


def config_file(folder: Path, name: str, **settings) -> str:
    """``recipes/configs/<name>`` with ``settings`` over its values, written into ``folder`` under the same name;
    returns its path (for ``--config``, ``--sft_config`` or ``--report_config``)."""
    import yaml

    values = yaml.safe_load((RECIPES / "configs" / name).read_text())
    unknown = set(settings) - set(values)
    if unknown:
        raise KeyError(f"{name} has no {sorted(unknown)}")
    path = Path(folder) / name
    path.write_text(yaml.safe_dump({**values, **settings}, sort_keys=False))
    return str(path)

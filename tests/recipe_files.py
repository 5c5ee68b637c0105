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

"""Layering: recruit_trl and the environments meet only through recruit_trl.protocol and entry points.

``env/`` never imports ``recruit_trl``, ``recruit_trl/`` never imports ``env`` (not even inside a function, nor by
a module name in a string), and environments are found by name through the ``recruit_trl.envs`` entry points.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

import recruit_trl.protocol as protocol
from recruit_trl.protocol import get_env_interface, register_env

ROOT = Path(__file__).parents[1]
# A string that names a module of the env package ("env.clinical.agent", "env.clinical.agent:CLINICAL"): an import
# in disguise.
ENV_MODULE = re.compile(r"env(\.\w+)*[.:]\w+")


def imported_packages(path: Path) -> list[tuple[int, str]]:
    """``(line, top-level package)`` of every import in the file, at any depth (functions included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def sources(package: str) -> list[Path]:
    paths = sorted((ROOT / package).rglob("*.py"))
    assert paths, package
    return paths


def imports_of(folder: str, package: str) -> list[str]:
    """``file:line`` of every import of ``package`` in ``folder``'s sources."""
    return [
        f"{path.relative_to(ROOT)}:{line}"
        for path in sources(folder)
        for line, imported in imported_packages(path)
        if imported == package
    ]


def test_env_never_imports_recruit_trl():
    bad = imports_of("env", "recruit_trl")
    assert not bad, f"env/ imports recruit_trl at {bad}"


def test_recruit_trl_never_imports_env():
    bad = imports_of("recruit_trl", "env")
    assert not bad, f"recruit_trl/ imports env at {bad}"
    named = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}"
        for path in sources("recruit_trl")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and ENV_MODULE.fullmatch(node.value)
    ]
    assert not named, f"recruit_trl/ names env modules (use an entry point): {named}"


def test_the_clinical_environment_is_an_installed_entry_point():
    entry_points = {ep.name: ep for ep in importlib.metadata.entry_points(group="recruit_trl.envs")}
    assert entry_points["clinical"].value == "env.clinical.agent:CLINICAL"
    import env.clinical.agent

    assert get_env_interface("clinical") is env.clinical.agent.CLINICAL
    # module:attribute still works
    assert get_env_interface("env.clinical.agent:CLINICAL") is env.clinical.agent.CLINICAL


def test_lookup_order_and_errors(monkeypatch):
    monkeypatch.setattr(protocol, "_REGISTRY", {})
    mine = SimpleNamespace(name="mine", render=None)  # an interface, not a factory (it renders)
    register_env("clinical", mine)  # the in-process registry comes first
    assert get_env_interface("clinical") is mine
    register_env("factory", lambda: mine)  # a factory is called once
    assert get_env_interface("factory") is mine and protocol._REGISTRY["factory"] is mine
    with pytest.raises(ValueError, match=r"Unknown environment 'nowhere'\. Known: \[.*'clinical'.*'factory'"):
        get_env_interface("nowhere")
    with pytest.raises(ValueError, match="Cannot import environment interface 'env.clinical.agent:MISSING'"):
        get_env_interface("env.clinical.agent:MISSING")

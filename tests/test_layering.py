"""Layering: recruit_trl and the environments meet only through recruit_trl.protocol and entry points.

``env/``'s agent interfaces import ``recruit_trl.protocol`` (their base class) and nothing else of recruit_trl; the
rest of ``env/`` never imports it. ``recruit_trl/`` never imports ``env`` (not even inside a function, nor by a
module name in a string), and environments are found by name through the ``recruit_trl.envs`` entry points.
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


def test_env_imports_only_recruit_trls_protocol_and_only_in_its_agent_interfaces():
    """An environment's interface subclasses ``recruit_trl.protocol.EnvInterface``; nothing else in ``env/`` (engines,
    servers, clients) imports recruit_trl, and no environment imports more of it than the protocol."""
    bad = []
    for path in sources("env"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            elif isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            else:
                continue
            for module in modules:
                if module.split(".")[0] == "recruit_trl" and (
                    module != "recruit_trl.protocol" or path.name != "agent.py"
                ):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} {module}")
    assert not bad, f"env/ imports more of recruit_trl than the protocol in its agent interfaces: {bad}"


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
    mine = type("Mine", (protocol.EnvInterface,), {"name": "mine"})()  # an interface instance, not a factory
    register_env("clinical", mine)  # the in-process registry comes first
    assert get_env_interface("clinical") is mine
    register_env("factory", lambda: mine)  # a factory is called once
    assert get_env_interface("factory") is mine and protocol._REGISTRY["factory"] is mine
    with pytest.raises(ValueError, match=r"Unknown environment 'nowhere'\. Known: \[.*'clinical'.*'factory'"):
        get_env_interface("nowhere")
    with pytest.raises(ValueError, match="Cannot import environment interface 'env.clinical.agent:MISSING'"):
        get_env_interface("env.clinical.agent:MISSING")
    register_env("duck", SimpleNamespace(name="duck", render=None))  # duck-typed: no base class, no defaults
    with pytest.raises(ValueError, match="'duck' is a SimpleNamespace, not an EnvInterface"):
        get_env_interface("duck")


def test_every_environment_has_the_fallback_agent_as_a_policy():
    import random

    for name in ("clinical", "conquest"):
        interface = get_env_interface(name)
        env = interface.make_env(interface.tasks()[0])
        obs, _ = env.reset(seed=0)
        policy = interface.get_policy(protocol.FALLBACK_POLICY)
        assert policy(obs, random.Random(0)) == interface.fallback_action(obs)
        with pytest.raises(ValueError, match="Unknown policy"):
            interface.get_policy("no-such-policy")


# recruit_trl's rooms, bottom to top: a module imports only from its own room or a lower one. The foundation is the
# top-level modules every room uses. The plugin's core is the foundation, models, rollout and training; the main job's
# workflow and the developer tools sit above it.
FOUNDATION = {"protocol", "contracts", "traces", "files", "versions", "ranges"}
CORE = ("foundation", "models", "rollout", "training")
ROOM_LEVELS = {
    "foundation": 0,
    "models": 1,
    "rollout": 2,
    "training": 3,
    "workflow": 4,
    "tools": 5,
    "cli": 6, "__main__": 7,
}  # fmt: skip
CORE_LINES = 5_500  # the core stays small enough to read in one sitting


def module_imports() -> dict[str, set[str]]:
    """``recruit_trl`` module -> the ``recruit_trl`` modules it imports, at any depth (functions included); the
    package root (the public API, imported lazily by name) is left out."""
    modules = {}
    for path in sources("recruit_trl"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("recruit_trl"):
                targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                           for a in node.names]  # fmt: skip
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("recruit_trl")]
            found.update(t for t in targets if t in modules and t not in (name, "recruit_trl"))
        graph[name] = found
    return graph


def room(module: str) -> str:
    name = module.split(".")[1]
    return "foundation" if name in FOUNDATION else name


def test_recruit_trl_has_no_import_circle():
    graph = module_imports()
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for imported in sorted(graph[module]):
            if state.get(imported) == 1:
                circle = path[path.index(imported) :] + [imported]
                raise AssertionError(f"import circle: {' -> '.join(circle)}")
            if imported not in state:
                visit(imported, path + [imported])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert len(graph) > 30  # the walk saw the package


def test_recruit_trl_rooms_import_downwards_only():
    graph = module_imports()
    unknown = sorted({room(m) for m in graph if m != "recruit_trl"} - set(ROOM_LEVELS))
    assert not unknown, f"rooms without a level in ROOM_LEVELS: {unknown}"
    upward = [
        f"{module} -> {imported}"
        for module, imports in graph.items()
        if module != "recruit_trl"  # the package root: the public API, imported lazily by name
        for imported in imports
        if room(module) != room(imported) and ROOM_LEVELS[room(module)] <= ROOM_LEVELS[room(imported)]
    ]
    assert not upward, f"imports that do not go down a level: {upward}"


def test_no_module_re_exports_another_modules_names():
    """Callers import a name from the module that defines it: only the package root lists a public API."""
    with_all = [
        str(path.relative_to(ROOT))
        for path in sources("recruit_trl")
        if path != ROOT / "recruit_trl" / "__init__.py"
        and any(
            isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets)
            for node in ast.parse(path.read_text()).body
        )
    ]
    assert not with_all, f"modules with __all__ (import from the defining module instead): {with_all}"


def test_every_script_imports_names_that_exist():
    """The recipes, the docs' measurement scripts and the tests import only names the project defines, at any depth
    (a function-local import fails only when its function runs, which a measurement script may do once a month)."""
    import importlib.util

    scripts = [*sorted((ROOT / "recipes").glob("*.py")), *sorted((ROOT / "docs").rglob("*.py")), *sources("tests")]
    missing = []
    for path in scripts:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                continue
            if node.module.split(".")[0] not in ("recruit_trl", "env", "rewards"):
                continue
            try:
                module = importlib.import_module(node.module)
            except ModuleNotFoundError:
                missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: no module {node.module}")
                continue
            for alias in node.names:
                if not hasattr(module, alias.name) and importlib.util.find_spec(f"{node.module}.{alias.name}") is None:
                    missing.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.module} has no {alias.name}")
    assert not missing, "\n".join(missing)


# Libraries whose import takes seconds: a recruit_trl module defers them to the function that needs them, so that
# `recruit-trl --help`, the argument classes and the environments' agents load in a fraction of a second.
HEAVY_LIBRARIES = {"torch", "transformers", "trl", "peft", "datasets", "accelerate", "bitsandbytes", "matplotlib"}
# Installed only with an extra: a module that imports one at module level is itself imported where it is needed.
OPTIONAL_LIBRARIES = {"vllm"}


def module_level_imports(path: Path) -> set[str]:
    """The modules a file imports when it is imported: statements at module level, inside ``if`` / ``try`` blocks
    too, except ``if TYPE_CHECKING:``, never inside a function or class."""
    found: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.update(f"{node.module}.{alias.name}" for alias in node.names)
                found.add(node.module)
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                walk(node.body)
                walk(node.orelse)
            elif isinstance(node, ast.Try):
                walk(node.body)

    walk(ast.parse(path.read_text()).body)
    return found


def test_a_function_local_import_defers_a_heavy_library():
    """A recruit_trl module imports another at module level unless that one loads torch and the like (then the import
    waits for the function that needs it, in a module that itself loads none of them) or a library only an extra
    installs (vLLM): a local import never hides an import circle (test_recruit_trl_has_no_import_circle counts them
    too) nor sits there for no reason."""
    modules = {}
    for path in sources("recruit_trl"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    direct = {name: module_level_imports(path) for name, path in modules.items()}
    heavy: dict[str, bool] = {}

    def is_heavy(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name not in heavy:
            imported = direct[name]
            own = {m for m in imported if m in modules and m != name and m not in seen and m != "recruit_trl"}
            heavy[name] = bool({m.split(".")[0] for m in imported} & HEAVY_LIBRARIES) or any(
                is_heavy(m, seen | {name}) for m in own
            )
        return heavy[name]

    needless = []
    for name, path in modules.items():
        if name == "recruit_trl":  # the package root: its public API is imported lazily by name
            continue
        tree = ast.parse(path.read_text())
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        for function in functions:
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "") in modules:
                    optional = {m.split(".")[0] for m in direct[node.module]} & OPTIONAL_LIBRARIES
                    if not optional and (is_heavy(name) or not is_heavy(node.module)):
                        needless.append(f"{path.relative_to(ROOT)}:{node.lineno}: from {node.module} import ...")
    assert heavy, "the walk saw no module"
    assert not needless, "function-local imports to move to the top of their module:\n" + "\n".join(needless)


def test_the_core_imports_nothing_from_the_workflow_or_the_tools_and_stays_small():
    graph = module_imports()
    core = [m for m in graph if m != "recruit_trl" and room(m) in CORE]
    assert {"recruit_trl.training.trainer", "recruit_trl.rollout.rollout_funcs", "recruit_trl.protocol"} <= set(core)
    above = sorted(f"{m} -> {i}" for m in core for i in graph[m] if room(i) not in CORE)
    assert not above, f"the core imports the workflow or the tools: {above}"
    lines = sum(
        len((ROOT / Path(*m.split("."))).with_suffix(".py").read_text().splitlines())
        if (ROOT / Path(*m.split("."))).with_suffix(".py").is_file()
        else len((ROOT / Path(*m.split(".")) / "__init__.py").read_text().splitlines())
        for m in core
    )
    assert lines <= CORE_LINES, f"the core has {lines} lines"

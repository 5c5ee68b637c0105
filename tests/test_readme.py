"""The README and docs/: every Python snippet runs as written (snippets that talk to a server get a real one; the
README's GRPOTrainer block, which trains, runs in tests/test_readme_python.py), the README stays short, its prompt is
what the code renders, and its environment checklist names what the protocol requires."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
from servers import env_server_cmd, free_port, start_server, stop_server

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
EXAMPLE = ROOT / "recipes" / "grpo_toy_walk.py"
# The README and every page of docs/ (the specs under docs/spec/ are not pages of this project: not collected).
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
SNIPPETS = [
    (doc, code)
    for doc in DOCUMENTS
    for code in re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
    if "trainer.train()" not in code  # trains: tests/test_readme_python.py runs it on a small budget
]
README_URL = "http://127.0.0.1:8000"


def section(title: str) -> str:
    """The README's section under ``## title``, up to the next ``## `` heading."""
    text = README.read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end > 0 else len(text)]


@pytest.fixture(scope="module")
def server_url():
    port = free_port()
    proc, url = start_server(env_server_cmd(port), port)
    yield url
    stop_server(proc)


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_python_snippet_runs(index, request):
    doc, code = SNIPPETS[index]
    if README_URL in code:
        code = code.replace(README_URL, request.getfixturevalue("server_url"))
    exec(compile(code, f"{doc.relative_to(ROOT)} snippet {index}", "exec"), {})


def test_readme_has_the_two_setup_commands():
    text = README.read_text()
    assert "pip install torch==2.13.0 && pip install -e ." in text
    assert 'python -m pytest -q -m "not slow"' in text


def test_the_readme_and_the_example_are_short_and_the_layout_names_every_recipe():
    text = README.read_text()
    assert len(text.splitlines()) <= 150, len(text.splitlines())
    assert len(EXAMPLE.read_text().splitlines()) <= 250
    layout = section("Layout")
    missing = [
        p.name for p in sorted((ROOT / "recipes").glob("*.py")) if p.name not in layout and p.stem != "gpu_check"
    ]
    assert not missing, f"recipes the README's layout does not name: {missing}"


def test_the_readmes_prompt_is_what_the_model_sees():
    """The README's prompt block is the clinical state it names, rendered now by the environment's interface in the
    index contract and the tiny model's chat template, then the expert's answer there; a line ``...`` stands for the
    lines it leaves out."""
    import random

    from recruit_trl.contracts import build_messages, completion_text
    from recruit_trl.protocol import get_env_interface, policy_action
    from recruit_trl.rollout.anchors import Anchor, AnchorCache
    from recruit_trl.workflow.tokenizer import EOS_TOKEN, build_tokenizer

    (shown,) = re.findall(r"```text\n(.*?)```", section("What the model sees"), flags=re.S)
    interface = get_env_interface("clinical")
    cache = AnchorCache(interface, recent_k=2)
    state = cache.get(Anchor("easy_bench", 0, 20, "grader_heuristic"))
    messages = build_messages(interface, state.obs, state.recent, "index")
    prompt = build_tokenizer(["x"], vocab_size=300).apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    env = cache.env("easy_bench")
    env.restore(state.snapshot)
    expert = policy_action(interface.get_policy("expert"), env, state.obs, random.Random(0))
    rendered = prompt + completion_text(expert, "index", interface.candidate_actions(state.obs)) + EOS_TOKEN + "\n"
    parts = shown.split("...\n")
    assert rendered.startswith(parts[0]) and rendered.endswith(parts[-1]), rendered
    at = 0
    for part in parts:  # in order, each cut standing for at least one line
        found = rendered.find(part, at)
        assert found >= 0, (part, rendered)
        at = found + len(part)


def test_the_readmes_checklist_names_what_an_environment_must_provide():
    """Every member of ``EnvInterface`` without a default (it raises ``NotImplementedError``), its attributes a
    subclass sets (those the toy walk sets, the smallest interface), the environment's methods (``MultiStepEnv``)
    and the entry point group."""
    from recruit_trl.protocol import ENTRY_POINT_GROUP, EnvInterface, MultiStepEnv

    checklist = section("Add an environment")
    required = [
        name
        for name, member in vars(EnvInterface).items()
        if inspect.isfunction(member) and "raise NotImplementedError" in inspect.getsource(member)
    ]
    assert len(required) >= 8
    attributes = ["name", "system_prompt", "reward_fields", "terminal_action_types"]
    env_methods = [n for n in vars(MultiStepEnv) if not n.startswith("_") and callable(getattr(MultiStepEnv, n))]
    assert set(env_methods) == {"reset", "step", "snapshot", "restore", "reseed"}
    missing = [n for n in [*required, *attributes, *env_methods] if f"`{n}`" not in checklist]
    assert not missing, f"the README's checklist does not name {missing}"
    assert f'"{ENTRY_POINT_GROUP}"' in checklist

"""Every Python snippet in the README and in docs/ runs as written (snippets that talk to a server get a real one)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from servers import env_server_cmd, free_port, start_server, stop_server

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
# The README and every page of docs/ (the specs under docs/spec/ are not pages of this project: not collected).
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md"))]
SNIPPETS = [
    (doc, code) for doc in DOCUMENTS for code in re.findall(r"```python\n(.*?)```", doc.read_text(), flags=re.S)
]
README_URL = "http://127.0.0.1:8000"


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


def test_the_readme_is_short_and_its_layout_names_every_recipe():
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    layout = text[text.index("## Layout") :]
    missing = [
        p.name for p in sorted((ROOT / "recipes").glob("*.py")) if p.name not in layout and p.stem != "gpu_check"
    ]
    assert not missing, f"recipes the README's layout does not name: {missing}"

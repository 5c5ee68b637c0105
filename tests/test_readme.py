"""Every Python snippet in the README runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_python_snippet_runs(index):
    exec(compile(SNIPPETS[index], f"README.md snippet {index}", "exec"), {})


def test_readme_has_the_two_setup_commands():
    text = README.read_text()
    assert "pip install torch==2.13.0 && pip install -e ." in text
    assert 'python -m pytest -q -m "not slow"' in text

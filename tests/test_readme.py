"""Every Python snippet in the README runs as written (snippets that talk to a server get a real one)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
README_URL = "http://127.0.0.1:8000"


@pytest.fixture(scope="module")
def server_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "env.server", "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1, trust_env=False).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_python_snippet_runs(index, request):
    code = SNIPPETS[index]
    if README_URL in code:
        code = code.replace(README_URL, request.getfixturevalue("server_url"))
    exec(compile(code, f"README.md snippet {index}", "exec"), {})


def test_readme_has_the_two_setup_commands():
    text = README.read_text()
    assert "pip install torch==2.13.0 && pip install -e ." in text
    assert 'python -m pytest -q -m "not slow"' in text

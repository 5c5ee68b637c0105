"""`.ci/run`'s verdict on pytest's exit status: its test section run with a stand-in `python` that exits as told."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

CI_RUN = Path(__file__).parents[1] / ".ci" / "run"


def ci_exit_status(tmp_path: Path, pytest_status: int) -> int:
    """Run the part of `.ci/run` after its install (from `echo "== tests"` on) with `python` exiting
    ``pytest_status``; return the script's exit status."""
    script = CI_RUN.read_text()
    tests_part = script[script.index('echo "== tests"') :]
    fake = tmp_path / "bin" / "python"
    fake.parent.mkdir()
    fake.write_text(f"#!/usr/bin/env bash\nexit {pytest_status}\n")
    fake.chmod(0o755)
    (tmp_path / "tests.sh").write_text("set -euo pipefail\nstart=$SECONDS\n" + tests_part)
    env = {**os.environ, "PATH": f"{fake.parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(["bash", str(tmp_path / "tests.sh")], env=env, capture_output=True).returncode


@pytest.mark.parametrize(("pytest_status", "passes"), [(0, True), (1, False), (2, False), (5, False)])
def test_ci_passes_only_when_pytest_ran_tests_and_they_passed(tmp_path, pytest_status, passes):
    assert (ci_exit_status(tmp_path, pytest_status) == 0) is passes

"""docs/results/learning_check_summary.py, the learning check's summary recomputed for checks written before it
reported credit minus start, run as docs/how-it-works.md runs it: the documented figures, and the arithmetic of one
of them by hand."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
CHECKS = ["clinical_branch", "clinical_episode", "toy_episode", "toy_branch", "toy_branch_tree_decoding"]


def test_the_summaries_in_the_docs_are_the_scripts_output(tmp_path):
    out = tmp_path / "summaries.json"
    files = [f"docs/results/learning_check_{name}.json" for name in CHECKS]
    proc = subprocess.run(
        [sys.executable, "docs/results/learning_check_summary.py", *files, "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    written = json.loads(out.read_text())
    assert written == json.loads((ROOT / "docs/results/learning_check_summaries.json").read_text())
    # Credit minus start on clinical's medium in branch mode, by hand from the check's own rows.
    check = json.loads((ROOT / "docs/results/learning_check_clinical_branch.json").read_text())
    cell_of = ("medium_bench", "greedy")
    start = next(r["value"] for r in check["start"]["rows"] if (r["task"], r["decoding"]) == cell_of)
    diffs = [r["value"] - start for r in sorted(check["rows"], key=lambda r: r["seed"])
             if (r["arm"], r["task"], r["decoding"]) == ("credit", "medium_bench", "greedy")]  # fmt: skip
    mean = sum(diffs) / 3
    se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 2 / 3)
    cell = written["learning_check_clinical_branch.json"]["all"]["greedy"]["medium_bench"]["credit_minus_start"]
    assert cell["diffs"] == pytest.approx(diffs) and cell["t"] == pytest.approx(mean / se)
    assert "medium+hard" in proc.stdout and "credit-start +0.074" in proc.stdout

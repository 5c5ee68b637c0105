"""docs/results/conquest_power.py, the conquest rung's power calculation, run as docs/conquest.md runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_the_power_calculation_reads_the_duel_runs(tmp_path):
    out = tmp_path / "power.json"
    proc = subprocess.run(
        [sys.executable, "docs/results/conquest_power.py", "--games", "400", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report == json.loads((ROOT / "docs/results/conquest_power.json").read_text())  # the documented figures
    seeds = [row["seeds_per_arm"] for row in report["rows"]]
    assert seeds == sorted(seeds, reverse=True) and seeds[0] > seeds[-1] >= 2  # larger effects need fewer seeds
    assert "effect 0.05: 29 seeds per arm" in proc.stdout

"""Smoke test of the GPU check (CleanRL style): the real script, ``--dry_run``, through the 4-bit bitsandbytes path."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
KEYS = {
    "seconds_per_step",
    "peak_gpu_memory_gib",
    "generated_tokens_per_s",
    "valid_action_rate",
    "device",
    "versions",
    "num_parameters",
    "linear4bit_layers",
    "config",
}


def test_gpu_check_dry_run_writes_measurements(tmp_path):
    pytest.importorskip("bitsandbytes")  # an optional extra (".[gpu]"); the script says how to install it
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        ["bash", "recipes/gpu_check.sh", "--dry_run", "--output_dir", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert KEYS <= result.keys()
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == result  # the printed object is the file's
    assert result["linear4bit_layers"] > 0
    assert result["seconds_per_step"] > 0
    assert 0.0 <= result["valid_action_rate"] <= 1.0
    assert result["generated_tokens_per_s"] > 0
    assert result["grad_norm"] > 0, "the LoRA weights got no gradient"
    assert result["dry_run"] is True and result["steps"] == 2
    assert set(result["versions"]) >= {"torch", "trl", "transformers", "bitsandbytes"}
    if result["device"].startswith("cpu"):
        assert result["peak_gpu_memory_gib"] is None


def test_gpu_check_without_gpu_says_how_to_run():
    torch = pytest.importorskip("torch")
    pytest.importorskip("bitsandbytes")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the full check would run")
    proc = subprocess.run(
        ["bash", "recipes/gpu_check.sh", "--max_steps", "1"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert "no CUDA device" in proc.stderr and "--dry_run" in proc.stderr

"""Two processes under ``accelerate launch`` on the CPU, with the project's configs for each engine: DDP (gloo),
DeepSpeed ZeRO-2 and ZeRO-3 (``accelerate_configs/cpu_*.yaml``). Each run has the main job's shape (a warm start with
a DAgger round, one GRPO step, the report on the main process while the other waits) and its weights are compared
with the DDP run's; ZeRO-3 with a LoRA adapter too (what GPU users train)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from recipe_files import config_file
from safetensors.torch import load_file

from recruit_trl.models.loading import is_trained

ROOT = Path(__file__).parents[1]
ENGINES = {"ddp": "cpu_ddp.yaml", "zero2": "cpu_deepspeed_zero2.yaml", "zero3": "cpu_deepspeed_zero3.yaml"}
# Weights of a DeepSpeed run lie this close to the DDP run's (largest difference measured: 5.7e-7, from the warm
# start's steps), while the GRPO step moves some weight by more than ten times as much.
ATOL = 2e-6
GRPO_MOVES = 2e-5

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU configs: a GPU machine uses its own")


def free_port() -> int:
    with socket.socket() as s:  # another job on this machine may be using accelerate's default port
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def launched(warm_model, tmp_path_factory):
    """``launched(engine, lora)``: the folder of that run, launched once per module."""
    root = tmp_path_factory.mktemp("launch")
    configs = {}
    for lora in (False, True):
        folder = root / f"configs-{'lora' if lora else 'full'}"
        folder.mkdir()
        sft = config_file(folder, "sft_clinical.yaml", teacher="safe", sft_train_seeds="300", max_steps=2,
                          per_device_train_batch_size=4, dagger_rounds=1, dagger_seeds="300",
                          use_peft=lora)  # fmt: skip
        report = config_file(folder, "report_clinical.yaml", eval_seeds="0", eval_baselines=["heuristic"],
                             eval_decisions=False, eval_workers=1)  # fmt: skip
        configs[lora] = (sft, report)
    runs: dict[tuple[str, bool], Path] = {}

    def launch(engine: str, lora: bool) -> Path:
        if (engine, lora) in runs:
            return runs[engine, lora]
        out = root / f"{engine}-{'lora' if lora else 'full'}"
        sft, report = configs[lora]
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(ROOT / "accelerate_configs" / ENGINES[engine]), "--main_process_port", str(free_port()),
               str(ROOT / "recipes" / "grpo_clinical.py"),
               "--model_name_or_path", warm_model, "--max_steps", "1", "--output_dir", str(out),
               "--tasks", "hard_bench_stage_30", "--anchor_seeds", "100", "--anchor_days", "0-20:10", "--horizon", "3",
               "--per_device_train_batch_size", "8", "--num_generations", "4", "--save_strategy", "no",
               "--use_peft", str(lora).lower(), "--sft_config", sft, "--report_config", report]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "DS_ACCELERATOR": "cpu"}
        # DeepSpeed's first launch on a machine compiles its shared-memory op (about 75 s); later ones reuse it.
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-4000:]
        runs[engine, lora] = out
        return out

    return launch


def weights(folder: Path) -> dict[str, torch.Tensor]:
    name = "adapter_model.safetensors" if (folder / "adapter_config.json").is_file() else "model.safetensors"
    return load_file(folder / name)


@pytest.mark.parametrize(("engine", "lora"), [("ddp", False), ("zero2", False), ("zero3", False), ("zero3", True)])
def test_two_processes_run_the_warm_start_with_dagger_grpo_and_the_report(launched, engine, lora):
    if engine != "ddp":
        pytest.importorskip("deepspeed", reason="DeepSpeed is in the test extra: pip install -e '.[test]'")
    out = launched(engine, lora)
    info = json.loads((out / "run_info.json").read_text())
    assert info["world_size"] == 2 and info["model"]["trained"] == ("adapter" if lora else "full")
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 1  # GRPO stepped
    assert all(is_trained(out / "sft" / f"round-{r}") for r in (0, 1))
    report = json.loads((out / "report.json").read_text())  # written by the main process while the other waited
    assert {row["policy"] for row in report["results"]} == {"base", "sft", "grpo", "heuristic"}
    trained, start = weights(out), weights(out / "sft")
    assert max(float((trained[k] - start[k]).abs().max()) for k in start) > GRPO_MOVES
    if engine == "ddp":
        return
    reference = launched("ddp", lora)
    for stage in ("sft/round-0", "sft/round-1", "sft", "."):
        got, want = weights(out / stage), weights(reference / stage)
        # ZeRO-2 saves the tied output embedding under its own name too: the same tensor
        assert all(torch.equal(got[k], got["model.embed_tokens.weight"]) for k in set(got) - set(want))
        assert set(want) <= set(got)
        gap = max(float((got[k] - want[k]).abs().max()) for k in want)
        assert gap <= ATOL, f"{stage}: {gap:.2g} from the DDP run"

"""Shared test fixtures: paths to the golden data recorded on the reference environment, and small models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
GOLDEN_FILE = DATA / "golden_trajectories.json"
WORLD_FACTS_FILE = DATA / "world_facts.json"


@pytest.fixture(scope="session")
def golden_episodes() -> list[dict]:
    return json.loads(GOLDEN_FILE.read_text())


@pytest.fixture(scope="session")
def world_facts() -> dict:
    return json.loads(WORLD_FACTS_FILE.read_text())


def small_model(tmp_path_factory, name: str, rows: list[dict], **sizes) -> str:
    """A one-layer tiny model trained on ``rows`` in a fresh session folder ``name``: what the fixtures below share."""
    from recruit_trl.workflow.tiny_model import build_tiny_model

    folder = tmp_path_factory.mktemp(name) / "model"
    return str(build_tiny_model(folder, rows, num_layers=1, num_heads=2, num_kv_heads=1, progress=False, **sizes))


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory) -> str:
    """A small model that answers in the index contract most of the time (so GRPO groups have variance)."""
    from recruit_trl.protocol import get_env_interface
    from recruit_trl.traces import collect_traces

    rows = collect_traces(
        get_env_interface("clinical"), ["easy_bench", "hard_bench"], range(2), epsilon=0.5, relabel=False
    )
    return small_model(
        tmp_path_factory, "warm", rows, hidden_size=64, intermediate_size=128, max_steps=80, batch_size=8, lr=5e-3,
        num_threads=1,
    )  # fmt: skip


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """The smallest model that plays the clinical 30-day task (two optimizer steps on its traces): for tests of the
    evaluation's plumbing, not of what a model learns."""
    from recruit_trl.protocol import get_env_interface
    from recruit_trl.traces import collect_traces

    rows = collect_traces(get_env_interface("clinical"), ["hard_bench_stage_30"], range(2))
    return small_model(tmp_path_factory, "tiny", rows, hidden_size=32, intermediate_size=64, max_steps=2, batch_size=4)

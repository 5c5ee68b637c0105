"""Shared test fixtures: paths to the golden data recorded on the reference environment."""

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

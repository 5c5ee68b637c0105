"""Task registry: the three public benchmark tasks and their progressive ``*_stage_{30,90,180}`` variants.

Every figure here comes from the behavioural specification (sections 2.1 and 2.4). A task is a frozen
dataclass; the world it describes (patients, sites, event calendar) is generated in :mod:`env.clinical.world`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

PUBLIC_TASK_IDS = ("easy_bench", "medium_bench", "hard_bench")
STAGE_HORIZONS = (30, 90, 180)
TOKEN_BUDGET = 12_000


@dataclass(frozen=True)
class TaskSpec:
    """Parameters of one task. ``world_seed`` fixes the world; ``default_seed`` seeds the step RNG when
    ``reset(seed=None)``."""

    task_id: str
    base_task: str
    name: str
    description: str
    difficulty: int
    world_type: str
    world_seed: int
    default_seed: int
    n_patients: int
    patient_noise: float
    n_sites: int
    site_variance: float
    event_density: float
    budget: float
    target: int
    max_steps: int
    screening_cost: float
    enrollment_cost: float
    recontact_cost: float
    strategy_cost: float
    dropout_base_rate: float
    uncertainty_growth: float
    curriculum: tuple[tuple[int, int], ...] = ()
    token_budget: int = TOKEN_BUDGET

    @property
    def difficulty_label(self) -> str:
        return {1: "easy", 2: "medium", 3: "hard"}[self.difficulty]


TASKS: dict[str, TaskSpec] = {
    "easy_bench": TaskSpec(
        task_id="easy_bench",
        base_task="easy_bench",
        name="Basic Eligibility Screening",
        description="One site, low noise: screen efficiently, keep the budget and enrol as many patients as you can.",
        difficulty=1,
        world_type="noise",
        world_seed=42,
        default_seed=42,
        n_patients=200,
        patient_noise=0.05,
        n_sites=1,
        site_variance=0.02,
        event_density=0.02,
        budget=120_000.0,
        target=80,
        max_steps=180,
        screening_cost=600.0,
        enrollment_cost=1200.0,
        recontact_cost=100.0,
        strategy_cost=200.0,
        dropout_base_rate=0.05,
        uncertainty_growth=0.001,
    ),
    "medium_bench": TaskSpec(
        task_id="medium_bench",
        base_task="medium_bench",
        name="Full Funnel with Site Allocation",
        description="Three sites of unequal quality: run the whole funnel and allocate patients to the right sites.",
        difficulty=2,
        world_type="site_bias",
        world_seed=123,
        default_seed=123,
        n_patients=350,
        patient_noise=0.12,
        n_sites=3,
        site_variance=0.08,
        event_density=0.06,
        budget=150_000.0,
        target=120,
        max_steps=180,
        screening_cost=800.0,
        enrollment_cost=1400.0,
        recontact_cost=150.0,
        strategy_cost=300.0,
        dropout_base_rate=0.10,
        uncertainty_growth=0.003,
    ),
    "hard_bench": TaskSpec(
        task_id="hard_bench",
        base_task="hard_bench",
        name="Multi-Objective Pipeline Under Pressure",
        description="Five sites, frequent regulatory holds and scheduled dropouts, curriculum windows: balance "
        "enrolment, retention, budget and recovery.",
        difficulty=3,
        world_type="dropout",
        world_seed=777,
        default_seed=777,
        n_patients=500,
        patient_noise=0.20,
        n_sites=5,
        site_variance=0.15,
        event_density=0.12,
        budget=100_000.0,
        target=150,
        max_steps=180,
        screening_cost=900.0,
        enrollment_cost=1500.0,
        recontact_cost=200.0,
        strategy_cost=400.0,
        dropout_base_rate=0.18,
        uncertainty_growth=0.005,
        curriculum=((25, 8), (60, 10), (100, 7), (140, 12)),
    ),
}


def stage_task(base: TaskSpec, horizon: int) -> TaskSpec:
    """The progressive variant of ``base`` with ``horizon`` steps (spec section 2.4)."""
    ratio = horizon / 180
    windows = []
    for start, duration in base.curriculum:
        if start >= horizon:
            continue
        end = min(start + duration, horizon - 1)
        windows.append((start, max(0, end - start)))
    return dataclasses.replace(
        base,
        task_id=f"{base.task_id}_stage_{horizon}",
        max_steps=horizon,
        target=max(1, round(base.target * ratio)),
        budget=round(base.budget * (0.35 + 0.65 * ratio), 2),
        default_seed=base.default_seed + horizon,
        curriculum=tuple(windows),
    )


ALL_TASKS: dict[str, TaskSpec] = dict(TASKS)
for _base in TASKS.values():
    for _h in STAGE_HORIZONS:
        _stage = stage_task(_base, _h)
        ALL_TASKS[_stage.task_id] = _stage


def get_task(task_id: str | None) -> TaskSpec:
    """Look up a task id (public or stage). ``None`` means ``easy_bench``.

    Raises:
        ValueError: for an unknown id, with the reference's message.
    """
    if task_id is None:
        task_id = "easy_bench"
    try:
        return ALL_TASKS[task_id]
    except (KeyError, TypeError):
        raise ValueError(f"Unknown task: {task_id}. Available: {list(PUBLIC_TASK_IDS)}") from None

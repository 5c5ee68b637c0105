"""Environments for recruit_trl, one package each: ``env.clinical`` (clinical-trial recruitment).

``env.server`` and ``env.client`` serve and reach them over HTTP / WebSocket. The clinical environment's public
names are re-exported here, so ``from env import ClinicalRecruitmentEnv, TASKS`` keeps working.
"""

from env.clinical import (
    ACTION_TYPES,
    ALL_TASKS,
    FEATURE_NAMES,
    HYPOTHESES,
    PLAN_PHASES,
    POLICIES,
    PUBLIC_TASK_IDS,
    STATE_DIM,
    TASKS,
    Action,
    ClinicalRecruitmentEnv,
    EnvSnapshot,
    TaskSpec,
    features,
    get_policy,
    get_task,
    heuristic_policy,
    random_policy,
    register_policy,
    run_episode,
    validate_action,
    world_fingerprint,
)

__all__ = [
    "ACTION_TYPES",
    "ALL_TASKS",
    "FEATURE_NAMES",
    "HYPOTHESES",
    "PLAN_PHASES",
    "POLICIES",
    "PUBLIC_TASK_IDS",
    "STATE_DIM",
    "TASKS",
    "Action",
    "ClinicalRecruitmentEnv",
    "EnvSnapshot",
    "TaskSpec",
    "features",
    "get_policy",
    "get_task",
    "heuristic_policy",
    "random_policy",
    "register_policy",
    "run_episode",
    "validate_action",
    "world_fingerprint",
]

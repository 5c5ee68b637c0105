"""The clinical-trial recruitment environment (bit-exact with the public reference), its tasks and policies.

The package `env` re-exports these names, so `from env import ClinicalRecruitmentEnv` works as well:

from env import ClinicalRecruitmentEnv, TASKS
env = ClinicalRecruitmentEnv(task="easy_bench")
obs, info = env.reset(seed=0)
obs, reward, terminated, truncated, info = env.step({"action_type": "screen_patient", "patient_id": "P-1149"})
"""

import env.clinical.expert  # noqa: F401  (registers the grader_heuristic, expert, ... policies)
from env.clinical.core import ClinicalRecruitmentEnv, EnvSnapshot
from env.clinical.feature_vector import FEATURE_NAMES, STATE_DIM, features
from env.clinical.models import ACTION_TYPES, HYPOTHESES, PLAN_PHASES, Action, validate_action
from env.clinical.policies import POLICIES, get_policy, heuristic_policy, random_policy, register_policy, run_episode
from env.clinical.tasks import ALL_TASKS, PUBLIC_TASK_IDS, TASKS, TaskSpec, get_task
from env.clinical.world import world_fingerprint

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

"""The clinical-trial recruitment environment (bit-exact with the public reference), its tasks and policies."""

from env.core import ClinicalRecruitmentEnv, EnvSnapshot
from env.models import ACTION_TYPES, HYPOTHESES, Action, validate_action
from env.tasks import ALL_TASKS, TASKS, TaskSpec, get_task

__all__ = [
    "ACTION_TYPES",
    "ALL_TASKS",
    "HYPOTHESES",
    "TASKS",
    "Action",
    "ClinicalRecruitmentEnv",
    "EnvSnapshot",
    "TaskSpec",
    "get_task",
    "validate_action",
]

"""Environments for recruit_trl, one package each: ``env.clinical`` (clinical-trial recruitment).

``env.server`` and ``env.client`` serve and reach them over HTTP / WebSocket. The clinical environment's public
names are re-exported here, so ``from env import ClinicalRecruitmentEnv, TASKS`` keeps working.
"""

from env import clinical
from env.clinical import *  # noqa: F403  (the clinical environment's public names)

__all__ = list(clinical.__all__)

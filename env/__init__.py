"""Environments for recruit_trl, one package each: ``env.clinical`` (clinical-trial recruitment).

``env.server`` and ``env.client`` serve and reach them over HTTP / WebSocket. The clinical environment's public
names are also the package's (``from env import ClinicalRecruitmentEnv, TASKS``: the public API users and checks
rely on).
"""

from env import clinical
from env.clinical import *  # noqa: F403  (the clinical environment's public names)

__all__ = list(clinical.__all__)

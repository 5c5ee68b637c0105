"""The public API: importable from ``recruit_trl``, loaded on first use, the same objects as the modules'."""

from __future__ import annotations

import subprocess
import sys

import pytest

import recruit_trl


def test_public_names_are_the_modules_objects():
    from recruit_trl.protocol import EnvInterface, get_env_interface, register_env
    from recruit_trl.rollout.config import RolloutConfig
    from recruit_trl.rollout.rollout_funcs import BranchRollout, make_rollout
    from rewards import get_reward_funcs

    assert recruit_trl.make_rollout is make_rollout and recruit_trl.RolloutConfig is RolloutConfig
    assert recruit_trl.BranchRollout is BranchRollout
    assert recruit_trl.EnvInterface is EnvInterface and recruit_trl.register_env is register_env
    assert recruit_trl.get_env_interface is get_env_interface and recruit_trl.get_reward_funcs is get_reward_funcs
    assert set(recruit_trl.__all__) == {"__version__", *recruit_trl._EXPORTS}
    assert set(recruit_trl.__all__) <= set(dir(recruit_trl))
    with pytest.raises(AttributeError, match="no_such_name"):
        recruit_trl.no_such_name  # noqa: B018
    with pytest.raises(AttributeError, match="renamed RecruitReinforceTrainer"):
        recruit_trl.ReinforceTrainer  # noqa: B018
    with pytest.raises(AttributeError, match="window mode was removed"):
        recruit_trl.WindowRollout  # noqa: B018


def test_importing_the_package_loads_neither_torch_nor_the_environment():
    code = "import sys, recruit_trl; print(sorted({'torch', 'trl', 'env', 'recruit_trl.protocol'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"

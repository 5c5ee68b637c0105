"""The README's "Use it in your own GRPOTrainer" block runs as written: TRL's own ``GRPOTrainer`` in branch mode on the
clinical environment, with two changes for a test's budget: its model builder returns the tests' tiny clinical model
(no two-minute build) and its 60 steps become 2."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
TITLE = "## Use it in your own GRPOTrainer"


def readme_block() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(TITLE)
    (code,) = re.findall(r"```python\n(.*?)```", text[start : text.find("\n## ", start + 1)], flags=re.S)
    return code


def test_the_block_is_short_and_puts_a_rollout_into_trls_trainer():
    code = readme_block()
    assert len(code.splitlines()) <= 30
    assert "from trl import GRPOConfig, GRPOTrainer" in code and "trainer = GRPOTrainer(" in code
    assert "rollout_func=make_rollout(RolloutConfig(env_name=" in code and "get_reward_funcs(" in code


def test_the_block_trains_two_steps(tiny_model, tmp_path, monkeypatch):
    from recruit_trl.rollout.rollout_funcs import BranchRollout
    from recruit_trl.workflow import model_setup

    asked = []

    def tests_tiny_model(name, interface, *, tasks, **kwargs):
        asked.append((name, interface.name, tuple(tasks)))
        return tiny_model

    monkeypatch.setattr(model_setup, "resolve_model", tests_tiny_model)
    monkeypatch.chdir(tmp_path)  # its output_dir is relative
    code = readme_block()
    assert code.count("max_steps=60") == 1
    namespace: dict = {}
    exec(compile(code.replace("max_steps=60", "max_steps=2"), "README.md GRPOTrainer block", "exec"), namespace)

    trainer = namespace["trainer"]
    assert asked == [("tiny", "clinical", ("easy_bench", "medium_bench", "hard_bench"))]
    assert type(trainer).__name__ == "GRPOTrainer" and isinstance(trainer.rollout_func, BranchRollout)
    assert trainer.state.global_step == 2
    assert len(namespace["anchors"]) > 100 and trainer.rollout_func.cache.misses > 0  # states rebuilt, branches scored
    assert any("train_loss" in entry for entry in trainer.state.log_history)

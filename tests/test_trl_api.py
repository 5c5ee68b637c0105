"""The check of TRL's private API (recruit_trl.training.trl_api): the installed TRL passes, a changed signature and a
removed method fail with the method's name."""

from __future__ import annotations

import pytest
import trl
from trl import GRPOTrainer

from recruit_trl.training.trl_api import TRL_PRIVATE_API, TRL_SERIES, check_trl_private_api


def test_the_installed_trl_has_every_private_method_recruit_trl_relies_on():
    assert trl.__version__.startswith(f"{TRL_SERIES}.")
    check_trl_private_api()


def test_the_table_lists_the_overridden_methods():
    listed = {entry.qualname for entry in TRL_PRIVATE_API}
    assert {
        "GRPOTrainer._prepare_inputs", "GRPOTrainer._generate_and_score_completions", "GRPOTrainer._generate",
        "GRPOTrainer._compute_loss", "GRPOTrainer._get_per_token_logps_and_entropies", "SFTTrainer._get_train_sampler",
    } <= listed  # fmt: skip


def test_a_changed_signature_fails_with_the_method_and_both_signatures(monkeypatch):
    def _compute_loss(self, model, inputs, num_items_in_batch=None):
        raise AssertionError("never called")

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", _compute_loss)
    with pytest.raises(RuntimeError) as error:
        check_trl_private_api()
    message = str(error.value)
    assert "written against trl 1.16's GRPOTrainer._compute_loss(self, model, inputs)" in message
    found = "GRPOTrainer._compute_loss(self, model, inputs, num_items_in_batch)"
    assert f"the installed trl {trl.__version__} has {found}" in message
    assert message.endswith("pin trl==1.16.*") and message.count("\n") == 0  # the one method that changed


def test_a_new_keyword_of_an_overridden_method_fails(monkeypatch):
    real = GRPOTrainer._get_per_token_logps_and_entropies

    def _get_per_token_logps_and_entropies(self, *args, temperature=None, **kwargs):
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", _get_per_token_logps_and_entropies)
    with pytest.raises(RuntimeError, match=r"entropies\(self, \*args, temperature, \*\*kwargs\) \(defined in test_"):
        check_trl_private_api()


def test_a_parameter_of_another_kind_fails(monkeypatch):
    def _compute_loss(self, model, /, inputs):
        raise AssertionError("never called")

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", _compute_loss)
    with pytest.raises(RuntimeError, match=r"has GRPOTrainer\._compute_loss\(self, model, /, inputs\)"):
        check_trl_private_api()


def test_a_removed_method_fails(monkeypatch):
    monkeypatch.delattr(GRPOTrainer, "_generate")
    with pytest.raises(RuntimeError, match=r"the installed trl \S+ has no GRPOTrainer\._generate: pin trl==1\.16"):
        check_trl_private_api()


def test_a_removed_helper_fails(monkeypatch):
    import trl.trainer.utils

    monkeypatch.delattr(trl.trainer.utils, "split_tensor_dict")
    with pytest.raises(RuntimeError, match=r"has no trl\.trainer\.utils\.split_tensor_dict"):
        check_trl_private_api()


def test_another_series_fails(monkeypatch):
    monkeypatch.setattr(trl, "__version__", "1.17.0")
    with pytest.raises(RuntimeError, match=r"written against trl 1\.16\.\*; trl 1\.17\.0 is installed"):
        check_trl_private_api()


def test_a_changed_body_of_an_overridden_method_fails_with_its_name(monkeypatch):
    """Same signature, other source: the override was written against the old body (e.g. _prepare_inputs'
    buffering), so the check names the method and both hashes."""

    def _prepare_inputs(self, generation_batch):
        return generation_batch  # a body that no longer buffers

    monkeypatch.setattr(GRPOTrainer, "_prepare_inputs", _prepare_inputs)
    with pytest.raises(RuntimeError) as error:
        check_trl_private_api()
    message = str(error.value)
    assert "GRPOTrainer._prepare_inputs has other source" in message and "not f824e7fb07147956" in message
    assert message.count("\n") == 0


def test_every_overridden_or_replaced_member_has_its_source_pinned():
    for entry in TRL_PRIVATE_API:
        assert bool(entry.source) == entry.used_by.startswith(("overridden", "replaced")), entry.qualname


def test_a_private_attribute_set_otherwise_or_no_longer_set_fails_with_its_name(monkeypatch):
    real = GRPOTrainer.__init__

    def __init__(self, *args, **kwargs):  # _metrics keyed otherwise, _logs no longer set; _step and the buffer kept
        self._metrics = {"train": {}, "eval": {}}
        self._step = 0
        self._buffered_inputs = None
        real(self, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "__init__", __init__)
    with pytest.raises(RuntimeError) as error:
        check_trl_private_api()
    problems = str(error.value).split("\n")
    assert len(problems) == 2
    assert "GRPOTrainer._metrics (read and written by" in problems[0] and "sets it otherwise (sha256" in problems[0]
    assert problems[1].startswith("recruit_trl was written against trl 1.16's GRPOTrainer._logs")
    assert "GRPOTrainer.__init__ no longer sets self._logs: pin trl==1.16.*" in problems[1]


def test_accelerates_private_state_reset_is_checked_too(monkeypatch):
    from accelerate.state import AcceleratorState

    monkeypatch.setattr(AcceleratorState, "_reset_state", staticmethod(lambda: None))
    with pytest.raises(RuntimeError, match=r"accelerate\.state\.AcceleratorState\._reset_state\(\)"):
        check_trl_private_api()


def test_every_recipe_refuses_a_changed_trl_while_parsing(monkeypatch, tmp_path):
    from recipe_files import load_recipe

    monkeypatch.setattr(trl, "__version__", "1.17.0")
    for name in ("grpo_clinical", "sft_clinical", "sft_conquest", "grpo_environment_factory"):
        with pytest.raises(RuntimeError, match=r"trl 1\.17\.0 is installed"):
            load_recipe(name).parse_args(["--output_dir", str(tmp_path / name)])

"""Files that re-runs trust: atomic writes survive a kill, torn markers and half-written weights count as absent."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def test_a_kill_between_writing_and_renaming_leaves_the_old_file_whole(tmp_path, monkeypatch):
    from recruit_trl.files import write_json_atomic

    path = tmp_path / "out" / "stats.json"
    write_json_atomic(path, {"rows": 1})

    def killed(src, dst):
        raise KeyboardInterrupt  # the process dies after the data is written, before the new name is in place

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic(path, {"rows": 2})
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"rows": 1}
    assert [p.name for p in path.parent.iterdir()] == ["stats.json"]  # no temporary file left either


def test_a_torn_json_marker_reads_as_absent_with_a_warning(tmp_path):
    from recruit_trl.files import read_json

    path = tmp_path / "heldout_report.json"
    assert read_json(path) is None
    path.write_text('{"teacher_match": 0.5, "rows"')
    with pytest.warns(UserWarning, match="heldout_report.json"):
        assert read_json(path) is None
    path.write_text('{"teacher_match": 0.5}')
    assert read_json(path) == {"teacher_match": 0.5}


def _tiny_model(folder: Path) -> Path:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=4,
    )  # fmt: skip
    Qwen3ForCausalLM(config).save_pretrained(folder)
    return folder


def test_a_model_counts_as_trained_only_with_complete_weights_and_config(tmp_path):
    from recruit_trl.models.loading import is_trained

    folder = _tiny_model(tmp_path / "model")
    assert is_trained(folder)
    weights = folder / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])  # killed while saving the weights
    assert not is_trained(folder)
    weights.write_bytes(whole)
    (folder / "config.json").write_text('{"model_type": ')
    with pytest.warns(UserWarning, match="config.json"):
        assert not is_trained(folder)
    (folder / "config.json").unlink()
    assert not is_trained(folder)
    adapter = tmp_path / "adapter"  # a LoRA adapter: its config and its weights
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(folder)}))
    assert not is_trained(adapter)
    (adapter / "adapter_model.safetensors").write_bytes(whole[:100])
    assert not is_trained(adapter)
    (adapter / "adapter_model.safetensors").write_bytes(whole)
    assert is_trained(adapter)


def test_a_model_fingerprint_follows_the_files_that_decide_its_answers(tmp_path):
    from recruit_trl.models.loading import model_fingerprint

    folder = _tiny_model(tmp_path / "model")
    first = model_fingerprint(folder)
    assert first == model_fingerprint(folder) and model_fingerprint("org/hub-id") is None
    (folder / "report.json").write_text("{}")  # results beside the model are not the model
    assert model_fingerprint(folder) == first
    _tiny_model(folder)  # new random weights in the same folder
    assert model_fingerprint(folder) != first
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(folder)}))
    (adapter / "adapter_model.safetensors").write_bytes(b"lora")
    on_base = model_fingerprint(adapter)
    _tiny_model(folder)  # the same adapter on another base: other answers
    assert model_fingerprint(adapter) != on_base

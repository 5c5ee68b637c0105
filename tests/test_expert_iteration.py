"""The expert-iteration recipe (recipes/expert_iteration.py) end to end on the smallest model, its controls' labels,
and its refusals."""

from __future__ import annotations

import json
import random

import pytest
from recipe_files import load_recipe

from recruit_trl.models.loading import is_trained
from recruit_trl.workflow.expert_iteration import relabel

ROW = {"completion": '{"action_index": 2}', "action_type": "c", "candidate_types": ["a", "b", "c", "d"], "greedy": 1,
       "best": 2, "means": {"1": 0.5, "2": 0.7, "3": 0.6}}  # fmt: skip


def test_the_controls_label_the_same_state_with_the_models_choice_or_permuted_values():
    assert relabel(ROW, "planner", random.Random(0)) is ROW
    own = relabel(ROW, "self", random.Random(0))
    assert own["completion"] == '{"action_index": 1}' and own["action_type"] == "b" and ROW["best"] == 2
    picks = {json.loads(relabel(ROW, "shuffled", random.Random(s))["completion"])["action_index"] for s in range(40)}
    assert picks == {1, 2, 3}  # the best of the permuted values: any scored candidate


def flags(start: str, out, *more: str) -> list[str]:
    return ["--start", start, "--output_dir", str(out), "--tasks", "hard_bench_stage_30", "--rounds", "2",
            "--train_seeds", "0-1", "--seeds_per_round", "1", "--days", "5-25:5", "--candidates", "3",
            "--continuations", "2", "--race", "0", "--margin", "0", "--per_device_train_batch_size", "4",
            *more]  # fmt: skip


@pytest.mark.parametrize(("labels", "keep_unclear"), [("planner", False), ("self", True)])
def test_rounds_play_label_keep_and_train_the_same_weights(tiny_model, tmp_path, labels, keep_unclear):
    recipe = load_recipe("expert_iteration")
    more = ("--labels", labels, "--keep_unclear", str(keep_unclear).lower())
    summary = recipe.main(*recipe.parse_args(flags(tiny_model, tmp_path, *more)))
    rounds = summary["rounds"]
    assert [r["seeds"] for r in rounds] == [[0], [1]] and all(r["states"] == 5 for r in rounds)
    assert rounds[1]["rows"] == rounds[0]["kept"] + rounds[1]["kept"]  # every round's rows so far
    for r, info in enumerate(rounds):
        assert info["clear"] == info["best_not_greedy"]  # a margin of 0: every state whose best is not the greedy
        assert info["kept"] == (info["states"] if keep_unclear else info["clear"])
        assert info["env_steps"] > 0 and info["planner_seconds"] > 0 and info["training_seconds"] > 0
        kept = json.loads((tmp_path / f"round-{r}" / "rows.json").read_text())
        chosen = [json.loads(row["completion"])["action_index"] for row in kept]
        assert chosen == [row["best" if labels == "planner" else "greedy"] for row in kept]
        assert is_trained(tmp_path / f"round-{r}")
    assert is_trained(tmp_path) and json.loads((tmp_path / "expert_iteration.json").read_text())["rounds"] == rounds
    stamp = (tmp_path / "round-1" / "round.json").stat().st_mtime
    assert recipe.main(*recipe.parse_args(flags(tiny_model, tmp_path, *more)))["rounds"] == rounds
    assert (tmp_path / "round-1" / "round.json").stat().st_mtime == stamp  # finished rounds are reused


@pytest.mark.parametrize(
    ("more", "message"),
    [
        (["--labels", "teacher"], "--labels 'teacher' must be one of planner, self, shuffled"),
        (["--rounds", "3"], "--train_seeds 0-1 holds 2 seeds: 3 rounds of 1 need 3"),
        (["--continuations", "1"], "continuations >= 2"),
        (["--margin", "-1"], "--margin and --race must be >= 0"),
    ],
    ids=["labels", "seeds", "continuations", "margin"],
)
def test_bad_settings_are_refused_while_parsing(tmp_path, more, message):
    with pytest.raises(ValueError, match=message):
        load_recipe("expert_iteration").parse_args(flags("x", tmp_path, *more))


def test_a_missing_start_is_named(tmp_path):
    recipe = load_recipe("expert_iteration")
    with pytest.raises(FileNotFoundError, match="--start .*nothing: no model there"):
        recipe.main(*recipe.parse_args(flags(str(tmp_path / "nothing"), tmp_path / "out")))


def test_the_replayed_data_joins_every_rounds_rows(tiny_model, tmp_path):
    from recruit_trl.protocol import get_env_interface
    from recruit_trl.traces import collect_traces
    from recruit_trl.workflow.sft_data import to_conversational

    traces = collect_traces(get_env_interface("clinical"), ["hard_bench_stage_30"], [7])
    to_conversational(traces).save_to_disk(str(tmp_path / "replay"))
    recipe = load_recipe("expert_iteration")
    more = ("--replay_data", str(tmp_path / "replay"), "--rounds", "1")
    summary = recipe.main(*recipe.parse_args(flags(tiny_model, tmp_path / "out", *more)))
    (info,) = summary["rounds"]
    assert info["replay_rows"] == len(traces) > 0 and is_trained(tmp_path / "out" / "round-0")
    state = json.loads((tmp_path / "out" / "round-0" / "trainer_state.json").read_text())
    assert state["global_step"] == -(-(len(traces) + info["rows"]) // 4)  # one epoch over both, batches of 4


def test_a_lora_start_trains_its_adapter_and_saves_one(tiny_model, tmp_path):
    """A LoRA warm start (an adapter folder) continues as the same adapter on its base: every round and the result
    are adapters on that base, and the adapter's weights moved."""
    import torch
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from recruit_trl.models.loading import ADAPTER_CONFIG, is_adapter

    start = tmp_path / "adapter"
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model), lora).save_pretrained(str(start))
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(str(start))
    recipe = load_recipe("expert_iteration")
    summary = recipe.main(*recipe.parse_args(flags(str(start), tmp_path / "out", "--rounds", "1")))
    assert summary["rounds"][0]["rows"] > 0
    for folder in (tmp_path / "out" / "round-0", tmp_path / "out"):
        assert is_adapter(folder) and is_trained(folder)
        assert json.loads((folder / ADAPTER_CONFIG).read_text())["base_model_name_or_path"] == tiny_model
    before, after = (load_file(str(f / "adapter_model.safetensors")) for f in (start, tmp_path / "out"))
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)

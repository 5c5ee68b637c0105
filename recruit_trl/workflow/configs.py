"""The recipes' config files (``recipes/configs/*.yaml``): each environment's and model's settings, written in full.

A recipe parses its dataclasses with TRL's parser from one YAML file, its own (``recipes/configs/<recipe>.yaml``)
unless ``--config`` names another, and the command line over it: one layer of settings over the dataclasses' and
TRL's own defaults. The one setting that depends on the machine rather than the recipe, a CPU-only machine's
precision (:func:`machine_defaults`), sits under the file.

An RL recipe's config names two more files by one field each, read and checked while it parses
(:func:`recruit_trl.workflow.arguments.check_rl_arguments`):

- ``sft_config``: the SFT recipe's config file, which the warm start trains with (:func:`read_warm_start`);
- ``report_config``: the report's (:class:`~recruit_trl.workflow.arguments.ReportArguments`,
  :func:`read_report_config`).

A config is named by a path (absolute, or relative to the working folder) or by its file name in
``recipes/configs`` (:func:`config_path`), so ``--config grpo_clinical_smollm2.yaml`` works from any folder.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from recruit_trl.models.loading import model_kind
from recruit_trl.rollout.anchors import MODEL_PREFIX
from recruit_trl.rollout.config import check_mode_rewards
from recruit_trl.training.distributed import check_backend
from recruit_trl.training.trl_api import check_trl_private_api
from recruit_trl.workflow.arguments import (
    NONE,
    ReportArguments,
    ScriptArguments,
    SFTScriptArguments,
    WarmStartArguments,
    check_constrained_sampling,
    check_policy,
    check_quantised_training,
    check_sft_budget,
    check_tasks,
    check_value,
    check_vllm_arguments,
    env_interface,
)

CONFIG_DIR = Path(__file__).resolve().parents[2] / "recipes" / "configs"
TINY = "tiny"

# Flags the recipes no longer take, and what replaced them: refused on one line before parsing.
REMOVED_FLAGS = {
    "--contract": "was removed: the index contract is the only one",
    "--window_turns": "was removed with window mode: use --mode branch|episode, or TRL's tool loop "
    "(recipes/grpo_environment_factory.py) for several decisions per completion",
    "--warm_start": "was replaced by --sft_config: the SFT config file the warm start trains with, or none",
    "--report": "was replaced by --report_config: the report's config file, or none",
    "--rl_full_finetune": "was replaced by ModelConfig's --use_peft (false: RL trains every weight)",
}
# The warm start's training budget, once RL flags of its own: now the SFT config's SFTConfig and ModelConfig fields.
WARM_START_BUDGET = {
    "--sft_epochs": "num_train_epochs",
    "--sft_max_steps": "max_steps",
    "--sft_batch_size": "per_device_train_batch_size",
    "--sft_learning_rate": "learning_rate",
    "--sft_full_finetune": "use_peft (false: every weight)",
}


def config_path(name: str | Path) -> Path:
    """The config file ``name`` names: a path (absolute, or relative to the working folder), else a file name in
    ``recipes/configs``.

    Raises:
        FileNotFoundError: neither exists.
    """
    path = Path(name)
    if path.is_file():
        return path
    if (CONFIG_DIR / path).is_file():
        return CONFIG_DIR / path
    raise FileNotFoundError(f"config file {str(name)!r} not found, as a path or in {CONFIG_DIR}")


def machine_defaults() -> dict[str, Any]:
    """The trainer settings a machine without a GPU needs under any config: fp32 on the CPU (TRL's configs default to
    bf16, which a CPU-only machine refuses)."""
    import torch

    return {} if torch.cuda.is_available() else {"bf16": False, "use_cpu": True}


def recipe_argv(argv: Sequence[str], default_config: str, moved: bool = False) -> list[str]:
    """``argv`` with ``--config <default_config>`` in front unless it names a config itself, every config named by
    :func:`config_path`.

    Args:
        argv: the command line.
        default_config: the recipe's own config file (a name in ``recipes/configs``).
        moved: refuse the warm start's and the report's settings too (an RL recipe: they live in the files its
            ``sft_config`` and ``report_config`` name).

    Raises:
        ValueError: a removed or moved flag, on one line with what replaced it or where it lives now.
        FileNotFoundError: a config that is not there.
    """
    argv = [str(arg) for arg in argv]
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag in REMOVED_FLAGS:
            raise ValueError(f"{flag} {REMOVED_FLAGS[flag]}")
        if moved:
            refuse_moved_flag(flag)
    out, i = [], 0
    named = False
    while i < len(argv):
        arg = argv[i]
        if arg == "--config" and i + 1 < len(argv):
            out += ["--config", str(config_path(argv[i + 1]))]
            named, i = True, i + 2
            continue
        if arg.startswith("--config="):
            out.append(f"--config={config_path(arg.split('=', 1)[1])}")
            named = True
        else:
            out.append(arg)
        i += 1
    return out if named else ["--config", str(config_path(default_config)), *out]


def refuse_moved_flag(flag: str) -> None:
    """Refuse a flag of the warm start or the report on an RL recipe's command line, naming the file it lives in.

    Raises:
        ValueError: one line naming the flag and its config file.
    """
    name = flag[2:]
    if flag in WARM_START_BUDGET:
        raise ValueError(f"{flag} is the warm start's {WARM_START_BUDGET[flag]}: set it in the SFT config file "
                         f"--sft_config names")  # fmt: skip
    if name in {f.name for f in fields(WarmStartArguments)}:
        raise ValueError(f"{flag} is a warm-start setting: set it in the SFT config file --sft_config names")
    if name in {f.name for f in fields(ReportArguments)}:
        raise ValueError(f"{flag} is a report setting: set it in the report config file --report_config names")


def env_named(argv: Sequence[str]) -> str | None:
    """The environment ``argv`` names with ``--env`` / ``--env_name`` (either form, ``--env=x`` too), else ``None``:
    a recipe for any environment picks that environment's config file by it."""
    argv = [str(arg) for arg in argv]
    for i, arg in enumerate(argv):
        flag, _, value = arg.partition("=")
        if flag in ("--env", "--env_name"):
            return value or (argv[i + 1] if i + 1 < len(argv) else None)
    return None


def model_key(name_or_path: str) -> str:
    """The name a model goes by in the configs: :data:`TINY` for the tiny model (named ``tiny``, or a folder
    recruit_trl built it in), else the name as given, in lower case (e.g. ``smollm2``)."""
    name = name_or_path.strip().lower()
    if name != TINY and Path(name_or_path).is_dir() and model_kind(name_or_path) == TINY:
        return TINY
    return name


@dataclass
class WarmStart:
    """The SFT recipe's settings as its config file holds them: what the warm start trains with. The file's
    environment is checked against the run's; its tasks and prompts are not used (the warm start trains on the
    run's)."""

    path: Path  # the config file
    warm: WarmStartArguments  # the teacher, its data, DAgger
    training: Any  # SFTConfig: the budget (epochs, steps, batch, learning rate) and the trainer's settings
    model: Any  # ModelConfig: whether every weight trains (use_peft; the rest is the RL run's)


def read_sft_file(name: str | Path) -> tuple[SFTScriptArguments, WarmStartArguments, Any, Any]:
    """The SFT recipe's four dataclasses from a config file alone (no command line).

    Raises:
        ValueError: a value the SFT recipe refuses, naming the file.
        FileNotFoundError: no such config.
    """
    from trl import ModelConfig, SFTConfig

    from recruit_trl.workflow.parsing import RecipeParser

    path = config_path(name)
    parser = RecipeParser((SFTScriptArguments, WarmStartArguments, SFTConfig, ModelConfig))
    parser.set_defaults(**machine_defaults())
    try:
        return parser.parse_args_and_config(args=["--config", str(path)])
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def read_warm_start(name: str, script_args: Any, model_args: Any) -> WarmStart | None:
    """The warm start ``--sft_config name`` names (``None`` for ``none``), checked against the RL run: the same
    environment and the same model (the budget in an SFT config is sized for its model).

    Raises:
        ValueError: the file's values, or another environment or model than the run's, on one line.
        FileNotFoundError: no such config.
    """
    if name == NONE:
        return None
    prompts, warm, training, model = read_sft_file(name)
    path = config_path(name)
    try:
        check_sft_budget(training)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
    if prompts.env_name != script_args.env_name:
        raise ValueError(f"--sft_config {name}: its environment is {prompts.env_name!r}, this run's "
                         f"{script_args.env_name!r}")  # fmt: skip
    if model_key(model.model_name_or_path) != model_key(model_args.model_name_or_path):
        own = CONFIG_DIR / f"grpo_{script_args.env_name}_{model_key(model_args.model_name_or_path)}.yaml"
        hint = f"--config {own.name} (the whole run for it), " if own.is_file() else ""
        raise ValueError(f"--sft_config {name} is sized for the model {model.model_name_or_path!r}, this run trains "
                         f"{model_args.model_name_or_path!r}: use {hint}an SFT config for it or "
                         f"--sft_config none")  # fmt: skip
    return WarmStart(path=path, warm=warm, training=training, model=model)


def read_report_config(name: str) -> ReportArguments | None:
    """The report ``--report_config name`` names (``None`` for ``none``).

    Raises:
        ValueError: a value the report refuses, or a key it does not take, naming the file.
        FileNotFoundError: no such config.
    """
    if name == NONE:
        return None
    from recruit_trl.workflow.parsing import RecipeParser

    path = config_path(name)
    try:
        return RecipeParser((ReportArguments,)).parse_args_and_config(args=["--config", str(path)])[0]
    except ValueError as exc:
        raise ValueError(f"--report_config {path}: {exc}") from None


def parse_recipe(
    dataclass_types: Sequence[type], default_config: str, argv: Sequence[str] | None = None, rl: bool = False
) -> tuple[Any, ...]:
    """A recipe's dataclasses from its config file (``default_config`` unless ``--config`` names another) and the
    command line over it (``argv``, default ``sys.argv[1:]``), over :func:`machine_defaults`.

    Args:
        rl: an RL recipe: the warm start's and the report's flags are refused with the file they live in.

    Raises:
        ValueError: a removed or moved flag, a value a dataclass refuses, a launch of several processes this machine
            cannot run (:func:`~recruit_trl.training.distributed.check_backend`), on one line.
        RuntimeError: the installed TRL is not the one the project was written against
            (:func:`~recruit_trl.training.trl_api.check_trl_private_api`).
        FileNotFoundError: a config that is not there.
    """
    import sys

    check_trl_private_api()  # every recipe, the tool loop's too: a TRL that changed is refused before anything runs
    from recruit_trl.workflow.parsing import RecipeParser

    parser = RecipeParser(tuple(dataclass_types))
    parser.set_defaults(**machine_defaults())
    argv = sys.argv[1:] if argv is None else argv
    parsed = tuple(parser.parse_args_and_config(args=recipe_argv(argv, default_config, moved=rl)))
    for config in parsed:
        if hasattr(config, "ddp_backend"):  # the trainer's arguments: can the launched processes talk?
            check_backend(config)
    return parsed


def check_rl_arguments(
    script_args: ScriptArguments, training_args: Any, model_args: Any
) -> tuple[ScriptArguments, Any, Any]:
    """Check what the RL recipes' dataclasses cannot check alone: the environment's tasks and policies, the rewards'
    weights, the sampling settings (with constrained decoding too), vLLM, the quantisation, and the config files of
    the warm start and the report (read and checked here: :mod:`recruit_trl.workflow.configs`). Returns the three
    unchanged.

    Raises:
        ValueError: one line naming the flag, its value and what it takes.
    """
    interface = env_interface(script_args.env_name)
    check_tasks("tasks", script_args.tasks, interface)
    check_tasks("anchor_tasks", script_args.anchor_tasks, interface)
    check_policy("continuation_policy", script_args.continuation_policy, interface)
    if script_args.reward_teacher:
        check_policy("reward_teacher", script_args.reward_teacher, interface)
    if script_args.anchor_policy != "student" and not script_args.anchor_policy.startswith(MODEL_PREFIX):
        check_policy("anchor_policy", script_args.anchor_policy, interface)
    check_mode_rewards(script_args.reward_funcs, script_args.mode, interface.has_potential())
    weights = training_args.reward_weights
    if weights is not None and len(weights) != len(script_args.reward_funcs):
        raise ValueError(f"--reward_weights {weights} must give one weight per --reward_funcs "
                         f"{script_args.reward_funcs}")  # fmt: skip
    check_value("temperature", training_args.temperature, training_args.temperature > 0, "> 0 (GRPO samples)")
    if script_args.shuffle_advantages:  # the control is a null of one update per generation batch, one pass over it
        check_value("num_iterations", training_args.num_iterations, training_args.num_iterations == 1,
                    "1 with --shuffle_advantages (the control's sign is a null of one pass)")  # fmt: skip
        steps, accumulation = training_args.steps_per_generation, training_args.gradient_accumulation_steps
        check_value("steps_per_generation", steps, steps is None or steps <= accumulation,
                    f"<= --gradient_accumulation_steps ({accumulation}) with --shuffle_advantages (one optimizer "
                    "step per generation batch)")  # fmt: skip
    # The rollouts generate on whole weights: under ZeRO-3 each process plays its own episodes, a different number of
    # generate calls, which partitioned weights (a gather per forward, with every process) cannot follow.
    check_value("ds3_gather_for_generation", training_args.ds3_gather_for_generation,
                training_args.ds3_gather_for_generation, "true (the rollouts generate on whole weights)")  # fmt: skip
    check_vllm_arguments(training_args, model_args)
    check_constrained_sampling(script_args, training_args)
    check_quantised_training(model_args, not model_args.use_peft, "--use_peft false (the command line or --config)")
    warm_start = read_warm_start(script_args.sft_config, script_args, model_args)
    if warm_start is not None:
        check_policy("teacher", warm_start.warm.teacher, interface)
        check_quantised_training(model_args, not warm_start.model.use_peft,
                                 f"use_peft: false in --sft_config {script_args.sft_config}")  # fmt: skip
    report = read_report_config(script_args.report_config)
    for name in report.eval_baselines if report else []:
        if not name.startswith(MODEL_PREFIX):
            check_policy("eval_baselines", name, interface)
    return script_args, training_args, model_args

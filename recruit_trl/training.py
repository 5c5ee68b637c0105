"""Shared wiring for the recipes: script arguments, model resolution, anchors, the model RL starts from, defaults.

The recipes (``recipes/*.py``) stay readable top to bottom; the pieces they share live here. The RL recipes'
arguments (:class:`ScriptArguments`) are groups of settings joined by inheritance, each declared once: the rollout's
(:class:`~recruit_trl.rollout_config.RolloutConfig`), the tasks (:class:`TaskArguments`, shared with the SFT recipe),
the warm start's (:class:`WarmStartArguments`, and :class:`~recruit_trl.sft.SFTArguments` renamed ``--sft_*``:
:data:`MainJobSFTArguments`), the report's (:class:`ReportArguments`), and the anchors and rewards.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from pathlib import Path
from typing import Any, get_type_hints

from recruit_trl.anchors import (
    MODEL_PREFIX,
    AnchorCache,
    anchor_dataset,
    build_anchors,
    load_states,
    record_anchors,
    save_states,
)
from recruit_trl.models import model_fingerprint
from recruit_trl.protocol import EnvInterface
from recruit_trl.rollout_config import RolloutConfig
from recruit_trl.sft import SFTArguments
from recruit_trl.traces import collect_traces

# The main job scores each sampled action by the final grade of its episode (continued to the end by a fast
# policy, common random numbers within the group) plus a format term; see the README for the rationale.
DEFAULT_REWARDS = ("final_score_reward", "format_reward")
DEFAULT_REWARD_WEIGHTS = [1.0, 0.5]
# Bump when the environment's prompt rendering changes: the cached tiny model was warmed on the old text. The cache
# key also carries prompt_fingerprint(), which catches changes to the rendering or the candidate lists by itself.
RENDER_VERSION = "render-6"


def parse_int_ranges(spec: str) -> list[int]:
    """``"0-15"``, ``"0-170:10"`` (step), ``"3,7,9-11"`` -> a sorted list of ints.

    Raises:
        ValueError: with the offending part.
    """
    out: set[int] = set()
    for part in str(spec).split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?(?::(\d+))?", part)
        if not m:
            raise ValueError(f"bad range {part!r} in {spec!r}: use forms like 0-15, 0-170:10 or 3,7,9-11")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        step = int(m.group(3)) if m.group(3) else 1
        if hi < lo or step < 1:
            raise ValueError(f"bad range {part!r} in {spec!r}: the end must be >= the start and the step >= 1")
        out.update(range(lo, hi + 1, step))
    return sorted(out)


@dataclass
class TaskArguments:
    """The tasks a recipe trains on, and the warm-up of the tiny model built for them."""

    tasks: list[str] = field(
        default_factory=list,
        metadata={"help": "Tasks to train on: anchors, warm-start traces, evaluation (default: the environment's)."},
    )
    tiny_corpus_seeds: int = field(
        default=8, metadata={"help": "Episodes per task in the tiny model's warm-up corpus (model 'tiny' only)."}
    )
    tiny_build_steps: int | None = field(
        default=None, metadata={"help": "Warm-up optimizer steps of the tiny model (default: the builder's epochs)."}
    )


def rl_flag(name: str) -> str:
    """The GRPO recipe's name of an :class:`~recruit_trl.sft.SFTArguments` field: ``sft_<name>``, except
    ``teacher`` and ``dagger_*``, which name nothing else there."""
    return name if name == "teacher" or name.startswith("dagger_") else f"sft_{name}"


# The main job's warm start, where it differs from the SFT recipe's defaults: sized for the CPU main job.
MAIN_JOB_SFT: dict[str, Any] = {
    "teacher": "expert",
    "train_seeds": "300-307",
    "heldout_seeds": "400",
    "dagger_rounds": 1,  # what the CPU main job has time for; the best round is kept
    "dagger_seeds": "300-303",  # half the traced seeds: CPU time
    "dagger_epochs": 0.5,  # rows are reshuffled every round, so each round sees a different half
    "length_buckets": True,  # faster on CPU; safe together with keep_best_round
}


def renamed_dataclass(cls: type, rename, defaults: dict[str, Any], name: str) -> type:
    """A dataclass with the fields of ``cls`` under the names ``rename(field)``, the same types and help, and
    ``defaults`` (keyed by the original names) in place of the defaults of ``cls``."""
    hints = get_type_hints(cls)
    specs = []
    for f in fields(cls):
        if f.name in defaults:
            spec = field(default=defaults[f.name], metadata=f.metadata)
        elif f.default is not MISSING:
            spec = field(default=f.default, metadata=f.metadata)
        else:
            spec = field(default_factory=f.default_factory, metadata=f.metadata)
        specs.append((rename(f.name), hints[f.name], spec))
    renamed = make_dataclass(name, specs)
    renamed.__module__ = __name__  # found (and pickled) as this module's attribute of the same name
    return renamed


# SFTArguments as the GRPO recipe names them (--sft_train_seeds, --teacher, --dagger_rounds, ...).
MainJobSFTArguments = renamed_dataclass(SFTArguments, rl_flag, MAIN_JOB_SFT, "MainJobSFTArguments")


def sft_arguments(args: Any) -> SFTArguments:
    """The warm start's :class:`~recruit_trl.sft.SFTArguments` from the GRPO recipe's arguments (checked)."""
    return SFTArguments(**{f.name: getattr(args, rl_flag(f.name)) for f in fields(SFTArguments)})


@dataclass
class WarmStartArguments:
    """Where RL starts: an SFT warm start run first (its settings: :class:`MainJobSFTArguments`), or a given one."""

    sft_adapter: str | None = field(
        default=None,
        metadata={"help": "An SFT LoRA adapter or fully fine-tuned model (recipes/sft_clinical.py) to start from."},
    )
    warm_start: str = field(
        default="auto",
        metadata={"help": "'auto': run the SFT warm start first (cached in <output_dir>/sft) unless --sft_adapter; "
                  "'none': start RL from the base model."},
    )  # fmt: skip
    sft_epochs: float = field(
        default=2.0, metadata={"help": "Epochs of the SFT warm start's first fit (DAgger rounds: --dagger_epochs)."}
    )
    sft_full_finetune: str = field(
        default="auto",
        metadata={"help": "SFT warm start: 'true' fine-tunes every weight, 'false' trains a LoRA adapter (RL then "
                  "continues it); 'auto': every weight for the tiny model built here from scratch (its LoRA lacks the "
                  "capacity to imitate the teacher), a LoRA adapter for every pretrained model and with "
                  "--load_in_4bit/--load_in_8bit. --use_peft false asks for every weight too."},
    )  # fmt: skip
    rl_full_finetune: str = field(
        default="auto",
        metadata={"help": "RL after a fully fine-tuned warm start: 'true' trains every weight, 'false' a fresh LoRA "
                  "adapter on it; 'auto': every weight for the tiny model built here (a fresh LoRA barely moved its "
                  "policy), a LoRA adapter otherwise. After a LoRA warm start RL always continues that adapter."},
    )  # fmt: skip
    sft_batch_size: int = field(default=16, metadata={"help": "Rows per step of the SFT warm start."})
    sft_max_steps: int = field(
        default=-1, metadata={"help": "Optimizer steps of the SFT warm start's first fit (-1: --sft_epochs decides)."}
    )
    sft_learning_rate: float | None = field(
        default=None, metadata={"help": "Learning rate of the SFT warm start (default: 3e-4 full, 1e-3 LoRA)."}
    )

    def __post_init__(self) -> None:
        for flag in ("sft_full_finetune", "rl_full_finetune"):
            if str(getattr(self, flag)).lower() not in ("auto", "true", "false"):
                raise ValueError(f"--{flag} must be auto, true or false, not {getattr(self, flag)!r}")


@dataclass
class ReportArguments:
    """The report at the end of an RL run: whole episodes on held-out seeds, and decisions on held-out states."""

    report: bool = field(
        default=True, metadata={"help": "Evaluate base / SFT / RL models and baselines at the end; write report.json."}
    )
    eval_seeds: str = field(default="0-9", metadata={"help": "Held-out reset seeds of the final evaluation."})
    eval_episodes: str = field(
        default="auto",
        metadata={"help": "Evaluate the base, SFT and RL models over whole episodes on --eval_seeds ('auto': for the "
                  "tiny model only; a real model on CPU needs minutes per episode, and is measured at decision "
                  "level instead, see --eval_decisions). --eval_baselines always play whole episodes."},
    )  # fmt: skip
    eval_decisions: bool = field(
        default=True,
        metadata={"help": "Decision-level report on held-out states: the benchmark table (strict JSON, valid action, "
                  "teacher match, invalid count) and state values (the final score reached from each policy's "
                  "action) for the models, the teacher and the safe agent (recruit_trl.decision_eval)."},
    )  # fmt: skip
    decision_seeds: str = field(
        default="500-507", metadata={"help": "Reset seeds of the decision-level report's states (never trained on)."}
    )
    decision_days: str = field(default="0-150:30", metadata={"help": "Days of the decision-level report's states."})
    decision_rows: int = field(
        default=100, metadata={"help": "Decisions in the report: a fixed subset stratified by task and action type."}
    )
    decision_continuations: int = field(
        default=1,
        metadata={"help": "Continuations per state value in the decision-level report, each with its own randomness "
                  "(the value is their mean): where one outcome is mostly dice, several are needed to compare "
                  "policies."},
    )  # fmt: skip
    benchmark_constrained: bool = field(
        default=True,
        metadata={"help": "The set benchmark (--sft_data teacher_sets) also decodes constrained to the listed "
                  "answers: a second decoding pass per model and set."},
    )  # fmt: skip
    benchmark_base_heldout: bool = field(
        default=True,
        metadata={"help": "The set benchmark scores the base model on the held-out set too (false: on the fixed set "
                  "only, as the anchor's table)."},
    )  # fmt: skip
    eval_workers: int = field(
        default=0,
        metadata={"help": "Processes that play the report's held-out episodes, each with one torch thread and every "
                  "n-th seed (0: one per CPU core without a GPU, else 1)."},
    )  # fmt: skip
    eval_baselines: list[str] = field(
        default_factory=lambda: ["heuristic", "expert"], metadata={"help": "Environment policies evaluated alongside."}
    )
    eval_temperature: float = field(
        default=1.0,
        metadata={
            "help": "Also evaluate the --eval_sampled models sampled at this temperature (rows '<model>-sampled'; "
            "0: greedy only). GRPO trains the sampled policy; greedy decoding of a small imitator can collapse onto "
            "one action."
        },
    )
    eval_sampled: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Models (base, sft, grpo) also evaluated sampled, with --eval_temperature > 0 (none by default: "
            "each costs as much as a greedy evaluation, and the CPU main job has no time for it)."
        },
    )
    eval_top_p: float = field(
        default=0.8, metadata={"help": "Nucleus for the sampled evaluation (trims malformed answers; 1 = off)."}
    )
    eval_constrained: bool = field(
        default=True,
        metadata={"help": "Evaluate the models with constrained decoding: they can only answer a listed candidate "
                  "(as with structured outputs in deployment); the rows' own_answer_valid_rate still gives the "
                  "share of the model's own greedy answers that were legal ('false': free decoding, where an "
                  "illegal answer plays the parser's fallback)."},
    )  # fmt: skip

    def __post_init__(self) -> None:
        if str(self.eval_episodes).lower() not in ("auto", "true", "false"):
            raise ValueError(f"--eval_episodes must be auto, true or false, not {self.eval_episodes!r}")
        unknown = set(self.eval_sampled) - {"base", "sft", "grpo"}
        if unknown:
            raise ValueError(f"--eval_sampled takes base, sft and grpo, not {sorted(unknown)}")


@dataclass
class ScriptArguments(ReportArguments, MainJobSFTArguments, WarmStartArguments, TaskArguments, RolloutConfig):
    """The RL recipes' arguments beyond ``GRPOConfig`` and ``ModelConfig``: the rollout settings, the tasks, the
    warm start, the report (one group each, by inheritance) and the anchors and rewards below."""

    anchor_tasks: list[str] = field(
        default_factory=list,
        metadata={"help": "Tasks of the anchors RL trains on (default: --tasks, which the warm start and the report "
                  "use too)."},
    )  # fmt: skip
    anchor_seeds: str = field(default="100-107", metadata={"help": "Reset seeds of the anchors (0..99 are for eval)."})
    anchor_days: str = field(default="0-170:10", metadata={"help": "Days of the anchors, e.g. 0-170:10."})
    anchor_policy: str = field(
        default="grader_heuristic",
        metadata={"help": "Who plays the days before an anchor: an environment policy (replayed), 'student' (the "
                  "model RL starts from, sampled as in training: on-policy states, recorded once into "
                  "<output_dir>/anchor_states.json) or 'model:PATH'."},
    )  # fmt: skip
    reward_funcs: list[str] = field(
        default_factory=lambda: list(DEFAULT_REWARDS),
        metadata={"help": "Reward functions from the `rewards` package, weighted by --reward_weights."},
    )

    def __post_init__(self) -> None:
        RolloutConfig.__post_init__(self)
        WarmStartArguments.__post_init__(self)
        sft_arguments(self)  # checks the warm start's settings at start-up, not after the model is built
        ReportArguments.__post_init__(self)
        if "teacher_match_reward" in self.reward_funcs and not self.reward_teacher:
            raise ValueError("--reward_funcs teacher_match_reward needs --reward_teacher (e.g. grader_heuristic)")


def with_env_tasks(args: Any, interface: EnvInterface) -> Any:
    """``args`` with ``tasks`` set to the environment's own (``interface.tasks()``) when none were given."""
    if not args.tasks:
        args.tasks = list(interface.tasks())
    return args


def tiny_corpus_fn(interface: EnvInterface, tasks, episodes_per_task: int, contract: str, recent_k: int):
    """The tiny model's warm-up corpus: safe-agent traces with 30% random candidates, on seeds 200+."""

    def corpus() -> list[dict[str, Any]]:
        return collect_traces(
            interface,
            tasks,
            range(200, 200 + episodes_per_task),
            contract=contract,
            recent_k=recent_k,
            epsilon=0.3,
            relabel=False,
        )

    return corpus


def prompt_fingerprint(interface: EnvInterface, tasks: Sequence[str], contract: str, recent_k: int) -> str:
    """A hash of every prompt and answer of one safe-agent episode (reset seed 0) per task.

    It changes whenever the rendering or the candidate lists change, so a tiny model warmed on other prompts is
    never taken from the cache (well under a second for the three public tasks).
    """
    rows = collect_traces(interface, tasks, [0], contract=contract, recent_k=recent_k, relabel=False)
    payload = json.dumps([[row["messages"], row["completion"]] for row in rows], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def resolve_policy_model(
    name_or_path: str,
    interface: EnvInterface,
    *,
    tasks: Sequence[str],
    contract: str = "index",
    recent_k: int = 2,
    corpus_episodes: int = 8,
    build_steps: int | None = None,
) -> str:
    """``tiny`` (built on first use from the interface's traces, then cached), ``smollm2``, or a local folder /
    hub id, as a local path."""
    from recruit_trl.models import resolve_model

    if name_or_path.strip().lower() != "tiny":
        return resolve_model(name_or_path)
    return resolve_model(
        "tiny",
        corpus_fn=tiny_corpus_fn(interface, tasks, corpus_episodes, contract, recent_k),
        version_key=f"{RENDER_VERSION}-{interface.name}-{contract}-{recent_k}-{corpus_episodes}-{','.join(tasks)}-"
        + prompt_fingerprint(interface, tasks, contract, recent_k),
        **({"max_steps": build_steps} if build_steps else {}),
    )


def resolve_model_for(name_or_path: str, args: Any, interface: EnvInterface) -> str:
    """:func:`resolve_policy_model` with the recipe arguments (``tasks``, ``contract``, ``recent_k``,
    ``tiny_corpus_seeds``, ``tiny_build_steps``)."""
    return resolve_policy_model(
        name_or_path,
        interface,
        tasks=args.tasks,
        contract=args.contract,
        recent_k=args.recent_k,
        corpus_episodes=args.tiny_corpus_seeds,
        build_steps=args.tiny_build_steps,
    )


def make_anchor_dataset(
    args: ScriptArguments,
    interface: EnvInterface,
    cache: AnchorCache | None = None,
    *,
    student: str | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    states_file: str | None = None,
    model_loading: dict | None = None,
    min_rows: int = 0,
):
    """Anchors over ``args.anchor_tasks`` (default ``args.tasks``) x seeds x days whose prefix does not end the
    episode, as a Dataset (repeated up to ``min_rows`` rows: :func:`recruit_trl.anchors.anchor_dataset`).

    Args:
        args: the recipe arguments (``anchor_policy``, ``anchor_seeds``, ``anchor_days``, ``tasks``, ...).
        interface: the environment interface.
        cache: the rollout's anchor cache; states recorded from a model are pinned there.
        student: the model RL starts from (``--anchor_policy student``).
        temperature: sampling temperature of a recording model (the training temperature: on-policy states).
        top_p: its nucleus.
        states_file: where recorded states are kept (:func:`recruit_trl.anchors.save_states`: JSON, replayed on
            load), reused when produced by the same model weights, environment and settings.
        model_loading: how a recording model is loaded (:func:`recruit_trl.models.loading_config`).
    """
    seeds, days = parse_int_ranges(args.anchor_seeds), parse_int_ranges(args.anchor_days)
    tasks = list(args.anchor_tasks or args.tasks)
    cache = cache or AnchorCache(interface, recent_k=args.recent_k)
    if args.anchor_policy == "student" or args.anchor_policy.startswith(MODEL_PREFIX):
        path = student if args.anchor_policy == "student" else args.anchor_policy[len(MODEL_PREFIX) :]
        if not path:
            raise ValueError("--anchor_policy student needs the model RL starts from (the warm start or base model)")
        label = args.anchor_policy if args.anchor_policy.startswith(MODEL_PREFIX) else f"{MODEL_PREFIX}student"
        meta = {
            "model": str(path), "weights": model_fingerprint(path), "env": interface.name, "label": label,
            "tasks": tasks, "seeds": seeds, "days": days, "temperature": temperature, "top_p": top_p,
            "contract": args.contract, "recent_k": args.recent_k, "model_loading": dict(model_loading or {}),
        }  # fmt: skip
        states = load_states(states_file, meta, interface) if states_file else None
        if states is None:
            states = record_anchors(
                interface, str(path), tasks, seeds, days, label=label,
                contract=args.contract, recent_k=args.recent_k, temperature=temperature, top_p=top_p,
                model_loading=model_loading,
            )  # fmt: skip
            if states_file:
                save_states(states_file, states, meta)
        cache.pin(states)
        anchors = list(states)
    else:
        anchors = build_anchors(interface, tasks, seeds, days, policy=args.anchor_policy, cache=cache)
    if not anchors:
        raise ValueError("No anchors: every (task, seed, day) prefix ended its episode; use earlier --anchor_days.")
    return anchor_dataset(anchors, min_rows)


def full_finetune(choice: str, model_args: Any, model_path: str) -> bool:
    """Whether a stage fine-tunes every weight (``choice``: ``--sft_full_finetune`` / ``--rl_full_finetune``).

    ``auto`` trains every weight only for the tiny model built here from scratch, or when ``--use_peft false`` asks
    for it; every pretrained model trains a LoRA adapter. A quantised model (``--load_in_4bit`` / ``--load_in_8bit``)
    always trains an adapter: its frozen integer weights cannot be fine-tuned.

    Raises:
        ValueError: ``true`` together with quantisation.
    """
    from recruit_trl.models import model_kind

    quantized = bool(getattr(model_args, "load_in_4bit", False) or getattr(model_args, "load_in_8bit", False))
    choice = str(choice).lower()  # one of auto / true / false: ScriptArguments checks it at start-up
    if choice == "true" and quantized:
        raise ValueError("full fine-tuning cannot train a quantised model: drop --load_in_4bit/--load_in_8bit or "
                         "set --sft_full_finetune/--rl_full_finetune to auto or false")  # fmt: skip
    if choice == "auto":
        return not quantized and (model_kind(model_path) == "tiny" or not model_args.use_peft)
    return choice == "true"


def rl_start(script_args: Any, training_args: Any, model_args: Any, model_path: str) -> tuple[Any, Any, Any]:
    """``(model, tokenizer, peft_config)`` that RL starts from; ``peft_config`` is ``None`` when no new adapter.

    Without a warm start (``script_args.sft_adapter`` unset): the base model, with a fresh LoRA adapter unless
    ``--use_peft false``. After a LoRA warm start: that adapter, trainable, on the base loaded as configured. After a
    fully fine-tuned one: that model, every weight trained or a fresh adapter on it (``--rl_full_finetune``), read
    with its own tokenizer when it saved one (the base may be another tiny build, with another vocabulary).
    """
    from transformers import AutoTokenizer
    from trl import get_peft_config

    from recruit_trl.models import is_adapter, load_trainable

    model: Any = model_path
    tokenizer_path = model_path
    peft_config = get_peft_config(model_args)
    if script_args.sft_adapter and is_adapter(script_args.sft_adapter):
        model = load_trainable(model_path, script_args.sft_adapter, training_args.model_init_kwargs)
        peft_config = None
    elif script_args.sft_adapter:
        model = script_args.sft_adapter
        if Path(model, "tokenizer_config.json").is_file():
            tokenizer_path = model
        if full_finetune(script_args.rl_full_finetune, model_args, model_path):
            peft_config = None
    return model, AutoTokenizer.from_pretrained(tokenizer_path, padding_side="left"), peft_config


def model_init_kwargs(model_args: Any, training_args: Any = None) -> dict[str, Any]:
    """``from_pretrained`` keyword arguments of the trained model in every stage (warm start, RL; evaluation loads
    with the same :func:`recruit_trl.models.loading_config`): ``ModelConfig``'s dtype, attention implementation and
    bitsandbytes quantisation. ``training_args.model_init_kwargs`` (TRL's own field), when set, overrides them."""
    from recruit_trl.models import from_pretrained_kwargs, loading_config

    return {
        **from_pretrained_kwargs(loading_config(model_args)),
        **(getattr(training_args, "model_init_kwargs", None) or {}),
    }


def last_checkpoint(output_dir: str) -> str | None:
    """The newest ``checkpoint-*`` in ``output_dir`` to resume from, if any."""
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None


def cpu_defaults() -> dict[str, Any]:
    """GRPOConfig values that make a plain CPU run work and learn (see shared TRL facts)."""
    return {
        "learning_rate": 3e-5,  # chosen for the tiny model's full fine-tune; a LoRA run wants about 1e-4
        "per_device_train_batch_size": 32,
        "num_generations": 8,
        "max_steps": 60,
        "max_completion_length": 12,
        "reward_weights": DEFAULT_REWARD_WEIGHTS,
        "beta": 0.0,
        "temperature": 1.0,
        "logging_steps": 1,
        "save_steps": 10,
        **trainer_defaults(),
    }


def trainer_defaults() -> dict[str, Any]:
    """Trainer-config values every recipe shares: no logger, no gradient checkpointing, seed 0, and fp32 on the CPU
    when there is no GPU."""
    import torch

    defaults: dict[str, Any] = {"report_to": "none", "gradient_checkpointing": False, "seed": 0}
    if not torch.cuda.is_available():
        defaults.update({"bf16": False, "use_cpu": True})
    return defaults


# Defaults for a named model, applied when the command line names it (``--model_name_or_path smollm2``); any flag
# still overrides them. SmolLM2-135M costs about 1.1 s per 400-token decision and 30-45 s per LoRA step of 8 rows on
# 2 CPU cores, so its run is sized for <= 45 minutes: a short LoRA warm start without DAgger (a DAgger round plays
# whole episodes), a few GRPO steps on small groups, and decision-level evaluation instead of whole episodes.
MODEL_PRESETS: dict[str, dict[str, Any]] = {
    "smollm2": {
        "sft_train_seeds": "300-301",
        "sft_max_steps": 16,
        "sft_batch_size": 8,
        "sft_heldout_rows": 32,
        "sft_learning_rate": 5e-4,
        "dagger_rounds": 0,
        "anchor_seeds": "100-101",
        "max_steps": 12,
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "learning_rate": 1e-4,
        "save_steps": 4,
    }
}


def preset_name(argv: Sequence[str]) -> str | None:
    """The :data:`MODEL_PRESETS` name of the model named on the command line (``--model_name_or_path NAME`` or
    ``--model_name_or_path=NAME``), else ``None``."""
    for i, arg in enumerate(argv):
        name = None
        if arg == "--model_name_or_path" and i + 1 < len(argv):
            name = argv[i + 1]
        elif arg.startswith("--model_name_or_path="):
            name = arg.split("=", 1)[1]
        if name is not None:
            name = name.strip().lower()
            return name if name in MODEL_PRESETS else None
    return None


def model_defaults() -> dict[str, Any]:
    """ModelConfig values: the tiny local model with LoRA on every linear layer."""
    return {
        "model_name_or_path": "tiny",
        "use_peft": True,
        "lora_r": 16,
        "lora_alpha": 32,
        "lora_target_modules": ["all-linear"],
    }

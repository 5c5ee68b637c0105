"""The RL recipes' arguments beyond ``GRPOConfig`` and ``ModelConfig``.

:class:`ScriptArguments` joins groups of settings by inheritance, each declared once: the rollout's
(:class:`~recruit_trl.rollout.config.RolloutConfig`), the tasks (:class:`TaskArguments`, shared with the SFT recipe),
the warm start's (:class:`WarmStartArguments`, and :class:`~recruit_trl.training.sft_data.SFTArguments` renamed
``--sft_*``: :data:`WarmStartSFTArguments`), the report's (:class:`ReportArguments`), and the anchors and rewards.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from typing import Any, get_type_hints

from recruit_trl.protocol import FALLBACK_POLICY, EnvInterface
from recruit_trl.rollout.config import RolloutConfig
from recruit_trl.training.defaults import DEFAULT_REWARDS, rl_flag
from recruit_trl.training.sft_data import SFTArguments


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


def renamed_dataclass(cls: type, rename, name: str) -> type:
    """A dataclass with the fields of ``cls`` under the names ``rename(field)``, the same types, defaults and help."""
    hints = get_type_hints(cls)
    specs = []
    for f in fields(cls):
        if f.default is not MISSING:
            spec = field(default=f.default, metadata=f.metadata)
        else:
            spec = field(default_factory=f.default_factory, metadata=f.metadata)
        specs.append((rename(f.name), hints[f.name], spec))
    renamed = make_dataclass(name, specs)
    renamed.__module__ = __name__  # found (and pickled) as this module's attribute of the same name
    return renamed


# SFTArguments as the GRPO recipe names them (--sft_train_seeds, --teacher, --dagger_rounds, ...).
WarmStartSFTArguments = renamed_dataclass(SFTArguments, rl_flag, "WarmStartSFTArguments")


def sft_arguments(args: Any) -> SFTArguments:
    """The warm start's :class:`~recruit_trl.training.sft_data.SFTArguments` from the GRPO recipe's arguments
    (checked)."""
    return SFTArguments(**{f.name: getattr(args, rl_flag(f.name)) for f in fields(SFTArguments)})


@dataclass
class WarmStartArguments:
    """Where RL starts: an SFT warm start run first (its settings: :class:`WarmStartSFTArguments`), or a given one."""

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
                  "action) for the models, the teacher and the safe agent (recruit_trl.decisions.report)."},
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
        default_factory=lambda: [FALLBACK_POLICY], metadata={"help": "Environment policies evaluated alongside."}
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
class ScriptArguments(ReportArguments, WarmStartSFTArguments, WarmStartArguments, TaskArguments, RolloutConfig):
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
        default=FALLBACK_POLICY,
        metadata={"help": "Who plays the days before an anchor: an environment policy (replayed; default: the "
                  "environment's fallback agent), 'student' (the "
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

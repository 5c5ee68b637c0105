"""The recipes' arguments beyond TRL's ``SFTConfig`` / ``GRPOConfig`` and ``ModelConfig``, each setting declared once,
with one environment-neutral default (an environment's and a model's values are written in the recipes' config files,
``recipes/configs``: :mod:`recruit_trl.workflow.configs`):

- :class:`WarmStartArguments`: the SFT warm start's settings (the teacher, its data, DAgger): the SFT recipes'
  (``recipes/sft_*.py``) flags, and what the RL recipes' warm start reads from the SFT config it names.
- :class:`SFTScriptArguments`: the SFT recipes' own: the environment, its prompts and the tasks.
- :class:`ReportArguments`: the RL recipes' report, read from the report config they name.
- :class:`ScriptArguments`: the RL recipes' own (``recipes/grpo_*.py``, ``recipes/reinforce_clinical.py``): the
  rollout (:class:`~recruit_trl.rollout.config.RolloutConfig`), the tasks, anchors and rewards, the control, and the
  config files of the warm start and the report.

The arguments are the run's inputs only: what a stage produces (the resolved tasks and model, the warm start's
adapter) is returned and passed on (:mod:`recruit_trl.workflow.model_setup`, :mod:`recruit_trl.workflow.pipeline`).

Every value is checked while the recipes parse their arguments, before any model is built, and a mistake is one line
naming the flag, its value and what the flag takes: each dataclass checks its own values as it is built
(``__post_init__``), :func:`recruit_trl.workflow.configs.check_rl_arguments` and :func:`check_sft_arguments` what
needs the environment (tasks, policies), TRL's configs beside them (reward weights, quantisation) or the config files
an RL recipe names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from recruit_trl.protocol import FALLBACK_POLICY, EnvInterface, get_env_interface
from recruit_trl.ranges import parse_int_ranges
from recruit_trl.rollout.config import PromptConfig, RolloutConfig, check_mode_rewards
from rewards import DEFAULT_REWARDS, get_reward_funcs

SFT_DATA = ("traces", "teacher_sets")
NONE = "none"  # --sft_config / --report_config: no warm start, no report


def tasks_field() -> Any:
    """The ``tasks`` field both stages declare (a dataclass field cannot be shared by two classes otherwise)."""
    return field(
        default_factory=list,
        metadata={"help": "Tasks to train on: anchors, warm-start traces, evaluation (default: the environment's)."},
    )


@dataclass
class WarmStartArguments:
    """The SFT warm start's settings: the teacher, its data, DAgger. The SFT recipes (``recipes/sft_*.py``) parse this
    dataclass beside their own; the RL recipes' warm start reads it from the SFT config its ``--sft_config`` names.

    The flags carry ``sft_`` (the RL recipes' trainer has its own ``--epsilon``, their anchors and evaluation their own
    seeds), except ``--teacher`` and ``--dagger_*``, which name nothing else in any recipe.
    """

    teacher: str = field(
        default=FALLBACK_POLICY,
        metadata={"help": "Teacher policy registered by the environment (default: its fallback agent)."},
    )
    sft_data: str = field(
        default="traces",
        metadata={"help": "Training rows: 'traces' (the teacher's episodes on --sft_train_seeds with --sft_epsilon "
                  "exploration, capped per action type by --sft_max_type_fraction; held out: the episodes of "
                  "--sft_heldout_seeds) or 'teacher_sets' (recruit_trl.workflow.decisions.teacher_sets: every "
                  "decision of the teacher's games on --sft_train_seeds, capped per decision phase by "
                  "--sft_max_type_fraction; held out: the 1,000-row 'heldout' set of --sft_heldout_seeds, beside "
                  "the 100-row 'fixed' set of --sft_fixed_seeds, the sets `recruit-trl benchmark --data "
                  "<output_dir>/dataset/sets` scores)."},
    )  # fmt: skip
    sft_train_seeds: str = field(
        default="300-311", metadata={"help": "Reset seeds of the teacher's training episodes."}
    )
    sft_heldout_seeds: str = field(
        default="400-402", metadata={"help": "Reset seeds of the held-out episodes (the teacher-match report)."}
    )
    sft_fixed_seeds: str = field(
        default="100-109", metadata={"help": "Game seeds of the fixed 100-row set (--sft_data teacher_sets only)."}
    )
    sft_heldout_rows: int = field(
        default=0, metadata={"help": "Held-out rows in the report: a fixed random subset of them (0: all)."}
    )
    sft_epsilon: float = field(
        default=0.1,
        metadata={"help": "Random-candidate rate while tracing the teacher (state coverage; the states it reaches "
                  "are labelled with the teacher's action)."},
    )  # fmt: skip
    sft_max_type_fraction: float = field(
        default=1.0,
        metadata={"help": "Cap on any action type's share of the training rows (with --sft_data teacher_sets: any "
                  "decision phase's share of a split); 1: no cap, the environment-neutral default (the "
                  "configs in recipes/configs set clinical 0.35, conquest 0.25)."},
    )  # fmt: skip
    sft_balance_by_task: bool = field(default=True, metadata={"help": "Apply the cap within every task's rows."})
    dagger_rounds: int = field(
        default=0,
        metadata={"help": "DAgger rounds after the first fit: the model plays, the teacher labels its states."},
    )
    dagger_seeds: str = field(
        default="300-307", metadata={"help": "Reset seeds the model plays in each DAgger round."}
    )
    dagger_epochs: float = field(
        default=1.0,
        metadata={"help": "Epochs over all data so far in each DAgger round (rows are reshuffled every round)."},
    )
    sft_keep_best_round: bool = field(
        default=True,
        metadata={"help": "With DAgger rounds: the last round's student also plays the DAgger seeds, and the round "
                  "whose student scored best (mean final score over the tasks) is the model saved, not necessarily "
                  "the last."},
    )  # fmt: skip
    sft_token_metrics: bool = field(
        default=True,
        metadata={"help": "true: TRL's loss (a chunked pass over the LM head that also logs entropy and mean token "
                  "accuracy each step, lean on memory for large vocabularies); false: the model's own "
                  "cross-entropy on the same completion tokens (about 20%% faster steps for the tiny model on CPU, "
                  "its default)."},
    )  # fmt: skip
    sft_length_buckets: bool = field(
        default=False,
        metadata={"help": "Batches of rows of similar lengths, in random order: about 30%% faster steps for the tiny "
                  "model on CPU (prompts run from about 250 to 570 tokens). Each batch then holds one range of days "
                  "and tasks, which can collapse a DAgger round (medium greedy 0.330 when the last round is kept "
                  "whatever it scored), so the main job turns it on only together with keeping the best round."},
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.sft_data not in SFT_DATA:
            raise ValueError(f"--sft_data must be one of {SFT_DATA}, not {self.sft_data!r}")
        for name in ("sft_train_seeds", "sft_heldout_seeds", "sft_fixed_seeds", "dagger_seeds"):
            check_range(name, getattr(self, name), required=name == "sft_train_seeds")
        check_value("sft_epsilon", self.sft_epsilon, 0 <= self.sft_epsilon <= 1, "in [0, 1]")
        check_value("sft_max_type_fraction", self.sft_max_type_fraction, 0 < self.sft_max_type_fraction <= 1,
                    "in (0, 1] (1: no cap)")  # fmt: skip
        check_value("sft_heldout_rows", self.sft_heldout_rows, self.sft_heldout_rows >= 0, ">= 0 (0: all)")
        check_value("dagger_rounds", self.dagger_rounds, self.dagger_rounds >= 0, ">= 0")
        check_value("dagger_epochs", self.dagger_epochs, self.dagger_epochs > 0, "> 0")


@dataclass
class SFTScriptArguments(PromptConfig):
    """The SFT recipes' arguments beyond :class:`WarmStartArguments`, ``SFTConfig`` and ``ModelConfig``: the
    environment and its prompts (:class:`~recruit_trl.rollout.config.PromptConfig`) and the tasks."""

    tasks: list[str] = tasks_field()


@dataclass
class ReportArguments:
    """The report at the end of an RL run (``recipes/configs/report_*.yaml``, named by ``--report_config``): whole
    episodes on held-out seeds, and decisions on held-out states."""

    eval_seeds: str = field(default="0-9", metadata={"help": "Held-out reset seeds of the final evaluation."})
    eval_episodes: bool = field(
        default=False,
        metadata={"help": "Evaluate the base, SFT and RL models over whole episodes on --eval_seeds (the tiny model's "
                  "default; a real model on CPU needs minutes per episode, and is measured at decision level "
                  "instead, see --eval_decisions). --eval_baselines always play whole episodes."},
    )  # fmt: skip
    eval_decisions: bool = field(
        default=True,
        metadata={"help": "Decision-level report on held-out states: the benchmark table (strict JSON, valid action, "
                  "teacher match, invalid count) and state values (the final score reached from each policy's "
                  "action) for the models, the teacher and the safe agent (recruit_trl.workflow.decisions.report)."},
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
        unknown = set(self.eval_sampled) - {"base", "sft", "grpo"}
        if unknown:
            raise ValueError(f"--eval_sampled takes base, sft and grpo, not {sorted(unknown)}")
        for name in ("eval_seeds", "decision_seeds", "decision_days"):
            check_range(name, getattr(self, name))
        check_value("decision_rows", self.decision_rows, self.decision_rows >= 1, ">= 1")
        check_value("decision_continuations", self.decision_continuations, self.decision_continuations >= 1, ">= 1")
        check_value("eval_workers", self.eval_workers, self.eval_workers >= 0, ">= 0 (0: one per CPU core)")
        check_value("eval_temperature", self.eval_temperature, self.eval_temperature >= 0, ">= 0 (0: greedy only)")
        check_value("eval_top_p", self.eval_top_p, 0 < self.eval_top_p <= 1, "in (0, 1]")


@dataclass
class ScriptArguments(RolloutConfig):
    """The RL recipes' arguments beyond ``GRPOConfig`` and ``ModelConfig`` (at most 25, counted by a test): the
    rollout settings (:class:`~recruit_trl.rollout.config.RolloutConfig`), then the tasks, anchors and rewards, the
    control, and the config files of the warm start and the report (:mod:`recruit_trl.workflow.configs`)."""

    tasks: list[str] = tasks_field()
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
        metadata={
            "help": "Reward functions, weighted by --reward_weights: names from the `rewards` package (generic "
            "ones and each environment's) or 'package.module:function' for any other. What every mode learns: "
            "branch mode scores a row (the sampled action and its continuation) with them, episode mode "
            "each decision's own step (its step reward; their sum is the episode's outcome)."
        },
    )
    shuffle_advantages: bool = field(
        default=False,
        metadata={"help": "The control of a learning claim, in every mode: the advantages the trainer computed are "
                  "permuted among the rows of each optimizer step and multiplied by one random sign "
                  "(recruit_trl.training.trainer), so the update has their size but no credit and no mean, under "
                  "AdamW and clipping too; what a run gains beyond its control is learnt from the credit."},
    )  # fmt: skip

    # Where RL starts, and the report: each a config file of its own (recruit_trl.workflow.configs).
    sft_config: str = field(
        default=NONE,
        metadata={"help": "The warm start: the SFT recipe's config file (a path, or a name in recipes/configs) it "
                  "trains with, on this run's model, environment, tasks and prompts, into <output_dir>/sft (cached "
                  "there); 'none': RL starts from the base model."},
    )  # fmt: skip
    sft_adapter: str | None = field(
        default=None,
        metadata={"help": "Start RL from this SFT LoRA adapter or fully fine-tuned model (recipes/sft_*.py) instead "
                  "of training the warm start."},
    )  # fmt: skip
    report_config: str = field(
        default=NONE,
        metadata={"help": "The report at the end (base / SFT / RL models and baselines on held-out seeds and "
                  "states; report.json): its config file (a path, or a name in recipes/configs); 'none': no report."},
    )  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        try:
            get_reward_funcs(self.reward_funcs)
        except ValueError as exc:
            raise ValueError(f"--reward_funcs: {exc}") from None
        check_mode_rewards(self.reward_funcs, self.mode, has_potential=True)  # the environment's part: below
        if "teacher_match_reward" in self.reward_funcs and not self.reward_teacher:
            raise ValueError("--reward_funcs teacher_match_reward needs --reward_teacher (e.g. grader_heuristic)")
        check_range("anchor_seeds", self.anchor_seeds, required=True)
        check_range("anchor_days", self.anchor_days, required=True)


# ------------------------------------------------------------------------------------------------ checks
# Each raises a one-line ValueError naming the flag, its value and what the flag takes; the recipes check every value
# while their arguments are parsed, before any model is built (recruit_trl.workflow.parsing turns the error into
# argparse's "error:" line).


def check_value(flag: str, value: Any, allowed: bool, what: str) -> None:
    """Refuse ``--flag value`` unless ``allowed``; ``what`` says what the flag takes (e.g. ``">= 1"``).

    Raises:
        ValueError: ``--flag must be <what>, not <value>``.
    """
    if not allowed:
        raise ValueError(f"--{flag} must be {what}, not {value!r}")


def check_range(flag: str, spec: str, required: bool = False) -> None:
    """Refuse an integer range (``0-15``, ``0-170:10``, ``3,7,9-11``) that does not parse, or with ``required`` one
    that names no value.

    Raises:
        ValueError: naming ``--flag`` and the offending part.
    """
    try:
        values = parse_int_ranges(spec)
    except ValueError as exc:
        raise ValueError(f"--{flag}: {exc}") from None
    if required and not values:
        raise ValueError(f"--{flag} names no value ({spec!r}): use forms like 0-15, 0-170:10 or 3,7,9-11")


def known_tasks(interface: EnvInterface) -> list[str]:
    """Every task id the environment takes: its tasks and the variants it describes beyond them."""
    known = list(interface.tasks())
    return known + [row["id"] for row in interface.describe_tasks(all_tasks=True) if row["id"] not in known]


def check_tasks(flag: str, tasks: Sequence[str], interface: EnvInterface) -> None:
    """Refuse tasks the environment does not know.

    Raises:
        ValueError: naming ``--flag``, the unknown tasks and the known ones.
    """
    known = known_tasks(interface)
    unknown = [task for task in tasks if task not in known]
    if unknown:
        raise ValueError(f"--{flag}: unknown task(s) {unknown} for environment {interface.name!r}; known: {known}")


def check_policy(flag: str, name: str, interface: EnvInterface) -> None:
    """Refuse a policy name the environment does not register.

    Raises:
        ValueError: naming ``--flag``, the policy and the registered ones (the environment's own message).
    """
    try:
        interface.get_policy(name)
    except ValueError as exc:
        raise ValueError(f"--{flag}: {exc}") from None


def env_interface(name: str) -> EnvInterface:
    """The environment ``--env`` names.

    Raises:
        ValueError: ``--env: <why>`` for a name no environment goes by.
    """
    try:
        return get_env_interface(name)
    except ValueError as exc:
        raise ValueError(f"--env: {exc}") from None


def check_env_values(args: Any, warm: WarmStartArguments, interface: EnvInterface) -> None:
    """The values only the environment can check: ``args.tasks`` (and ``anchor_tasks`` where there are some) are its
    tasks, and the teacher is one of its policies."""
    check_tasks("tasks", args.tasks, interface)
    check_tasks("anchor_tasks", getattr(args, "anchor_tasks", []), interface)
    check_policy("teacher", warm.teacher, interface)


def check_vllm_arguments(training_args: Any, model_args: Any) -> None:
    """With ``--use_vllm true``: vLLM installed and importable, and on a machine without a GPU the settings its CPU
    build runs (one process, colocated, no 4-bit weights; :mod:`recruit_trl.training.vllm_colocate`).

    Raises:
        ImportError: vLLM missing or broken, with the command that installs or repairs it.
        ValueError: one line naming the flag and what it takes.
    """
    if not training_args.use_vllm:
        return
    check_rollout_vllm_settings(training_args)
    import torch

    from recruit_trl.models.vllm_engine import check_cpu_settings, require_vllm

    require_vllm()
    if not torch.cuda.is_available():
        quantised = getattr(model_args, "load_in_4bit", False) or getattr(model_args, "load_in_8bit", False)
        check_cpu_settings(training_args.vllm_mode, training_args.world_size, quantised)


def check_rollout_vllm_settings(training_args: Any) -> None:
    """Refuse the vLLM settings recruit_trl's rollouts cannot honour: they generate through a colocated engine in
    the training process (server mode syncs weights to another process the rollouts never call), keep its KV cache
    awake between generations (sleep mode frees it after TRL's own generation step, which the rollouts replace) and
    send each rank's own prompts (a tensor-parallel group expects the same prompts on every rank).

    Raises:
        ValueError: one line naming the flag and the fix.
    """
    if training_args.vllm_mode != "colocate":
        raise ValueError(f"--vllm_mode {training_args.vllm_mode}: recruit_trl's rollouts generate through a colocated "
                         "engine; use --vllm_mode colocate")  # fmt: skip
    if training_args.vllm_enable_sleep_mode:
        raise ValueError("--vllm_enable_sleep_mode true: recruit_trl's rollouts generate between TRL's steps, with "
                         "the engine asleep; drop it (or --use_vllm false)")  # fmt: skip
    if training_args.vllm_tensor_parallel_size > 1:
        raise ValueError(f"--vllm_tensor_parallel_size {training_args.vllm_tensor_parallel_size}: recruit_trl's "
                         "rollouts send each rank's own prompts, which a tensor-parallel group cannot take; "
                         "use 1")  # fmt: skip


def check_quantised_training(model_args: Any, full_finetune: bool, flags: str) -> None:
    """Refuse to fine-tune every weight of a quantised model (``--load_in_4bit`` / ``--load_in_8bit``): its frozen
    integer weights train only through a LoRA adapter. ``full_finetune`` is what ``flags`` asked for."""
    quantised = getattr(model_args, "load_in_4bit", False) or getattr(model_args, "load_in_8bit", False)
    if quantised and full_finetune:
        raise ValueError(f"a quantised model (--load_in_4bit/--load_in_8bit) trains a LoRA adapter, not every weight: "
                         f"drop {flags} or the quantisation")  # fmt: skip


def check_constrained_sampling(script_args: ScriptArguments, training_args: Any) -> None:
    """With ``--constrained_decoding``, refuse the sampling settings that the sampler and the loss would not share.

    The constrained sampler (:func:`recruit_trl.models.generation.sample`) draws each answer token from the model's
    distribution at ``--temperature`` renormalised over the legal tokens, and the loss
    (:mod:`recruit_trl.training.legal_logprobs`) renormalises the same logits, divided by the same temperature, over
    the same tokens. Top-k and top-p would cut the set the sampler draws from but not the one the loss renormalises
    over; the sampler applies neither min-p, nor a repetition penalty, nor ``--generation_kwargs``.

    Raises:
        ValueError: one line naming the first such flag and its value.
    """
    if not script_args.constrained_decoding:
        return
    renormalised = "samples from the legal tokens renormalised, and the loss assumes that"
    cut = f"constrained decoding {renormalised}"
    ignored = f"the constrained sampler does not apply it: it {renormalised}"
    settings = [  # (flag, value, whether it changes the distribution GRPOConfig asks for, why that is refused)
        ("top_p", training_args.top_p, training_args.top_p is not None and training_args.top_p < 1.0, cut),
        ("top_k", training_args.top_k, bool(training_args.top_k), cut),
        ("min_p", training_args.min_p, bool(training_args.min_p), ignored),
        ("repetition_penalty", training_args.repetition_penalty, training_args.repetition_penalty not in (None, 1.0),
         ignored),
        ("generation_kwargs", training_args.generation_kwargs, bool(training_args.generation_kwargs), ignored),
    ]  # fmt: skip
    for flag, value, changed, why in settings:
        if changed:
            raise ValueError(f"--{flag} {value}: {why}; drop --{flag} or turn off --constrained_decoding")


def check_sft_budget(training_args: Any) -> None:
    """Refuse an SFT budget that cannot train (checked while parsing: the warm start trains after the teacher's
    traces, minutes into a run).

    Raises:
        ValueError: one line naming the field, its value and what it takes.
    """
    batch, epochs, steps, lr = (training_args.per_device_train_batch_size, training_args.num_train_epochs,
                                training_args.max_steps, training_args.learning_rate)  # fmt: skip
    check_value("per_device_train_batch_size", batch, batch >= 1, ">= 1")
    check_value("num_train_epochs", epochs, epochs > 0, "> 0")
    check_value("max_steps", steps, steps == -1 or steps >= 1, "-1 (num_train_epochs decides) or >= 1")
    check_value("learning_rate", lr, lr > 0, "> 0")


def check_sft_arguments(
    script_args: SFTScriptArguments, warm: WarmStartArguments, training_args: Any, model_args: Any
) -> tuple[SFTScriptArguments, WarmStartArguments, Any, Any]:
    """Check what the SFT recipes' dataclasses cannot check alone: the environment's tasks and teacher, and the
    quantisation. Returns the four unchanged.

    Raises:
        ValueError: one line naming the flag, its value and what it takes.
    """
    check_env_values(script_args, warm, env_interface(script_args.env_name))
    check_sft_budget(training_args)
    check_quantised_training(model_args, not model_args.use_peft, "--use_peft false")
    return script_args, warm, training_args, model_args

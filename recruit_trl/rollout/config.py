"""Settings of the rollouts: which environment, how its states become prompts, and how samples are drawn and scored.

:class:`PromptConfig` holds what every stage that renders a state shares (the environment, the action contract, the
recent actions in the digest): the rollouts, the SFT warm start's traces and the evaluation must agree on it, or a
model is trained on prompts it never sees. :class:`RolloutConfig` adds the rollout's own settings; the recipes expose
both as command-line flags.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import ClassVar

from recruit_trl.contracts import MAX_NEW_TOKENS
from recruit_trl.protocol import FALLBACK_POLICY

MODES = ("branch", "episode")
TO_THE_END = 1_000_000  # a horizon no episode outlasts
# Settings that only one mode reads: set to anything but their default in another mode, they are refused.
MODE_FLAGS = {
    "continuation_seeds": ("branch",),
    "self_horizon": ("branch",),
    "reward_teacher": ("branch",),
    "episode_groups": ("episode",),
    "episode_decisions": ("episode",),
    "episode_weight": ("episode",),
    "step_weight": ("episode",),
    "step_horizon": ("episode",),
}
# Per-row fields every rollout returns besides the environment's reward components.
ROW_FIELDS = (
    "valid", "action_shaping", "final_score", "potential_change", "action_type", "action_error", "scored_steps",
    "teacher_match",
)  # fmt: skip
# Reward functions that read a field only some modes fill: named in another mode (or in TRL's tool loop, "tool"),
# they are refused. teacher_match needs the --reward_teacher policy, which only branch mode consults.
MODE_REWARDS = {"teacher_match_reward": ("branch",)}


def check_mode_rewards(names: Sequence[str], mode: str, has_potential: bool) -> None:
    """Refuse reward functions that cannot apply in ``mode`` (``"tool"``: TRL's tool loop), and ``potential_reward``
    for an environment without a potential, with a one-line message naming the flag."""
    for name in names:
        modes = MODE_REWARDS.get(name)
        if modes is not None and mode not in modes:
            where = "TRL's tool loop" if mode == "tool" else f"{mode} mode"
            raise ValueError(
                f"--reward_funcs {name} applies to {' and '.join(modes)} mode only: {where} has no teacher to "
                "compare with (--reward_teacher); drop it"
            )
        if name == "potential_reward" and not has_potential:
            raise ValueError(
                "--reward_funcs potential_reward: this environment defines no potential (EnvInterface.potential), "
                "so the reward would always be missing; drop it"
            )


@dataclass
class PromptConfig:
    """The environment and the rendering of its states as prompts (shared by rollouts, traces and evaluation)."""

    env_name: str = field(
        default="",
        metadata={
            "help": "Environment interface: a name (registered, or an installed recruit_trl.envs entry point) or "
            "'package.module:attribute'. Required. On the command line also --env; in a YAML config env_name "
            "(TrlParser reads a YAML's env: as environment variables).",
            "aliases": ["--env"],
        },
    )
    # The action contract of every prompt (recruit_trl.contracts): the one contract, not a setting.
    contract: ClassVar[str] = "index"
    recent_k: int = field(default=2, metadata={"help": "Recent actions shown in the prompt's digest."})

    def __post_init__(self) -> None:
        if not self.env_name:
            raise ValueError("name the environment: env_name='clinical', 'conquest' or 'package.module:attribute'")
        if self.recent_k < 0:
            raise ValueError(f"recent_k must be >= 0, got {self.recent_k}")


@dataclass
class RolloutConfig(PromptConfig):
    """How samples are drawn from the environment (the recipe exposes these as command-line flags)."""

    mode: str = field(
        default="branch",
        metadata={"help": "Rollout mode: 'branch' (one decision per row, scored from the anchor's snapshot by a "
                  "continuation) or 'episode' (the policy's own episodes, every decision a row, "
                  "recruit_trl.rollout.advantages). Several decisions per completion: TRL's tool loop "
                  "(recipes/grpo_environment_factory.py)."},
    )  # fmt: skip
    horizon: int = field(
        default=TO_THE_END,
        metadata={"help": "Decisions played by the continuation policy after the sampled action(s) (default: to the "
                  "episode's end)."},
    )  # fmt: skip
    continuation_policy: str = field(
        default=FALLBACK_POLICY,
        metadata={"help": "Policy (registered by the environment) that plays the horizon (default: the environment's "
                  "fallback agent)."},
    )  # fmt: skip
    continuation_seeds: int = field(
        default=1,
        metadata={"help": "Branch mode: continuations per distinct sampled action, each with its own randomness, "
                  "averaged (a single action moves the final grade by less than one continuation's noise)."},
    )  # fmt: skip
    self_horizon: int = field(
        default=0,
        metadata={"help": "Branch mode: days the policy itself plays (greedy, all branches in lock-step) after the "
                  "sampled action, before the continuation policy plays the rest of the horizon. The continuation "
                  "policy forgives what the policy would leave undone; these days charge for it (0: off)."},
    )  # fmt: skip
    reward_teacher: str = field(
        default="",
        metadata={"help": "Policy (registered by the environment) whose action in the same state each decision is "
                  "compared with (row field teacher_match, for rewards.teacher_match_reward); '' for none."},
    )  # fmt: skip
    episode_groups: int = field(
        default=2,
        metadata={"help": "Episode mode: groups played per generation batch and process, each of num_generations "
                  "episodes of the policy from one anchor with the same dice; every decision is a training row, and "
                  "the batch's rows are drawn from all of them."},
    )  # fmt: skip
    episode_decisions: int = field(
        default=0,
        metadata={"help": "Episode mode: decisions the policy plays per episode before the continuation policy plays "
                  "the rest (0: the policy plays the whole episode)."},
    )  # fmt: skip
    episode_weight: float = field(
        default=1.0,
        metadata={"help": "Episode mode: weight of the episode-level advantage (the episode's outcome, the sum of its "
                  "decisions' step rewards under --reward_funcs x --reward_weights, against the group's other "
                  "episodes, leave-one-out)."},
    )  # fmt: skip
    step_weight: float = field(
        default=1.0,
        metadata={"help": "Episode mode: weight of the step-level advantage (the n-step return of the decisions' step "
                  "rewards, --reward_funcs x --reward_weights on each decision's own step, against decisions at the "
                  "same state in other episodes, else the group's mean)."},
    )  # fmt: skip
    step_horizon: int = field(
        default=15, metadata={"help": "Episode mode: decisions in the step level's n-step return (0: to the end)."}
    )
    constrained_decoding: bool = field(
        default=False,
        metadata={"help": "Sample only answers that take a listed candidate (masked tokens are never drawn), so "
                  "every rollout action is the model's own; the index contract's invalid-answer penalty then "
                  "never applies."},
    )  # fmt: skip

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mode == "window":
            raise ValueError("--mode window was removed: use --mode branch|episode, or TRL's tool loop "
                             "(recipes/grpo_environment_factory.py) for several decisions per completion")  # fmt: skip
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.horizon < 0 or self.continuation_seeds < 1:
            raise ValueError("horizon must be >= 0, continuation_seeds >= 1")
        if not 0 <= self.self_horizon <= self.horizon:
            raise ValueError(f"self_horizon must be in [0, horizon={self.horizon}], got {self.self_horizon}")
        if self.episode_groups < 1 or self.episode_decisions < 0 or self.step_horizon < 0:
            raise ValueError("episode_groups must be >= 1, episode_decisions and step_horizon >= 0")
        defaults = {f.name: f.default for f in fields(RolloutConfig)}
        for name, modes in MODE_FLAGS.items():
            if self.mode not in modes and getattr(self, name) != defaults[name]:
                raise ValueError(
                    f"--{name} applies to {' and '.join(modes)} mode only and has no effect in {self.mode} mode "
                    f"(got {getattr(self, name)!r}): drop it or choose --mode {modes[0]}"
                )

    @property
    def decision_tokens(self) -> int:
        """Tokens per decision: the contract's answer budget (12 tokens)."""
        return MAX_NEW_TOKENS[self.contract]

"""TRL ``rollout_func`` implementations that wrap a multi-step environment.

``branch`` mode (default). Each prompt is an anchor (a state somewhere in an episode). The rollout renders
the state as a compact chat prompt, samples one action per repeated row with the current policy, and scores
every sampled action from the *same* snapshot: apply it, then play ``horizon`` more days with a continuation
policy, ``continuation_seeds`` times with different randomness, and average. The environment RNG is re-seeded
every simulated day from (anchor, optimizer step, rollout seed, continuation, day), so every row of a group
faces the same randomness on the same day, even after actions that drew different amounts of it and even when
TRL splits the group across processes (common random numbers: the comparison inside a group is fair and nothing
is clairvoyant across groups). The outcome is therefore a function of (anchor, step, action): rows of a group
that sampled the same action share one computation. With ``self_horizon`` D > 0 the policy itself (greedy) plays
the first D days after the sampled action, every branch in its own environment and all of them in lock-step, before
the continuation policy takes over: a continuation policy forgives what the policy would leave undone. With
``guide_policy`` set, a group that did not sample the guide's action (a policy's, or the best-scoring listed
candidate's) gets it in place of its most duplicated sample: off-policy guidance, so a good action the policy rarely
samples is still compared within the group.

``window`` mode. ``turns`` consecutive decisions from an anchor form one multi-turn completion: model
tokens (mask 1) alternate with the environment's reply rendered as the next user turn (``env_mask`` 0).
Model tokens are never re-tokenised; environment text is tokenised on its own and spliced in.

Both return ``prompt_ids``, ``completion_ids``, ``logprobs`` and extra per-row fields that reward functions
receive as keyword arguments: every environment reward component summed over the scored steps, ``valid``
(1.0 when the model's text parsed under the action contract), ``action_shaping`` (``None`` for invalid
rows), ``final_score`` (``None`` unless the episode ended inside the horizon), ``action_type``,
``action_error``, ``scored_steps`` and ``teacher_match`` (with ``reward_teacher`` set: 1.0 when the model's action does
what that policy would do in the same state, in window mode the fraction of turns; ``None`` without a teacher).

Invalid model output never raises: the environment interface's fallback action is played instead and the
row is counted (``rollout/fallback_rate``). Collapse and cost metrics are logged through the trainer.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any

from recruit_trl.anchors import Anchor, AnchorCache, AnchorState, anchor_from_prompt
from recruit_trl.contracts import (
    CONTRACTS,
    MAX_NEW_TOKENS,
    ParsedAction,
    answer_texts,
    build_messages,
    digest,
    parse_action,
)
from recruit_trl.generation import (
    answer_token_ids,
    completion_logprobs,
    encode_prompt,
    policy_for_generation,
    sample,
)
from recruit_trl.protocol import Action, EnvInterface, get_env_interface, policy_action
from recruit_trl.traces import match_candidate, same_action

MODES = ("branch", "window")
BEST_CANDIDATE = "best"  # the guide that scores every listed candidate and takes the best (see RolloutConfig)
# Per-row fields every rollout returns besides the environment's reward components.
ROW_FIELDS = ("valid", "action_shaping", "final_score", "action_type", "action_error", "scored_steps", "teacher_match")


@dataclass
class RolloutConfig:
    """How samples are drawn from the environment (the recipe exposes these as command-line flags)."""

    env: str = field(
        default="clinical",
        metadata={
            "help": "Environment interface: a name (registered, or an installed recruit_trl.envs entry point) or "
            "'package.module:attribute'."
        },
    )
    mode: str = field(default="branch", metadata={"help": "Rollout mode: 'branch' or 'window'."})
    contract: str = field(default="index", metadata={"help": "Action contract: 'index' or 'json'."})
    horizon: int = field(
        default=180,
        metadata={"help": "Days played by the continuation policy after the sampled action(s) (180: to the end)."},
    )
    continuation_policy: str = field(
        default="grader_heuristic",
        metadata={"help": "Policy (registered by the environment) that plays the horizon."},
    )
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
    guide_policy: str = field(
        default="",
        metadata={"help": "Branch mode: policy (registered by the environment, e.g. 'expert') whose action is put "
                  "into every group that did not sample it, in place of the most duplicated sample (off-policy "
                  "guidance: each state's group then compares the guide's answer with the policy's own, so a good "
                  "action the policy rarely samples is still scored and reinforced); 'best': every listed candidate "
                  "is scored and the one with the best final score is the guide's (one outcome per candidate: "
                  "costlier); '' for none."},
    )  # fmt: skip
    window_turns: int = field(default=4, metadata={"help": "Model decisions per completion in window mode."})
    recent_k: int = field(default=2, metadata={"help": "Recent actions shown in the prompt's digest."})
    max_new_tokens: int | None = field(
        default=None, metadata={"help": "Tokens per decision (default: 12 for 'index', 96 for 'json')."}
    )
    generation_chunk: int = field(default=64, metadata={"help": "Prompts per generate() call."})
    rollout_seed: int = field(default=0, metadata={"help": "Mixed into every group's environment seed."})
    enable_thinking: bool = field(
        default=False, metadata={"help": "Passed to the chat template (Qwen3 thinks before answering when True)."}
    )
    constrained_decoding: bool = field(
        default=False,
        metadata={"help": "Sample only answers that take a listed candidate (masked tokens are never drawn), so "
                  "every rollout action is the model's own; the index contract's invalid-answer penalty then "
                  "never applies."},
    )  # fmt: skip

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.contract not in CONTRACTS:
            raise ValueError(f"contract must be one of {CONTRACTS}, got {self.contract!r}")
        if self.horizon < 0 or self.window_turns < 1 or self.recent_k < 0 or self.continuation_seeds < 1:
            raise ValueError("horizon and recent_k must be >= 0, window_turns and continuation_seeds >= 1")
        if not 0 <= self.self_horizon <= self.horizon:
            raise ValueError(f"self_horizon must be in [0, horizon={self.horizon}], got {self.self_horizon}")
        for name in ("self_horizon", "guide_policy"):
            if getattr(self, name) and self.mode != "branch":
                raise ValueError(f"{name} applies to branch mode only")

    @property
    def template_kwargs(self) -> dict:
        return {"enable_thinking": self.enable_thinking}

    @property
    def decision_tokens(self) -> int:
        return self.max_new_tokens or MAX_NEW_TOKENS[self.contract]


def last(items: list, k: int) -> list:
    """The last ``k`` items (``k == 0`` gives none, unlike ``items[-0:]``)."""
    return items[len(items) - k :] if k > 0 else []


def group_seed(anchor: Anchor, step: int, seed: int) -> int:
    """Environment seed shared by every row of one group (same anchor, same optimizer step)."""
    digest_ = hashlib.sha256(f"{anchor.key()}|{step}|{seed}".encode()).digest()
    return int.from_bytes(digest_[:8], "little")


def day_seed(seed: int, day: int) -> int:
    """The step RNG's seed on simulated ``day`` (counted from the anchor) of a continuation seeded ``seed``."""
    return (seed * 1_000_003 + day * 7_919 + 1) & 0xFFFFFFFFFFFFFFFF


class _Scorer:
    """Plays sampled actions from anchor snapshots and sums the interface's reward components."""

    def __init__(self, interface: EnvInterface, config: RolloutConfig, cache: AnchorCache) -> None:
        self.interface = interface
        self.config = config
        self.cache = cache
        self.continuation = interface.get_policy(config.continuation_policy)
        self.env_seconds = 0.0
        self.env_steps = 0

    def start(self, anchor: Anchor, state: AnchorState, seed: int, env=None):
        """``env`` (default: the pooled one) restored to the anchor, its RNG seeded for simulated day 0."""
        env = env if env is not None else self.cache.env(anchor.task)
        env.restore(state.snapshot)
        env.reseed(day_seed(seed, 0))
        return env

    def apply(self, env, obs: dict, parsed: ParsedAction) -> tuple[ParsedAction, tuple]:
        """Step the parsed action; an action the environment rejects is replaced by the fallback (invalid)."""
        t0 = time.perf_counter()
        try:
            result = env.step(parsed.action)
        except ValueError as exc:
            parsed = ParsedAction(self.interface.fallback_action(obs), False, f"env_rejected: {exc}"[:80])
            result = env.step(parsed.action)
        self.env_seconds += time.perf_counter() - t0
        self.env_steps += 1
        return parsed, result

    def continue_(
        self, env, obs: dict, totals: dict[str, float], seed: int, days: int, first_day: int = 1
    ) -> tuple[int, dict]:
        """Play ``days`` days with the continuation policy, re-seeding the step RNG every day (simulated days
        ``first_day``, ``first_day + 1``, ...); returns (steps played, last info)."""
        t0 = time.perf_counter()
        rng = random.Random(seed)
        info: dict = {}
        played = 0
        for k in range(days):
            env.reseed(day_seed(seed, first_day + k))
            action = self.continuation(obs, rng)
            new_obs, reward, terminated, truncated, info = env.step(action)
            _add(totals, self.interface.step_components(obs, action, new_obs, reward, info))
            obs = new_obs
            played += 1
            if terminated or truncated:
                break
        self.env_seconds += time.perf_counter() - t0
        self.env_steps += played
        return played, info


def _add(totals: dict[str, float], components: dict[str, float]) -> None:
    for key, value in components.items():
        totals[key] = totals.get(key, 0.0) + value


class _RolloutBase:
    def __init__(self, config: RolloutConfig | None = None, interface: EnvInterface | None = None) -> None:
        self.config = config or RolloutConfig()
        self.interface = interface or get_env_interface(self.config.env)
        self.cache = AnchorCache(self.interface, recent_k=self.config.recent_k)
        self.scorer = _Scorer(self.interface, self.config, self.cache)
        self.teacher = self.interface.get_policy(self.config.reward_teacher) if self.config.reward_teacher else None
        guide = self.config.guide_policy
        self.guide = self.interface.get_policy(guide) if guide and guide != BEST_CANDIDATE else None
        self._prompt_ids: dict[str, list[int]] = {}

    # ------------------------------------------------------------------ helpers
    def _begin(self, prompts: list, trainer, tokenizer, step):
        """Reset the cost counters; resolve the tokenizer, the optimizer step and the anchors of a call."""
        self.scorer.env_seconds, self.scorer.env_steps = 0.0, 0
        tokenizer = tokenizer or trainer.processing_class
        step = step if step is not None else (trainer.state.global_step if trainer is not None else 0)
        return tokenizer, step, [anchor_from_prompt(p) for p in prompts]

    def _states(self, anchors: list[Anchor]) -> list[AnchorState]:
        """The anchors' states; an anchor whose prefix already ended its episode has nothing left to decide."""
        states = [self.cache.get(a) for a in anchors]
        ended = sorted({a.key() for a, s in zip(anchors, states, strict=True) if s.done})
        if ended:
            raise ValueError(
                f"{len(ended)} anchor(s) start after the end of their episode (first: {ended[0]}); build the dataset "
                "with recruit_trl.anchors.build_anchors, which leaves them out, or use earlier days"
            )
        return states

    def teacher_action(self, env, obs: dict, seed: int, policy=None) -> Action | None:
        """The action of ``policy`` (default: the reward teacher) in ``env``'s current state (``obs``); a planner
        reads ``env`` but never steps it."""
        policy = policy or self.teacher
        if policy is None:
            return None
        t0 = time.perf_counter()
        action = policy_action(policy, env, obs, random.Random(seed))
        self.scorer.env_seconds += time.perf_counter() - t0
        return action

    def _extra_fields(self, rows: list[dict[str, Any]]) -> dict[str, list]:
        """The per-row fields forwarded to reward functions (one list per field, in row order)."""
        names = (*self.interface.reward_fields, *ROW_FIELDS)
        return {name: [r[name] for r in rows] for name in names}

    def encode_messages(self, tokenizer, messages: list[dict[str, str]]) -> list[int]:
        return encode_prompt(tokenizer, messages, **self.config.template_kwargs)

    def prompt_for(self, tokenizer, anchor: Anchor, state: AnchorState, candidates: Sequence[Action]) -> list[int]:
        key = anchor.key()
        if key not in self._prompt_ids:
            messages = build_messages(self.interface, state.obs, state.recent, self.config.contract, candidates)
            self._prompt_ids[key] = self.encode_messages(tokenizer, messages)
            if len(self._prompt_ids) > 8192:
                self._prompt_ids.pop(next(iter(self._prompt_ids)))
        return self._prompt_ids[key]

    def log_metrics(
        self, trainer, rows: list[dict], seconds: float, gen_tokens: int, decisions: int, prompt_tokens: int = 0
    ) -> None:
        """Collapse and cost metrics, averaged over processes by TRL (``_log_metric``)."""
        log = getattr(trainer, "_log_metric", None)
        if log is None or not rows:
            return
        n = len(rows)
        log("rollout/fallback_rate", sum(1 for r in rows if not r["valid"]) / n)
        log("rollout/invalid_action_rate", sum(1 for r in rows if not r["valid"] or r["action_error"]) / n)
        counts = Counter(r["action_type"] for r in rows)
        for kind in self.interface.action_types():
            log(f"rollout/action_type/{kind}", counts.get(kind, 0) / n)
        entropy = -sum(c / n * math.log(c / n) for c in counts.values())
        log("rollout/action_entropy", entropy)
        log("rollout/action_entropy_normalized", entropy / math.log(max(2, len(self.interface.action_types()))))
        log("rollout/env_time_share", self.scorer.env_seconds / seconds if seconds > 0 else 0.0)
        log("rollout/env_steps_per_row", self.scorer.env_steps / n)
        log("rollout/gen_tokens_per_decision", gen_tokens / max(1, decisions))
        log("rollout/prompt_tokens_per_decision", prompt_tokens / max(1, decisions))
        log("rollout/seconds", seconds)


class BranchRollout(_RolloutBase):
    """``rollout_func`` for branch mode: one sampled action per row, scored from the anchor's snapshot.

    Args:
        config: rollout settings; ``config.env`` names the environment interface.
        interface: an interface object (overrides ``config.env``).

    Call it as TRL does: ``rollout(prompts, trainer) -> dict``. It can also be called with
    ``trainer=None`` and explicit ``model``/``tokenizer``/``generation_config`` (tests, benchmarks).
    """

    def __init__(self, config: RolloutConfig | None = None, interface: EnvInterface | None = None) -> None:
        super().__init__(config, interface)
        self._branch_envs: dict[str, list] = {}  # task -> environments for branches played side by side

    def __call__(self, prompts: list, trainer=None, *, model=None, tokenizer=None, generation_config=None, step=None):
        start = time.perf_counter()
        tokenizer, step, anchors = self._begin(prompts, trainer, tokenizer, step)
        t0 = time.perf_counter()
        states = self._states(anchors)
        candidates = [self.interface.candidate_actions(s.obs) for s in states]
        self.scorer.env_seconds += time.perf_counter() - t0
        prompt_ids = [self.prompt_for(tokenizer, a, s, c) for a, s, c in zip(anchors, states, candidates, strict=True)]

        completion_ids, logprobs = self._generate(trainer, model, tokenizer, generation_config, prompt_ids, candidates)
        texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        parsed = [
            parse_action(text, self.config.contract, self.interface, state.obs, cands)
            for state, cands, text in zip(states, candidates, texts, strict=True)
        ]

        self._outcomes: dict[tuple[str, str], dict[str, Any]] = {}  # (anchor, action) -> outcome, this call only
        self._taught: dict[str, Action | None] = {}  # anchor -> the teacher's action, this call only
        guided = [False] * len(parsed)
        if self.config.guide_policy:
            args = (trainer, model, tokenizer, generation_config, anchors, states, candidates, step)
            guided = self._guide(*args, prompt_ids, completion_ids, logprobs, parsed)
        if self.config.self_horizon:
            self._self_continued(trainer, model, tokenizer, anchors, states, parsed, step)
        rows = [self._score(a, s, p, step) for a, s, p in zip(anchors, states, parsed, strict=True)]
        out: dict[str, Any] = {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}
        out.update(self._extra_fields(rows))
        gen_tokens = sum(len(c) for c in completion_ids)
        prompt_tokens = sum(len(p) for p in prompt_ids)
        # The collapse metrics describe the policy's own samples, not the guide's answers.
        sampled = [r for r, g in zip(rows, guided, strict=True) if not g]
        self.log_metrics(trainer, sampled, time.perf_counter() - start, gen_tokens, len(rows), prompt_tokens)
        return out

    def _guide(
        self, trainer, model, tokenizer, generation_config, anchors, states, candidates, step,
        prompt_ids, completion_ids, logprobs, parsed,
    ) -> list[bool]:  # fmt: skip
        """Put the guide policy's action into every group of the call that did not sample it (edits
        ``completion_ids``, ``logprobs`` and ``parsed`` in place); returns which rows now hold the guide's answer.

        A group here is a run of consecutive rows with the same anchor: TRL may split a group across processes,
        and each part then gets the guide's answer. The replaced row is an invalid one, else one of the most
        duplicated action, so the fewest distinct samples are lost. Its log-probabilities are the policy's own
        (temperature only: ``logprobs`` matter only for vLLM's importance correction, which these rollouts do not
        use). A guide action that is not a listed candidate is skipped.
        """
        runs = (list(rows) for _, rows in groupby(range(len(anchors)), key=lambda i: anchors[i].key()))
        groups = [rows for rows in runs if len(rows) >= 2]
        if self.guide is None and self.config.self_horizon:  # BEST_CANDIDATE: every group's candidates in lock-step
            jobs = [(g[0], c) for g in groups for c in candidates[g[0]]]
            self._self_continued(
                trainer, model, tokenizer, [anchors[i] for i, _ in jobs], [states[i] for i, _ in jobs],
                [ParsedAction(c, True) for _, c in jobs], step,
            )  # fmt: skip
        guided = [False] * len(anchors)
        already = 0
        rows_done: list[int] = []
        for group in groups:
            anchor, state, cands = anchors[group[0]], states[group[0]], candidates[group[0]]
            if self.guide is None:  # BEST_CANDIDATE
                k = self._best_candidate(anchor, state, cands, step)
                action = cands[k]
            else:
                action = self._anchor_action(self.guide, anchor, state, step)
                k = match_candidate(self.interface, action, cands)
            if k is None:
                continue
            if any(parsed[i].valid and same_action(self.interface, parsed[i].action, action) for i in group):
                already += 1
                continue
            counts = Counter(self._key(anchor, parsed[i].action) for i in group)
            row = max(group, key=lambda i: (not parsed[i].valid, counts[self._key(anchor, parsed[i].action)], i))
            answer = answer_token_ids(tokenizer, answer_texts(self.config.contract, cands)[k : k + 1])[0]
            completion_ids[row] = [*answer, tokenizer.eos_token_id]
            parsed[row] = ParsedAction(cands[k], True)
            guided[row] = True
            rows_done.append(row)
        if rows_done:
            prompts = [prompt_ids[i] for i in rows_done]
            completions = [completion_ids[i] for i in rows_done]
            config = generation_config or getattr(trainer, "generation_config", None)
            temperature = getattr(config, "temperature", None)
            with policy_for_generation(trainer) if trainer is not None else nullcontext(model) as policy:
                new = completion_logprobs(policy, prompts, completions, temperature)
            for i, lps in zip(rows_done, new, strict=True):
                logprobs[i] = lps
        log = getattr(trainer, "_log_metric", None)
        if log is not None:
            log("rollout/guided_rate", len(rows_done) / max(1, len(anchors)))
            log("rollout/guide_sampled_rate", already / max(1, already + len(rows_done)))
        return guided

    def _best_candidate(self, anchor, state, candidates, step) -> int:
        """The index of the listed candidate with the best final score from the anchor (the first of equals); every
        outcome is kept for the call's rows (with ``self_horizon``, :meth:`_guide` has scored them all already)."""
        scores = [self._cached_outcome(anchor, state, action, step)["final_score"] for action in candidates]
        if None in scores:
            raise ValueError(
                f"guide_policy={BEST_CANDIDATE!r} ranks the candidates by final score, but the horizon "
                f"({self.config.horizon} days) ended before the episode at {anchor.key()}: use a longer one"
            )
        return max(range(len(candidates)), key=lambda k: scores[k])

    def _generate(self, trainer, model, tokenizer, generation_config, prompt_ids, candidates):
        """One decision per prompt; with ``constrained_decoding``, only the texts that take one of ``candidates``."""
        n_tokens = self.config.decision_tokens
        chunk = self.config.generation_chunk
        allowed = None
        if self.config.constrained_decoding:
            allowed = [answer_token_ids(tokenizer, answer_texts(self.config.contract, c)) for c in candidates]
        if trainer is None:
            return sample(model, tokenizer, prompt_ids, generation_config, n_tokens, chunk, allowed=allowed)
        if getattr(trainer, "use_vllm", False):
            raise NotImplementedError("recruit_trl rollouts generate with transformers; set use_vllm=False.")
        with policy_for_generation(trainer) as policy:
            config = generation_config or trainer.generation_config
            return sample(policy, tokenizer, prompt_ids, config, n_tokens, chunk, allowed=allowed)

    @staticmethod
    def _key(anchor: Anchor, action: Action) -> tuple[str, str]:
        return anchor.key(), json.dumps(action, sort_keys=True, default=str)

    def _continuation_seeds(self, anchor: Anchor, step: int) -> list[int]:
        """The seeds of the ``continuation_seeds`` continuations, shared by every row of the anchor's group."""
        base = group_seed(anchor, step, self.config.rollout_seed)
        return [(base + k * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF for k in range(self.config.continuation_seeds)]

    def _branch(self, anchor: Anchor, state: AnchorState, action: Action, seed: int, env=None) -> _Branch:
        """Restore the anchor (into ``env``, default the pooled one), play ``action`` on simulated day 0."""
        env = self.scorer.start(anchor, state, seed, env)
        applied, (obs, reward, terminated, truncated, info) = self.scorer.apply(
            env, state.obs, ParsedAction(action, True)
        )
        branch = _Branch(env, obs, seed, {name: 0.0 for name in self.interface.reward_fields}, info)
        _add(branch.totals, self.interface.step_components(state.obs, applied.action, obs, reward, info))
        branch.applied, branch.error, branch.done = applied, info.get("last_action_error"), terminated or truncated
        branch.recent = last(
            [*state.recent, digest(self.interface, state.day, applied.action, info)], self.config.recent_k
        )
        branch.day = state.day + 1
        return branch

    def _finish(self, branch: _Branch, first_day: int) -> None:
        """The continuation policy plays the rest of the horizon from simulated day ``first_day``."""
        days = self.config.horizon - (first_day - 1)
        if not branch.done and days > 0:
            played, last_info = self.scorer.continue_(
                branch.env, branch.obs, branch.totals, branch.seed, days, first_day
            )
            branch.played += played
            branch.info = last_info or branch.info

    def _average(self, branches: list[_Branch]) -> dict[str, Any]:
        """One outcome from a distinct action's continuations: reward components, final score and scored steps
        averaged; the action's error and the fallback that replaced a rejected action from the first (the
        action's effect does not depend on the seed)."""
        n = len(branches)
        scores = [self.interface.final_score(b.info) for b in branches]
        out: dict[str, Any] = {
            name: sum(b.totals[name] for b in branches) / n for name in self.interface.reward_fields
        }
        out["final_score"] = None if None in scores else sum(scores) / n
        out["action_error"] = branches[0].error
        out["scored_steps"] = sum(b.played for b in branches) / n
        out["rejected"] = None if branches[0].applied.valid else branches[0].applied
        return out

    def _outcome(self, anchor: Anchor, state: AnchorState, action: Action, step: int) -> dict[str, Any]:
        """What ``action`` at the anchor leads to, averaged over ``continuation_seeds`` continuations."""
        branches = []
        for seed in self._continuation_seeds(anchor, step):
            branch = self._branch(anchor, state, action, seed)
            self._finish(branch, first_day=1)
            branches.append(branch)
        return self._average(branches)

    def _anchor_action(self, policy, anchor: Anchor, state: AnchorState, step: int) -> Action:
        """``policy``'s action in the anchor's state, seeded as the anchor's group (a planner looks ahead from it)."""
        seed = group_seed(anchor, step, self.config.rollout_seed)
        return self.teacher_action(self.scorer.start(anchor, state, seed), state.obs, seed, policy)

    def _cached_outcome(self, anchor: Anchor, state: AnchorState, action: Action, step: int) -> dict[str, Any]:
        """:meth:`_outcome`, computed once per (anchor, action) in a call (rows and the guide share it)."""
        key = self._key(anchor, action)
        if key not in self._outcomes:
            self._outcomes[key] = self._outcome(anchor, state, action, step)
        return self._outcomes[key]

    def _self_continued(self, trainer, model, tokenizer, anchors, states, parsed, step) -> None:
        """Outcomes of every distinct (anchor, action) of the call when the policy itself plays the first
        ``self_horizon`` days after the action: greedy, every branch in lock-step (one generate() per day), each
        in its own environment; then the continuation policy plays the rest of the horizon."""
        from transformers import GenerationConfig

        jobs: list[tuple[tuple[str, str], _Branch]] = []
        seen: set[tuple[str, str]] = set()
        used: Counter = Counter()  # task -> pooled environments taken by this call
        for anchor, state, p in zip(anchors, states, parsed, strict=True):
            key = self._key(anchor, p.action)
            if key in seen or key in self._outcomes:  # scored already (every candidate, for the best-candidate guide)
                continue
            seen.add(key)
            for seed in self._continuation_seeds(anchor, step):
                pool = self._branch_envs.setdefault(anchor.task, [])
                if used[anchor.task] == len(pool):
                    pool.append(self.interface.make_env(anchor.task))
                env = pool[used[anchor.task]]
                used[anchor.task] += 1
                jobs.append((key, self._branch(anchor, state, p.action, seed, env)))
        greedy = GenerationConfig(do_sample=False, temperature=None, top_p=None, top_k=None)
        for day in range(1, self.config.self_horizon + 1):
            active = [b for _, b in jobs if not b.done]
            if not active:
                break
            candidates = [self.interface.candidate_actions(b.obs) for b in active]
            prompts = [
                self.encode_messages(
                    tokenizer, build_messages(self.interface, b.obs, b.recent, self.config.contract, c)
                )
                for b, c in zip(active, candidates, strict=True)
            ]
            ids, _ = self._generate(trainer, model, tokenizer, greedy, prompts, candidates)
            for b, c, text in zip(
                active, candidates, tokenizer.batch_decode(ids, skip_special_tokens=True), strict=True
            ):
                choice = parse_action(text, self.config.contract, self.interface, b.obs, c)
                b.env.reseed(day_seed(b.seed, day))
                choice, (obs, reward, terminated, truncated, info) = self.scorer.apply(b.env, b.obs, choice)
                _add(b.totals, self.interface.step_components(b.obs, choice.action, obs, reward, info))
                b.recent = last([*b.recent, digest(self.interface, b.day, choice.action, info)], self.config.recent_k)
                b.obs, b.info, b.done, b.day, b.played = obs, info, terminated or truncated, b.day + 1, b.played + 1
        by_key: dict[tuple[str, str], list[_Branch]] = {}
        for key, branch in jobs:
            self._finish(branch, first_day=self.config.self_horizon + 1)
            by_key.setdefault(key, []).append(branch)
        for key, branches in by_key.items():
            self._outcomes[key] = self._average(branches)

    def _score(self, anchor: Anchor, state: AnchorState, parsed: ParsedAction, step: int) -> dict[str, Any]:
        """One row: the (possibly shared) outcome of the parsed action plus what is particular to the row."""
        outcome = self._cached_outcome(anchor, state, parsed.action, step)
        if outcome["rejected"] is not None:
            parsed = outcome["rejected"]
        row = {name: outcome[name] for name in (*self.interface.reward_fields, "final_score", "action_error")}
        row["valid"] = 1.0 if parsed.valid else 0.0
        row["action_shaping"] = self.interface.action_shaping(state.obs, parsed.action) if parsed.valid else None
        row["action_type"] = self.interface.action_type(parsed.action)
        row["scored_steps"] = outcome["scored_steps"]
        row["teacher_match"] = None
        if self.teacher is not None:
            if anchor.key() not in self._taught:
                self._taught[anchor.key()] = self._anchor_action(self.teacher, anchor, state, step)
            row["teacher_match"] = float(
                parsed.valid and same_action(self.interface, parsed.action, self._taught[anchor.key()])
            )
        return row


@dataclass
class _Branch:
    """One continuation of a sampled action in its own environment (see ``BranchRollout``)."""

    env: Any
    obs: dict
    seed: int
    totals: dict[str, float]
    info: dict
    applied: ParsedAction | None = None
    error: str | None = None
    done: bool = False
    played: int = 1
    recent: list[str] = field(default_factory=list)
    day: int = 0


class WindowRollout(_RolloutBase):
    """``rollout_func`` for window mode: ``window_turns`` decisions per completion, environment text masked.

    Every row plays its own trajectory from the anchor (the group shares the environment seed). After the
    window, ``horizon`` more days are played by the continuation policy, as in branch mode.
    """

    def __call__(self, prompts: list, trainer=None, *, model=None, tokenizer=None, generation_config=None, step=None):
        start = time.perf_counter()
        tokenizer, step, anchors = self._begin(prompts, trainer, tokenizer, step)
        states = self._states(anchors)
        n = len(anchors)
        seeds = [group_seed(a, step, self.config.rollout_seed) for a in anchors]
        envs = [self.interface.make_env(a.task) for a in anchors]
        for env, state in zip(envs, states, strict=True):
            env.restore(state.snapshot)
        obs = [s.obs for s in states]
        recent = [list(s.recent) for s in states]
        candidates = [self.interface.candidate_actions(o) for o in obs]
        prompt_ids = [self.prompt_for(tokenizer, a, s, c) for a, s, c in zip(anchors, states, candidates, strict=True)]
        completion_ids: list[list[int]] = [[] for _ in range(n)]
        env_mask: list[list[int]] = [[] for _ in range(n)]
        logprobs: list[list[float]] = [[] for _ in range(n)]
        totals = [{name: 0.0 for name in self.interface.reward_fields} for _ in range(n)]
        rows: list[dict[str, Any]] = [
            {
                "valid_turns": 0,
                "matched_turns": 0,
                "turns": 0,
                "first": None,
                "action_error": None,
                "info": {},
                "done": False,
            }
            for _ in range(n)
        ]
        day = [s.day for s in states]
        stop_ids = {tokenizer.eos_token_id}
        for turn in range(self.config.window_turns):
            active = [i for i in range(n) if not rows[i]["done"]]
            if not active:
                break
            contexts = [prompt_ids[i] + completion_ids[i] for i in active]
            new_ids, new_logps = self._generate(
                trainer, model, tokenizer, generation_config, contexts, [candidates[i] for i in active]
            )
            texts = tokenizer.batch_decode(new_ids, skip_special_tokens=True)
            for i, ids, lps, text in zip(active, new_ids, new_logps, texts, strict=True):
                completion_ids[i] += ids
                env_mask[i] += [1] * len(ids)
                logprobs[i] += lps
                parsed = parse_action(text, self.config.contract, self.interface, obs[i], candidates[i])
                before = obs[i]
                taught = self.teacher_action(envs[i], before, day_seed(seeds[i], turn))
                if taught is not None:
                    rows[i]["matched_turns"] += int(
                        parsed.valid and same_action(self.interface, parsed.action, taught)
                    )
                envs[i].reseed(day_seed(seeds[i], turn))
                parsed, (obs_i, reward, terminated, truncated, info) = self.scorer.apply(envs[i], before, parsed)
                _add(totals[i], self.interface.step_components(before, parsed.action, obs_i, reward, info))
                row = rows[i]
                row["turns"] += 1
                row["valid_turns"] += int(parsed.valid)
                row["info"] = info
                if row["first"] is None:
                    row["first"] = (before, parsed)
                    row["action_error"] = info.get("last_action_error")
                recent[i] = last(
                    [*recent[i], digest(self.interface, day[i], parsed.action, info)], self.config.recent_k
                )
                day[i] += 1
                obs[i] = obs_i
                if terminated or truncated:
                    row["done"] = True
                    continue
                if turn + 1 < self.config.window_turns:
                    candidates[i] = self.interface.candidate_actions(obs_i)
                    messages = build_messages(self.interface, obs_i, recent[i], self.config.contract, candidates[i])
                    env_ids = self._env_turn_ids(tokenizer, messages[-1]["content"], ids[-1] in stop_ids)
                    completion_ids[i] += env_ids
                    env_mask[i] += [0] * len(env_ids)
                    logprobs[i] += [0.0] * len(env_ids)
        out_rows = []
        for i in range(n):
            row, tot = rows[i], totals[i]
            info = row["info"]
            if not row["done"] and self.config.horizon:
                played, last_info = self.scorer.continue_(
                    envs[i], obs[i], tot, seeds[i], self.config.horizon, first_day=row["turns"]
                )
                row["turns_scored"] = row["turns"] + played
                if last_info:
                    info = last_info
            first_obs, first = row["first"]
            out = dict(tot)
            out["valid"] = row["valid_turns"] / max(1, row["turns"])
            out["action_shaping"] = self.interface.action_shaping(first_obs, first.action) if first.valid else None
            out["final_score"] = self.interface.final_score(info)
            out["action_type"] = self.interface.action_type(first.action)
            out["action_error"] = row["action_error"]
            out["scored_steps"] = row.get("turns_scored", row["turns"])
            out["teacher_match"] = row["matched_turns"] / max(1, row["turns"]) if self.teacher is not None else None
            out_rows.append(out)
        result: dict[str, Any] = {
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "logprobs": logprobs,
            "env_mask": env_mask,
        }
        result.update(self._extra_fields(out_rows))
        gen_tokens = sum(sum(m) for m in env_mask)
        decisions = sum(r["turns"] for r in rows)
        # Every decision reads a full state: the anchor prompt, then one environment turn per later decision.
        prompt_tokens = sum(len(p) for p in prompt_ids) + sum(len(m) - sum(m) for m in env_mask)
        self.log_metrics(trainer, out_rows, time.perf_counter() - start, gen_tokens, decisions, prompt_tokens)
        return result

    _generate = BranchRollout._generate

    def _env_turn_ids(self, tokenizer, user_content: str, ends_with_eos: bool) -> list[int]:
        """Token ids of the environment's turn, as the chat template places them after the model's turn."""
        before, after = env_turn_template(tokenizer, self.config.template_kwargs)
        text = before + user_content + after
        if not ends_with_eos:  # the model hit its token budget: close its turn before the environment speaks
            text = tokenizer.eos_token + text
        return tokenizer(text, add_special_tokens=False)["input_ids"]


def env_turn_template(tokenizer, chat_template_kwargs: dict) -> tuple[str, str]:
    """``(before, after)``: the chat template's text around a user message that follows the model's EOS.

    Rendered from the tokenizer's own template, so any ChatML-like format works: for Qwen-style ChatML this is
    ``("\\n<|im_start|>user\\n", "<|im_end|>\\n<|im_start|>assistant\\n")``.
    """
    user_mark, model_mark = "\x00", "\x01"
    convo = [{"role": "user", "content": "q"}, {"role": "assistant", "content": model_mark}]
    full = tokenizer.apply_chat_template(
        [*convo, {"role": "user", "content": user_mark}], add_generation_prompt=True, tokenize=False,
        **chat_template_kwargs,
    )  # fmt: skip
    head, after = full.split(user_mark, 1)
    between = head.split(model_mark, 1)[1]
    eos = tokenizer.eos_token or ""
    before = between[len(eos) :] if between.startswith(eos) else between
    return before, after


ROLLOUTS = {"branch": BranchRollout, "window": WindowRollout}


def make_rollout(config: RolloutConfig, interface: EnvInterface | None = None) -> BranchRollout | WindowRollout:
    """The rollout function for ``config.mode``."""
    return ROLLOUTS[config.mode](config, interface)

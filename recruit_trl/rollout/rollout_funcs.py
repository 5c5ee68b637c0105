"""TRL ``rollout_func`` implementations that wrap a multi-step environment.

``branch`` mode (default). Each prompt is an anchor (a state somewhere in an episode). The rollout renders
the state as a compact chat prompt, samples one action per repeated row with the current policy, and scores
every sampled action from the *same* snapshot: apply it, then play ``horizon`` more days with a continuation
policy, ``continuation_seeds`` times with different randomness, and average. The environment RNG is re-seeded
every simulated day from (anchor, optimizer step, rollout seed, continuation, day), so every row of a group
faces the same randomness on the same day, even after actions that drew different amounts of it and even when
TRL splits the group across processes (common random numbers, :mod:`recruit_trl.rollout.continuation`: the comparison
inside a group is fair and nothing is clairvoyant across groups). The outcome is therefore a function of (anchor,
step, action): rows of a group that sampled the same action share one computation. With ``self_horizon`` D > 0 the
policy itself (greedy) plays the first D days after the sampled action, every branch in its own environment and all
of them in lock-step, before the continuation policy takes over: a continuation policy forgives what the policy
would leave undone.

``episode`` mode (:class:`EpisodeRollout`). The policy's own episodes, G per anchor with common random numbers;
every decision is a row (prompt and answer) with its own advantage (:mod:`recruit_trl.rollout.advantages`), trained on
by :class:`recruit_trl.training.trainer.RecruitGRPOTrainer` (``episode_advantages=True``). A row's scored steps are the
decision's own step (the last decision's also the continuation's): the reward functions on it are the decision's step
reward, and an episode's outcome is the sum of its step rewards.

Both return ``prompt_ids``, ``completion_ids``, ``logprobs`` and extra per-row fields that reward functions
receive as keyword arguments: every environment reward component summed over the scored steps, ``valid``
(1.0 when the model's text parsed under the action contract), ``action_shaping`` (``None`` for invalid
rows), ``final_score`` (``None`` unless the episode ended inside the scored steps), ``potential_change`` (the change
of the environment's ``potential`` over the scored steps; ``None`` without one), ``action_type``,
``action_error``, ``scored_steps`` and ``teacher_match`` (with ``reward_teacher`` set: 1.0 when the model's action does
what that policy would do in the same state; ``None`` without a teacher).

Invalid model output never raises: the environment interface's fallback action is played instead and the
row is counted (``rollout/fallback_rate``). Collapse and cost metrics are logged through the trainer, and for an
interface with ``rate_metrics`` (e.g. conquest's ``win``) the share of scored rows whose game ends with it
(``rollout/win_rate``: where the sampled action and the continuation lead).

The settings live in :mod:`recruit_trl.rollout.config` and the continuation machinery in
:mod:`recruit_trl.rollout.continuation`; both are re-exported here.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from recruit_trl.contracts import ParsedAction, answer_texts, build_messages, digest, parse_action
from recruit_trl.models.generation import LEGAL_FIELD, answer_token_ids, encode_prompt, sample
from recruit_trl.models.policy import policy_for_generation, trainer_generation_config
from recruit_trl.protocol import (
    Action,
    EnvInterface,
    get_env_interface,
    policy_action,
)
from recruit_trl.rollout.advantages import AdvantageWeights, decision_advantages
from recruit_trl.rollout.anchors import Anchor, AnchorCache, AnchorState, anchor_from_prompt
from recruit_trl.rollout.config import ROW_FIELDS, RolloutConfig
from recruit_trl.rollout.continuation import Branch, Scorer, add_components, day_seed, group_seed, last
from recruit_trl.traces import same_action
from rewards import (
    DEFAULT_REWARD_WEIGHTS,
    DEFAULT_REWARDS,
    SUM_THEN_NORMALIZE,
    RewardFunc,
    call_reward_funcs,
    get_reward_funcs,
    unscorable_as_zero,
)


class _RolloutBase:
    """What both modes share: the environment, the anchors' states, prompts, generation and metrics."""

    def __init__(self, config: RolloutConfig, interface: EnvInterface | None = None, seed: int = 0) -> None:
        self.config = config
        self.seed = seed  # mixed into every group's environment seed (common random numbers within a group)
        self.interface = interface or get_env_interface(self.config.env_name)
        self.cache = AnchorCache(self.interface, recent_k=self.config.recent_k)
        self.scorer = Scorer(self.interface, self.config, self.cache)
        self.teacher = self.interface.get_policy(self.config.reward_teacher) if self.config.reward_teacher else None
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
                "with recruit_trl.rollout.anchors.build_anchors, which leaves them out, or use earlier days"
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

    def _rates(self, ends: list[tuple[dict, dict]]) -> dict[str, float]:
        """The interface's rate metrics (e.g. a win) at the end of scored continuations ``(obs, info)``, averaged;
        empty for an interface without them."""
        names = self.interface.rate_metrics
        if not names or not ends:
            return {}
        values = [self.interface.episode_metrics(obs, info) for obs, info in ends]
        return {name: sum(float(v.get(name, 0.0)) for v in values) / len(values) for name in names}

    def _extra_fields(self, rows: list[dict[str, Any]]) -> dict[str, list]:
        """The per-row fields forwarded to reward functions (one list per field, in row order)."""
        names = (*self.interface.reward_fields, *ROW_FIELDS)
        return {name: [r[name] for r in rows] for name in names}

    def encode_messages(self, tokenizer, messages: list[dict[str, str]]) -> list[int]:
        return encode_prompt(tokenizer, messages, enable_thinking=False)

    def prompt_for(self, tokenizer, anchor: Anchor, state: AnchorState, candidates: Sequence[Action]) -> list[int]:
        key = anchor.key()
        if key not in self._prompt_ids:
            messages = build_messages(self.interface, state.obs, state.recent, self.config.contract, candidates)
            self._prompt_ids[key] = self.encode_messages(tokenizer, messages)
            if len(self._prompt_ids) > 8192:
                self._prompt_ids.pop(next(iter(self._prompt_ids)))
        return self._prompt_ids[key]

    def log_metrics(
        self,
        trainer,
        rows: list[dict],
        seconds: float,
        gen_tokens: int,
        decisions: int,
        prompt_tokens: int = 0,
        trained: int | None = None,
    ) -> None:
        """Collapse and cost metrics, averaged over processes by TRL (``_log_metric``): ``decisions`` the policy
        answered in the call, ``trained`` of them handed to the trainer (default: all)."""
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
        for name in self.interface.rate_metrics:  # e.g. rollout/win_rate: where the rows' games end
            log(f"rollout/{name}_rate", sum(r["rates"].get(name, 0.0) for r in rows) / n)
        log("rollout/action_entropy_normalized", entropy / math.log(max(2, len(self.interface.action_types()))))
        log("rollout/env_time_share", self.scorer.env_seconds / seconds if seconds > 0 else 0.0)
        log("rollout/env_steps_per_row", self.scorer.env_steps / n)
        log("rollout/gen_tokens_per_decision", gen_tokens / max(1, decisions))
        log("rollout/prompt_tokens_per_decision", prompt_tokens / max(1, decisions))
        log("rollout/seconds", seconds)
        log("rollout/decisions", float(decisions))
        log("rollout/decisions_trained", float(decisions if trained is None else trained))

    def _generate(self, trainer, model, tokenizer, generation_config, prompt_ids, candidates):
        """One decision per prompt; with ``constrained_decoding``, only the texts that take one of ``candidates``.

        Returns:
            ``(completion_ids, logprobs, legal)``: ``legal`` is ``None`` for free decoding, else per completion the
            token ids allowed at each of its positions (the trainer's :mod:`recruit_trl.training.legal_logprobs`).
        """
        n_tokens = self.config.decision_tokens
        allowed, legal = None, None
        if self.config.constrained_decoding:
            allowed = [answer_token_ids(tokenizer, answer_texts(self.config.contract, c)) for c in candidates]
            legal = []
        if trainer is None:
            ids, logps = sample(
                model, tokenizer, prompt_ids, generation_config, n_tokens, allowed=allowed, legal=legal
            )
        else:
            with policy_for_generation(trainer) as policy:
                config = generation_config or trainer_generation_config(trainer)
                ids, logps = sample(policy, tokenizer, prompt_ids, config, n_tokens, allowed=allowed, legal=legal)
        return ids, logps, legal


class BranchRollout(_RolloutBase):
    """``rollout_func`` for branch mode: one sampled action per row, scored from the anchor's snapshot.

    Args:
        config: rollout settings; ``config.env_name`` names the environment interface.
        interface: an interface object (overrides ``config.env_name``).
        seed: mixed into every group's environment seed.

    Call it as TRL does: ``rollout(prompts, trainer) -> dict``. It can also be called with
    ``trainer=None`` and explicit ``model``/``tokenizer``/``generation_config`` (tests, benchmarks).
    """

    def __init__(self, config: RolloutConfig, interface: EnvInterface | None = None, seed: int = 0) -> None:
        super().__init__(config, interface, seed)
        self._branch_envs: dict[str, list] = {}  # task -> environments for branches played side by side

    def __call__(self, prompts: list, trainer=None, *, model=None, tokenizer=None, generation_config=None, step=None):
        start = time.perf_counter()
        tokenizer, step, anchors = self._begin(prompts, trainer, tokenizer, step)
        t0 = time.perf_counter()
        states = self._states(anchors)
        candidates = [self.interface.candidate_actions(s.obs) for s in states]
        self.scorer.env_seconds += time.perf_counter() - t0
        prompt_ids = [self.prompt_for(tokenizer, a, s, c) for a, s, c in zip(anchors, states, candidates, strict=True)]

        completion_ids, logprobs, legal = self._generate(
            trainer, model, tokenizer, generation_config, prompt_ids, candidates
        )
        texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
        parsed = [
            parse_action(text, self.config.contract, self.interface, state.obs, cands)
            for state, cands, text in zip(states, candidates, texts, strict=True)
        ]

        self._outcomes: dict[tuple[str, str], dict[str, Any]] = {}  # (anchor, action) -> outcome, this call only
        self._taught: dict[str, Action | None] = {}  # anchor -> the teacher's action, this call only
        if self.config.self_horizon:
            self._self_continued(trainer, model, tokenizer, anchors, states, parsed, step)
        rows = [self._score(a, s, p, step) for a, s, p in zip(anchors, states, parsed, strict=True)]
        out: dict[str, Any] = {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs}
        if legal is not None:
            out[LEGAL_FIELD] = legal
        out.update(self._extra_fields(rows))
        gen_tokens = sum(len(c) for c in completion_ids)
        prompt_tokens = sum(len(p) for p in prompt_ids)
        self.log_metrics(trainer, rows, time.perf_counter() - start, gen_tokens, len(rows), prompt_tokens)
        return out

    @staticmethod
    def _key(anchor: Anchor, action: Action) -> tuple[str, str]:
        return anchor.key(), json.dumps(action, sort_keys=True, default=str)

    def _continuation_seeds(self, anchor: Anchor, step: int) -> list[int]:
        """The seeds of the ``continuation_seeds`` continuations, shared by every row of the anchor's group."""
        base = group_seed(anchor, step, self.seed)
        return [(base + k * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF for k in range(self.config.continuation_seeds)]

    def _branch(self, anchor: Anchor, state: AnchorState, action: Action, seed: int, env=None) -> Branch:
        """Restore the anchor (into ``env``, default the pooled one), play ``action`` on simulated day 0."""
        env = self.scorer.start(anchor, state, seed, env)
        applied, (obs, reward, terminated, truncated, info) = self.scorer.apply(
            env, state.obs, ParsedAction(action, True)
        )
        branch = Branch(env, obs, seed, {name: 0.0 for name in self.interface.reward_fields}, info, start=state.obs)
        add_components(branch.totals, self.interface.step_components(state.obs, applied.action, obs, reward, info))
        branch.applied, branch.error, branch.done = applied, info.get("last_action_error"), terminated or truncated
        branch.recent = last(
            [*state.recent, digest(self.interface, state.day, applied.action, info)], self.config.recent_k
        )
        branch.day = state.day + 1
        return branch

    def _finish(self, branch: Branch, first_day: int) -> None:
        """The continuation policy plays the rest of the horizon from simulated day ``first_day``."""
        days = self.config.horizon - (first_day - 1)
        if not branch.done and days > 0:
            played, last_info, last_obs = self.scorer.continue_(
                branch.env, branch.obs, branch.totals, branch.seed, days, first_day
            )
            branch.played += played
            branch.info = last_info or branch.info
            branch.obs = last_obs

    def _average(self, branches: list[Branch]) -> dict[str, Any]:
        """One outcome from a distinct action's continuations: reward components, final score and scored steps
        averaged; the action's error and the fallback that replaced a rejected action from the first (the
        action's effect does not depend on the seed)."""
        n = len(branches)
        scores = [self.interface.final_score(b.info) for b in branches]
        out: dict[str, Any] = {
            name: sum(b.totals[name] for b in branches) / n for name in self.interface.reward_fields
        }
        out["final_score"] = None if None in scores else sum(scores) / n
        changes = [self.interface.potential_change(b.start, b.obs) for b in branches]
        out["potential_change"] = None if None in changes else sum(changes) / n
        out["rates"] = self._rates([(b.obs, b.info) for b in branches])
        out["action_error"] = branches[0].error
        out["scored_steps"] = sum(b.played for b in branches) / n
        out["rejected"] = None if branches[0].applied.valid else branches[0].applied
        return out

    def outcome(self, anchor: Anchor, state: AnchorState, action: Action, step: int) -> dict[str, Any]:
        """What ``action`` at the anchor leads to, averaged over ``continuation_seeds`` continuations: the GRPO
        reward's outcome, also used to value actions outside training (:mod:`recruit_trl.workflow.decisions.values`).

        Each continuation restores the anchor's snapshot, plays ``action`` (a rejected action plays the fallback) and
        then the continuation policy for the rest of the horizon, re-seeded every simulated day from (anchor, ``step``,
        the rollout's ``seed``, the continuation's number, day): the same arguments give the same outcome. Not cached.

        Returns:
            The averaged reward components (``reward_fields``), ``final_score`` (``None`` when a continuation ends
            before the episode does), ``scored_steps``, ``action_error`` and ``rejected`` (the fallback that replaced a
            rejected action, else ``None``).
        """
        branches = []
        for seed in self._continuation_seeds(anchor, step):
            branch = self._branch(anchor, state, action, seed)
            self._finish(branch, first_day=1)
            branches.append(branch)
        return self._average(branches)

    def _anchor_action(self, policy, anchor: Anchor, state: AnchorState, step: int) -> Action:
        """``policy``'s action in the anchor's state, seeded as the anchor's group (a planner looks ahead from it)."""
        seed = group_seed(anchor, step, self.seed)
        return self.teacher_action(self.scorer.start(anchor, state, seed), state.obs, seed, policy)

    def _cached_outcome(self, anchor: Anchor, state: AnchorState, action: Action, step: int) -> dict[str, Any]:
        """:meth:`outcome`, computed once per (anchor, action) in a call (shared by the rows that sampled it)."""
        key = self._key(anchor, action)
        if key not in self._outcomes:
            self._outcomes[key] = self.outcome(anchor, state, action, step)
        return self._outcomes[key]

    def _self_continued(self, trainer, model, tokenizer, anchors, states, parsed, step) -> None:
        """Outcomes of every distinct (anchor, action) of the call when the policy itself plays the first
        ``self_horizon`` days after the action: greedy, every branch in lock-step (one generate() per day), each
        in its own environment; then the continuation policy plays the rest of the horizon."""
        from transformers import GenerationConfig

        jobs: list[tuple[tuple[str, str], Branch]] = []
        seen: set[tuple[str, str]] = set()
        used: Counter = Counter()  # task -> pooled environments taken by this call
        for anchor, state, p in zip(anchors, states, parsed, strict=True):
            key = self._key(anchor, p.action)
            if key in seen:
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
            ids, _, _ = self._generate(trainer, model, tokenizer, greedy, prompts, candidates)
            for b, c, text in zip(
                active, candidates, tokenizer.batch_decode(ids, skip_special_tokens=True), strict=True
            ):
                choice = parse_action(text, self.config.contract, self.interface, b.obs, c)
                b.env.reseed(day_seed(b.seed, day))
                choice, (obs, reward, terminated, truncated, info) = self.scorer.apply(b.env, b.obs, choice)
                add_components(b.totals, self.interface.step_components(b.obs, choice.action, obs, reward, info))
                b.recent = last([*b.recent, digest(self.interface, b.day, choice.action, info)], self.config.recent_k)
                b.obs, b.info, b.done, b.day, b.played = obs, info, terminated or truncated, b.day + 1, b.played + 1
        by_key: dict[tuple[str, str], list[Branch]] = {}
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
        names = (*self.interface.reward_fields, "final_score", "potential_change", "action_error", "rates")
        row = {name: outcome[name] for name in names}
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


class EpisodeRollout(_RolloutBase):
    """``rollout_func`` for episode mode: the policy's own episodes, every decision a training row with its advantage.

    From each of the first ``episode_groups`` distinct anchors of a call it plays ``num_generations`` episodes of the
    current policy (sampled as in training), all restored from the anchor's snapshot and re-seeded before decision d
    from (anchor, optimizer step, rollout seed, d): episodes that choose the same actions are the same episode (common
    random numbers), so the episodes of a group differ only through the policy's choices. The episodes of all groups
    are played in lock-step, one ``generate()`` per decision. With ``episode_decisions`` K > 0 the policy plays K
    decisions and the continuation policy the rest.

    Every decision has a *step row*: the reward functions' fields of its own step (the environment's reward components,
    ``valid``, ``action_shaping``, ``potential_change``; ``final_score`` only on the episode's last decision, ``None``
    elsewhere). A continuation's steps are the last policy decision's: their components, the potential's change and the
    episode's final score go on its row, as branch mode credits a branch with its continuation. The decision's step
    reward is the weighted sum of the reward functions on its row (:func:`rewards.call_reward_funcs`: called with TRL's
    arguments and summed as TRL sums them in branch mode, with the same functions and weights: the trainer's, else
    ``reward_funcs`` and ``reward_weights`` given here, else the plugin's defaults; a row that no function scores
    counts 0, ``episode/unscorable_steps``), and the episode's outcome is the sum of its step rewards. Every decision
    gets an advantage from them (:func:`recruit_trl.rollout.advantages.decision_advantages`: the outcome against its
    group's other episodes, and the n-step return of the step rewards against decisions at the same state); the call
    returns as many rows as it got prompts, drawn at random from all the decisions (a decision's prompt and answer as
    one row: environment text is prompt, never completion), with the advantage in the ``advantage`` field for
    :class:`recruit_trl.training.trainer.RecruitGRPOTrainer` (``episode_advantages=True``) and the step row's fields
    (so TRL's ``rewards/<name>/mean`` is each function's mean over the drawn decisions' own steps).

    Logged per call: the policy's own outcome, final score and rate metrics over its episodes (``episode/...``, e.g.
    ``episode/win_rate``), the share of groups whose episodes all had the same outcome, the share of decisions in a
    step group, decisions per episode, and the rollout's collapse and cost metrics over the decisions.
    """

    def __init__(
        self,
        config: RolloutConfig,
        interface: EnvInterface | None = None,
        seed: int = 0,
        reward_funcs: Sequence[RewardFunc] | None = None,
        reward_weights: Sequence[float] | None = None,
    ) -> None:
        super().__init__(config, interface, seed)
        self._envs: dict[str, list] = {}  # task -> environments for the episodes played side by side
        self.reward_funcs = list(reward_funcs) if reward_funcs is not None else None
        self.reward_weights = list(reward_weights) if reward_weights is not None else None

    def rewards(self, trainer) -> tuple[list[RewardFunc], list[float]]:
        """The reward functions and their weights: the trainer's (what TRL sums, and logs, for the rows), else this
        rollout's own, else the plugin's defaults (``rewards.DEFAULT_REWARDS``)."""
        if trainer is not None and getattr(trainer, "reward_funcs", None) is not None:
            return list(trainer.reward_funcs), [float(w) for w in trainer.reward_weights]
        if self.reward_funcs is not None:
            return self.reward_funcs, self.reward_weights or [1.0] * len(self.reward_funcs)
        return get_reward_funcs(DEFAULT_REWARDS), list(DEFAULT_REWARD_WEIGHTS)

    def __call__(self, prompts: list, trainer=None, *, model=None, tokenizer=None, generation_config=None, step=None):
        start = time.perf_counter()
        tokenizer, step, anchors = self._begin(prompts, trainer, tokenizer, step)
        size = self._group_size(trainer, anchors)
        distinct = list(dict.fromkeys(a.key() for a in anchors))[: self.config.episode_groups]
        groups = [Anchor.from_key(key) for key in distinct]
        episodes = self.play(trainer, model, tokenizer, generation_config, groups, size, step)
        weights = AdvantageWeights(self.config.episode_weight, self.config.step_weight, self.config.step_horizon)
        decisions, group_stats = [], []
        for g in range(len(groups)):
            group = episodes[g * size : (g + 1) * size]
            advantages, stats = decision_advantages(
                [e["outcome"] for e in group], [e["step_rewards"] for e in group], [e["keys"] for e in group], weights
            )
            group_stats.append(stats)
            for episode, episode_advantages in zip(group, advantages, strict=True):
                for row, advantage in zip(episode["rows"], episode_advantages, strict=True):
                    decisions.append({**row, "advantage": advantage})
        mean_advantage = sum(s["advantage_mean"] * s["decisions"] for s in group_stats) / max(1, len(decisions))
        rng = random.Random(group_seed(groups[0], step, self.seed))
        chosen = rng.sample(decisions, min(len(prompts), len(decisions)))
        chosen += rng.choices(decisions, k=len(prompts) - len(chosen))  # fewer decisions than rows: some twice
        out: dict[str, Any] = {
            "prompt_ids": [r["prompt_ids"] for r in chosen],
            "completion_ids": [r["completion_ids"] for r in chosen],
            "logprobs": [r["logprobs"] for r in chosen],
            "advantage": [r["advantage"] for r in chosen],
        }
        if self.config.constrained_decoding:
            out[LEGAL_FIELD] = [r["legal"] for r in chosen]
        out.update(self._extra_fields(chosen))
        self._log_episodes(trainer, episodes, group_stats, decisions, mean_advantage)
        gen_tokens = sum(len(r["completion_ids"]) for r in decisions)
        prompt_tokens = sum(len(r["prompt_ids"]) for r in decisions)
        self.log_metrics(
            trainer, decisions, time.perf_counter() - start, gen_tokens, len(decisions), prompt_tokens, len(chosen)
        )
        return out

    def _group_size(self, trainer, anchors: list[Anchor]) -> int:
        """Episodes per group: the trainer's ``num_generations``, else how often the first anchor is repeated."""
        if trainer is not None:
            return trainer.num_generations
        return sum(1 for a in anchors if a.key() == anchors[0].key())

    def play(self, trainer, model, tokenizer, generation_config, groups: list[Anchor], size: int, step: int):
        """``size`` episodes of the policy from each anchor of ``groups`` (group after group), in lock-step.

        Returns:
            One dict per episode: ``rows`` (per decision: ``prompt_ids``, ``completion_ids``, ``logprobs``, ``text``
            and its step row, the fields of the reward functions), ``step_rewards`` (the weighted reward functions on
            each step row), ``outcome`` (their sum), ``keys`` (state keys), ``final_score``, ``rates`` and ``ended``
            (the policy or the continuation reached the episode's end).
        """
        fields = self.interface.reward_fields
        episodes = []
        used: Counter = Counter()
        for anchor in groups:
            state = self._states([anchor])[0]
            seed = group_seed(anchor, step, self.seed)
            for _ in range(size):
                pool = self._envs.setdefault(anchor.task, [])
                if used[anchor.task] == len(pool):
                    pool.append(self.interface.make_env(anchor.task))
                env = pool[used[anchor.task]]
                used[anchor.task] += 1
                env.restore(state.snapshot)
                episodes.append({
                    "env": env, "obs": state.obs, "recent": list(state.recent), "day": state.day, "seed": seed,
                    "info": {}, "done": False, "rows": [], "keys": [], "last_before": state.obs,
                })  # fmt: skip
        limit = self.config.episode_decisions
        decision = 0
        while True:
            active = [e for e in episodes if not e["done"] and (limit == 0 or decision < limit)]
            if not active:
                break
            t0 = time.perf_counter()
            candidates = [self.interface.candidate_actions(e["obs"]) for e in active]
            self.scorer.env_seconds += time.perf_counter() - t0
            prompt_ids = [
                self.encode_messages(
                    tokenizer, build_messages(self.interface, e["obs"], e["recent"], self.config.contract, c)
                )
                for e, c in zip(active, candidates, strict=True)
            ]
            ids, logps, legal = self._generate(trainer, model, tokenizer, generation_config, prompt_ids, candidates)
            texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
            legal = legal if legal is not None else [None] * len(ids)
            for e, cands, prompt, completion, lp, allowed, text in zip(
                active, candidates, prompt_ids, ids, logps, legal, texts, strict=True
            ):
                before = e["obs"]
                parsed = parse_action(text, self.config.contract, self.interface, before, cands)
                key = self.interface.state_key(before)
                e["env"].reseed(day_seed(e["seed"], decision))
                parsed, (obs, reward, terminated, truncated, info) = self.scorer.apply(e["env"], before, parsed)
                components = self.interface.step_components(before, parsed.action, obs, reward, info)
                e["rows"].append({
                    "prompt_ids": prompt, "completion_ids": completion, "logprobs": lp, "legal": allowed, "text": text,
                    **{name: float(components.get(name, 0.0)) for name in fields},
                    "valid": 1.0 if parsed.valid else 0.0,
                    "action_shaping": self.interface.action_shaping(before, parsed.action) if parsed.valid else None,
                    "final_score": None, "potential_change": self.interface.potential_change(before, obs),
                    "action_type": self.interface.action_type(parsed.action),
                    "action_error": info.get("last_action_error"), "scored_steps": 1, "teacher_match": None,
                })  # fmt: skip
                e["keys"].append(key)
                e["recent"] = last([*e["recent"], digest(self.interface, e["day"], parsed.action, info)],
                                   self.config.recent_k)  # fmt: skip
                e["obs"], e["info"], e["day"], e["last_before"] = obs, info, e["day"] + 1, before
                e["done"] = terminated or truncated
            decision += 1
        for e in episodes:
            tail = {name: 0.0 for name in fields}  # the continuation's steps, credited to the last decision
            played = 0
            if not e["done"]:  # cut after episode_decisions: the continuation policy plays to the end
                played, info, obs = self.scorer.continue_(
                    e["env"], e["obs"], tail, e["seed"], 1_000_000, first_day=decision
                )
                e["info"], e["obs"] = info or e["info"], obs
            e["final_score"] = self.interface.final_score(e["info"])
            e["rates"] = self._rates([(e["obs"], e["info"])])
            e["ended"] = e["final_score"] is not None
            final = e["rows"][-1]  # the episode's end: its terminal fields and the continuation's steps
            final.update({name: final[name] + tail[name] for name in fields})
            final["scored_steps"] += played
            final["final_score"] = e["final_score"]
            final["potential_change"] = self.interface.potential_change(e["last_before"], e["obs"])
            for row in e["rows"]:
                row["rates"] = e["rates"]  # where the decision's game ends (rollout/<rate>_rate)
        rows = [row for e in episodes for row in e["rows"]]
        # The functions get TRL's arguments as TRL passes them for a branch row of the same start: its anchor key
        # (anchor_dataset's prompt) and the dataset's other columns, the decision's answer and ids, the trainer state.
        starts = [groups[j // size] for j, e in enumerate(episodes) for _ in e["rows"]]
        columns = {name: [getattr(a, name) for a in starts] for name in ("task", "seed", "day", "policy")}
        funcs, weights = self.rewards(trainer)
        totals, _ = call_reward_funcs(
            funcs,
            weights,
            prompts=[a.key() for a in starts],
            completions=[r["text"] for r in rows],
            completion_ids=[r["completion_ids"] for r in rows],
            fields={**columns, **self._extra_fields(rows)},
            trainer_state=getattr(trainer, "state", None),
            log_metric=getattr(trainer, "_log_metric", None),  # not log_extra: TRL's table holds the drawn rows only
            aggregation=getattr(trainer, "multi_objective_aggregation", SUM_THEN_NORMALIZE),
        )
        step_rewards, unscorable = unscorable_as_zero(totals, "episode mode's step rewards")
        if getattr(trainer, "_log_metric", None) is not None:
            trainer._log_metric("episode/unscorable_steps", unscorable / max(1, len(rows)))
        k = 0
        for e in episodes:
            e["step_rewards"] = step_rewards[k : k + len(e["rows"])]
            e["outcome"] = sum(e["step_rewards"])
            k += len(e["rows"])
        return episodes

    def _log_episodes(
        self, trainer, episodes: list[dict], group_stats: list[dict], decisions: list[dict], mean_advantage: float
    ) -> None:
        """The policy's own play over the call's episodes, and the advantages' make-up (``episode/...``;
        ``episode/outcome`` is the episodes' mean outcome, the sum of their step rewards; ``episode/advantage_mean``
        is the decisions' mean advantage, before the trainer centres the rows it trains)."""
        log = getattr(trainer, "_log_metric", None)
        if log is None or not episodes:
            return
        n = len(episodes)
        log("episode/outcome", sum(e["outcome"] for e in episodes) / n)
        scores = [e["final_score"] for e in episodes if e["final_score"] is not None]
        if scores:
            log("episode/final_score", sum(scores) / len(scores))
        for name in self.interface.rate_metrics:
            log(f"episode/{name}_rate", sum(e["rates"].get(name, 0.0) for e in episodes) / n)
        log("episode/decisions", sum(len(e["rows"]) for e in episodes) / n)
        log("episode/zero_variance_groups", sum(s["zero_variance"] for s in group_stats) / len(group_stats))
        log("episode/step_matched_share", sum(s["matched_share"] for s in group_stats) / len(group_stats))
        log("episode/advantage_abs", sum(abs(d["advantage"]) for d in decisions) / max(1, len(decisions)))
        log("episode/advantage_mean", mean_advantage)


ROLLOUTS = {"branch": BranchRollout, "episode": EpisodeRollout}


def make_rollout(
    config: RolloutConfig, interface: EnvInterface | None = None, seed: int = 0
) -> BranchRollout | EpisodeRollout:
    """The rollout function for ``config.mode`` (``seed``: mixed into every group's environment seed)."""
    return ROLLOUTS[config.mode](config, interface, seed)

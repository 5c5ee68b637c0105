"""The planner policy (``planner:model:PATH``): a model proposes, continuations from a snapshot choose.

At every decision the model samples ``candidates`` answers to the state's prompt (at ``temperature``, with the
evaluation's contract, constrained decoding and parser: an answer the parser rejects proposes the fallback action);
each distinct action is applied to a copy of the state (the live environment's snapshot, restored into a scratch
environment of the task) and scored by the final grade after ``continuation_policy`` plays to the episode's end,
averaged over ``continuations`` continuations. The action with the best mean is played (ties: the first sampled).

The continuations of one decision use common random numbers, as branch rollouts do
(:mod:`recruit_trl.rollout.continuation`): continuation ``k`` re-seeds the scratch environment's step RNG every
simulated day from (policy seed, task, reset seed, day of the decision, ``k``), the same for every candidate, so two
candidates' scores differ by their actions, not their luck. The snapshot's own RNG (the true future) is discarded
by that re-seeding, and what else the state holds that the agent does not see is redrawn from the continuation's seed
(:meth:`~recruit_trl.protocol.EnvInterface.resample_hidden`: conquest's undrawn pile and the other seats' hands), so
the planner is not clairvoyant; the live environment is only read, never stepped or re-seeded.

This is one policy-improvement step over the model, the step branch-mode GRPO takes in gradient form, done at test
time: its score is what a perfect update toward the continuation's grades could reach from that model. With one
candidate (or when every sample proposes the same action) nothing is scored and the model's sample is played, so
``candidates=1`` plays the model's own sampled episode.
"""

from __future__ import annotations

import hashlib
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from recruit_trl.protocol import Action, EnvInterface, MultiStepEnv
from recruit_trl.rollout.config import TO_THE_END, RolloutConfig
from recruit_trl.rollout.continuation import Scorer, day_seed

PLANNER_PREFIX = "planner:"


def paired_margin(scores: Sequence[float], reference: Sequence[float]) -> tuple[float, float]:
    """``(mean, standard error)`` of ``scores[k] - reference[k]`` over the continuations ``k`` both played."""
    diffs = [a - b for a, b in zip(scores, reference, strict=False)]
    if len(diffs) < 2:
        return (diffs[0] if diffs else 0.0), math.inf
    return statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs))


def behind(scores: Sequence[float], leader: Sequence[float], race: float) -> bool:
    """Whether an action is clearly behind the leader: its paired difference lies more than ``race`` standard errors
    below zero (below zero at all when every continuation differs by the same amount)."""
    mean, se = paired_margin(scores, leader)
    return mean + race * se < 0


def planned_model(policy: str) -> str | None:
    """The model folder of a ``planner:model:PATH`` policy name; ``None`` for any other policy.

    Raises:
        ValueError: for ``planner:`` followed by anything but ``model:PATH``.
    """
    if not policy.startswith(PLANNER_PREFIX):
        return None
    rest = policy[len(PLANNER_PREFIX) :]
    if not rest.startswith("model:") or not rest[len("model:") :]:
        raise ValueError(f"a planner policy is planner:model:PATH (a model proposes its candidates), not {policy!r}")
    return rest[len("model:") :]


def default_continuation(interface: EnvInterface) -> str:
    """The environment's continuation policy (:attr:`recruit_trl.protocol.EnvInterface.continuation_policy`)."""
    return interface.continuation_policy


@dataclass(frozen=True)
class PlannerSettings:
    """How the planner proposes and scores (see the module docstring)."""

    candidates: int = 8
    continuations: int = 4
    continuation_policy: str = ""  # "": the environment's (default_continuation)
    temperature: float = 1.0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if self.candidates < 1 or self.continuations < 1:
            raise ValueError(
                f"the planner needs candidates >= 1 and continuations >= 1 (got {self.candidates}, "
                f"{self.continuations})"
            )
        if self.candidates > 1 and self.temperature <= 0:
            raise ValueError("the planner samples its candidates: give it a temperature > 0 (e.g. 1.0)")


@dataclass(frozen=True)
class Choice:
    """What :meth:`CandidateScorer.choose` decided and what it cost."""

    index: int  # into the proposed actions: the one to play
    means: list[float] | None  # each proposed action's mean score (None: one distinct action, nothing scored)
    scored: int  # distinct actions scored
    env_steps: int  # environment steps their continuations took
    seconds: float


class CandidateScorer:
    """Scores candidate actions in a live environment's state by continuations from its snapshot (one scratch
    environment per task, restored from the snapshot for every continuation)."""

    def __init__(self, interface: EnvInterface, settings: PlannerSettings, policy_seed: int) -> None:
        self.interface = interface
        self.settings = settings
        self.policy_seed = policy_seed
        continuation = settings.continuation_policy or default_continuation(interface)
        config = RolloutConfig(env_name=interface.name or "planner", continuation_policy=continuation)
        self.scorer = Scorer(interface, config, cache=None)  # the branch rollouts' continuation
        self.scratch: dict[str, MultiStepEnv] = {}

    def choose(self, env: MultiStepEnv, actions: list[Action], task: str, seed: int, day: int) -> Choice:
        """Which of ``actions`` to play in ``env``'s current state (task ``task``, reset seed ``seed``, decision
        ``day``). An action the environment rejects scores ``-inf``."""
        keys = [self.interface.action_key(action) for action in actions]
        distinct = list(dict.fromkeys(keys))
        if len(distinct) == 1:
            return Choice(0, None, 0, 0, 0.0)
        start, steps = time.perf_counter(), self.scorer.env_steps
        scores = self.continuation_scores(env.snapshot(), task, actions, seed, day)
        means = {key: sum(values) / len(values) for key, values in scores.items()}
        best = max(distinct, key=lambda key: means[key])  # max keeps the first of equal scores: the first sampled
        return Choice(
            keys.index(best),
            [means[key] for key in keys],
            len(distinct),
            self.scorer.env_steps - steps,
            time.perf_counter() - start,
        )

    def continuation_scores(
        self, snapshot: Any, task: str, actions: list[Action], seed: int, day: int, race: float = 0.0
    ) -> dict[Any, list[float]]:
        """Each distinct action of ``actions`` (by :meth:`~recruit_trl.protocol.EnvInterface.action_key`) -> its final
        grades over the ``continuations`` continuations from ``snapshot`` (task ``task``, reset seed ``seed``,
        decision ``day``): continuation ``k`` uses the same seed for every action (common random numbers), so the
        lists are paired.

        With ``race > 0`` the actions race: from the third continuation on, an action whose paired difference from
        the current leader (the best mean so far) lies more than ``race`` standard errors below zero plays no further
        continuation, and its list stops there; the first action (the policy's own choice, whose margin is measured)
        always plays them all."""
        scratch = self.scratch.get(task)
        if scratch is None:
            scratch = self.scratch[task] = self.interface.make_env(task)
        first: dict[Any, Action] = {}
        for action in actions:
            first.setdefault(self.interface.action_key(action), action)
        scores: dict[Any, list[float]] = {key: [] for key in first}
        live, own = list(first), next(iter(first))
        for k in range(self.settings.continuations):
            continuation = self._seed(task, seed, day, k)
            for key in live:
                scores[key].append(self._play_out(scratch, snapshot, first[key], continuation))
            if race > 0 and k >= 2 and len(live) > 1:
                leader = max(live, key=lambda key: sum(scores[key]) / len(scores[key]))
                live = [key for key in live if key in (leader, own) or not behind(scores[key], scores[leader], race)]
        return scores

    def _play_out(self, scratch: MultiStepEnv, snapshot: Any, action: Action, seed: int) -> float:
        """The final grade of ``action`` played in the snapshot's state, continued to the end under seed ``seed``
        (which also redraws what the agent cannot see: :meth:`~recruit_trl.protocol.EnvInterface.resample_hidden`)."""
        scratch.restore(snapshot)
        scratch.reseed(day_seed(seed, 0))
        self.interface.resample_hidden(scratch, day_seed(seed, -1))
        try:
            new_obs, _, terminated, truncated, info = scratch.step(action)
        except ValueError:
            return -math.inf
        self.scorer.env_steps += 1
        if not (terminated or truncated):
            _, info, _ = self.scorer.continue_(scratch, new_obs, {}, seed, TO_THE_END, first_day=1)
        score = self.interface.final_score(info)
        if score is None:
            raise RuntimeError(
                f"the continuation of {self.interface.name!r} ended without a final score: the planner scores whole "
                "episodes (final_score of the last step's info)"
            )
        return float(score)

    def _seed(self, task: str, seed: int, day: int, k: int) -> int:
        """Continuation ``k``'s seed at this decision: the same for every candidate (common random numbers)."""
        text = f"planner|{self.policy_seed}|{task}|{seed}|{day}|{k}"
        return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")

"""Planner labels on a model's own states: at each state the model reaches playing greedily, which of its proposals
the planner's continuations prefer, by how much over the model's own greedy choice, and how sure that is.

At a state the model answers greedily once (its own choice) and samples ``candidates`` more answers (its
proposals, as the planner policy samples them); each distinct action is played in a copy of the state and continued
to the end by the environment's continuation policy, ``continuations`` times, with common random numbers (the same
re-seeded dice for every action at continuation ``k``: :class:`~recruit_trl.workflow.evaluation.planner.
CandidateScorer`). The best proposal is the one with the highest mean final score; its margin is the mean over the
continuations of (best - greedy), paired, and its standard error the spread of those differences over
``sqrt(continuations)``. A state whose best action is the greedy one has margin 0.

The best proposal is picked on the same continuations that measure its margin, so the margin is biased upward when
several proposals are close (the winner's curse); a filter of ``k`` standard errors keeps the labels that stand out
from that noise. What the continuations may not know is redrawn in each of them
(:meth:`~recruit_trl.protocol.EnvInterface.resample_hidden`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recruit_trl.contracts import answer_texts, build_messages, parse_index
from recruit_trl.models.loading import load_for_inference
from recruit_trl.protocol import EnvInterface
from recruit_trl.rollout.anchors import Anchor, AnchorState
from recruit_trl.traces import trace_row
from recruit_trl.workflow.evaluation.evaluate import MAX_NEW_TOKENS
from recruit_trl.workflow.evaluation.planner import CandidateScorer, PlannerSettings, paired_margin


@dataclass(frozen=True)
class LabelSettings:
    """How a state is labelled: ``candidates`` sampled proposals besides the greedy answer, each distinct action
    scored by ``continuations`` continuations of ``continuation_policy`` ("": the environment's); with ``race`` > 0
    a proposal more than ``race`` standard errors behind the leader stops early
    (:meth:`~recruit_trl.workflow.evaluation.planner.CandidateScorer.continuation_scores`)."""

    candidates: int = 8
    continuations: int = 8
    continuation_policy: str = ""
    temperature: float = 1.0
    top_p: float = 1.0
    race: float = 0.0

    def __post_init__(self) -> None:
        if self.candidates < 1 or self.continuations < 2:
            raise ValueError(
                f"labels need candidates >= 1 and continuations >= 2 (a standard error), got {self.candidates}, "
                f"{self.continuations}"
            )
        if self.temperature <= 0:
            raise ValueError("the proposals are sampled: give them a temperature > 0 (e.g. 1.0)")


def clears(row: Mapping[str, Any], k: float) -> bool:
    """Whether a labelled state's best proposal beats the greedy choice by at least ``k`` standard errors (and by
    more than nothing: a state whose best is the greedy answer clears no margin above 0)."""
    return row["margin"] > 0 and row["margin"] >= k * row["se"]


def answers(
    model: Any,
    tokenizer: Any,
    messages: Sequence[list[dict[str, str]]],
    counts: Sequence[int],
    config: Any,
    repeat: int = 1,
    batch_size: int = 64,
) -> list[int]:
    """The candidate index the model answers to each prompt (``messages[i]``, listing ``counts[i]`` candidates),
    ``repeat`` times each in a row, decoding with the generation ``config`` constrained to the legal answers."""
    from recruit_trl.models.generation import answer_token_ids, encode_prompt, sample

    prompts = [encode_prompt(tokenizer, m, enable_thinking=False) for m in messages for _ in range(repeat)]
    allowed = [answer_token_ids(tokenizer, answer_texts("index", range(n))) for n in counts for _ in range(repeat)]
    ids, _ = sample(model, tokenizer, prompts, config, MAX_NEW_TOKENS["index"], batch_size, allowed=allowed)
    picks = [
        parse_index(text, n)[0]
        for text, n in zip(
            tokenizer.batch_decode(ids, skip_special_tokens=True),
            [n for n in counts for _ in range(repeat)],
            strict=True,
        )
    ]
    if any(k is None for k in picks):  # constrained decoding writes only legal answers
        raise RuntimeError("a constrained answer did not parse: the answer tree and the parser disagree")
    return picks  # type: ignore[return-value]


def greedy_choices(model: Any, tokenizer: Any, rows: Sequence[Mapping[str, Any]], batch_size: int = 64) -> list[int]:
    """The model's greedy (constrained) candidate index for each labelled row's prompt."""
    from transformers import GenerationConfig

    counts = [len(r["candidate_types"]) for r in rows]
    return answers(model, tokenizer, [r["messages"] for r in rows], counts, GenerationConfig(do_sample=False),
                   batch_size=batch_size)  # fmt: skip


def label_states(
    interface: EnvInterface,
    model_path: str,
    states: Mapping[Anchor, AnchorState],
    settings: LabelSettings,
    *,
    model_loading: dict | None = None,
    batch_size: int = 64,
    policy_seed: int = 0,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """One labelled row per state (index contract, constrained decoding): :func:`recruit_trl.traces.trace_row`
    answering with the best proposal, plus ``greedy`` and ``best`` (candidate indices), ``margin`` and ``se`` (see
    the module docstring), ``means`` (each scored candidate index -> its mean score), ``scored`` (distinct actions),
    ``env_steps`` and ``seconds``.

    ``states`` come from :func:`recruit_trl.workflow.evaluation.evaluate.record_anchors` (their ``recent`` digest is
    what the prompt shows)."""
    import torch
    from transformers import GenerationConfig

    model, tokenizer = load_for_inference(model_path, model_loading)
    items = sorted(states.items(), key=lambda item: (item[0].task, item[0].seed, item[0].day))
    candidates = [interface.candidate_actions(state.obs) for _, state in items]
    messages = [
        build_messages(interface, state.obs, state.recent, "index", cands)
        for (_, state), cands in zip(items, candidates, strict=True)
    ]
    counts = [len(c) for c in candidates]
    greedy = answers(model, tokenizer, messages, counts, GenerationConfig(do_sample=False), batch_size=batch_size)
    torch.manual_seed(policy_seed)
    top_p = settings.top_p if settings.top_p < 1 else None
    sampled = GenerationConfig(do_sample=True, temperature=settings.temperature, top_p=top_p, top_k=None)
    n = settings.candidates
    proposed = answers(model, tokenizer, messages, counts, sampled, repeat=n, batch_size=batch_size)
    planner = PlannerSettings(
        candidates=n + 1,
        continuations=settings.continuations,
        continuation_policy=settings.continuation_policy,
        temperature=settings.temperature,
        top_p=settings.top_p,
    )
    scorer = CandidateScorer(interface, planner, policy_seed)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(items), desc="planner labels", unit="state")
    rows = []
    for j, (anchor, state) in enumerate(items):
        cands = candidates[j]
        picks = list(dict.fromkeys([greedy[j], *proposed[j * n : (j + 1) * n]]))  # the greedy answer first
        started, steps = time.perf_counter(), scorer.scorer.env_steps
        scores = scorer.continuation_scores(state.snapshot, anchor.task, [cands[k] for k in picks], anchor.seed,
                                            anchor.day, race=settings.race)  # fmt: skip
        by_pick = {k: scores[interface.action_key(cands[k])] for k in picks}
        means = {k: statistics.fmean(values) for k, values in by_pick.items()}
        finished = [k for k in picks if len(by_pick[k]) == settings.continuations]  # not left behind by the race
        best = max(finished, key=lambda k: means[k])  # ties: the greedy answer, then the first sampled
        margin, se = paired_margin(by_pick[best], by_pick[greedy[j]]) if best != greedy[j] else (0.0, 0.0)
        row = trace_row(interface, messages[j], cands, cands[best], "index", anchor.task, anchor.seed, anchor.day)
        row.update(
            greedy=greedy[j],
            best=best,
            margin=margin,
            se=se,
            means={str(k): mean for k, mean in means.items()},
            scored=len(picks),
            continuations={str(k): len(values) for k, values in by_pick.items()},
            env_steps=scorer.scorer.env_steps - steps,
            seconds=time.perf_counter() - started,
        )
        rows.append(row)
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    return rows


def margin_counts(rows: Sequence[Mapping[str, Any]], ks: Sequence[float] = (1, 2, 3)) -> dict[str, Any]:
    """How many labelled states there are, how many have a best proposal other than the greedy answer, and how many
    clear a margin of ``k`` standard errors, for each ``k``."""
    return {
        "states": len(rows),
        "best_not_greedy": sum(r["best"] != r["greedy"] for r in rows),
        **{f"clear_{k}se": sum(clears(r, k) for r in rows) for k in ks},
    }

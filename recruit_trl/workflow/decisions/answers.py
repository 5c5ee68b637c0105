"""The answers of a model or an environment policy to the decisions of a decision set, and the actions they play.

A model answers every decision's prompt greedily (:func:`model_answers`, batched by :func:`greedy_answers`); an
environment policy's action is written as the answer that takes it (:func:`action_answer`); an answer plays the action
it parses to, or the interface's fallback (:func:`answer_actions`), as in the rollouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from recruit_trl.contracts import MAX_NEW_TOKENS, answer_texts, completion_text, parse_action
from recruit_trl.models.generation import answer_token_ids, encode_prompt, sample
from recruit_trl.models.loading import load_for_inference
from recruit_trl.protocol import Action, EnvInterface
from recruit_trl.traces import match_candidate
from recruit_trl.workflow.decisions.decision_set import Decision


def greedy_answers(
    model,
    tokenizer,
    prompts: Sequence[list[dict[str, str]]],
    contract: str,
    *,
    candidates: Sequence[Sequence[Action]] | None = None,
    batch_size: int = 8,
    progress: bool = True,
) -> list[str]:
    """A model's greedy answer to each chat prompt (decoded text, special tokens dropped), in the prompts' order.

    Prompts are rendered as the rollouts render them (chat template, generation prompt, no thinking) and batched by
    length (left padding, as :func:`recruit_trl.models.generation.sample` pads), so a batch wastes little on padding.

    Args:
        prompts: chat messages per prompt.
        contract: the action contract (sets the answer's token budget, and the legal answers when constrained).
        candidates: per prompt, the listed candidates: the model can then only write one of their answers
            (constrained decoding); ``None`` for free decoding.
        batch_size: prompts per ``generate`` call.
        progress: show a progress bar over the batches.
    """
    from tqdm.auto import tqdm
    from transformers import GenerationConfig

    greedy = GenerationConfig(do_sample=False, temperature=None, top_p=None, top_k=None)
    ids = [encode_prompt(tokenizer, messages, enable_thinking=False) for messages in prompts]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    texts: list[str] = [""] * len(ids)
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    for batch in tqdm(batches, desc="generating", unit="batch", disable=not progress):
        allowed = None
        if candidates is not None:
            allowed = [answer_token_ids(tokenizer, answer_texts(contract, candidates[i])) for i in batch]
        out, _ = sample(
            model, tokenizer, [ids[i] for i in batch], greedy, MAX_NEW_TOKENS[contract], len(batch), allowed=allowed
        )
        for i, text in zip(batch, tokenizer.batch_decode(out, skip_special_tokens=True), strict=True):
            texts[i] = text
    return texts


def model_answers(
    model_or_path: Any,
    decisions: Sequence[Decision],
    *,
    tokenizer=None,
    batch_size: int = 8,
    constrained: bool = False,
    progress: bool = True,
) -> list[str]:
    """The model's greedy answer to every decision's prompt (:func:`greedy_answers`), in the decisions' order.

    Args:
        model_or_path: a loaded causal LM (then ``tokenizer`` is required), or a local folder holding a full model or
            a LoRA adapter (loaded by :func:`recruit_trl.models.loading.load_for_inference`).
        decisions: the rows (each carries its prompt, candidates and contract; one contract for all).
        batch_size: prompts per ``generate`` call.
        constrained: the model can only write one of the listed answers (constrained decoding).
        progress: show a progress bar over the batches.
    """
    if isinstance(model_or_path, str):
        model, tokenizer = load_for_inference(model_or_path)
    elif tokenizer is None:
        raise ValueError("model_answers needs the tokenizer of a loaded model")
    else:
        model = model_or_path
    contracts = {d.contract for d in decisions}
    if len(contracts) > 1:
        raise ValueError(f"decisions of several action contracts: {sorted(contracts)}")
    return greedy_answers(
        model, tokenizer, [d.messages for d in decisions], contracts.pop() if contracts else "index",
        candidates=[d.candidates for d in decisions] if constrained else None, batch_size=batch_size,
        progress=progress,
    )  # fmt: skip


def answer_actions(interface: EnvInterface, decisions: Sequence[Decision], answers: Sequence[str]) -> list[Action]:
    """The actions the answers play: the parsed action, or the interface's fallback for an answer that does not
    parse under the contract (as in the rollouts)."""
    return [
        parse_action(text, d.contract, interface, d.state.obs, d.candidates).action
        for d, text in zip(decisions, answers, strict=True)
    ]


def action_answer(interface: EnvInterface, decision: Decision, action: Action) -> str:
    """The answer that takes an environment policy's ``action`` ("" when the candidates do not list it)."""
    k = match_candidate(interface, action, decision.candidates)
    return "" if k is None else completion_text(decision.candidates[k], decision.contract, decision.candidates)

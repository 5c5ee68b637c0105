"""A vLLM logits processor that keeps each request on its answer tree: constrained decoding in one ``generate`` call.

A request names its tree in ``SamplingParams.extra_args[ANSWER_TREE]`` (a
:func:`recruit_trl.models.generation.prefix_tree`). Before every sampling step the processor walks the tree along the
request's output tokens and sets every logit outside the node's children to ``-inf``: a forced token then has
probability 1, and at a branch the token is drawn from the model's distribution renormalised over the legal children
(vLLM applies the temperature after this mask, and its ``processed_logprobs`` are those of that distribution). The
engine is built with it (:func:`recruit_trl.models.vllm_engine.start_engine`); requests without a tree are untouched.
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

ANSWER_TREE = "recruit_trl_answer_tree"


class AnswerTreeLogitsProcessor(LogitsProcessor):
    """Masks each request's logits to the children of its position in its answer tree (see the module docstring)."""

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.requests: dict[int, tuple[dict, list[int]]] = {}  # batch index -> (tree, the live output tokens)

    def is_argmax_invariant(self) -> bool:
        return False  # it changes what greedy decoding picks

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        def new_state(params, prompt_ids, output_ids):
            tree = (params.extra_args or {}).get(ANSWER_TREE)
            return None if tree is None else (tree, output_ids)

        process_dict_updates(self.requests, batch_update, new_state)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for row, (tree, output_ids) in self.requests.items():
            node = tree
            for token in output_ids:
                node = node.get(token, {})
            keep = torch.tensor(sorted(node), dtype=torch.long, device=logits.device)
            allowed = logits[row, keep]
            logits[row] = float("-inf")
            logits[row, keep] = allowed
        return logits

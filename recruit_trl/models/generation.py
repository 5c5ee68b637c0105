"""Batched sampling with a Hugging Face causal LM: token ids plus per-token log-probabilities.

Used by the rollout functions (with the trainer's current policy, unwrapped for DDP / DeepSpeed ZeRO-3) and
by evaluation (many episodes in lock-step). Log-probabilities come from the *processed* scores (after
temperature / top-p), i.e. the distribution the tokens were actually sampled from.

Constrained decoding (``allowed=``): each prompt may carry the token sequences of its legal answers (for the index
contract, ``{"action_index": k}`` for every listed candidate; see :func:`answer_token_ids`), and generation is then
restricted to a prefix of one of them followed by an end token: a masked token is never sampled, so every answer
parses. The log-probabilities are those of the masked (renormalised) distribution the tokens were drawn from, and
``legal=`` returns, per completion token, the tokens the mask allowed there, so a trainer can compute the same
distribution (:mod:`recruit_trl.training.legal_logprobs`).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Sequence

import torch
from transformers import Cache, GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase


def eos_ids(tokenizer: PreTrainedTokenizerBase, generation_config: GenerationConfig | None = None) -> set[int]:
    ids = set()
    if generation_config is not None and generation_config.eos_token_id is not None:
        eos = generation_config.eos_token_id
        ids.update(eos if isinstance(eos, list | tuple) else [eos])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


LEGAL_FIELD = "legal_token_ids"  # the rollout field of constrained rows: per completion token, the ids allowed there

TokenSequences = list[list[int]]  # the token ids of the answers one prompt may be completed with


def encode_prompt(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], **template_kwargs) -> list[int]:
    """The token ids of a chat prompt, ending with the generation prompt (``template_kwargs``: chat template
    options such as ``enable_thinking``)."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **template_kwargs)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def answer_token_ids(tokenizer: PreTrainedTokenizerBase, answers: Sequence[str]) -> TokenSequences:
    """The token ids of each answer text, as the model writes it after the generation prompt."""
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in answers]


def prefix_tree(sequences: TokenSequences, ends: set[int]) -> dict:
    """The answers' token sequences as a trie of nested dicts, each answer followed by any of the ``ends`` tokens."""
    root: dict = {}
    for seq in sequences:
        node = root
        for tok in seq:
            node = node.setdefault(tok, {})
        for end in ends:
            node.setdefault(end, {})
    return root


def legal_per_position(tree: dict, completion: Sequence[int]) -> list[list[int]]:
    """The tokens the prefix tree allowed before each token of ``completion`` (empty once it leaves the tree)."""
    out, node = [], tree
    for tok in completion:
        out.append(sorted(node) if node is not None else [])
        node = node.get(tok) if node is not None else None
    return out


def _allowed_tokens_fn(trees: list[dict], width: int, pad_id: int):
    """``prefix_allowed_tokens_fn`` for ``generate``: the tokens that keep row ``i`` on a path of ``trees[i]``."""

    def allowed(row: int, input_ids: torch.Tensor) -> list[int]:
        node = trees[row]
        for tok in input_ids[width:].tolist():
            node = node.get(tok)
            if node is None:  # only after the end token (the row is finished and padded)
                return [pad_id]
        return list(node) or [pad_id]

    return allowed


@torch.no_grad()
def sample(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt_ids: Sequence[Sequence[int]],
    generation_config: GenerationConfig,
    max_new_tokens: int,
    chunk_size: int = 64,
    allowed: Sequence[TokenSequences] | None = None,
    unchanged: list[bool | None] | None = None,
    legal: list[list[list[int]]] | None = None,
) -> tuple[list[list[int]], list[list[float]]]:
    """Sample one completion per prompt (left-padded batches of ``chunk_size``), with a Hugging Face model or a
    :class:`recruit_trl.models.vllm_engine.VLLMPolicy` (the same contract, through vLLM).

    Free decoding runs ``model.generate``. Constrained decoding (``allowed``) walks the answers' prefix tree instead
    (:func:`decode_tree`): the model runs only where the tree branches, a forced token costs nothing, and the answer
    is drawn from the same masked distribution ``generate`` with ``prefix_allowed_tokens_fn`` draws from.

    Args:
        allowed: per prompt, the token sequences of its legal answers (constrained decoding); ``None`` for free
            generation.
        unchanged: with ``allowed`` and greedy decoding, filled with one flag per completion: whether the model's
            own greedy choice was allowed at every step, i.e. free decoding would have written the same (legal)
            answer (``None`` when sampling).
        legal: with ``allowed``, filled with one list per completion: for each of its tokens, the token ids the
            constraint allowed at that position (the support of the distribution it was drawn from).

    Returns:
        ``(completion_ids, logprobs)``: each completion is cut after its first EOS token (kept, so TRL sees
        it as terminated) and is never empty; ``logprobs`` has one value per completion token.

    Raises:
        RuntimeError: with ``allowed``, when a sampled token lies outside the legal set of its position
            (:func:`check_in_legal_sets`).
    """
    if getattr(model, "samples_itself", False):  # a VLLMPolicy (recruit_trl.models.vllm_engine imports this module)
        return model.sample(tokenizer, prompt_ids, generation_config, max_new_tokens, allowed, unchanged, legal)
    config = copy.deepcopy(generation_config)
    config.max_new_tokens = max_new_tokens
    stop = eos_ids(tokenizer, config)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(stop))
    config.pad_token_id = pad_id
    if config.eos_token_id is None:
        config.eos_token_id = sorted(stop)
    check_unchanged = unchanged is not None and allowed is not None and not config.do_sample
    completions: list[list[int]] = []
    logprobs: list[list[float]] = []
    for start in range(0, len(prompt_ids), chunk_size):
        batch = prompt_ids[start : start + chunk_size]
        if allowed is None:
            rows = generate_batch(model, batch, config, stop, pad_id)
        else:
            trees = [prefix_tree(seqs, stop) for seqs in allowed[start : start + chunk_size]]
            rows = decode_tree(model, batch, trees, config, pad_id, check_unchanged)
        for ids, logps, allowed_here, same in rows:
            if allowed is not None:
                check_in_legal_sets(len(completions), ids, allowed_here)
            completions.append(ids)
            logprobs.append(logps)
            if unchanged is not None:
                unchanged.append(same if check_unchanged else None)
            if legal is not None and allowed is not None:
                legal.append(allowed_here)
    return completions, logprobs


Decoded = tuple[list[int], list[float], list[list[int]] | None, bool | None]  # ids, logprobs, legal, unchanged


def check_in_legal_sets(row: int, completion: Sequence[int], legal: Sequence[Sequence[int]]) -> None:
    """Refuse a constrained completion with a token outside the legal set of its position: the log-probabilities of
    the rollout and of the loss (:mod:`recruit_trl.training.legal_logprobs`) are over those sets.

    Raises:
        RuntimeError: naming the completion, the position and the token.
    """
    if len(legal) != len(completion):
        raise RuntimeError(f"completion {row}: {len(completion)} tokens but {len(legal)} legal sets")
    for position, (token, allowed) in enumerate(zip(completion, legal, strict=True)):
        if token not in allowed:
            raise RuntimeError(
                f"completion {row}, position {position}: token {token} was sampled outside its legal set {allowed}"
            )


def distinct_rows(rows: Sequence[Sequence[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct token lists of ``rows``, and for each row which of them it is, so a batch can run each once.

    In a GRPO rollout every prompt comes ``num_generations`` times: :func:`decode_tree` and :func:`generate_batch`
    prefill each distinct prompt once and copy its KV cache to the rows that share it (:func:`share_rows`). A
    benchmark measures the per-row path by replacing this function with the identity (``list(range(len(rows)))`` as
    the index). The lists are told apart by their tokens (a dict keyed on tuples keeps them in order).

    Returns:
        ``(distinct, index)``: the distinct lists in the order they first appear, and per row the position of its
        list in ``distinct``.
    """
    positions: dict[tuple[int, ...], int] = {}
    index = [positions.setdefault(tuple(row), len(positions)) for row in rows]
    return [list(row) for row in positions], index


def share_rows(cache: Cache, index: Sequence[int]) -> Cache:
    """``cache``, changed in place, with one batch row per entry of ``index``: row ``i`` a copy of its row
    ``index[i]``.

    Through the public ``reorder_cache`` (an ``index_select`` on the batch dimension of every layer, as beam search
    uses it): every cache layer of transformers 5 has it, recurrent states included, which ``batch_select_indices``
    leaves out.
    """
    cache.reorder_cache(torch.tensor(index, dtype=torch.long))
    return cache


def left_pad(rows: Sequence[Sequence[int]], width: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``rows`` as a ``(len(rows), width)`` batch of token ids, right-aligned after ``pad_id`` tokens, and its
    attention mask (1 on the tokens, 0 on the padding)."""
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, row in enumerate(rows):
        ids[r, width - len(row) :] = torch.tensor(row, dtype=torch.long)
        mask[r, width - len(row) :] = 1
    return ids, mask


@torch.no_grad()
def prefill(model: PreTrainedModel, rows: Sequence[Sequence[int]], width: int, pad_id: int) -> Cache:
    """The KV cache of one forward pass over ``rows``, left-padded to ``width``.

    The positions count each row's tokens from 0, as ``generate`` numbers a left-padded prompt (the padding is
    masked); the logits are computed at the last position only, and not used.
    """
    ids, mask = left_pad(rows, width, pad_id)
    device = next(model.parameters()).device
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    cache_name = cache_argument(model)
    out = model(
        input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
        use_cache=True, logits_to_keep=1, **{cache_name: None},
    )  # fmt: skip
    return getattr(out, cache_name)


@torch.no_grad()
def generate_batch(
    model: PreTrainedModel,
    batch: Sequence[Sequence[int]],
    config: GenerationConfig,
    stop: set[int],
    pad_id: int,
    trees: list[dict] | None = None,
    check_unchanged: bool = False,
) -> list[Decoded]:
    """One left-padded ``model.generate`` call; with ``trees``, constrained by ``prefix_allowed_tokens_fn`` (the
    reference :func:`decode_tree` is checked against).

    Rows that repeat a prompt (a GRPO group's samples) share its prefill: every prompt but its last token runs once
    per distinct prompt (:func:`distinct_rows`, :func:`prefill`), the KV cache is copied to the rows sharing it, and
    ``generate`` gets the full prompts with that cache, so it feeds only the last token before decoding. When all
    prompts differ, ``generate`` prefills as usual.
    """
    config = copy.deepcopy(config)
    config.output_scores = True
    config.return_dict_in_generate = True
    config.output_logits = check_unchanged  # the unprocessed logits: the model's own greedy choice
    device = next(model.parameters()).device
    width = max(len(p) for p in batch)
    input_ids, attention = left_pad(batch, width, pad_id)
    shared = {}
    heads, index = distinct_rows([ids[:-1] for ids in batch])  # the rows are all left-padded to end together
    if len(heads) < len(batch) and width > 1:
        # generate's first forward then computes the logits of the last prompt token, as in its own prefill
        shared[cache_argument(model)] = share_rows(prefill(model, heads, width - 1, pad_id), index)
    constraint = _allowed_tokens_fn(trees, width, pad_id) if trees is not None else None
    out = model.generate(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        generation_config=config,
        prefix_allowed_tokens_fn=constraint,
        synced_gpus=False,  # whole weights (a trainer's are gathered under ZeRO-3): no process waits for another
        **shared,
    )
    new = out.sequences[:, width:].cpu()
    token_logps = torch.stack(
        [torch.log_softmax(s.float(), dim=-1).gather(1, new[:, t : t + 1].to(s.device)).squeeze(1).cpu()
         for t, s in enumerate(out.scores)],
        dim=1,
    )  # fmt: skip
    own = torch.stack([logits.argmax(-1).cpu() for logits in out.logits], dim=1) if check_unchanged else None
    rows: list[Decoded] = []
    for row in range(len(batch)):
        ids = new[row].tolist()
        end = max(1, next((k + 1 for k, tok in enumerate(ids) if tok in stop), len(ids)))
        rows.append((
            ids[:end],
            token_logps[row, :end].tolist(),
            legal_per_position(trees[row], ids[:end]) if trees is not None else None,
            own[row, :end].tolist() == ids[:end] if own is not None else None,
        ))  # fmt: skip
    return rows


def branch_logprobs(scores: torch.Tensor, config: GenerationConfig) -> torch.Tensor:
    """The distribution ``generate`` draws from among a branch's legal tokens, given their logits ``scores``: after
    the mask come temperature, top-k and top-p when sampling (``-inf`` for the tokens they cut); greedy, the masked
    logits as they are. Log-probabilities, one per legal token."""
    scores = scores.float()
    if config.do_sample:
        scores = scores / (config.temperature or 1.0)
        if config.top_k and config.top_k < scores.numel():
            kth = torch.topk(scores, config.top_k).values[-1]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        if config.top_p is not None and config.top_p < 1.0:
            ordered, order = torch.sort(scores)  # ascending, as transformers' TopPLogitsWarper
            drop = ordered.softmax(-1).cumsum(-1) <= (1 - config.top_p)
            drop[-1] = False  # at least one token stays
            scores = scores.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    return torch.log_softmax(scores, dim=-1)


def _choose(scores: torch.Tensor, config: GenerationConfig) -> tuple[int, float]:
    """The index of the legal token picked (sampled, or the first highest logit) and its log-probability."""
    logps = branch_logprobs(scores, config)
    pick = int(torch.multinomial(logps.exp(), 1)) if config.do_sample else int(torch.argmax(scores))
    return pick, float(logps[pick])


def cache_argument(model: PreTrainedModel) -> str:
    """The name of the KV-cache argument of ``model``'s forward (and of its output): ``cache`` in recent transformers
    5 releases, ``past_key_values`` before (vLLM's CPU build pins transformers < 5.18)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


@torch.no_grad()
def decode_tree(
    model: PreTrainedModel,
    batch: Sequence[Sequence[int]],
    trees: list[dict],
    config: GenerationConfig,
    pad_id: int,
    check_unchanged: bool = False,
) -> list[Decoded]:
    """Constrained decoding by walking each prompt's answer tree, running the model only where it branches.

    A node with one child appends that token (log-probability 0 under the masked distribution) without a forward
    pass. At a branch, the tokens since the last pass are fed in one forward (the first pass: the prompt and the
    forced prefix, e.g. ``{"action_index": ``), and the next token is chosen among the node's children as
    ``generate`` would (:func:`_choose`). For the index contract that is one pass per digit plus one for the end
    token, instead of one per answer token. With ``check_unchanged`` every forced token is fed too, so the model's
    own (unconstrained) greedy choice is known at every position.

    Rows whose first feed is the same (a prompt repeated with the same tree, as a GRPO group's samples are) share the
    first pass: it runs on the distinct feeds only (:func:`distinct_rows`), and its KV cache, attention mask and logits
    are then copied to every row, which goes on alone from there. When all feeds differ, the pass is the same as
    without sharing.
    """
    device = next(model.parameters()).device
    n = len(batch)
    ids: list[list[int]] = [[] for _ in range(n)]
    logps: list[list[float]] = [[] for _ in range(n)]
    legal: list[list[list[int]]] = [[] for _ in range(n)]
    own: list[list[int]] = [[] for _ in range(n)]  # the model's argmax before each completion token
    nodes: list[dict] = list(trees)
    unfed: list[list[int]] = [list(p) for p in batch]  # tokens not yet through the model (first the prompt)
    limit = config.max_new_tokens

    def done(r: int) -> bool:
        return not nodes[r] or len(ids[r]) >= limit  # after an end token the node is empty

    def advance(r: int) -> None:  # forced tokens
        while not done(r) and len(nodes[r]) == 1:
            (tok,) = nodes[r]
            ids[r].append(tok), logps[r].append(0.0), legal[r].append([tok])
            unfed[r].append(tok)
            nodes[r] = nodes[r][tok]

    for r in range(n):
        advance(r)
    mask = torch.zeros((n, 0), dtype=torch.long)  # the attention mask of everything fed so far
    cache, cache_name = None, cache_argument(model)
    first = True
    while True:
        # what each row feeds: up to a branch; a finished row only what its unchanged check still needs
        feeds = []
        for r in range(n):
            if not done(r):
                feeds.append(unfed[r])
            elif check_unchanged and len(unfed[r]) > 1:
                feeds.append(unfed[r][:-1])
            else:
                feeds.append([])
        if not any(feeds):
            break
        # the first pass runs each distinct feed once (a GRPO group's samples share the prompt and forced prefix):
        # ``fed`` are the rows through the model, ``index`` (when some are shared) says which one each row reads
        fed, index = feeds, None
        if first:
            distinct, index = distinct_rows(feeds)
            if len(distinct) < n:
                fed = distinct
            else:
                index = None
        width = max(len(f) for f in fed)
        chunk, new_mask = left_pad(fed, width, pad_id)
        mask = new_mask if first else torch.cat([mask, new_mask], dim=1)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -width:]
        # the positions that predict completion tokens, each row's last ones (feeds are right-aligned): when checking,
        # in the first pass the prompt's last and every forced token, later every token fed; else the last one only
        predicting = [
            (len(feed) - len(batch[r]) + 1 if first else len(feed)) if feed and check_unchanged else 1
            for r, feed in enumerate(feeds)
        ]
        keep = max(predicting)
        out = model(
            input_ids=chunk.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
            use_cache=True, logits_to_keep=keep, **{cache_name: cache},
        )  # fmt: skip
        cache = getattr(out, cache_name)
        logits = out.logits[:, -keep:].float().cpu()
        if index is not None:  # back to one row per sample
            cache, logits, mask = share_rows(cache, index), logits[index], mask[index]
        for r, feed in enumerate(feeds):
            if not feed:
                continue
            if check_unchanged:  # the first token fed after the first pass was predicted by the pass before
                own[r].extend(logits[r, keep - predicting[r] :].argmax(-1).tolist())
            unfed[r] = []
            if done(r):
                continue
            children = sorted(nodes[r])
            pick, logp = _choose(logits[r, -1, children], config)
            tok = children[pick]
            ids[r].append(tok), logps[r].append(logp), legal[r].append(children)
            unfed[r].append(tok)
            nodes[r] = nodes[r][tok]
            advance(r)
        first = False
    return [
        (ids[r], logps[r], legal[r], own[r][: len(ids[r])] == ids[r] if check_unchanged else None) for r in range(n)
    ]

"""The rows of a batch that repeat a prompt (a GRPO group's samples) share one prefill, in the tree walk
(``recruit_trl.models.generation.decode_tree``) and through ``generate`` (``generate_batch``): the same completions,
legal sets, "unchanged" flags, log-probabilities and sampled tokens as the per-row path (``distinct_rows`` replaced
by the identity, as the benchmark's baseline does), with each distinct prompt through the model once."""

from __future__ import annotations

import pytest
import torch
from test_tree_decoding import answers_of, states
from transformers import GenerationConfig

from recruit_trl.contracts import build_messages
from recruit_trl.models import generation
from recruit_trl.models.generation import answer_token_ids, encode_prompt, eos_ids, prefix_tree, sample
from recruit_trl.models.loading import load_for_inference
from recruit_trl.protocol import get_env_interface

# (state, whether its tree keeps only the last answer): repeated prompts among distinct ones, of different lengths; a
# prompt with two trees shares its prefill through generate but not its tree walk's first feed
ROWS = [(0, False), (0, False), (1, False), (0, False), (2, False), (2, True), (3, False), (1, False), (4, False),
        (5, False), (5, False), (5, False), (6, True), (6, True), (7, False), (0, True)]  # fmt: skip
PATHS = ["decode_tree", "generate_batch with trees", "generate_batch"]


def per_row(rows):
    """``distinct_rows`` as the identity: every row prefilled on its own, as before the sharing."""
    return [list(row) for row in rows], list(range(len(rows)))


@pytest.fixture(scope="module")
def clinical(warm_model):
    """The warm model, its tokenizer and real clinical prompts with their answers: the contract's (``"index"``) and
    the candidate actions written out (``"actions"``: longer forced prefixes), under the same prompts."""
    model, tokenizer = load_for_inference(warm_model)
    interface = get_env_interface("clinical")
    cases = states("clinical", ["easy_bench", "hard_bench"], range(2), 60, 8)[:8]
    prompts, answers = {}, {}
    for kind in ("index", "actions"):
        prompts[kind] = [encode_prompt(tokenizer, build_messages(interface, o, [], "index", c)) for o, c in cases]
        answers[kind] = [answers_of(kind, c) for _, c in cases]
    assert len({len(p) for p in prompts["index"]}) > 4  # different lengths: left padding
    return model, tokenizer, prompts, answers


def lora(folder):
    """The model saved in ``folder`` (a fresh copy: the adapter's layers go into it) in a LoRA adapter with non-zero
    weights."""
    from peft import LoraConfig, get_peft_model

    model, _ = load_for_inference(folder)
    torch.manual_seed(0)
    config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False, task_type="CAUSAL_LM")
    return get_peft_model(model, config).eval()


def decode(path, model, tokenizer, prompts, answers, rows, do_sample, seed=0):
    """The :data:`PATHS` ``path`` on ``rows`` (see :data:`ROWS`), greedy or sampling from ``seed``."""
    stop = eos_ids(tokenizer, model.generation_config)
    pad_id = tokenizer.pad_token_id
    config = GenerationConfig(do_sample=do_sample, temperature=1.0, top_k=None, top_p=1.0, max_new_tokens=40)
    config.eos_token_id, config.pad_token_id = sorted(stop), pad_id
    batch = [prompts[k] for k, _ in rows]
    trees = [prefix_tree(answer_token_ids(tokenizer, answers[k][-1:] if one else answers[k]), stop) for k, one in rows]
    torch.manual_seed(seed)
    if path == "decode_tree":
        return generation.decode_tree(model, batch, trees, config, pad_id, check_unchanged=not do_sample)
    if path == "generate_batch with trees":
        return generation.generate_batch(model, batch, config, stop, pad_id, trees, check_unchanged=not do_sample)
    return generation.generate_batch(model, batch, config, stop, pad_id)


def assert_same(shared, alone):
    """The same tokens, legal sets and flags, and log-probabilities within 1e-5."""
    assert len(shared) == len(alone)
    for (ids, logps, legal, same), (ref_ids, ref_logps, ref_legal, ref_same) in zip(shared, alone, strict=True):
        assert ids == ref_ids and legal == ref_legal and same == ref_same
        assert logps == pytest.approx(ref_logps, abs=1e-5)


def test_distinct_rows_lists_each_token_list_once_in_order():
    rows = [[5, 6], [7], [5, 6], [], [7], [5], []]
    assert generation.distinct_rows(rows) == ([[5, 6], [7], [], [5]], [0, 1, 0, 2, 1, 3, 2])
    assert generation.distinct_rows([]) == ([], [])


GREEDY_CASES = [  # (path, answers, in a LoRA adapter)
    *[(path, "index", False) for path in PATHS],
    ("decode_tree", "actions", False),  # longer forced prefixes (free decoding does not read the trees)
    ("generate_batch with trees", "actions", False),
    *[(path, "index", True) for path in PATHS],
]


@pytest.mark.parametrize("path, kind, wrapped", GREEDY_CASES)
def test_greedy_decoding_gives_the_per_row_answers(path, kind, wrapped, clinical, warm_model, monkeypatch):
    model, tokenizer, prompts, answers = clinical
    model = lora(warm_model) if wrapped else model
    shared = decode(path, model, tokenizer, prompts[kind], answers[kind], ROWS, do_sample=False)
    monkeypatch.setattr(generation, "distinct_rows", per_row)
    alone = decode(path, model, tokenizer, prompts[kind], answers[kind], ROWS, do_sample=False)
    assert_same(shared, alone)
    if path != "generate_batch" and kind == "index" and not wrapped:  # the answers the warm model learned
        # both values of the unchanged flag compared
        assert {same for *_, same in shared} == {True, False}


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("path", PATHS)
def test_sampling_draws_the_per_row_tokens(path, seed, clinical, monkeypatch):
    model, tokenizer, prompts, answers = clinical
    shared = decode(path, model, tokenizer, prompts["index"], answers["index"], ROWS, do_sample=True, seed=seed)
    monkeypatch.setattr(generation, "distinct_rows", per_row)
    alone = decode(path, model, tokenizer, prompts["index"], answers["index"], ROWS, do_sample=True, seed=seed)
    assert_same(shared, alone)
    assert len({tuple(shared[r][0]) for r in (9, 10, 11)}) > 1  # the rows sharing a prefill draw their own answers


@pytest.mark.parametrize("constrained", [True, False])
def test_sample_shares_the_prefill_of_a_group_split_across_chunks(constrained, clinical, monkeypatch):
    """``sample`` as a rollout calls it: 4 prompts x 4 samples, in chunks of 6 rows."""
    model, tokenizer, prompts, answers = clinical
    prompt_ids = [prompts["index"][k] for k in range(4) for _ in range(4)]
    allowed = [answer_token_ids(tokenizer, answers["index"][k]) for k in range(4) for _ in range(4)]
    config = GenerationConfig(do_sample=True, temperature=1.0, top_k=None, top_p=1.0)

    def run():
        torch.manual_seed(0)
        legal = []
        completions, logprobs = sample(
            model, tokenizer, prompt_ids, config, 40, 6, allowed if constrained else None, legal=legal
        )
        return completions, logprobs, legal

    completions, logprobs, legal = run()
    monkeypatch.setattr(generation, "distinct_rows", per_row)
    ref_completions, ref_logprobs, ref_legal = run()
    assert completions == ref_completions and legal == ref_legal
    for logps, ref_logps in zip(logprobs, ref_logprobs, strict=True):
        assert logps == pytest.approx(ref_logps, abs=1e-5)


class FedTokens:
    """The ``(rows, tokens)`` shape of every batch through the model's input embeddings (one per forward)."""

    def __init__(self, model):
        self.shapes: list[tuple[int, int]] = []
        self.hook = model.get_input_embeddings().register_forward_hook(
            lambda module, args, output: self.shapes.append(tuple(args[0].shape))
        )


@pytest.mark.parametrize("path", PATHS)
def test_the_prefill_runs_once_per_distinct_prompt(path, clinical, monkeypatch):
    model, tokenizer, prompts, answers = clinical
    fed = FedTokens(model)
    try:
        decode(path, model, tokenizer, prompts["index"], answers["index"], ROWS, do_sample=False)
        shared = fed.shapes
        fed.shapes = []
        monkeypatch.setattr(generation, "distinct_rows", per_row)
        decode(path, model, tokenizer, prompts["index"], answers["index"], ROWS, do_sample=False)
        alone = fed.shapes
    finally:
        fed.hook.remove()
    width = max(len(prompts["index"][k]) for k, _ in ROWS)
    if path == "decode_tree":  # the first feed: a prompt and its tree's forced tokens
        assert shared[0][0] == len(set(ROWS)) and alone[0][0] == len(ROWS) and shared[0][1] == alone[0][1] > width
        assert shared[1:] == alone[1:]
    else:  # every prompt but its last token, then generate feeds that token with the cache
        distinct = len({k for k, _ in ROWS})
        assert shared[:2] == [(distinct, width - 1), (len(ROWS), 1)] and alone[0] == (len(ROWS), width)
        assert shared[2:] == alone[1:]


@pytest.mark.parametrize("path", PATHS)
def test_distinct_prompts_take_the_per_row_path(path, clinical, monkeypatch):
    """Nothing shared: the same passes as without sharing, no extra prefill."""
    model, tokenizer, prompts, answers = clinical
    rows = [(k, False) for k in range(8)]
    fed = FedTokens(model)
    try:
        shared = decode(path, model, tokenizer, prompts["index"], answers["index"], rows, do_sample=False)
        shared_shapes, fed.shapes = fed.shapes, []
        monkeypatch.setattr(generation, "distinct_rows", per_row)
        alone = decode(path, model, tokenizer, prompts["index"], answers["index"], rows, do_sample=False)
    finally:
        fed.hook.remove()
    assert shared_shapes == fed.shapes and shared_shapes[0][0] == 8
    assert_same(shared, alone)

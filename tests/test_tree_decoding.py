"""Constrained decoding by walking the answer tree (``recruit_trl.models.generation.decode_tree``) against
``generate`` with ``prefix_allowed_tokens_fn`` (``generate_batch``): the same greedy answers, log-probabilities and
"unchanged" flags on a few hundred real states of each environment, for the contract's answers and for longer ones
(the candidate actions written out); the same sampling distribution as transformers' warpers."""

from __future__ import annotations

import json
import random

import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from recruit_trl.contracts import answer_texts, build_messages
from recruit_trl.models.generation import (
    answer_token_ids,
    branch_logprobs,
    decode_tree,
    encode_prompt,
    eos_ids,
    generate_batch,
    prefix_tree,
)
from recruit_trl.models.loading import load_for_inference
from recruit_trl.protocol import get_env_interface


def states(env: str, tasks: list[str], seeds: range, days: int, every: int) -> list[tuple[dict, list]]:
    """(observation, candidates) every ``every`` days of the fallback agent's episodes."""
    interface = get_env_interface(env)
    out = []
    for task in tasks:
        for seed in seeds:
            env_ = interface.make_env(task)
            obs, _ = env_.reset(seed=seed)
            for day in range(days):
                if day % every == 0:
                    out.append((obs, interface.candidate_actions(obs)))
                obs, _, terminated, truncated, _ = env_.step(interface.fallback_action(obs))
                if terminated or truncated:
                    break
    return out


def answers_of(kind: str, candidates: list) -> list[str]:
    """The texts a tree allows: ``"index"``, the contract's answers; ``"actions"``, the candidate actions written out
    as JSON objects (longer answers with long shared prefixes)."""
    if kind == "index":
        return answer_texts("index", candidates)
    return [json.dumps({k: v for k, v in action.items() if v is not None}) for action in candidates]


CASES = {
    "clinical": lambda: states("clinical", ["easy_bench", "medium_bench", "hard_bench"], range(4), 170, 8),
    "conquest": lambda: states("conquest", ["duel"], range(10), 1000, 1),
}


@pytest.mark.parametrize("kind", ["index", "actions"])
@pytest.mark.parametrize("env", sorted(CASES))
def test_tree_decoding_gives_generates_greedy_answers(env, kind, warm_model):
    model, tokenizer = load_for_inference(warm_model)
    interface = get_env_interface(env)
    cases = CASES[env]()
    if kind == "actions":
        cases = cases[::8]  # longer answers: fewer states
    assert len(cases) >= (200 if kind == "index" else 25)
    prompts = [encode_prompt(tokenizer, build_messages(interface, obs, [], "index", c)) for obs, c in cases]
    stop = eos_ids(tokenizer, model.generation_config)
    pad_id = tokenizer.pad_token_id
    config = GenerationConfig(do_sample=False, max_new_tokens=48 if kind == "index" else 160)
    config.eos_token_id, config.pad_token_id = sorted(stop), pad_id
    mismatched = 0
    for start in range(0, len(cases), 32):
        batch = prompts[start : start + 32]
        answers = [answers_of(kind, c) for _, c in cases[start : start + 32]]
        answers = [texts if k % 3 else texts[-1:] for k, texts in enumerate(answers)]  # a third: one forced answer
        trees = [prefix_tree(answer_token_ids(tokenizer, texts), stop) for texts in answers]
        ours = decode_tree(model, batch, trees, config, pad_id, check_unchanged=True)
        theirs = generate_batch(model, batch, config, stop, pad_id, trees=trees, check_unchanged=True)
        for (ids, logps, legal, same), (ref_ids, ref_logps, ref_legal, ref_same) in zip(ours, theirs, strict=True):
            assert ids == ref_ids and legal == ref_legal and same == ref_same
            assert logps == pytest.approx(ref_logps, abs=1e-4)
            mismatched += not same
    assert mismatched > 0 and (mismatched < len(cases) or kind == "actions")  # the flags' two values compared


def test_a_branch_is_drawn_from_what_transformers_warpers_leave():
    torch.manual_seed(0)
    vocab = torch.randn(50) * 3
    legal = sorted(random.Random(0).sample(range(50), 12))
    for temperature, top_k, top_p in [(1.0, None, 1.0), (0.7, 5, 1.0), (1.3, None, 0.8), (0.5, 4, 0.6)]:
        config = GenerationConfig(do_sample=True, temperature=temperature, top_k=top_k, top_p=top_p)
        masked = torch.full((1, 50), float("-inf"))
        masked[0, legal] = vocab[legal]
        scores = TemperatureLogitsWarper(temperature)(None, masked)
        if top_k:
            scores = TopKLogitsWarper(top_k)(None, scores)
        scores = TopPLogitsWarper(top_p)(None, scores)
        expected = torch.log_softmax(scores, dim=-1)[0, legal]
        assert branch_logprobs(vocab[legal], config).exp().tolist() == pytest.approx(expected.exp().tolist(), abs=1e-6)


def test_the_benchmark_compares_the_current_paths_with_the_baselines_and_profiles_both(
    warm_model, tmp_path, monkeypatch
):
    from recruit_trl.tools import bench_rollout
    from recruit_trl.training.packed_groups import PackedGroups

    flags = [
        "--steps", "2", "--model_name_or_path", warm_model, "--anchor_seeds", "100", "--anchor_days", "0-60:20",
        "--tasks", "easy_bench", "--per_device_train_batch_size", "8", "--num_generations", "4", "--horizon", "2",
    ]  # fmt: skip
    out = tmp_path / "bench.json"
    calls = []
    real = bench_rollout.profiled_train

    def counting(*args):
        from recruit_trl.models import generation

        calls.append((PackedGroups._get_per_token_logps_and_entropies.__name__, generation.distinct_rows.__name__))
        return real(*args)

    monkeypatch.setattr(bench_rollout, "profiled_train", counting)
    argv = [*flags, "--constrained_decoding", "true", "--compare_baseline", "true", "--profile", "true"]
    assert bench_rollout.main([*argv, "--json", str(out)]) == 0
    # the baseline first (every row scored and prefilled on its own), then the packed groups and the shared prefill
    assert calls == [("unpacked", "every_row"), ("_get_per_token_logps_and_entropies", "distinct_rows")]
    report = json.loads(out.read_text())
    for profile in (report["profile"], report["baseline_profile"]):
        assert profile["seconds_per_step"]["total"] > 0 and profile["seconds_per_step"]["prefill"] > 0
        assert 0 <= profile["padding"]["trainer_forward"] < 1
    assert report["baseline"]["decisions_played_per_second"] > 0
    assert report["baseline"]["first_step_peak_memory_mib"] > 0 and report["figures"]["first_step_peak_memory_mib"] > 0
    assert report["ratio"]["decisions_played_per_second"] > 0

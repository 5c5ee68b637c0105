"""Constrained rollouts train on the distribution they sampled from (``recruit_trl.training.legal_logprobs``): the
trainer's log-probabilities over the legal tokens equal the sampler's, in every rollout mode, and equal what the
whole-vocabulary logits give, without computing them."""

from __future__ import annotations

import contextlib
import math
import random

import pytest
import torch
from recipe_files import load_recipe

from recruit_trl.models.generation import LEGAL_FIELD
from recruit_trl.training.legal_logprobs import (
    LEGAL_IDS,
    LegalLogprobs,
    check_legal_ids,
    legal_head_logps_and_entropy,
    legal_id_tensor,
)
from recruit_trl.training.trainer import RecruitGRPOTrainer


def test_log_probabilities_are_renormalised_over_the_legal_tokens_where_there_is_a_choice():
    logits = torch.tensor([[[0.0, 1.0, 2.0, 3.0], [1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 2.0]]])
    tokens = torch.tensor([[2, 0, 3]])
    legal = legal_id_tensor([[[1, 2], [0], []]], width=3)
    assert legal.tolist() == [[[1, 2], [0, -1], [-1, -1]]]
    # the identity as the LM head: the "hidden states" are the logits
    logps, entropy = legal_head_logps_and_entropy(
        logits, torch.nn.Identity(), tokens, legal, 1.0, compute_entropy=True
    )
    p = math.exp(2) / (math.exp(1) + math.exp(2))
    assert logps[0].tolist() == pytest.approx([math.log(p), 0.0, 0.0])  # two legal, one forced, none (not scored)
    assert entropy[0].tolist() == pytest.approx([-(p * math.log(p) + (1 - p) * math.log(1 - p)), 0.0, 0.0])
    halved, _ = legal_head_logps_and_entropy(logits, torch.nn.Identity(), tokens, legal, 2.0)
    assert float(halved[0, 0]) == pytest.approx(math.log(math.exp(1) / (math.exp(0.5) + math.exp(1))))


def full_vocabulary_logps(model, input_ids, attention_mask, legal, temperature):
    """The computation the trainer used before (the reference): the model's logits at every completion position, over
    the whole vocabulary, renormalised over the legal tokens where a position has some."""
    width = legal.size(1)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=width + 1).logits
    logits = (logits[:, :-1] / temperature).float()
    tokens = input_ids[:, -width:]
    has_legal = (legal >= 0).any(-1)
    legal_logits = logits.gather(-1, legal.clamp(min=0)).masked_fill(legal < 0, float("-inf"))
    legal_norm = torch.logsumexp(legal_logits, dim=-1)
    norm = torch.where(has_legal, legal_norm, torch.logsumexp(logits, dim=-1))
    logps = logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - norm
    legal_logp = legal_logits - legal_norm.unsqueeze(-1)
    entropy = -(legal_logp.exp() * legal_logp).nan_to_num(0.0).sum(-1)
    return logps, entropy


def constrained_batch(vocab: int, window: bool, seed: int = 0):
    """Four rows as TRL lays them out (prompts left-padded, completions right-padded) with their legal ids: decisions
    of forced tokens and choices among 2-6 legal tokens; ``window``: two decisions with environment tokens (no legal
    set, not trained) between them."""
    rng = random.Random(seed)
    prompts, completions, legal_rows, trained_rows = [], [], [], []
    for _ in range(4):
        prompts.append([rng.randrange(vocab) for _ in range(rng.randint(4, 12))])
        ids, legal, trained = [], [], []
        for turn in range(2 if window else 1):
            if turn:
                env = [rng.randrange(vocab) for _ in range(rng.randint(3, 9))]
                ids += env
                legal += [[] for _ in env]
                trained += [0] * len(env)
            for _ in range(rng.randint(3, 7)):
                if rng.random() < 0.4:
                    options = [rng.randrange(vocab)]  # forced
                else:
                    options = sorted(rng.sample(range(vocab), rng.randint(2, 6)))
                ids.append(rng.choice(options))
                legal.append(options)
                trained.append(1)
        completions.append(ids)
        legal_rows.append(legal)
        trained_rows.append(trained)
    width, plen = max(map(len, completions)), max(map(len, prompts))
    input_ids = torch.zeros((4, plen + width), dtype=torch.long)
    attention = torch.zeros((4, plen + width), dtype=torch.long)
    trained = torch.zeros((4, width), dtype=torch.long)
    for r in range(4):
        p, c = prompts[r], completions[r]
        input_ids[r, plen - len(p) : plen] = torch.tensor(p)
        input_ids[r, plen : plen + len(c)] = torch.tensor(c)
        attention[r, plen - len(p) : plen + len(c)] = 1
        trained[r, : len(c)] = torch.tensor(trained_rows[r])
    return input_ids, attention, legal_id_tensor(legal_rows, width), trained


class _Accelerator:  # what the mixin uses of the trainer's accelerator, in one process on the CPU
    autocast = staticmethod(contextlib.nullcontext)
    unwrap_model = staticmethod(lambda model: model)


class _Scorer(LegalLogprobs):
    """The mixin with what it reads of a ``GRPOTrainer``: the accelerator, the temperature, the legal ids."""

    def __init__(self, legal: torch.Tensor, temperature: float) -> None:
        self.accelerator, self.temperature, self._legal = _Accelerator(), temperature, legal


def tiny_random_model(kind: str):
    """A randomly initialised two-layer model whose forward transforms its logits (soft-capping, a logit scale), or
    a Mixture-of-Experts model with a load-balancing loss."""
    from transformers import (
        CohereConfig,
        CohereForCausalLM,
        Gemma2Config,
        Gemma2ForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    torch.manual_seed(0)
    sizes = {"vocab_size": 97, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1}  # fmt: skip
    if kind == "softcap":  # a cap small enough to change the logits of a random model
        return Gemma2ForCausalLM(Gemma2Config(**sizes, head_dim=16, final_logit_softcapping=0.5)).eval()
    if kind == "logit_scale":
        return CohereForCausalLM(CohereConfig(**sizes, logit_scale=4.0)).eval()
    config = Qwen3MoeConfig(**sizes, head_dim=16, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                            router_aux_loss_coef=0.01)  # fmt: skip
    return Qwen3MoeForCausalLM(config).eval()


def _model(kind: str, warm_model: str):
    from transformers import AutoModelForCausalLM

    if kind in ("tiny", "tiny_lora"):
        model = AutoModelForCausalLM.from_pretrained(warm_model, dtype=torch.float32).eval()
        if kind == "tiny_lora":
            from peft import LoraConfig, get_peft_model

            torch.manual_seed(0)  # init_lora_weights=False: a random adapter that changes the outputs
            config = LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False, task_type="CAUSAL_LM")
            model = get_peft_model(model, config).eval()
        return model
    return tiny_random_model(kind)


# "gaps": rows with positions that have no legal set (not trained), which the scorer must give 0
@pytest.mark.parametrize(
    ("kind", "window"),
    [("tiny", False), ("tiny", True), ("tiny_lora", False), ("softcap", True), ("logit_scale", True)],
    ids=["tiny-branch", "tiny-gaps", "tiny_lora-branch", "softcap-gaps", "logit_scale-gaps"],
)
def test_legal_log_probabilities_and_gradients_equal_the_whole_vocabulary_computation(kind, window, warm_model):
    model = _model(kind, warm_model)
    vocab = model.config.get_text_config().vocab_size
    input_ids, attention, legal, trained = constrained_batch(vocab, window)
    has_legal = (legal >= 0).any(-1)
    assert window == bool((attention[:, -legal.size(1) :].bool() & ~has_legal).any())  # environment tokens
    scorer = _Scorer(legal, temperature=0.7)
    params = [p for p in model.parameters() if p.requires_grad]
    weights = torch.randn(has_legal.shape, generator=torch.Generator().manual_seed(1)) * trained

    ref_logps, ref_entropy = full_vocabulary_logps(model, input_ids, attention, legal, 0.7)
    ref_grads = torch.autograd.grad((ref_logps * weights).sum(), params)
    logps, entropy, aux = scorer._get_per_token_logps_and_entropies(
        model, input_ids, attention, legal.size(1), batch_size=3, compute_entropy=True
    )
    grads = torch.autograd.grad((logps * weights).sum(), params)

    assert aux is None and logps.dtype == torch.float32
    assert torch.allclose(logps[has_legal], ref_logps[has_legal], atol=1e-6, rtol=0)
    assert torch.allclose(entropy[has_legal], ref_entropy[has_legal], atol=1e-6, rtol=0)
    assert (logps[~has_legal] == 0).all() and (entropy[~has_legal] == 0).all()  # environment tokens, padding
    for grad, ref in zip(grads, ref_grads, strict=True):
        assert torch.allclose(grad, ref, atol=1e-6, rtol=1e-5)
    assert any(g.abs().sum() > 0 for g in grads)
    if kind in ("softcap", "logit_scale"):  # the forward transforms the head's logits: the head alone would differ
        head_alone = model.get_output_embeddings()(model.base_model(input_ids=input_ids).last_hidden_state)
        assert not torch.allclose(model(input_ids=input_ids).logits, head_alone, atol=1e-3)


def test_a_moe_model_scores_policy_old_and_reference_over_the_legal_tokens_with_trls_load_balancing_loss():
    from trl.trainer.utils import add_fused_lm_head

    model = tiny_random_model("moe")
    input_ids, attention, legal, _ = constrained_batch(model.config.vocab_size, window=True)
    width = legal.size(1)
    scorer = _Scorer(legal, temperature=1.0)
    plain, _, no_aux = scorer._get_per_token_logps_and_entropies(model, input_ids, attention, width)
    logps, _, aux = scorer._get_per_token_logps_and_entropies(
        model, input_ids, attention, width, compute_aux_loss=True
    )
    assert no_aux is None and torch.equal(logps, plain)  # the policy's log-probabilities: legal with the aux loss too
    ref_logps, _ = full_vocabulary_logps(model, input_ids, attention, legal, 1.0)
    has_legal = (legal >= 0).any(-1)
    assert torch.allclose(logps[has_legal], ref_logps[has_legal], atol=1e-6, rtol=0)
    # TRL's own load-balancing loss of the same batch (its fused LM head path), and a gradient through ours
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    labels = input_ids.masked_fill(attention == 0, -100)
    labels[:, :-width] = -100
    trl_aux = model(input_ids=input_ids, attention_mask=attention, labels=labels, fused_lm_head=True,
                    output_router_logits=True).aux_loss  # fmt: skip
    assert float(aux) == pytest.approx(float(trl_aux), abs=1e-6) and float(aux) > 0
    (router,) = {n: p for n, p in model.named_parameters() if "layers.0.mlp.gate" in n}.values()
    assert torch.autograd.grad(aux, router)[0].abs().sum() > 0


def test_a_batch_the_legal_log_probabilities_would_score_wrongly_is_refused():
    legal = legal_id_tensor([[[3, 5], [7], []]], width=3)
    ids = torch.tensor([[5, 7, 9]])
    check_legal_ids(ids, torch.tensor([[1, 1, 0]]), legal)  # the environment token has no legal set: fine
    with pytest.raises(RuntimeError, match="row 0, completion position 2: a trained token without a legal set"):
        check_legal_ids(ids, torch.tensor([[1, 1, 1]]), legal)
    with pytest.raises(RuntimeError, match=r"row 0, completion position 0: token 4 is not in its legal set \[3, 5\]"):
        check_legal_ids(torch.tensor([[4, 7, 9]]), torch.tensor([[1, 1, 0]]), legal)


@pytest.mark.parametrize(
    ("mode", "flags"),
    [
        ("branch", ["--horizon", "2"]),
        ("episode", ["--episode_decisions", "2", "--episode_groups", "2", "--anchor_days", "0"]),
    ],
)
def test_the_trainer_scores_constrained_rollouts_as_they_were_sampled(mode, flags, warm_model, tmp_path):
    seen = []

    class Recording(RecruitGRPOTrainer):
        def _generate(self, prompts):
            result = super()._generate(prompts)
            seen.append({"sampled": result[4], "fields": set(result[5])})
            return result

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
            mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
            width = output["completion_ids"].size(1)
            self.model.eval()  # as sampled: no dropout
            with torch.no_grad():
                self._legal = output[LEGAL_IDS]
                legal, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, mask, width)
                self._legal = None
                free, _, _ = self._get_per_token_logps_and_entropies(self.model, ids, mask, width)
            self.model.train()
            seen[-1].update(legal=legal, free=free, mask=output["completion_mask"] * output.get("tool_mask", 1))
            return output

    recipe = load_recipe("grpo_clinical")
    recipe.main(*recipe.parse_args([
        "--model_name_or_path", warm_model, "--mode", mode, *flags, "--constrained_decoding", "true",
        "--anchor_seeds", "100", "--anchor_days", "0-60:20", "--tasks", "easy_bench", "hard_bench",
        "--per_device_train_batch_size", "8", "--num_generations", "4", "--save_strategy", "no",
        "--sft_config", "none", "--report_config", "none", "--use_peft", "true",
        "--max_steps", "1", "--temperature", "1.5",
        "--output_dir", str(tmp_path),
    ]), trainer_cls=Recording)  # fmt: skip
    assert len(seen) == 1
    (batch,) = seen
    assert LEGAL_FIELD not in batch["fields"]  # handed to the generation batch, not to the reward functions
    checked = forced = 0
    for row, sampled in enumerate(batch["sampled"]):
        for t, value in enumerate(sampled):
            if batch["mask"][row, t]:
                assert float(batch["legal"][row, t]) == pytest.approx(value, abs=2e-4)
                checked += 1
                forced += value == 0.0
    assert checked > 0 and 0 < forced < checked  # forced tokens (log 1) and real choices both seen
    # TRL's own (whole-vocabulary) log-probabilities of the same tokens are lower wherever the mask cut something
    differ = (batch["free"] < batch["legal"] - 1e-3) & batch["mask"].bool()
    assert differ.any()

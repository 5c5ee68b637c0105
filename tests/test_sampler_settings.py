"""Constrained decoding samples what its loss describes: the RL recipes refuse, while parsing, the sampling settings
the constrained sampler does not reproduce, and the sampler refuses a token outside its legal set."""

from __future__ import annotations

import pytest
from recipe_files import load_recipe
from transformers import GenerationConfig

from recruit_trl.contracts import answer_texts, build_messages
from recruit_trl.models import generation
from recruit_trl.models.generation import answer_token_ids, encode_prompt, sample
from recruit_trl.models.loading import load_for_inference
from recruit_trl.protocol import get_env_interface

CUT = "constrained decoding samples from the legal tokens renormalised, and the loss assumes that"
IGNORED = "the constrained sampler does not apply it: it samples from the legal tokens renormalised"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--top_p", "0.9"], f"--top_p 0.9: {CUT}; drop --top_p or turn off --constrained_decoding"),
        (["--top_k", "5"], f"--top_k 5: {CUT}; drop --top_k or turn off --constrained_decoding"),
        (["--min_p", "0.1"], f"--min_p 0.1: {IGNORED}"),
        (["--repetition_penalty", "1.2"], f"--repetition_penalty 1.2: {IGNORED}"),
        (["--generation_kwargs", '{"no_repeat_ngram_size": 2}'], "--generation_kwargs {'no_repeat_ngram_size': 2}: "),
    ],
    ids=["top_p", "top_k", "min_p", "repetition_penalty", "generation_kwargs"],
)
def test_constrained_decoding_refuses_sampling_settings_its_sampler_and_loss_do_not_share(tmp_path, flags, message):
    recipe = load_recipe("grpo_clinical")
    argv = ["--output_dir", str(tmp_path / "out"), *flags]
    with pytest.raises(ValueError) as refused:
        recipe.parse_args([*argv, "--constrained_decoding", "true"])
    (line,) = str(refused.value).splitlines()
    assert line.startswith(message) and line.endswith(f"drop {flags[0]} or turn off --constrained_decoding")
    recipe.parse_args(argv)  # free decoding samples as TRL's generation config says: the settings are allowed
    assert not (tmp_path / "out").exists()


# Each recipe's own config (the tiny model) and SmolLM2's: its config, or the model and its warm start named.
SMOLLM2 = {
    "grpo_clinical": ["--config", "grpo_clinical_smollm2.yaml"],
    "grpo_conquest": ["--config", "grpo_conquest_smollm2.yaml"],
    "reinforce_clinical": ["--model_name_or_path", "smollm2", "--use_peft", "true", "--sft_config",
                           "sft_clinical_smollm2.yaml", "--report_config", "report_clinical_smollm2.yaml"],
}  # fmt: skip


@pytest.mark.parametrize("recipe", ["grpo_clinical", "grpo_conquest", "reinforce_clinical"])
@pytest.mark.parametrize("model", ["tiny", "smollm2"])
def test_the_shipped_recipes_take_constrained_decoding_with_their_own_defaults(tmp_path, recipe, model):
    flags = ["--output_dir", str(tmp_path), *(SMOLLM2[recipe] if model == "smollm2" else []),
             "--constrained_decoding", "true"]  # fmt: skip
    script_args, training_args, model_args = load_recipe(recipe).parse_args(flags)
    assert model_args.model_name_or_path == model
    assert script_args.constrained_decoding
    # temperature is no refusal: the sampler and the loss both divide the logits by it
    load_recipe(recipe).parse_args([*flags, "--temperature", "0.7"])


def _prompts(tokenizer, n: int) -> tuple[list[list[int]], list[list[list[int]]]]:
    """``n`` clinical prompts of the index contract and the token sequences of their legal answers."""
    interface = get_env_interface("clinical")
    prompts, allowed = [], []
    for seed in range(n):
        obs, _ = interface.make_env("easy_bench").reset(seed=seed)
        candidates = interface.candidate_actions(obs)
        prompts.append(encode_prompt(tokenizer, build_messages(interface, obs, [], "index", candidates)))
        allowed.append(answer_token_ids(tokenizer, answer_texts("index", candidates)))
    return prompts, allowed


@pytest.mark.parametrize("corrupt", ["legal_set", "draw"])
def test_a_token_sampled_outside_its_legal_set_is_refused(warm_model, monkeypatch, corrupt):
    model, tokenizer = load_for_inference(warm_model)
    prompts, allowed = _prompts(tokenizer, 3)
    config = GenerationConfig(do_sample=True, temperature=1.0, top_p=1.0)
    legal: list = []
    completions, _ = sample(model, tokenizer, prompts, config, 12, allowed=allowed, legal=legal)
    for ids, sets in zip(completions, legal, strict=True):  # a real draw: every token in its set
        assert all(token in options for token, options in zip(ids, sets, strict=True))
    real = generation.decode_tree

    def corrupted(*args, **kwargs):
        """The real tree walk, then completion 1's first choice among several tokens corrupted."""
        rows = real(*args, **kwargs)
        ids, logps, sets, same = rows[1]
        position = next(t for t, options in enumerate(sets) if len(options) > 1)
        token = ids[position]
        if corrupt == "legal_set":  # the set handed to the loss lacks the token drawn
            sets = [*sets[:position], [o for o in sets[position] if o != token], *sets[position + 1 :]]
        else:  # the draw returned a token the set does not hold
            token = max(max(options) for options in sets) + 1
            ids = [*ids[:position], token, *ids[position + 1 :]]
        rows[1] = (ids, logps, sets, same)
        corrupted.where = position, token
        return rows

    monkeypatch.setattr(generation, "decode_tree", corrupted)
    with pytest.raises(RuntimeError) as refused:
        sample(model, tokenizer, prompts, config, 12, allowed=allowed, legal=[])
    position, token = corrupted.where
    assert str(refused.value).startswith(
        f"completion 1, position {position}: token {token} was sampled outside its legal set"
    )

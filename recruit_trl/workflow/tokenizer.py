"""The tiny model's tokenizer: a byte-level BPE trained on the warm-up corpus, and how corpus rows render.

:func:`build_tokenizer` trains a byte-level BPE (``tokenizers``; Qwen-style pre-tokenizer, so every digit is its own
token and any byte string round-trips) on the corpus text, with the special tokens ``<|endoftext|>`` (pad),
``<|im_start|>`` and ``<|im_end|>`` (eos) and a ChatML chat template. Corpus rows are
``{"messages": [...], "completion": str}`` (or TRL's ``prompt`` / conversational ``completion``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

PAD_TOKEN = "<|endoftext|>"
IM_START_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START_TOKEN, EOS_TOKEN]

#: ChatML, as Qwen renders it. Assistant turns are wrapped in ``{% generation %}`` so that TRL's
#: ``assistant_only_loss=True`` works too; rendering is the same as the plain template.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['role'] == 'assistant' %}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen2/Qwen3's pre-tokenizer: letters, single digits, punctuation runs, whitespace.
_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def build_tokenizer(texts: Iterable[str], vocab_size: int = 2048, *, model_max_length: int = 2048):
    """Train a byte-level BPE tokenizer on ``texts`` and wrap it as a ``PreTrainedTokenizerFast``.

    Every byte sequence round-trips (256 byte symbols are always in the vocabulary), every digit is a
    token of its own (as in Qwen), and frequent JSON fragments of the corpus (``{"``, ``":``,
    ``action_index``) become single tokens. ``vocab_size`` counts the special tokens; the result can be
    smaller when the corpus has fewer merges to offer.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=None,
        additional_special_tokens=[IM_START_TOKEN],
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )


def _completion_text(row: dict) -> str:
    completion = row["completion"]
    if isinstance(completion, str):
        return completion
    # TRL conversational completion: [{"role": "assistant", "content": ...}]
    return "".join(m["content"] for m in completion)


def _row_messages(row: dict) -> list[dict]:
    return row["messages"] if "messages" in row else row["prompt"]


def render_row(tokenizer, row: dict) -> tuple[str, str]:
    """Return ``(prompt_text, completion_text)`` of a corpus row; their concatenation is its training text.

    The prompt is the chat template with the generation prompt, the completion is the assistant text
    followed by ``<|im_end|>`` (the eos token, so the model learns to stop).
    """
    prompt = tokenizer.apply_chat_template(_row_messages(row), add_generation_prompt=True, tokenize=False)
    return prompt, _completion_text(row) + EOS_TOKEN


def tokenizer_texts(corpus: Sequence[dict]) -> Iterator[str]:
    """The text the tokenizer trains on: the rendered messages and the completion of every row.

    The chat template is applied by hand here (no tokenizer exists yet); the special tokens are removed
    by the trainer anyway.
    """
    for row in corpus:
        for m in _row_messages(row):
            yield f"{m['role']}\n{m['content']}\n"
        yield "assistant\n" + _completion_text(row) + "\n"

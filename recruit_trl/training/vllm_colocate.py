"""TRL's colocated vLLM generator on a CPU: the engine and the weight sync that vLLM's CPU build needs.

With ``GRPOConfig(use_vllm=True, vllm_mode="colocate")`` TRL builds ``VLLMGeneration``: an engine from the model's
folder, and a weight sync before each rollout that merges LoRA and loads every weight with the model's
``load_weights``. On GPUs that is used as it is. vLLM's CPU build differs in two places (measured: the first sync
raised ``'Parameter' object has no attribute 'weight_loader'``, because the CPU build re-packs linear weights for
oneDNN; and an engine built without a dtype ran a float32 checkpoint in bfloat16, log-probabilities 9.5e-3 off).
:class:`CPUColocateGeneration` is ``VLLMGeneration`` with those two methods replaced: the engine is
:func:`recruit_trl.models.vllm_engine.start_engine` (in-process, the trained model's dtype, prefix caching, eager),
and the sync pushes TRL's own merged weights (``_iter_named_params``) through
:func:`~recruit_trl.models.vllm_engine.push_weights`. :func:`cpu_vllm_generation` makes TRL build it around a
``GRPOTrainer(...)`` call when there is no GPU (:class:`recruit_trl.training.trainer.RecruitGRPOTrainer` does so
itself; the tool loop's recipe wraps TRL's trainer in it).

Server mode's sync sends the weights over NCCL, which needs CUDA: on CPU it is refused at set-up with that reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from trl.generation.vllm_generation import VLLMGeneration

from recruit_trl.models.vllm_engine import check_cpu_settings, push_weights, start_engine


class CPUColocateGeneration(VLLMGeneration):
    """``VLLMGeneration`` for a process without a GPU (see the module docstring)."""

    def _init_vllm(self):
        quantised = any(getattr(p, "quant_state", None) is not None for p in self.model.parameters())
        check_cpu_settings(self.mode, self.accelerator.num_processes, quantised)
        dtype = str(next(self.model.parameters()).dtype).removeprefix("torch.")
        self.llm = start_engine(
            self.model.name_or_path,
            dtype=dtype,
            seed=self.accelerator.process_index,
            max_model_len=self.max_model_length,
            max_num_seqs=max(256, self.max_num_seqs or 0),  # episode mode plays many episodes side by side
        )
        self._llm_weights_sleeping = False
        self.accelerator.wait_for_everyone()

    def sync_weights(self):
        # TRL's iterator merges LoRA, yields each weight under vLLM's name, and un-merges in place at its end, so the
        # tensors are copied before that happens.
        push_weights(self.llm, [(name, tensor.clone()) for name, tensor in self._iter_named_params()])


@contextlib.contextmanager
def cpu_vllm_generation() -> Iterator[None]:
    """Within it, a ``GRPOTrainer`` built without a GPU gets :class:`CPUColocateGeneration` as its vLLM generator."""
    import trl.trainer.grpo_trainer as grpo_module

    if torch.cuda.is_available():
        yield
        return
    original = grpo_module.VLLMGeneration
    grpo_module.VLLMGeneration = CPUColocateGeneration
    try:
        yield
    finally:
        grpo_module.VLLMGeneration = original

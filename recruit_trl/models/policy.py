"""The trainer's current policy, ready to sample: its model unwrapped for generation, or TRL's vLLM engine.

:func:`policy_for_generation` yields what :func:`recruit_trl.models.generation.sample` takes (a model, or a
:class:`recruit_trl.models.vllm_engine.VLLMPolicy` when the trainer generates with vLLM), and
:func:`trainer_generation_config` the sampling settings the trainer was configured with.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from transformers import GenerationConfig

from recruit_trl.models.vllm_engine import VLLMPolicy


def checkpointing_kwargs(args) -> dict | None:
    """A training config's activation-checkpointing options, under their name in recent transformers 5 releases
    (``activation_checkpointing_kwargs``) or in older ones (``gradient_checkpointing_kwargs``; vLLM's CPU build pins
    transformers < 5.18)."""
    if hasattr(args, "activation_checkpointing_kwargs"):
        return args.activation_checkpointing_kwargs
    return args.gradient_checkpointing_kwargs


def trainer_generation_config(trainer) -> GenerationConfig:
    """The sampling settings of a ``GRPOTrainer``: its ``generation_config``, or, when it generates with vLLM (TRL
    then builds none), the same settings from its arguments."""
    if hasattr(trainer, "generation_config"):
        return trainer.generation_config
    settings = {"temperature": trainer.temperature, "top_p": trainer.top_p, "top_k": trainer.top_k,
                "min_p": trainer.min_p, "repetition_penalty": trainer.repetition_penalty}  # fmt: skip
    return GenerationConfig(do_sample=True, **settings, **(trainer.args.generation_kwargs or {}))


@contextmanager
def policy_for_generation(trainer) -> Iterator[Any]:
    """The trainer's current policy, unwrapped for generation (DDP, DeepSpeed ZeRO-3 gather) and in eval mode; with
    ``use_vllm``, a :class:`recruit_trl.models.vllm_engine.VLLMPolicy` on TRL's colocated engine (TRL pushes the
    weights into it before it calls the rollout).

    TRL does not switch modes around a custom rollout: without ``eval()`` LoRA dropout would be active while
    sampling. The previous mode is restored afterwards.
    """
    from trl.models import unwrap_model_for_generation

    if getattr(trainer, "use_vllm", False):
        generator = trainer.vllm_generation
        if generator.mode != "colocate":
            raise NotImplementedError(
                "recruit_trl's rollouts generate through vLLM in colocate mode (vllm_mode='colocate'); server mode "
                "serves TRL's own generation only"
            )
        yield VLLMPolicy(generator.llm)
        return

    with unwrap_model_for_generation(
        trainer.model_wrapped,
        trainer.accelerator,
        gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
        generation_kwargs=getattr(trainer, "generation_kwargs", None),
        gradient_checkpointing_kwargs=checkpointing_kwargs(trainer.args),  # TRL 1.16 keeps the old name
    ) as model:
        was_training = model.training
        model.eval()
        try:
            yield model
        finally:
            if was_training:
                model.train()

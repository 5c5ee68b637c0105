"""What the project's pipeline needs from a run of several processes (``accelerate launch`` with DDP or DeepSpeed)
beyond what transformers and accelerate do for one trainer:

- :func:`release_accelerator`: every ``Trainer`` of a process (the warm start's rounds, then RL) gets its own
  ``Accelerator``, one at a time;
- :func:`recruit_trl.models.loading.whole_models` (beside the loading it guards): models loaded and run by one
  process on its own (the report, on-policy anchors, a DAgger student, the tiny model's build) are plain,
  unpartitioned models that start no collective operation;
- :func:`check_backend`: a launch the machine cannot run (several processes without CUDA and without gloo) is refused
  before any model loads, with the fix.
"""

from __future__ import annotations

import os
from typing import Any


def release_accelerator() -> None:
    """Let the next ``Trainer`` of this process build its own ``Accelerator``.

    accelerate keeps one process-wide ``AcceleratorState`` and refuses a second ``Accelerator`` that brings a
    DeepSpeed plugin, while each ``TrainingArguments`` brings its own (with its own batch sizes and precision): a warm
    start's SFT trainer then a GRPO trainer in one process meets the refusal. The state is cleared here once a
    trainer is done with it; ``PartialState`` (the process group, ranks and device) stays. The finished trainer's
    ``accelerator`` must not be used afterwards."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=False)


def launched_processes() -> int:
    """How many processes the launcher started (``WORLD_SIZE``; 1 without a launcher)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_backend(training_args: Any) -> None:
    """Refuse a launch of several processes that cannot talk on this machine, before any model loads.

    Without CUDA the processes need gloo: transformers picks it when ``use_cpu`` is set (the recipes' CPU default);
    with ``--use_cpu false`` and no ``--ddp_backend`` accelerate finds no backend and every process believes it is
    alone (DeepSpeed then stops on its batch-size check, DDP trains unsynchronised copies).

    Raises:
        ValueError: with the flag that fixes it.
    """
    import torch

    processes = launched_processes()
    if processes <= 1 or torch.cuda.is_available():
        return
    import torch.distributed as dist

    if not dist.is_gloo_available():
        raise ValueError(
            f"{processes} processes without CUDA need torch's gloo backend, which this torch build lacks: install "
            "the CPU wheel (pip install torch==2.13.0) or launch one process"
        )
    backend = training_args.ddp_backend
    if backend not in (None, "gloo", "ccl", "mpi"):
        raise ValueError(f"--ddp_backend {backend} needs a device this machine lacks: use --ddp_backend gloo")
    if not training_args.use_cpu and backend is None:
        raise ValueError(
            f"{processes} processes without CUDA talk through gloo, which --use_cpu false leaves unset: drop "
            "--use_cpu false (the CPU default is true) or add --ddp_backend gloo"
        )

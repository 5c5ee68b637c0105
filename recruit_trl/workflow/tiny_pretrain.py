"""The tiny model's warm-up: a short full-parameter pre-training with transformers' ``Trainer``.

:func:`pretrain` trains a freshly initialised causal LM in place on ``(prompt_ids, completion_ids)`` samples and
returns the statistics that :func:`recruit_trl.workflow.tiny_model.build_tiny_model` keeps in the build metadata.

The recipe
    AdamW with betas (0.9, 0.95) and weight decay on the >=2-D weights outside the norms; a linear warm-up over
    ``warmup_ratio`` of the steps, then cosine decay to 10% of ``lr``; gradients clipped to norm 1. Batches are rows
    of similar length (:func:`recruit_trl.models.batching.length_bucketed_batches`, epoch after epoch from one
    ``random.Random(seed)``), right-padded; with causal attention the real tokens never see the padding, so there
    is no attention mask. Loss = mean LM loss over the real tokens + ``completion_weight`` x mean loss over the
    completion tokens.

How it maps onto ``Trainer``
    The optimizer and a ``LambdaLR`` come in through ``optimizers``; a custom ``get_train_dataloader`` yields the
    padded batches of a batch sampler; ``compute_loss`` computes the weighted loss; a ``TrainerCallback`` keeps the
    per-step losses and tokens, the training time and the progress bar. Gradient accumulation is 1, so Trainer's
    loss scaling divides by 1 and changes nothing. Training runs on the CPU in fp32 whatever the machine, and
    leaves the process as it found it (:func:`_isolated_trainer`): the build may run inside a training job that has
    already set up accelerate for its GPUs and ranks.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import random
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PrinterCallback, Trainer, TrainerCallback, TrainingArguments

from recruit_trl.models.batching import length_bucketed_batches
from recruit_trl.models.build_cache import is_launcher_variable
from recruit_trl.models.loading import whole_models


def pretrain(
    model,
    samples: list[tuple[list[int], list[int]]],
    *,
    pad_id: int,
    epochs: float,
    max_steps: int | None,
    max_train_tokens: int | None,
    lr: float,
    batch_size: int,
    completion_weight: float,
    warmup_ratio: float,
    weight_decay: float,
    seed: int,
    progress: bool,
) -> dict[str, Any]:
    """Train ``model`` in place on ``samples``; return steps, epochs, tokens, initial/final losses and seconds.

    The number of optimizer steps is ``max_steps`` when given, else ``epochs`` passes over the samples capped at
    about ``max_train_tokens`` tokens. ``progress`` shows a tqdm bar with the latest losses.
    """
    lengths = [len(p) + len(c) for p, c in samples]
    steps_per_epoch = math.ceil(len(samples) / batch_size)
    if max_steps is not None:
        total = max_steps
    else:
        total = max(1, round(epochs * steps_per_epoch))
        if max_train_tokens:  # bounds the build time on a large corpus
            total = min(total, max(1, math.ceil(max_train_tokens / (batch_size * sum(lengths) / len(lengths)))))
    warmup = max(1, round(warmup_ratio * total))

    def lr_at(step: int) -> float:
        if step < warmup:
            return lr * (step + 1) / warmup
        t = (step - warmup) / max(1, total - warmup)
        return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "norm" in name else decay).append(p)
    # Base learning rate 1: LambdaLR sets each step's rate to 1.0 * lr_at(step), the schedule's value to the last bit.
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1.0,
        betas=(0.9, 0.95),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    loader = torch.utils.data.DataLoader(
        samples,
        batch_sampler=_BucketedBatches(lengths, batch_size, total, seed),
        collate_fn=functools.partial(_pad_batch, pad_id=pad_id),
    )
    record = _Record(total, progress)
    with tempfile.TemporaryDirectory() as scratch, _isolated_trainer():
        args = TrainingArguments(
            output_dir=scratch,  # Trainer creates it; nothing is written there
            max_steps=total,
            per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=1,
            max_grad_norm=1.0,
            eval_strategy="no",
            save_strategy="no",
            logging_strategy="no",
            report_to="none",
            disable_tqdm=True,
            use_cpu=True,
            seed=seed,
            use_cache=model.config.use_cache,  # Trainer writes it into the config that the build saves
        )
        trainer = _WarmupTrainer(
            model=model,
            args=args,
            optimizers=(optimizer, scheduler),
            callbacks=[record],
            loader=loader,
            completion_weight=completion_weight,
            record=record,
        )
        trainer.remove_callback(PrinterCallback)  # it would print Trainer's end-of-training metrics
        trainer.train()

    history = record.history
    tail = history[-max(1, total // 10) :]
    head = history[: max(1, min(10, total // 10))]
    return {
        "steps": total,
        "epochs": round(total / steps_per_epoch, 3),
        "tokens_seen": record.tokens_seen,
        "tokens_per_second": round(record.tokens_seen / max(record.seconds, 1e-9)),
        "initial_losses": {
            "lm": round(sum(h[0] for h in head) / len(head), 4),
            "completion": round(sum(h[1] for h in head) / len(head), 4),
        },
        # mean over the last 10% of the steps
        "final_losses": {
            "lm": round(sum(h[0] for h in tail) / len(tail), 4),
            "completion": round(sum(h[1] for h in tail) / len(tail), 4),
        },
        "train_seconds": round(record.seconds, 2),
        # CPU time of all threads: about num_threads x train_seconds on an idle machine, far less when contended
        "train_cpu_seconds": round(record.cpu_seconds, 2),
    }


class _BucketedBatches:
    """A batch sampler: ``total`` batches of sample indices, :func:`length_bucketed_batches` epoch after epoch."""

    def __init__(self, lengths: list[int], batch_size: int, total: int, seed: int) -> None:
        self.lengths, self.batch_size, self.total, self.seed = lengths, batch_size, total, seed

    def __len__(self) -> int:
        return self.total

    def __iter__(self) -> Iterator[list[int]]:
        rng = random.Random(self.seed)
        epochs = (b for _ in itertools.count() for b in length_bucketed_batches(self.lengths, self.batch_size, rng))
        return itertools.islice(epochs, self.total)


def _pad_batch(rows: list[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded token ids, and each token's kind: 0 padding, 1 prompt, 2 completion."""
    width = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    kind = torch.zeros((len(rows), width), dtype=torch.long)
    for r, (p, c) in enumerate(rows):
        ids[r, : len(p) + len(c)] = torch.tensor(p + c)
        kind[r, : len(p)] = 1
        kind[r, len(p) : len(p) + len(c)] = 2
    return {"input_ids": ids, "kind": kind}


class _Record(TrainerCallback):
    """The per-step losses and tokens (fed by the loss), the training time and the progress bar."""

    def __init__(self, total: int, progress: bool) -> None:
        self.total, self.progress = total, progress
        self.history: list[tuple[float, float]] = []
        self.tokens_seen = 0
        self.seconds = self.cpu_seconds = 0.0
        self.bar = None

    def add(self, lm_loss: float, completion_loss: float, tokens: int) -> None:
        self.history.append((lm_loss, completion_loss))
        self.tokens_seen += tokens

    def on_train_begin(self, args, state, control, **kwargs):
        if self.progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, desc="warming tiny model", unit="step", dynamic_ncols=True)
        self._t0, self._cpu0 = time.perf_counter(), time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(1)
            step = state.global_step - 1
            if step % 10 == 0 or step == self.total - 1:
                lm, completion = self.history[-1]
                self.bar.set_postfix(lm=f"{lm:.3f}", completion=f"{completion:.3f}")

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
        self.seconds = time.perf_counter() - self._t0
        self.cpu_seconds = time.process_time() - self._cpu0


class _WarmupTrainer(Trainer):
    """``Trainer`` on a ready-made data loader, with the completion-weighted LM loss."""

    def __init__(self, *args, loader, completion_weight: float, record: _Record, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.loader, self.completion_weight, self.record = loader, completion_weight, record

    def get_train_dataloader(self):
        return self.loader

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        ids, kind = inputs["input_ids"], inputs["kind"]
        outputs = model(input_ids=ids, use_cache=False)
        logits = outputs.logits[:, :-1]
        target, target_kind = ids[:, 1:], kind[:, 1:]
        tok_loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1), reduction="none")
        tok_loss = tok_loss.view_as(target)
        valid = (target_kind > 0).float()
        comp = (target_kind == 2).float()
        lm_loss = (tok_loss * valid).sum() / valid.sum()
        comp_loss = (tok_loss * comp).sum() / comp.sum().clamp(min=1)
        loss = lm_loss + self.completion_weight * comp_loss
        # the tokens the model learns from: the real targets, plus each row's first token as context
        self.record.add(lm_loss.item(), comp_loss.item(), int(valid.sum().item()) + len(ids))
        return (loss, outputs) if return_outputs else loss


@contextlib.contextmanager
def _isolated_trainer() -> Iterator[None]:
    """Run a single-process CPU ``Trainer`` in the block and leave the process as it was before it.

    Accelerate keeps one process-wide state (devices, ranks, mixed precision, plugins) that ``TrainingArguments``
    resets and rebuilds. A training job that builds the tiny model on first use has already set it up for its own
    GPUs and ranks: that state is saved here and put back afterwards. The launchers' environment variables are
    hidden meanwhile, so the Trainer in the block runs alone (the job's other ranks wait for this build on a lock),
    in fp32, without DeepSpeed or FSDP (:func:`~recruit_trl.models.loading.whole_models`). Trainer seeds
    Python's, NumPy's and torch's global RNGs: their CPU states are restored too (torch also seeds the accelerators,
    with the seed the build has just used for the weights).
    """
    from accelerate.state import AcceleratorState, GradientState, PartialState

    shared = [cls._shared_state for cls in (PartialState, AcceleratorState, GradientState)]
    saved = [dict(state) for state in shared]
    hidden = {k: os.environ.pop(k) for k in list(os.environ) if is_launcher_variable(k)}
    rng_states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    for state in shared:
        state.clear()
    try:
        with whole_models():  # under ZeRO-3 too: a plain model, built by this process alone
            yield
    finally:
        for state, old in zip(shared, saved, strict=True):
            state.clear()
            state.update(old)
        os.environ.update(hidden)
        random.setstate(rng_states[0])
        np.random.set_state(rng_states[1])
        torch.set_rng_state(rng_states[2])

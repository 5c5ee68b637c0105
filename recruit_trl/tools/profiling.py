"""Where the seconds of a training step or an evaluation go: wall time split into named shares, each second counted
once (a share's time excludes the shares timed inside it), used by ``python -m recruit_trl.tools.bench_rollout
--profile``.

Shares (:data:`SHARES`): building and tokenizing prompts, the model's passes over prompts (``prefill``: a pass
without a filled key-value cache) and over answer tokens (``decode``, with the sampler's own work), the environment
(steps, the continuation policy, candidates, anchor replay, a teacher's labels), the rest of the rollout (parsing
answers, advantages, bookkeeping), the trainer's forward pass, its loss on the logits (log-softmax, the legal
renormalisation, the policy loss), backward, the optimizer, model passes outside both (TRL's old or reference
log-probabilities), and the rest of the step (TRL's batching, reward functions, padding, logging), found as the step's
wall time less the shares measured.

The shares are timed by wrapping functions and by forward hooks on the model's causal-LM module; nothing changes what
runs. The wrapping is undone when the profile ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from transformers import TrainerCallback

from recruit_trl.models import generation
from recruit_trl.rollout import continuation, rollout_funcs
from recruit_trl.workflow.evaluation import evaluate
from recruit_trl.workflow.evaluation.evaluate import Evaluator

SHARES = {
    "prompt": "building and tokenizing prompts",
    "prefill": "model passes over prompts",
    "decode": "model passes over answer tokens, and sampling",
    "environment": "environment steps, continuation, candidates",
    "play_other": "rest of the rollout or evaluation loop (parsing, advantages, bookkeeping)",
    "trainer_forward": "trainer's forward pass",
    "loss": "loss on the logits (log-softmax, legal renormalisation)",
    "backward": "backward pass",
    "optimizer": "optimizer step",
    "logprob_recompute": "model passes outside rollout and loss (old/reference log-probs)",
    "setup": "loading the model (an evaluation)",
    "other": "rest of the step or run (TRL's batching, reward functions, logging)",
}


class Profile:
    """Exclusive wall time per share, and a snapshot at the end of every optimizer step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = dict.fromkeys(SHARES, 0.0)
        self._stack: list[list[Any]] = []  # [share, seconds of the shares timed inside it]
        self._undo: list[Callable[[], None]] = []
        self._hooked: set[int] = set()
        self.steps: list[tuple[float, dict[str, float]]] = []  # (time, cumulative seconds) after each optimizer step
        self.tokens: dict[str, list[int]] = {}  # share -> [tokens, positions with padding] of the model's passes

    def enter(self, share: str) -> None:
        self._stack.append([share, 0.0, time.perf_counter()])

    def leave(self) -> None:
        share, inner, start = self._stack.pop()
        elapsed = time.perf_counter() - start
        self.seconds[share] += elapsed - inner
        if self._stack:
            self._stack[-1][1] += elapsed

    def within(self, share: str) -> bool:
        return any(entry[0] == share for entry in self._stack)

    def wrap(self, owner: Any, name: str, share: str) -> None:
        """Time every call of ``owner.name`` as ``share``: a module's function, a class's method (not a static one)
        or an instance's method."""
        own = hasattr(owner, "__dict__") and name in vars(owner)
        saved = vars(owner)[name] if own else None
        original = getattr(owner, name)

        def timed(*args, **kwargs):
            self.enter(share)
            try:
                return original(*args, **kwargs)
            finally:
                self.leave()

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, saved) if own else delattr(owner, name))

    def hook_model(self, model) -> None:
        """Time the passes of ``model``'s causal-LM module by where they run: in the rollout or an evaluation
        (``prefill`` or ``decode``), in the loss (``trainer_forward``), else ``logprob_recompute``."""
        for module in model.modules():
            if not type(module).__name__.endswith("ForCausalLM") or id(module) in self._hooked:
                continue
            self._hooked.add(id(module))

            def before(_module, _args, kwargs):
                cache = kwargs.get("past_key_values", kwargs.get("cache"))  # transformers 5 passes "cache"
                filled = cache is not None and (not hasattr(cache, "get_seq_length") or cache.get_seq_length() > 0)
                if self.within("loss"):
                    share = "trainer_forward"
                elif self.within("play_other") or self.within("decode"):
                    share = "decode" if filled else "prefill"
                else:
                    share = "logprob_recompute"
                mask = kwargs.get("attention_mask")
                if mask is not None and share != "decode":
                    counts = self.tokens.setdefault(share, [0, 0])
                    counts[0] += _attended_tokens(mask)
                    counts[1] += mask.shape[0] * mask.shape[-1]
                self.enter(share)

            def after(_module, _args, _kwargs, _output):
                self.leave()

            handles = [
                module.register_forward_pre_hook(before, with_kwargs=True),
                module.register_forward_hook(after, with_kwargs=True),
            ]
            self._undo.extend(handle.remove for handle in handles)

    def mark_step(self) -> None:
        self.steps.append((time.perf_counter(), dict(self.seconds)))

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()

    def per_step(self, skip: int = 1) -> dict[str, float]:
        """Mean seconds per optimizer step by share over the steps after the first ``skip`` (the first pays for
        warm-up and anchor replay), ``other`` being the steps' wall time less the shares; ``total`` their sum."""
        marks = self.steps[skip:]  # the first mark is the start of the first step
        if len(marks) < 2:
            return {}
        (t0, first), (t1, last) = marks[0], marks[-1]
        n = len(marks) - 1
        out = {share: (last[share] - first[share]) / n for share in SHARES if share != "other"}
        out["other"] = max(0.0, (t1 - t0) / n - sum(out.values()))
        out["total"] = (t1 - t0) / n
        return {k: round(v, 3) for k, v in out.items()}

    def padding(self) -> dict[str, float]:
        """The share of the positions the model ran that were padding, by share (prefill, trainer forward, ...)."""
        return {share: round(1 - real / total, 3) for share, (real, total) in self.tokens.items() if total}

    def totals(self, wall: float) -> dict[str, float]:
        """Seconds by share over a whole run of ``wall`` seconds (an evaluation), ``other`` the unmeasured rest."""
        out = {share: self.seconds[share] for share in SHARES if share != "other"}
        out["other"] = max(0.0, wall - sum(out.values()))
        out["total"] = wall
        return {k: round(v, 3) for k, v in out.items() if v or k == "total"}


def _attended_tokens(mask) -> int:
    """The real (not padding) positions of a pass: the 1s of a 2D mask; with a 4D mask (packed groups:
    :mod:`recruit_trl.training.packed_groups`, boolean or additive), the queries that see more than themselves plus
    each sequence's first token (a padding query sees itself only, as does a sequence's first token)."""
    if mask.dim() == 2:
        return int(mask.sum())
    visible = mask if mask.dtype == torch.bool else mask == 0
    return int((visible.sum(-1) > 1).sum()) + mask.shape[0]


class FirstStepPeakMemory(TrainerCallback):
    """The peak memory of the first optimizer step (rollout, trainer passes, optimizer), above the memory held when it
    starts, in MiB (:attr:`peak_mib`): on a GPU torch's peak allocation; on the CPU the running sum of the
    allocations and frees torch's profiler records (``profile_memory``), which covers tensors only. The first step is
    the one the benchmark's timings skip, so the profiler's overhead costs none of them."""

    def __init__(self) -> None:
        self.peak_mib: float | None = None
        self._profiler = None  # torch's profiler of the step, on the CPU
        self._on_gpu = False
        self._start = 0

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step != 0 or self.peak_mib is not None or self._profiler is not None or self._on_gpu:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._start = torch.cuda.memory_allocated()
            self._on_gpu = True
        else:
            self._profiler = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
            )
            self._profiler.__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        if (self._profiler is None and not self._on_gpu) or self.peak_mib is not None:
            return
        if self._on_gpu:
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - self._start
        else:
            self._profiler.__exit__(None, None, None)
            events = sorted(self._profiler.events(), key=lambda event: event.time_range.start)
            peak = held = 0
            for event in events:  # an operator's own allocations, and "[memory]" events (frees are negative)
                held += event.self_cpu_memory_usage
                peak = max(peak, held)
        self.peak_mib = round(peak / 2**20, 1)
        self._profiler = None


def rollout_wraps(profile: Profile, rollout) -> None:
    """Wrap the rollout's shares (the rollout call itself as ``play_other``)."""
    profile.wrap(type(rollout), "__call__", "play_other")
    profile.wrap(rollout_funcs, "build_messages", "prompt")
    for name in ("encode_messages", "prompt_for"):
        profile.wrap(rollout_funcs._RolloutBase, name, "prompt")
    profile.wrap(rollout_funcs, "sample", "decode")
    for name in ("apply", "continue_", "start"):
        profile.wrap(continuation.Scorer, name, "environment")
    for name in ("teacher_action", "_states"):
        profile.wrap(rollout_funcs._RolloutBase, name, "environment")
    profile.wrap(rollout.interface, "candidate_actions", "environment")


@contextmanager
def profile_training(trainer, rollout) -> Iterator[Profile]:
    """A :class:`Profile` of ``trainer.train()`` run inside the block: the rollout's shares, the trainer's loss
    (``compute_loss``), backward and optimizer steps, the model's passes by where they run. A step ends when the
    trainer's callbacks have seen its end: the callbacks added before this block (e.g. :class:`FirstStepPeakMemory`
    tearing down its profiler) count in the step they end, not in the next one's ``other``."""
    profile = Profile()
    rollout_wraps(profile, rollout)
    profile.wrap(trainer, "compute_loss", "loss")
    profile.wrap(trainer.accelerator, "backward", "backward")
    profile.hook_model(trainer.model)

    def optimizer_before(_optimizer, _args, _kwargs):
        profile.enter("optimizer")

    def optimizer_after(_optimizer, _args, _kwargs):
        profile.leave()

    handles = [
        register_optimizer_step_pre_hook(optimizer_before),
        register_optimizer_step_post_hook(optimizer_after),
    ]
    marks = _StepMarks(profile)
    trainer.add_callback(marks)
    profile.mark_step()  # the start of the first step
    try:
        yield profile
    finally:
        for handle in handles:
            handle.remove()
        trainer.remove_callback(marks)
        profile.undo()


class _StepMarks(TrainerCallback):
    """Marks the end of every optimizer step in a :class:`Profile`."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile

    def on_step_end(self, args, state, control, **kwargs):
        self.profile.mark_step()


@contextmanager
def profile_evaluation(interface) -> Iterator[Profile]:
    """A :class:`Profile` of the model policies that evaluations play inside the block, in this process (an
    evaluation in worker processes is not seen): prompts, the model's passes, the environment of ``interface`` (steps,
    candidates, the teacher's labels), the rest of the play loop."""
    profile = Profile()
    profile.wrap(Evaluator, "run_model", "play_other")
    profile.wrap(Evaluator, "_teacher_action", "environment")
    profile.wrap(type(interface), "candidate_actions", "environment")
    profile.wrap(evaluate, "build_messages", "prompt")
    for name in ("encode_prompt", "answer_token_ids"):
        profile.wrap(generation, name, "prompt")
    profile.wrap(generation, "sample", "decode")
    load, make_env = evaluate.load_for_inference, Evaluator.make_env

    def load_hooked(*args, **kwargs):
        profile.enter("setup")
        try:
            model, tokenizer = load(*args, **kwargs)
        finally:
            profile.leave()
        profile.hook_model(model)
        return model, tokenizer

    def make_timed_env(self, task):
        env = make_env(self, task)
        profile.wrap(env, "step", "environment")
        profile.wrap(env, "reset", "environment")
        return env

    evaluate.load_for_inference, Evaluator.make_env = load_hooked, make_timed_env
    try:
        yield profile
    finally:
        evaluate.load_for_inference, Evaluator.make_env = load, make_env
        profile.undo()


def share_table(seconds: dict[str, float], unit: str = "s") -> str:
    """The shares as a text table: seconds, share of the total, what each share holds."""
    total = seconds.get("total") or sum(v for k, v in seconds.items() if k != "total") or 1.0
    rows = [f"{'share':<18} {unit:>9} {'of total':>9}  what"]
    for share, what in SHARES.items():
        if share in seconds:
            rows.append(f"{share:<18} {seconds[share]:>9.3f} {seconds[share] / total:>8.1%}  {what}")
    rows.append(f"{'total':<18} {total:>9.3f} {1:>8.1%}")
    return "\n".join(rows)

"""GPU check: a few QLoRA GRPO steps on a randomly initialised model of Qwen3-4B's shape, measured.

What it measures (printed as one JSON object and written atomically to ``<output_dir>/gpu_check.json``):
seconds per optimizer step (rollout, loss, backward and update; median over the steps after the first, which pays
for warm-up), peak GPU memory (``torch.cuda.max_memory_allocated`` from loading the 4-bit model to the end of
training, GiB; ``null`` on CPU), generated tokens per second in the rollouts' ``generate`` calls (after the first),
the rollouts' valid-action rate (``1 - rollout/invalid_action_rate``: the answers that parsed as a listed action
and that the environment took without error), the device, library versions, the parameter count, the number of
``bitsandbytes.nn.Linear4bit`` layers actually loaded, and the configuration used.

Nothing is downloaded. The model is built from ``transformers.Qwen3Config`` with Qwen3-4B's dimensions and random
weights, saved (bf16 on GPU) with a small byte-level BPE tokenizer trained on rendered environment prompts
(``recruit_trl.workflow.tokenizer.build_tokenizer``; the embedding keeps Qwen3's 151936 rows), then loaded the way
``recipes/grpo_clinical.py --load_in_4bit`` loads a model: ``GRPOTrainer`` gets the folder, a 4-bit NF4
``BitsAndBytesConfig`` and a LoRA ``peft_config`` (r=16, every linear layer), and trains with the project's branch
rollouts (``recruit_trl.rollout.rollout_funcs.make_rollout``) on clinical anchors with a 4-day continuation horizon, so
the environment does not dominate, and constrained decoding, so that a random model's samples are listed actions: the
rows of a group play different actions, their rewards differ and the LoRA weights get real gradients
(``grad_norm``). A random model is no policy: the valid-action rate checks the plumbing; the speed and memory figures
are those of a Qwen3-4B QLoRA run of the same shape (prompt lengths are the small tokenizer's,
``prompt_tokens_per_decision``).

Run it on a machine with one CUDA GPU (at most 8 minutes; the model build and 4-bit load take most of it)::

    pip install torch==2.13.0 && pip install -e ".[gpu]"
    bash recipes/gpu_check.sh

and anywhere (CPU included, about a minute): a model of the same architecture shrunk to hidden 64 and 2 layers, a
smaller batch and 2 steps, still through the 4-bit bitsandbytes path, LoRA and GRPO::

    bash recipes/gpu_check.sh --dry_run

On a CPU, bitsandbytes' one-way repacking of 4-bit weights for inference is turned off, as in the recipes
(:func:`recruit_trl.models.loading.keep_4bit_layers_trainable`), so the dry run's gradients are exact.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every model and tokenizer here is built locally

BNB_PIP = 'pip install -e ".[gpu]"  (or: pip install "bitsandbytes==0.50.*")'
ENV = "clinical"

# Qwen3-4B's published dimensions (its config.json), built here with random weights.
QWEN3_4B = {
    "hidden_size": 2560,
    "intermediate_size": 9728,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1_000_000.0,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
}
# The dry run: the same architecture, small enough for a CPU; the vocabulary is the tokenizer's (None: set later).
DRY_RUN_MODEL = {
    **QWEN3_4B,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": None,
    "max_position_embeddings": 2048,
}
# Anchors and rollouts: every task, two reset seeds, three days each (18 anchors); 4 continuation days per action,
# so that the environment does not dominate. A random model's free answers never parse, so every row of a group would
# play the same fallback action: equal rewards, zero advantages, zero gradients. Constrained decoding samples listed
# actions only, so the rows of a group differ and the 4-bit LoRA backward pass produces real gradients (grad_norm > 0).
ROLLOUT = {
    "tasks": ["easy_bench", "medium_bench", "hard_bench"],
    "anchor_seeds": "100-101",
    "anchor_days": "0-100:50",
    "horizon": 4,
    "constrained_decoding": True,
    "reward_funcs": ["env_return_reward", "format_reward"],
}
REWARD_WEIGHTS = [1.0, 1.0]
LORA = {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": "all-linear", "task_type": "CAUSAL_LM"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; the sizes left out take the full check's defaults, or the dry run's with ``--dry_run``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--dry_run",
        action="store_true",
        help="Small model (hidden 64, 2 layers), batch 4, 2 generations, 2 steps: about a minute on a CPU (on the "
        "GPU when there is one).",
    )
    parser.add_argument("--max_steps", type=int, default=None, help="Optimizer steps (default: 5, dry run 2).")
    parser.add_argument("--output_dir", default="outputs/gpu_check", help="Where gpu_check.json is written.")
    parser.add_argument(
        "--per_device_train_batch_size", type=int, default=None, help="Rows per step (default: 16, dry run 4)."
    )
    parser.add_argument(
        "--num_generations", type=int, default=None, help="Rows per anchor, the GRPO group (default: 8, dry run 2)."
    )
    args = parser.parse_args(argv)
    defaults = {"max_steps": 2, "per_device_train_batch_size": 4, "num_generations": 2} if args.dry_run else {}
    defaults = {"max_steps": 5, "per_device_train_batch_size": 16, "num_generations": 8, **defaults}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.max_steps < 1 or args.num_generations < 2:
        parser.error("--max_steps must be >= 1 and --num_generations >= 2")
    if args.per_device_train_batch_size % args.num_generations:
        parser.error("--per_device_train_batch_size must be a multiple of --num_generations (whole GRPO groups)")
    return args


def check_requirements(dry_run: bool) -> None:
    """Fail early, with the fix, when bitsandbytes or (outside a dry run) a CUDA device is missing."""
    import torch

    if importlib.util.find_spec("bitsandbytes") is None:
        sys.exit(f"gpu_check: bitsandbytes is not installed; install it with: {BNB_PIP}")
    if not dry_run and not torch.cuda.is_available():
        sys.exit(
            "gpu_check: no CUDA device found (torch.cuda.is_available() is False). Run it on a GPU machine after "
            '`pip install torch==2.13.0 && pip install -e ".[gpu]"`, or add --dry_run for the small CPU check.'
        )


def build_tokenizer_for(interface):
    """A byte-level BPE tokenizer trained on one safe-agent episode per task, rendered as the rollouts render it."""
    from recruit_trl.traces import collect_traces
    from recruit_trl.workflow.tokenizer import build_tokenizer

    rows = collect_traces(interface, ROLLOUT["tasks"], [0], contract="index", recent_k=2, relabel=False)

    def texts():
        for row in rows:
            for message in row["messages"]:
                yield f"{message['role']}\n{message['content']}\n"
            yield f"assistant\n{row['completion']}\n"

    return build_tokenizer(texts(), vocab_size=2048)


def build_random_model(folder: Path, dims: dict, tokenizer, device: str, dtype) -> int:
    """Save a randomly initialised Qwen3 of ``dims`` and ``tokenizer`` into ``folder``; return its parameter count.

    On a GPU the weights are initialised there (seconds, where 4B parameters take minutes on a CPU) and saved in
    bf16 (about 8 GB for Qwen3-4B); then the GPU is emptied so that the peak memory is the 4-bit run's alone.
    """
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

    config = Qwen3Config(
        hidden_size=dims["hidden_size"],
        intermediate_size=dims["intermediate_size"],
        num_hidden_layers=dims["num_hidden_layers"],
        num_attention_heads=dims["num_attention_heads"],
        num_key_value_heads=dims["num_key_value_heads"],
        head_dim=dims["head_dim"],
        vocab_size=dims["vocab_size"],
        max_position_embeddings=dims["max_position_embeddings"],
        max_window_layers=dims["num_hidden_layers"],
        rope_parameters={"rope_type": "default", "rope_theta": dims["rope_theta"]},
        tie_word_embeddings=dims["tie_word_embeddings"],
        rms_norm_eps=dims["rms_norm_eps"],
        bos_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    num_parameters = sum(p.numel() for p in model.parameters())
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    del model
    if device == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return num_parameters


class GenerationTimer:
    """Times the rollout's ``generate`` calls: wall seconds and the completion tokens each returns.

    It takes the place of the rollout's ``_generate`` on that one object: timing the whole rollout call would also
    count the environment.
    """

    def __init__(self, rollout) -> None:
        self.calls: list[tuple[float, int]] = []
        self._generate = rollout._generate
        rollout._generate = self

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        result = self._generate(*args, **kwargs)  # ids come back on the CPU: the GPU is done
        self.calls.append((time.perf_counter() - start, sum(len(ids) for ids in result[0])))
        return result

    def tokens_per_s(self) -> float:
        """Generated tokens per second over the calls after the first (which pays for warm-up), else all."""
        calls = self.calls[1:] or self.calls
        seconds = sum(s for s, _ in calls)
        return sum(n for _, n in calls) / seconds if seconds > 0 else 0.0


def step_timer():
    """A ``TrainerCallback`` recording every optimizer step's wall time (rollout, loss, backward and update)."""
    import torch
    from transformers import TrainerCallback

    def sync() -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self._start = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            sync()
            self._start = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            self.seconds.append(time.perf_counter() - self._start)

    return StepTimer()


def count_linear4bit(model) -> int:
    """Layers that really hold 4-bit weights: ``bitsandbytes.nn.Linear4bit`` with a quantised ``Params4bit``."""
    import bitsandbytes as bnb

    return sum(
        1
        for module in model.modules()
        if isinstance(module, bnb.nn.Linear4bit)
        and isinstance(module.weight, bnb.nn.Params4bit)
        and module.weight.quant_state is not None
    )


def logged_mean(log_history: list[dict], key: str) -> float | None:
    """The mean of ``key`` over the trainer's logged steps (each step's value is already a mean over its rows)."""
    values = [entry[key] for entry in log_history if key in entry]
    return statistics.fmean(values) if values else None


def _round(value: float | None, digits: int) -> float | None:
    """``round``, passing ``None`` (a metric that was not logged) through."""
    return None if value is None else round(value, digits)


def device_name(cuda: bool) -> str:
    """The GPU's name, or the CPU's architecture and torch's vector instruction level."""
    import torch

    if cuda:
        return torch.cuda.get_device_name(0)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.backends.cpu.get_cpu_capability()})"


def versions() -> dict[str, str]:
    """Installed versions of the libraries the measurements depend on."""
    return {
        name: importlib.metadata.version(name)
        for name in ("torch", "trl", "transformers", "bitsandbytes", "peft", "accelerate")
    }


def main(args: argparse.Namespace) -> dict:
    """Build the model, run the GRPO steps, print and write the measurements; return them."""
    check_requirements(args.dry_run)
    import torch
    from peft import LoraConfig
    from transformers import AutoTokenizer, BitsAndBytesConfig, set_seed
    from trl import GRPOConfig, GRPOTrainer

    from recruit_trl.files import write_json_atomic
    from recruit_trl.models.loading import keep_4bit_layers_trainable
    from recruit_trl.protocol import get_env_interface
    from recruit_trl.rollout.rollout_funcs import make_rollout
    from recruit_trl.workflow.anchor_data import make_anchor_dataset
    from recruit_trl.workflow.arguments import ScriptArguments
    from rewards import get_reward_funcs

    started = time.perf_counter()
    timings: dict[str, float] = {}
    cuda = torch.cuda.is_available()
    compute_dtype = torch.bfloat16 if cuda else torch.float32  # bf16 is slower than fp32 on most CPUs
    dims = DRY_RUN_MODEL if args.dry_run else QWEN3_4B
    if not cuda:
        # The CPU run's model is tiny: a second thread gains nothing, and torch's threads spin-wait for a core when
        # another process holds one (steps 20x slower under a parallel test run).
        torch.set_num_threads(1)
    set_seed(0)

    interface = get_env_interface(ENV)
    t0 = time.perf_counter()
    tokenizer = build_tokenizer_for(interface)
    dims = {**dims, "vocab_size": dims["vocab_size"] or len(tokenizer)}
    with tempfile.TemporaryDirectory(prefix="gpu_check_model_") as folder:
        num_parameters = build_random_model(Path(folder), dims, tokenizer, "cuda" if cuda else "cpu", compute_dtype)
        timings["build_model"] = time.perf_counter() - t0
        tokenizer = AutoTokenizer.from_pretrained(folder, padding_side="left")

        script_args = ScriptArguments(env_name=ENV, **ROLLOUT)
        rollout = make_rollout(script_args, interface)
        generation = GenerationTimer(rollout)
        dataset = make_anchor_dataset(script_args, interface, rollout.cache, tasks=script_args.tasks)
        training_args = GRPOConfig(
            output_dir=args.output_dir,
            max_steps=args.max_steps,
            per_device_train_batch_size=args.per_device_train_batch_size,
            num_generations=args.num_generations,
            max_completion_length=12,  # the index contract's answer budget (the rollout's decision_tokens)
            learning_rate=1e-5,
            beta=0.0,
            temperature=1.0,
            reward_weights=REWARD_WEIGHTS,
            bf16=cuda,
            use_cpu=not cuda,
            activation_checkpointing=cuda,  # (gradient_checkpointing's new name) memory for a 4B model's activations
            model_init_kwargs={"dtype": compute_dtype},
            logging_steps=1,
            save_strategy="no",
            report_to="none",
            seed=0,
        )
        quantization = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute_dtype
        )
        timer = step_timer()
        t0 = time.perf_counter()
        # As recipes/grpo_clinical.py --load_in_4bit runs a real model: the trainer loads the folder with the
        # quantization config and adds the adapter. No prepare_model_for_kbit_training: the recipe does not call it
        # (TRL enables input gradients for checkpointing itself), and it would upcast the 151936 x 2560 embedding.
        trainer = GRPOTrainer(
            model=folder,
            reward_funcs=get_reward_funcs(script_args.reward_funcs),
            args=training_args,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=LoraConfig(**LORA),
            quantization_config=quantization,
            rollout_func=rollout,
            callbacks=[timer],
        )
        timings["load_4bit_and_lora"] = time.perf_counter() - t0
        keep_4bit_layers_trainable(trainer.model)
        linear4bit = count_linear4bit(trainer.model)
        if linear4bit == 0:
            raise RuntimeError("the model loaded without bitsandbytes Linear4bit layers: this is not a QLoRA run")
        t0 = time.perf_counter()
        trainer.train()
        timings["train"] = time.perf_counter() - t0

    history = trainer.state.log_history
    invalid = logged_mean(history, "rollout/invalid_action_rate")
    later_steps = timer.seconds[1:] or timer.seconds
    result = {
        "seconds_per_step": round(statistics.median(later_steps), 4),
        "step_seconds": [round(s, 4) for s in timer.seconds],
        "peak_gpu_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3) if cuda else None,
        "generated_tokens_per_s": round(generation.tokens_per_s(), 2),
        "valid_action_rate": None if invalid is None else round(1.0 - invalid, 4),
        "gen_tokens_per_decision": _round(logged_mean(history, "rollout/gen_tokens_per_decision"), 2),
        "prompt_tokens_per_decision": _round(logged_mean(history, "rollout/prompt_tokens_per_decision"), 1),
        "grad_norm": _round(logged_mean(history, "grad_norm"), 6),
        "env_time_share": _round(logged_mean(history, "rollout/env_time_share"), 4),
        "device": device_name(cuda),
        "versions": versions(),
        "num_parameters": num_parameters,
        "trainable_parameters": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "linear4bit_layers": linear4bit,
        "steps": trainer.state.global_step,
        "dry_run": args.dry_run,
        "config": {
            "model": {"class": "Qwen3ForCausalLM", "init": "random", **dims},
            "tokenizer_vocab": len(tokenizer),
            "quantization": {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "compute_dtype": str(compute_dtype)},
            "lora": LORA,
            "grpo": {
                "max_steps": args.max_steps,
                "per_device_train_batch_size": args.per_device_train_batch_size,
                "num_generations": args.num_generations,
                "max_completion_length": training_args.max_completion_length,
                "learning_rate": training_args.learning_rate,
                "beta": training_args.beta,
                "bf16": training_args.bf16,
                "gradient_checkpointing": training_args.activation_checkpointing,
                "use_cpu": training_args.use_cpu,
            },
            "rollout": {**ROLLOUT, "mode": script_args.mode, "env": ENV, "reward_weights": REWARD_WEIGHTS},
            "anchors": len(dataset),
        },
        "timings_seconds": {k: round(v, 2) for k, v in timings.items()},
        "seconds_total": round(time.perf_counter() - started, 2),
    }
    write_json_atomic(Path(args.output_dir) / "gpu_check.json", result)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main(parse_args())

"""Seconds of the model's pass over a prompt by batch size: whether a fuller generation batch would make episode
mode's lock-step decoding cheaper per decision on this machine.

    python docs/results/prefill_batch_size.py --model outputs/sft_conquest --json docs/results/prefill_batch_size.json

Random prompts of --tokens tokens, no padding; every batch size is timed --rounds times (interleaved) and the median
seconds per prompt are reported.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoModelForCausalLM

from recruit_trl.files import write_json_atomic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder")
    parser.add_argument("--tokens", type=int, default=500, help="prompt length (conquest's mean is ~506)")
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    vocab = model.config.vocab_size
    times: dict[int, list[float]] = {n: [] for n in args.batch_sizes}
    with torch.no_grad():
        for _ in range(args.rounds):
            for n in args.batch_sizes:
                ids = torch.randint(0, vocab, (n, args.tokens))
                reps = max(1, 16 // n)  # 16 prompts a measurement at every batch size
                start = time.perf_counter()
                for _ in range(reps):
                    model(input_ids=ids, attention_mask=torch.ones_like(ids), logits_to_keep=1)
                times[n].append((time.perf_counter() - start) / (reps * n))
    figures = {str(n): round(statistics.median(v) * 1000, 2) for n, v in times.items()}
    print("ms per prompt by batch size (median):", figures)
    if args.json:
        write_json_atomic(
            args.json,
            {
                "ms_per_prompt": figures,
                "tokens": args.tokens,
                "rounds": args.rounds,
                "torch_threads": torch.get_num_threads(),
                "model": args.model,
            },
        )


if __name__ == "__main__":
    main()

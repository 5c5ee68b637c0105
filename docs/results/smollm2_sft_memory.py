"""Peak memory and time of a few SmolLM2-135M LoRA SFT steps on the conquest teacher rows: ``recipes/sft_conquest.py
--config sft_conquest_smollm2.yaml`` without its benchmark.

    python docs/results/smollm2_sft_memory.py --output_dir outputs/smollm2_memory
    python docs/results/smollm2_sft_memory.py --output_dir outputs/smollm2_memory_ckpt --gradient_checkpointing true

Run from the repository root; every flag goes to the recipe's parser (default here: 3 steps). Prints the process's
peak resident memory and the training time.
"""

import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path("recipes").resolve()))
import sft_conquest  # noqa: E402

if __name__ == "__main__":
    sft_conquest.benchmark_sft = lambda *args: args[-1]  # training only: the report, unbenchmarked
    argv = ["--config", "sft_conquest_smollm2.yaml", "--max_steps", "3", "--save_steps", "1000", *sys.argv[1:]]
    start = time.time()
    sft_conquest.main(*sft_conquest.parse_args(argv))
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    print(f"peak resident memory {peak_gb:.1f} GB; warm start {time.time() - start:.0f} s")

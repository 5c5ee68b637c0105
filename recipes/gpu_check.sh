#!/usr/bin/env bash
# GPU check: a few QLoRA GRPO steps on a random model of Qwen3-4B's shape, one JSON object of measurements
# (also in <output_dir>/gpu_check.json, default outputs/gpu_check). See recipes/gpu_check.py.
#   bash recipes/gpu_check.sh             # one CUDA GPU: pip install torch==2.13.0 && pip install -e ".[gpu]"
#   bash recipes/gpu_check.sh --dry_run   # anywhere, about a minute on a CPU
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1
limit=480  # 8 minutes, the check's budget
# Not exec: the wrapper stays to say so when the limit is hit (timeout exits 124).
rc=0
timeout --kill-after=15 "$limit" python recipes/gpu_check.py "$@" || rc=$?
if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "gpu_check: TIMED OUT after ${limit} s (rc $rc): no gpu_check.json was written" >&2
fi
exit "$rc"

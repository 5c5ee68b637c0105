"""SmolLM2 LoRA SFT variant, then the decision-level table on the SmolLM2 run's 88 held-out decisions.

usage (from the repository root of commit e236f89, whose recipes/sft_clinical.py it imports):
    python docs/results/smollm2_sft_sweep.py LABEL STEPS LR BATCH GRAD_ACCUM TRAIN_SEEDS
writes outputs/sft_sweep/LABEL (the adapter, heldout_report.json) and outputs/sft_sweep/LABEL-decisions.json.
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "recipes"))
import sft_clinical  # noqa: E402

from recruit_trl.protocol import get_env_interface
from recruit_trl.ranges import parse_int_ranges
from recruit_trl.workflow.decisions.decision_set import decision_set, sample_decisions
from recruit_trl.workflow.decisions.report import evaluate_decisions, format_decision_report

label, steps, lr, bs, ga, seeds = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6]
out = f"outputs/sft_sweep/{label}"
t0 = time.perf_counter()
args = sft_clinical.parse_args(
    [
        "--config",
        "sft_clinical_smollm2.yaml",
        "--dagger_rounds",
        "0",
        "--sft_train_seeds",
        seeds,
        "--sft_heldout_seeds",
        "400",
        "--sft_heldout_rows",
        "32",
        "--max_steps",
        steps,
        "--per_device_train_batch_size",
        bs,
        "--gradient_accumulation_steps",
        ga,
        "--learning_rate",
        lr,
        "--output_dir",
        out,
    ]
)
report = sft_clinical.main(*args)
sft_seconds = time.perf_counter() - t0
interface = get_env_interface("clinical")
states = decision_set(
    interface, list(interface.tasks()), parse_int_ranges("500-505"), parse_int_ranges("0-150:30"), teacher="expert"
)
states = sample_decisions(interface, states, 100)
t1 = time.perf_counter()
result = evaluate_decisions(interface, {label: f"model:{out}", "safe": "safe"}, states, reference="safe")
print(format_decision_report(result))
print(
    json.dumps(
        {
            "label": label,
            "sft_seconds": round(sft_seconds),
            "eval_seconds": round(time.perf_counter() - t1),
            "heldout": {k: report[k] for k in ("rows", "teacher_match", "strict_json_rate", "valid_action_rate")},
        }
    )
)
json.dump(result, open(f"{out}-decisions.json", "w"), indent=2)

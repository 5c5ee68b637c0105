"""How many continuations a conquest state value needs: the safe agent's answer against the teacher's at the held-out
states of ``recipes/grpo_conquest.py``'s decision report (seeds 500-507, every 20th decision, 93 states), valued with
one continuation for each of the continuation seeds 0-3 (the report uses seed 0) and with 8 continuations averaged.

usage (from the repository root):
    python docs/results/conquest_state_value_seeds.py docs/results/conquest_state_value_seeds.json
"""

import sys

from recruit_trl.files import write_json_atomic
from recruit_trl.protocol import get_env_interface
from recruit_trl.workflow.decisions.decision_set import decision_set, sample_decisions
from recruit_trl.workflow.decisions.report import evaluate_decisions

conquest = get_env_interface("conquest")
seeds, days = list(range(500, 508)), list(range(0, 201, 20))
states = decision_set(conquest, ["classic3", "duel"], seeds, days, teacher="teacher")
states = sample_decisions(conquest, states, 100)
runs = [{"seed": seed, "continuation_seeds": 1} for seed in range(4)] + [{"seed": 0, "continuation_seeds": 8}]
out = []
for run in runs:
    result = evaluate_decisions(
        conquest, {"teacher": "teacher", "safe": "safe"}, states, continuation="teacher", progress=False, **run
    )
    values = result["state_value"]
    row = {**run, "states": len(states), **{p: {k: values[p][k] for k in ("mean", "se")} for p in values}}
    row["safe_minus_teacher"] = {k: values["safe"]["vs_reference"][k] for k in ("mean", "se", "better", "worse")}
    print(row)
    out.append(row)
write_json_atomic(sys.argv[1], {"runs": out})

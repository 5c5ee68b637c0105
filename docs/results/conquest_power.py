"""How many training seeds and held-out games the conquest rung of the learning check would need.

Reads docs/results/conquest_episode_duel.json (the duel runs of episode mode from the SFT start, 200 held-out games
each) and prints, for a range of true effects (credit minus control in greedy win rate), the training seeds per arm
at which the paired t over seeds reaches the rung's 2.8 with 80 % probability, and the 2-core hours that takes.

The spread between training seeds comes from the two runs that differ only in their seed (uncentred, temperature 0.5):
their difference, less the games' own noise. A seed's credit-minus-control difference then varies with
``sd_d^2 = 2 * sd_seed^2 + 2 * se_games(N)^2`` (unpaired games, the conservative case; pairing the games of the two
arms measured 0.027 at 200 games against the unpaired 0.045). Seeds needed, normal approximation:
``n = ((2.8 + 0.84) * sd_d / effect)^2``.

Usage: python docs/results/conquest_power.py [--games 400] [--eval_seconds 150] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

RESULTS = Path(__file__).with_name("conquest_episode_duel.json")
T_TARGET, Z_POWER = 2.8, 0.84  # the rung's t, and 80 % power


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=400, help="held-out games per model")
    parser.add_argument(
        "--eval_seconds",
        type=float,
        default=150.0,
        help="seconds 200 greedy duel games take to evaluate on the machine (2 cores: about 150)",
    )
    parser.add_argument("--json", help="also write the table here")
    args = parser.parse_args()
    runs = json.loads(RESULTS.read_text())
    a, b = runs["episode_ab_t0.5_seed0"], runs["episode_ab_t0.5_seed1"]
    seed_var = max(0.0, (a["win_rate"] - b["win_rate"]) ** 2 / 2 - (a["se"] ** 2 + b["se"] ** 2) / 2)
    p = (a["win_rate"] + b["win_rate"]) / 2
    se_games = math.sqrt(p * (1 - p) / args.games)
    sd_diff = math.sqrt(2 * seed_var + 2 * se_games**2)
    train_s = (a["training"]["seconds"] + runs["control_shuffled_t0.5_seed0"]["training"]["seconds"]) / 2
    eval_s = args.eval_seconds * args.games / 200
    pair_hours = 2 * (train_s + eval_s) / 3600
    print(
        f"seed sd of the win rate {math.sqrt(seed_var):.3f} (seeds 0 and 1: {a['win_rate']:.3f}, {b['win_rate']:.3f})"
    )
    print(f"game se at {args.games} games {se_games:.3f}; sd of a seed's credit-minus-control {sd_diff:.3f}")
    print(f"one seed pair (both arms trained and evaluated) {pair_hours:.2f} h on 2 cores")
    rows = []
    for effect in (0.03, 0.05, 0.08, 0.10):
        seeds = max(2, math.ceil(((T_TARGET + Z_POWER) * sd_diff / effect) ** 2))
        rows.append({"effect": effect, "seeds_per_arm": seeds, "hours": round(seeds * pair_hours, 1)})
        print(f"effect {effect:.2f}: {seeds} seeds per arm, {seeds * pair_hours:.1f} h")
    if args.json:
        out = {"games": args.games, "seed_sd": math.sqrt(seed_var), "se_games": se_games, "sd_diff": sd_diff,
               "pair_hours": pair_hours, "rows": rows}  # fmt: skip
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()

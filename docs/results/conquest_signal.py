"""How much of a decision's credit is the decision's and how much is dice: the same candidate answers, scored under
two independent dice streams, ranked alike or not.

At each state (the teacher's games on duel seeds 2000-2007, every 20th decision up to 200), every listed candidate
answer (at most 8) is played, then the continuation plays on for H decisions under dice stream s (s = 0, 1; the
same stream for every candidate of a state: common random numbers). A candidate's value under a stream is the
credit episode mode gives the decision at that horizon: the change of conquest's potential over those decisions, plus
1 when the game was won within them. The signal is the Pearson correlation, pooled over the states, of the
candidates' values under stream 0 and stream 1, each centred on its state's mean: 1 means the ranking is the
decision's, 0 that it is the dice's.

Continuations: the model (``model:PATH``, sampled at --temperature, all branches in lock-step) or an environment
policy (e.g. ``teacher``, the branch mode's continuation). H: --horizons, 0 for the whole game.

usage: python docs/results/conquest_signal.py --policy model:outputs/grpo_conquest/sft --json FILE
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time

from recruit_trl.contracts import build_messages, parse_action
from recruit_trl.protocol import get_env_interface, policy_action
from recruit_trl.ranges import parse_int_ranges
from recruit_trl.rollout.anchors import Anchor, AnchorCache
from recruit_trl.rollout.continuation import day_seed

INTERFACE = get_env_interface("conquest")


def pooled_r(pairs: list[list[tuple[float, float]]]) -> float:
    """Pearson r of (x, y) over all states, each state's values centred on its own means."""
    xs, ys = [], []
    for state in pairs:
        mx = sum(x for x, _ in state) / len(state)
        my = sum(y for _, y in state) / len(state)
        xs += [x - mx for x, _ in state]
        ys += [y - my for _, y in state]
    sxy = sum(x * y for x, y in zip(xs, ys, strict=True))
    sxx, syy = sum(x * x for x in xs), sum(y * y for y in ys)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")


def play(branches, horizon: int, policy: str, model=None, tokenizer=None, temperature: float = 1.0) -> None:
    """Every branch plays on for ``horizon`` decisions (0: to the game's end), all of them in lock-step."""
    from transformers import GenerationConfig

    from recruit_trl.models.generation import encode_prompt, sample

    env_policy = None if policy.startswith("model:") else INTERFACE.get_policy(policy)
    config = GenerationConfig(do_sample=True, temperature=temperature, top_p=1.0)
    step = 1
    while True:
        active = [b for b in branches if not b["done"] and (horizon == 0 or step <= horizon)]
        if not active:
            return
        if env_policy is None:
            cands = [INTERFACE.candidate_actions(b["obs"]) for b in active]
            prompts = [encode_prompt(tokenizer, build_messages(INTERFACE, b["obs"], [], "index", c))
                       for b, c in zip(active, cands, strict=True)]  # fmt: skip
            ids, _ = sample(model, tokenizer, prompts, config, 12, 256)
            texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
            actions = [parse_action(t, "index", INTERFACE, b["obs"], c).action
                       for t, b, c in zip(texts, active, cands, strict=True)]  # fmt: skip
        else:
            actions = [policy_action(env_policy, b["env"], b["obs"], b["rng"]) for b in active]
        for b, action in zip(active, actions, strict=True):
            b["env"].reseed(day_seed(b["seed"], step))
            b["obs"], _, terminated, truncated, info = b["env"].step(action)
            b["done"] = terminated or truncated
            b["won"] = info.get("outcome") == "win"
        step += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", required=True, help="the continuation: model:PATH or an environment policy")
    parser.add_argument("--temperature", type=float, default=0.5, help="a model continuation's sampling temperature")
    parser.add_argument("--horizons", default="15,0", help="decisions scored after the answer (0: the whole game)")
    parser.add_argument("--seeds", default="2000-2007")
    parser.add_argument("--days", default="0-200:20", help="decision numbers of the states")
    parser.add_argument("--candidates", type=int, default=8)
    parser.add_argument("--json", required=True)
    args = parser.parse_args()
    model = tokenizer = None
    if args.policy.startswith("model:"):
        from recruit_trl.models.loading import load_for_inference

        model, tokenizer = load_for_inference(args.policy[len("model:") :], {})
    cache = AnchorCache(INTERFACE)
    anchors = [
        Anchor("duel", s, d, "teacher") for s in parse_int_ranges(args.seeds) for d in parse_int_ranges(args.days)
    ]
    states = [st for a in anchors if not (st := cache.get(a)).done and len(INTERFACE.candidate_actions(st.obs)) > 1]
    out = {"policy": args.policy, "temperature": args.temperature, "states": len(states), "horizons": {}}
    for horizon in [int(h) for h in args.horizons.split(",")]:
        t0 = time.perf_counter()
        branches = []
        for i, state in enumerate(states):
            for k, candidate in enumerate(INTERFACE.candidate_actions(state.obs)[: args.candidates]):
                for stream in (0, 1):
                    env = INTERFACE.make_env("duel")
                    env.restore(state.snapshot)
                    seed = 1_000_003 * (i + 1) + 7_919 * stream
                    env.reseed(day_seed(seed, 0))
                    obs, _, terminated, truncated, info = env.step(candidate)
                    branches.append({"state": i, "k": k, "stream": stream, "env": env, "obs": obs, "seed": seed,
                                     "before": INTERFACE.potential(state.obs), "done": terminated or truncated,
                                     "won": info.get("outcome") == "win", "rng": random.Random(seed)})  # fmt: skip
        play(branches, horizon, args.policy, model, tokenizer, args.temperature)
        values: dict[tuple[int, int], list[float]] = {}
        for b in branches:
            value = INTERFACE.potential(b["obs"]) - b["before"] + float(b["won"])
            values.setdefault((b["state"], b["k"]), [0.0, 0.0])[b["stream"]] = value
        pairs = [[tuple(v) for (s, _), v in values.items() if s == i] for i in range(len(states))]
        out["horizons"][str(horizon)] = {
            "r": round(pooled_r(pairs), 3),
            "branches": len(branches),
            "wins": sum(b["won"] for b in branches),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        print(horizon, out["horizons"][str(horizon)], flush=True)
    with open(args.json, "w") as f:
        json.dump(out, f, indent=2)


if __name__ == "__main__":
    main()

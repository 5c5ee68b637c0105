"""GRPO from snapshots on a toy walk, in one file: recruit_trl's core idea, readable top to bottom.

A walker on a number line has 12 days to reach a target and stop there; now and then a gust pushes it one step more. A
training row is an *anchor*: a state somewhere in a walk, rebuilt by replay and kept as a snapshot. Its GRPO group is G
answers of the model in that state, each applied to the *same* snapshot and scored by the final score after a
continuation policy plays on to the end. Every day of every branch is re-seeded from (anchor, step, day), so the
branches meet the same gusts (common random numbers): they differ only by their actions, and the group advantage is
the credit for that one decision. TRL's `GRPOTrainer` takes the rows from `rollout_func` and does the rest. The model
is recruit_trl's tiny Qwen3, built here in seconds from the walk's own text (nothing is downloaded). Run:
`python recipes/grpo_toy_walk.py` (about 30 s on 2 CPU cores) prints the greedy score before and after.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import statistics

from recruit_trl.workflow.tiny_model import build_tiny_model  # before TRL: keeps a library notice off the console

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental in TRL

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

# ------------------------------------------------------------------------------------- 1. a multi-step environment
DAYS, GUST = 12, 0.2
TARGETS = {"near": 3, "far": 8}  # task -> target position; every walk starts at 0
ACTIONS = ("toward", "away", "wait", "stop")  # a step toward the target or away from it, or none; stop ends the walk


class Walk:
    """`reset`/`step`, and what branching needs: `snapshot`/`restore` (RNG included) and `reseed` (common dice)."""

    def __init__(self, task: str) -> None:
        self.target, self.position, self.day, self.done, self.rng = TARGETS[task], 0, 0, False, random.Random(0)

    def observation(self) -> dict:
        return {"day": self.day, "position": self.position, "target": self.target}

    def reset(self, seed: int) -> dict:
        self.position, self.day, self.done, self.rng = 0, 0, False, random.Random(seed)
        return self.observation()

    def step(self, action: str) -> dict:
        side = (self.target > self.position) - (self.target < self.position)  # +1: the target is to the right
        self.position += {"toward": side, "away": -side or 1}.get(action, 0)
        if action != "stop" and self.rng.random() < GUST:
            self.position += self.rng.choice((-1, 1))
        self.day += 1
        self.done = action == "stop" or self.day >= DAYS
        return self.observation()

    def final_score(self) -> float:  # 1 on the target, 0 at the target's distance from it or more
        return max(0.0, 1 - abs(self.target - self.position) / self.target)

    def snapshot(self) -> tuple:
        return self.position, self.day, self.done, self.rng.getstate()

    def restore(self, snapshot: tuple) -> None:
        self.position, self.day, self.done, state = snapshot
        self.rng.setstate(state)

    def reseed(self, seed: int) -> None:
        self.rng = random.Random(seed)


def wanderer(obs: dict, rng: random.Random) -> str:  # plays the days before an anchor; never stops
    return "toward" if rng.random() < 2 / 3 else rng.choice(ACTIONS[:3])


def continuation(obs: dict) -> str:
    """Plays on after the sampled action. The simplest stops at once: a branch scores where its action led."""
    return "stop"


# ----------------------------------------------------------------------- 2. the prompt and the answer (index contract)
SYSTEM = "You walk on a number line, one step per day. Reach the target and stop there.\n"
SYSTEM += 'Reply with one JSON object {"action_index": N} choosing an action from the list.'
FALLBACK = "wait"  # the safe agent: what an answer that does not parse plays


def prompt(obs: dict) -> list[dict]:
    gap = obs["target"] - obs["position"]
    where = "to the right" if gap > 0 else "to the left" if gap < 0 else "here"
    state = f"Day {obs['day']}/{DAYS} | position {obs['position']} | target {obs['target']} | the target is {where}"
    listing = "\n".join(f"{k}: {action}" for k, action in enumerate(ACTIONS))
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"{state}\nActions:\n{listing}"}]


def parse(text: str) -> str:
    """Strict: one JSON object naming a listed action; anything else plays the fallback."""
    try:
        k = json.loads(text)["action_index"]
    except (ValueError, TypeError, KeyError):
        return FALLBACK
    return ACTIONS[k] if type(k) is int and 0 <= k < len(ACTIONS) else FALLBACK


def encode(tokenizer, obs: dict) -> list[int]:
    text = tokenizer.apply_chat_template(prompt(obs), add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@torch.no_grad()
def generate(model, tokenizer, prompt_ids: list[list[int]], sample: bool) -> list[list[int]]:
    """One answer per prompt (its token ids up to and with the end of turn), sampled at temperature 1 or greedy."""
    batch = tokenizer.pad({"input_ids": prompt_ids}, return_tensors="pt").to(model.device)
    out = model.generate(**batch, do_sample=sample, temperature=1.0 if sample else None, top_p=1.0,
                         max_new_tokens=12, pad_token_id=tokenizer.pad_token_id)  # fmt: skip
    rows, eos = out[:, batch["input_ids"].shape[1] :].tolist(), tokenizer.eos_token_id
    return [row[: row.index(eos) + 1] if eos in row else row for row in rows]


# ------------------------------------------------------------------------------ 3. anchors: states, as snapshots
SNAPSHOTS: dict[str, tuple] = {}  # anchor key -> (snapshot, observation)


def anchor_state(key: str) -> tuple:
    """The anchor's state, rebuilt once by replaying the wanderer's days (deterministic), then cached."""
    if key not in SNAPSHOTS:
        anchor = json.loads(key)
        env, rng = Walk(anchor["task"]), random.Random(anchor["seed"])
        obs = env.reset(anchor["seed"])
        for _ in range(anchor["day"]):
            obs = env.step(wanderer(obs, rng))
        SNAPSHOTS[key] = env.snapshot(), obs
    return SNAPSHOTS[key]


# ------------------------------------------------------------ 4. branches with common random numbers, the advantage
def day_seed(key: str, step: int, day: int) -> int:
    """The same dice for every branch of a group on the same day, whatever each drew before."""
    return int.from_bytes(hashlib.sha256(f"{key}|{step}|{day}".encode()).digest()[:8], "big")


def branch_score(key: str, action: str, step: int) -> float:
    """Restore the anchor's snapshot, play `action`, let the continuation play to the end: the final score."""
    snapshot, obs = anchor_state(key)
    env = Walk(json.loads(key)["task"])
    env.restore(snapshot)
    day = 0
    while not env.done:
        env.reseed(day_seed(key, step, day))
        obs = env.step(action if day == 0 else continuation(obs))
        day += 1
    return env.final_score()


def group_advantages(scores: list[float], g: int) -> list[float]:
    """GRPO's credit, as TRL computes it from the rewards: (score - group mean) / group standard deviation."""
    groups = [scores[i : i + g] for i in range(0, len(scores), g)]
    return [(s - statistics.fmean(group)) / (statistics.pstdev(group) + 1e-4) for group in groups for s in group]


def make_rollout_func(tokenizer, g: int):
    def rollout_func(prompts: list[str], trainer) -> dict:
        """TRL's `rollout_func`: the prompts are anchor keys, each repeated G times in a row (one group per anchor)."""
        step = trainer.state.global_step
        model = trainer.accelerator.unwrap_model(trainer.model)
        prompt_ids = [encode(tokenizer, anchor_state(key)[1]) for key in prompts]
        completion_ids = generate(model, tokenizer, prompt_ids, sample=True)
        actions = [parse(tokenizer.decode(ids, skip_special_tokens=True)) for ids in completion_ids]
        scores = [branch_score(key, action, step) for key, action in zip(prompts, actions, strict=True)]
        if step % 10 == 0:
            advantages = group_advantages(scores, g)
            informative = sum(any(advantages[i : i + g]) for i in range(0, len(advantages), g))
            print(f"step {step}: mean branch score {statistics.fmean(scores):.3f}, "
                  f"groups with a signal {informative}/{len(scores) // g}", flush=True)  # fmt: skip
        # Any field besides the three TRL requires reaches the reward functions by its name.
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None, "final_score": scores}

    return rollout_func


def final_score_reward(completions: list, final_score: list[float], **kwargs) -> list[float]:
    return final_score


# ------------------------------------------------------------------------------------- 5. the model, its score
def build_model(folder: str, seed: int) -> str:
    """recruit_trl's tiny Qwen3 (0.33M parameters), warmed on the walks' prompts with careless answers (away from the
    target two times in five, else any action): it learns the format and to read the state, and walks the wrong way."""
    rng, rows = random.Random(seed), []
    for walk_seed in range(200, 232):
        for task in TARGETS:
            env = Walk(task)
            obs = env.reset(walk_seed)
            while not env.done:
                careless = ACTIONS.index("away") if rng.random() < 0.4 else rng.randrange(len(ACTIONS))
                rows.append({"messages": prompt(obs), "completion": json.dumps({"action_index": careless})})
                obs = env.step(wanderer(obs, rng))
    sizes = {"hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 1, "intermediate_size": 256}
    return str(build_tiny_model(folder, rows, **sizes, vocab_size=512, max_steps=200, seed=seed, progress=False))


def greedy_score(model, tokenizer, seeds: range) -> dict[str, float]:
    """Mean final score of whole walks the model plays greedily, per task, on held-out reset seeds."""
    scores = {}
    for task in TARGETS:
        envs = [Walk(task) for _ in seeds]
        obs = [env.reset(seed) for env, seed in zip(envs, seeds, strict=True)]
        while live := [i for i, env in enumerate(envs) if not env.done]:
            answers = generate(model, tokenizer, [encode(tokenizer, obs[i]) for i in live], sample=False)
            for i, ids in zip(live, answers, strict=True):
                obs[i] = envs[i].step(parse(tokenizer.decode(ids, skip_special_tokens=True)))
        scores[task] = statistics.fmean(env.final_score() for env in envs)
    return scores


# ------------------------------------------------------------------------------------------------- 6. training
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = {"max_steps": 20, "learning_rate": 1e-3, "num_generations": 4, "anchors_per_step": 16, "seed": 0}
    for name, default in {**defaults, "output_dir": "outputs/grpo_toy_walk"}.items():
        parser.add_argument(f"--{name}", type=type(default), default=default)  # num_generations: G, per anchor
    args = parser.parse_args()

    model_path = build_model(os.path.join(args.output_dir, "model"), args.seed)
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_path)
    before = greedy_score(model, tokenizer, range(20))  # held-out reset seeds: the anchors' walks use 100-115

    anchors = [{"task": t, "seed": s, "day": d} for t in TARGETS for s in range(100, 116) for d in range(DAYS)]
    config = GRPOConfig(
        output_dir=args.output_dir, max_steps=args.max_steps, learning_rate=args.learning_rate, seed=args.seed,
        per_device_train_batch_size=args.anchors_per_step * args.num_generations, num_generations=args.num_generations,
        max_completion_length=12, temperature=1.0, beta=0.0, logging_strategy="no", save_strategy="no", report_to=[],
        disable_tqdm=True, use_cpu=not torch.cuda.is_available(), bf16=False,
    )  # fmt: skip
    rollout_func = make_rollout_func(tokenizer, args.num_generations)
    trainer = GRPOTrainer(
        model=model, reward_funcs=final_score_reward, args=config, processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": [json.dumps(a) for a in anchors]}), rollout_func=rollout_func,
    )  # fmt: skip
    trainer.train()

    after = greedy_score(trainer.model, tokenizer, range(20))
    print(" | ".join(f"{task}: {before[task]:.3f} -> {after[task]:.3f}" for task in TARGETS))
    means = statistics.fmean(before.values()), statistics.fmean(after.values())
    print("greedy score on held-out seeds 0-19: {:.3f} before, {:.3f} after".format(*means), args.max_steps, "steps")


if __name__ == "__main__":
    main()

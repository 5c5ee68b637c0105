"""GRPO for an LLM agent on the clinical recruitment environment, through TRL's ``GRPOTrainer``.

With no arguments on a CPU machine this is the main job, end to end in one output folder:

    accelerate launch recipes/grpo_clinical.py
    accelerate launch recipes/grpo_clinical.py --model_name_or_path smollm2   # a real LLM with LoRA, <= 45 min
    accelerate launch --config_file accelerate_configs/cpu_ddp.yaml recipes/grpo_clinical.py --max_steps 10
    accelerate launch --config_file accelerate_configs/single_gpu.yaml recipes/grpo_clinical.py \\
        --model_name_or_path Qwen/Qwen3-4B --load_in_4bit --bf16 true --per_device_train_batch_size 16
    python recipes/grpo_clinical.py --config recipes/grpo_clinical.yaml

Top to bottom:
1. Arguments: ``ScriptArguments`` (anchors, rollout mode, rewards, warm start, report) + ``GRPOConfig`` +
   ``ModelConfig`` through ``TrlParser`` (``--config file.yaml`` supported); CPU-friendly defaults, and a named
   model's own (``recruit_trl.training.MODEL_PRESETS``: ``smollm2``'s are sized for 45 minutes on 2 cores).
2. The environment interface (``--env``) and its tasks (``--tasks``, default: all of the environment's).
3. The policy model: ``tiny`` (a warm tiny Qwen3 built locally and cached), ``smollm2`` (from its wheel), or
   any local folder / cached hub id, loaded as ``ModelConfig`` says in every stage (dtype, attention,
   ``--load_in_4bit`` for QLoRA).
4. Warm start (``--warm_start auto``): the SFT recipe's pipeline (``recruit_trl.warm_start``), in-process with
   this run's ``ModelConfig``, imitates ``--teacher`` (cached in ``<output_dir>/sft``; DAgger rounds, the best round
   kept; its settings are the SFT recipe's flags as ``--sft_*``). A pretrained model trains a
   LoRA adapter, which RL continues; the tiny model built here fine-tunes every weight (``--sft_full_finetune
   auto``) and RL then trains every weight too (``--rl_full_finetune auto``) or a fresh adapter on it.
5. Anchors: states on tasks x seeds x days, reached by replaying ``--anchor_policy`` (an environment policy) or
   recorded once from the model RL starts from (``--anchor_policy student``: on-policy states); the prompt column
   carries the anchor. Rollouts (``--mode branch|window``; ``--continuation_seeds`` continuations per distinct
   action, the first ``--self_horizon`` days of each played by the policy itself) and rewards (``--reward_funcs``
   x ``--reward_weights``), then ``trainer.train()`` (resumes from the last checkpoint); the adapter is saved to
   ``--output_dir``.
6. Report (``--report``): ``--eval_baselines``, and the base, SFT and RL models (``--eval_episodes``: the tiny model),
   over whole episodes on held-out ``--eval_seeds`` (models greedy; those named by ``--eval_sampled`` also sampled
   at ``--eval_temperature`` / ``--eval_top_p``: rows ``<model>-sampled``); the decision-level report
   (``--eval_decisions``: benchmark table and state values on held-out states, every model);
   ``report.json``, PNG plots and a one-screen summary in ``--output_dir`` (``recruit_trl.run_report``). The
   baselines (pure Python) run in a background process while the warm start traces the teacher, on the core that
   would otherwise idle.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

import torch  # noqa: E402
from accelerate import PartialState  # noqa: E402
from trl import GRPOConfig, GRPOTrainer, ModelConfig, TrlParser  # noqa: E402

from recruit_trl.files import write_json_atomic  # noqa: E402
from recruit_trl.models import keep_4bit_layers_trainable, loading_config, model_summary  # noqa: E402
from recruit_trl.protocol import get_env_interface  # noqa: E402
from recruit_trl.rollout import make_rollout  # noqa: E402
from recruit_trl.run_report import report_run, sft_trained, start_baseline_evals  # noqa: E402
from recruit_trl.training import (  # noqa: E402
    MODEL_PRESETS,
    ScriptArguments,
    cpu_defaults,
    last_checkpoint,
    make_anchor_dataset,
    model_defaults,
    model_init_kwargs,
    preset_name,
    resolve_model_for,
    rl_start,
    with_env_tasks,
)
from recruit_trl.warm_start import run_warm_start  # noqa: E402
from rewards import get_reward_funcs  # noqa: E402


def main(
    script_args: ScriptArguments, training_args: GRPOConfig, model_args: ModelConfig, trainer_cls=GRPOTrainer
) -> GRPOTrainer:
    started = time.perf_counter()
    timings: dict[str, float] = {}
    if training_args.use_vllm:
        raise ValueError("recruit_trl rollouts generate with transformers; vLLM is not supported (drop --use_vllm)")
    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // max(1, training_args.world_size)))

    # 1. Environment (and its tasks, unless --tasks names some).
    interface = get_env_interface(script_args.env)
    with_env_tasks(script_args, interface)

    # 2. Policy model (a local folder).
    t0 = time.perf_counter()
    model_path = resolve_model_for(model_args.model_name_or_path, script_args, interface)
    timings["base_model"] = time.perf_counter() - t0
    # One model configuration (dtype, attention, quantisation) for every stage: warm start, RL and evaluation.
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)

    # 3. Warm start: imitate the teacher first (cached in <output_dir>/sft), then continue from what it trained.
    background = None
    if script_args.sft_adapter is None and script_args.warm_start == "auto":
        t0 = time.perf_counter()
        background = start_baseline_evals(script_args, training_args, model_args, model_path)
        script_args.sft_adapter = run_warm_start(script_args, training_args, model_args, model_path)
        timings["sft"] = time.perf_counter() - t0
    model, tokenizer, peft_config = rl_start(script_args, training_args, model_args, model_path)

    # 4. Anchors (states the samples start from; on-policy ones are recorded by one process, read by the others),
    # rollouts, rewards and training.
    rollout = make_rollout(script_args, interface)
    with PartialState().main_process_first():
        dataset = make_anchor_dataset(
            script_args, interface, rollout.cache, student=script_args.sft_adapter or model_path,
            temperature=training_args.temperature, top_p=training_args.top_p,
            states_file=str(Path(training_args.output_dir) / "anchor_states.json"),
            model_loading=loading_config(model_args),
        )  # fmt: skip
    trainer = trainer_cls(
        model=model,
        reward_funcs=get_reward_funcs(script_args.reward_funcs),
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,  # quantisation, when asked for, is in training_args.model_init_kwargs
        rollout_func=rollout,
    )
    keep_4bit_layers_trainable(trainer.model)  # rollouts generate in eval mode; see its docstring (CPU QLoRA)
    t0 = time.perf_counter()
    trainer.train(resume_from_checkpoint=last_checkpoint(training_args.output_dir))
    timings["rl"] = time.perf_counter() - t0
    trainer.save_model(training_args.output_dir)
    trainer.save_state()  # trainer_state.json: every logged metric, step by step
    if trainer.accelerator.is_main_process:
        info = {
            "base_model": model_path, "world_size": trainer.accelerator.num_processes, "anchors": len(dataset),
            "model": model_summary(trainer.model), "sft_trained": sft_trained(script_args),
        }  # fmt: skip
        write_json_atomic(Path(training_args.output_dir, "run_info.json"), info)

    # 5. Report: held-out evaluation of base / SFT / RL models and baselines, plots, summary.
    if script_args.report and trainer.accelerator.is_main_process:
        report_run(script_args, training_args, model_args, trainer, model_path, timings, started, background)
    trainer.accelerator.wait_for_everyone()
    return trainer


def parse_args(argv: list[str] | None = None) -> tuple[ScriptArguments, GRPOConfig, ModelConfig]:
    parser = TrlParser((ScriptArguments, GRPOConfig, ModelConfig))
    preset = preset_name(sys.argv[1:] if argv is None else argv)  # e.g. smollm2: defaults sized for its CPU run
    own = {"output_dir": f"outputs/grpo_clinical_{preset}" if preset else "outputs/grpo_clinical"}
    preset_values = MODEL_PRESETS[preset] if preset else {}
    parser.set_defaults(**{**cpu_defaults(), **own, **model_defaults(), **preset_values})
    return parser.parse_args_and_config(args=argv)


if __name__ == "__main__":
    main(*parse_args())

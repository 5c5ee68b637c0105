"""The RL recipes' pipeline, top to bottom: what ``recipes/grpo_clinical.py`` and ``recipes/reinforce_clinical.py``
run with their own trainer class (the steps are described in ``recipes/grpo_clinical.py``'s docstring)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
from accelerate import PartialState
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_callback import TrainerState
from trl import GRPOConfig, ModelConfig

from recruit_trl.files import read_json, write_json_atomic
from recruit_trl.models.loading import (
    ADAPTER_CONFIG,
    is_adapter,
    keep_4bit_layers_trainable,
    load_trainable,
    loading_config,
    model_summary,
    used_settings,
)
from recruit_trl.rollout.rollout_funcs import make_rollout
from recruit_trl.training.trainer import RecruitGRPOTrainer
from recruit_trl.workflow.anchor_data import make_anchor_dataset
from recruit_trl.workflow.arguments import ScriptArguments
from recruit_trl.workflow.configs import read_report_config, read_warm_start
from recruit_trl.workflow.model_card import rl_model_card, write_model_card
from recruit_trl.workflow.model_setup import last_checkpoint, model_init_kwargs, rl_start, setup_run
from recruit_trl.workflow.run_report import RL_FINISHED, report_run, rl_finished, sft_trained, start_baseline_evals
from recruit_trl.workflow.warm_start import run_warm_start
from rewards import get_reward_funcs


def run_rl(
    script_args: ScriptArguments,
    training_args: GRPOConfig,
    model_args: ModelConfig,
    trainer_cls: type[RecruitGRPOTrainer] = RecruitGRPOTrainer,
) -> RecruitGRPOTrainer:
    """The RL recipes' pipeline: environment, policy model, warm start, anchors, rollouts, rewards, training with
    ``trainer_cls`` (:class:`~recruit_trl.training.trainer.RecruitGRPOTrainer` or a subclass, e.g.
    :class:`~recruit_trl.training.trainer.RecruitReinforceTrainer`), report.

    The arguments are inputs only: what a stage produces (the environment interface, the tasks and the base model,
    resolved once; the warm start's folder) is passed on to the next stages. The warm start trains with the SFT
    config file ``--sft_config`` names, the report reads the one ``--report_config`` names
    (:mod:`recruit_trl.workflow.configs`).

    Returns the trainer after training (and the report, unless ``--report_config none``).
    """
    started = time.perf_counter()
    timings: dict[str, float] = {}
    if not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 2) // max(1, training_args.world_size)))

    # 1. Environment (and its tasks, unless --tasks names some) and 2. the policy model (a local folder), resolved
    # once and passed to every stage.
    t0 = time.perf_counter()
    setup = setup_run(script_args, model_args.model_name_or_path)
    interface, model_path = setup.interface, setup.model_path
    timings["base_model"] = time.perf_counter() - t0
    # One model configuration (dtype, attention, quantisation) for every stage: warm start, RL and evaluation.
    training_args.model_init_kwargs = model_init_kwargs(model_args, training_args)

    # 3. Warm start: imitate the teacher first (cached in <output_dir>/sft), then continue from what it trained.
    background, sft_adapter = None, script_args.sft_adapter
    report = read_report_config(script_args.report_config)
    # The SFT config also names the teacher the report compares with when RL starts from a given --sft_adapter.
    warm_start = read_warm_start(script_args.sft_config, script_args, model_args)
    if sft_adapter is None and warm_start is not None:
        t0 = time.perf_counter()
        background = start_baseline_evals(script_args, report, training_args, model_args, setup)
        sft_adapter = run_warm_start(script_args, warm_start, training_args, model_args, setup)
        timings["sft"] = time.perf_counter() - t0
    # A finished RL stage (its marker written after the weights and the trainer state) is read back, never trained
    # further: a re-run of a finished command changes no weights, whatever checkpoints were kept.
    finished = rl_finished(training_args.output_dir)
    if finished:
        model, tokenizer, peft_config = finished_rl_model(training_args, model_path)
        print(f"RL already finished in {training_args.output_dir}; its weights are read back, not trained further "
              "(another --output_dir or an emptied folder trains again)")  # fmt: skip
    else:
        model, tokenizer, peft_config = rl_start(training_args, model_args, model_path, sft_adapter)

    # 4. Anchors (states the samples start from; on-policy ones are recorded by one process, read by the others),
    # rollouts, rewards and training.
    rollout = make_rollout(script_args, interface, seed=training_args.seed)  # the run's seed reaches the dice
    with PartialState().main_process_first():
        dataset = make_anchor_dataset(
            script_args, interface, rollout.cache, tasks=setup.tasks, student=sft_adapter or model_path,
            temperature=training_args.temperature, top_p=training_args.top_p,
            states_file=str(Path(training_args.output_dir) / "anchor_states.json"),
            model_loading=loading_config(model_args),
            # enough rows for a generation batch's distinct prompts over every process, however few the anchors
            # (fewer rows give TRL's sampler no batch: training would end at step 0)
            min_rows=training_args.generation_batch_size // training_args.num_generations,
        )  # fmt: skip
    trainer = trainer_cls(
        model=model,
        reward_funcs=get_reward_funcs(script_args.reward_funcs),
        args=training_args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,  # quantisation, when asked for, is in training_args.model_init_kwargs
        rollout_func=rollout,
        episode_advantages=script_args.mode == "episode",  # the rows carry their own advantages
        shuffle_advantages=script_args.shuffle_advantages,  # the control of a learning claim
    )
    keep_4bit_layers_trainable(trainer.model)  # rollouts generate in eval mode; see its docstring (CPU QLoRA)
    if finished:
        trainer.state = TrainerState.load_from_json(str(Path(training_args.output_dir, TRAINER_STATE_NAME)))
    else:
        t0 = time.perf_counter()
        trainer.train(resume_from_checkpoint=last_checkpoint(training_args.output_dir))
        timings["rl"] = time.perf_counter() - t0
        trainer.save_model(training_args.output_dir)
        trainer.save_state()  # trainer_state.json: every logged metric, step by step
        if trainer.accelerator.is_main_process:
            # Ours over TRL's card (written at each checkpoint) and PEFT's (written with the adapter).
            card = rl_model_card(script_args, training_args, model_args, trainer, setup, sft_adapter)
            write_model_card(training_args.output_dir, card)
            info = {
                "base_model": model_path, "world_size": trainer.accelerator.num_processes, "anchors": len(dataset),
                "model": model_summary(trainer.model), "sft_trained": sft_trained(sft_adapter),
                "arguments": used_settings(trainer, script=script_args, model_config=model_args),
            }  # fmt: skip
            write_json_atomic(Path(training_args.output_dir, RL_FINISHED), info)  # the marker: written last
    trainer.accelerator.wait_for_everyone()

    # 5. Report: held-out evaluation of base / SFT / RL models and baselines, plots, summary.
    if report is not None and trainer.accelerator.is_main_process:
        report_run(
            script_args,
            report,
            warm_start,
            training_args,
            model_args,
            trainer,
            setup,
            sft_adapter,
            timings,
            started,
            background,
        )
        card = rl_model_card(script_args, training_args, model_args, trainer, setup, sft_adapter)
        write_model_card(training_args.output_dir, card)  # again, now with the held-out scores
    trainer.accelerator.wait_for_everyone()
    return trainer


def finished_rl_model(training_args: GRPOConfig, model_path: str) -> tuple[Any, Any, None]:
    """``(model, tokenizer, None)`` of a finished RL stage, read back from ``--output_dir``: its LoRA adapter on the
    model it was trained on (the base or a fully fine-tuned warm start), trainable as RL left it, or its fully
    trained model, with the tokenizer saved beside it."""
    from transformers import AutoTokenizer

    out = training_args.output_dir
    model: Any = out
    if is_adapter(out):
        base = read_json(Path(out, ADAPTER_CONFIG))["base_model_name_or_path"]
        model = load_trainable(base, out, training_args.model_init_kwargs)
    tokenizer_path = out if Path(out, "tokenizer_config.json").is_file() else model_path
    return model, AutoTokenizer.from_pretrained(tokenizer_path, padding_side="left"), None

"""SFT warm start: imitate a teacher policy's decisions, rendered exactly like the RL prompts, with LoRA.

    python recipes/sft_clinical.py                                  # CPU: tiny model, safe-agent teacher
    python recipes/sft_clinical.py --teacher expert --train_seeds 300-347
    accelerate launch recipes/sft_clinical.py --model_name_or_path Qwen/Qwen3-4B --bf16 --load_in_4bit

Top to bottom:
1. Arguments: ``SFTScriptArguments`` + TRL's ``SFTConfig`` + ``ModelConfig`` through ``TrlParser``.
2. Data: teacher traces on ``--train_seeds`` (balanced by action type) and ``--heldout_seeds`` (untouched), as
   conversational prompt/completion rows; saved to ``<output_dir>/dataset`` and reused on re-runs.
3. ``SFTTrainer`` trains a LoRA adapter on the completions only; the adapter and tokenizer are saved to
   ``--output_dir``. Start GRPO / REINFORCE from it with ``--sft_adapter <output_dir>``.
4. Held-out report (``<output_dir>/heldout_report.json``): teacher match, strict-JSON and valid-action rates,
   predicted vs teacher action-type distributions.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoTokenizer
from trl import ModelConfig, SFTConfig, SFTTrainer, TrlParser, get_peft_config, get_quantization_config

from recruit_trl.protocol import get_env_interface
from recruit_trl.sft import build_sft_datasets, heldout_report
from recruit_trl.training import model_defaults, parse_int_ranges, resolve_model_for


@dataclass
class SFTScriptArguments:
    env: str = field(default="env.agent:CLINICAL", metadata={"help": "Environment interface (name or module:attr)."})
    tasks: list[str] = field(
        default_factory=lambda: ["easy_bench", "medium_bench", "hard_bench"], metadata={"help": "Tasks to trace."}
    )
    teacher: str = field(default="safe", metadata={"help": "Teacher policy registered by the environment."})
    train_seeds: str = field(default="300-311", metadata={"help": "Reset seeds of the training episodes."})
    heldout_seeds: str = field(default="400-402", metadata={"help": "Reset seeds of the held-out episodes."})
    contract: str = field(default="index", metadata={"help": "Action contract: 'index' or 'json'."})
    recent_k: int = field(default=2, metadata={"help": "Recent actions in the prompt digest (as in the rollouts)."})
    epsilon: float = field(default=0.1, metadata={"help": "Random-candidate rate while tracing (state coverage)."})
    max_type_fraction: float = field(default=0.35, metadata={"help": "Cap on any action type's share of rows."})
    tiny_corpus_seeds: int = field(default=8, metadata={"help": "Warm-up episodes per task (model 'tiny' only)."})
    tiny_build_steps: int | None = field(default=None, metadata={"help": "Warm-up steps (model 'tiny' only)."})


def main(script_args: SFTScriptArguments, training_args: SFTConfig, model_args: ModelConfig) -> dict:
    interface = get_env_interface(script_args.env)
    out = Path(training_args.output_dir)
    if (out / "heldout_report.json").is_file() and (out / "adapter_config.json").is_file():
        print(f"SFT already finished in {out}; delete the folder to train again")
        return json.loads((out / "heldout_report.json").read_text())

    # 1. Teacher traces -> balanced train / held-out chat datasets (reused when already on disk).
    data_dir = out / "dataset"
    if (data_dir / "stats.json").is_file():
        from datasets import load_from_disk

        train, heldout = load_from_disk(str(data_dir / "train")), load_from_disk(str(data_dir / "heldout"))
        stats = json.loads((data_dir / "stats.json").read_text())
    else:
        train, heldout, stats = build_sft_datasets(
            interface,
            script_args.tasks,
            parse_int_ranges(script_args.train_seeds),
            parse_int_ranges(script_args.heldout_seeds),
            teacher=script_args.teacher,
            contract=script_args.contract,
            recent_k=script_args.recent_k,
            epsilon=script_args.epsilon,
            max_type_fraction=script_args.max_type_fraction,
            seed=training_args.seed,
        )
        train.save_to_disk(str(data_dir / "train"))
        heldout.save_to_disk(str(data_dir / "heldout"))
        (data_dir / "stats.json").write_text(json.dumps(stats, indent=2))
    print(f"SFT data: {stats['train_rows']} train rows ({stats['train_rows_raw']} before balancing), ", end="")
    print(f"{stats['heldout_rows']} held out")

    # 2. Model and LoRA fine-tuning on the completions.
    model_path = resolve_model_for(model_args.model_name_or_path, script_args, interface)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    training_args.model_init_kwargs = {
        "dtype": model_args.dtype if model_args.dtype in (None, "auto") else getattr(torch, model_args.dtype),
        "quantization_config": get_quantization_config(model_args),
        **(training_args.model_init_kwargs or {}),
    }
    trainer = SFTTrainer(
        model=model_path,
        args=training_args,
        train_dataset=train.remove_columns(["task", "seed", "day", "action_type", "candidate_types"]),
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    trainer.train(resume_from_checkpoint=_last_checkpoint(training_args.output_dir))
    trainer.save_model(training_args.output_dir)
    tokenizer.save_pretrained(training_args.output_dir)

    # 3. Held-out report.
    trainer.model.eval()
    tokenizer.padding_side = "left"
    report = heldout_report(trainer.model, tokenizer, heldout, script_args.contract, interface=interface)
    report["data"] = stats
    (out / "heldout_report.json").write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k != "data"}, indent=2))
    return report


def _last_checkpoint(output_dir: str) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None


def parse_args(argv: list[str] | None = None) -> tuple[SFTScriptArguments, SFTConfig, ModelConfig]:
    parser = TrlParser((SFTScriptArguments, SFTConfig, ModelConfig))
    defaults = {
        "output_dir": "outputs/sft_clinical",
        "learning_rate": 1e-3,
        "num_train_epochs": 2,
        "per_device_train_batch_size": 16,
        "max_length": 1024,
        "logging_steps": 10,
        "save_steps": 100,
        "report_to": "none",
        "gradient_checkpointing": False,
        "seed": 0,
    }
    if not torch.cuda.is_available():
        defaults.update({"bf16": False, "use_cpu": True})
    parser.set_defaults(**defaults, **model_defaults())
    return parser.parse_args_and_config(args=argv)


if __name__ == "__main__":
    main(*parse_args())

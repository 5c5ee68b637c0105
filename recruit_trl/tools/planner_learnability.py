"""Is the planner's choice learnable from what the model sees? Planner labels on a start's own states, a model
trained on them, and how often it then picks the planner's choice on held-out states, against how often the start
already does.

Usage: ``python -m recruit_trl.tools.planner_learnability --start FOLDER [--task hard_bench] [--train_seeds 40-59]
[--heldout_seeds 60-69] [--days 0-175:5] [--candidates 8] [--continuations 8] [--margins 1 2 3]
[--output_dir DIR]``.

1. The start plays greedily on the train and held-out reset seeds; its states on ``--days`` are kept
   (:func:`~recruit_trl.workflow.evaluation.evaluate.record_anchors`).
2. Each state is labelled (:func:`~recruit_trl.workflow.planner_labels.label_states`): the best of the start's
   proposals under common-random-number continuations, its margin over the start's greedy choice and that margin's
   standard error. Labels are cached in ``<output_dir>/labels-<split>.json`` and reused for the same settings.
3. For each ``k`` of ``--margins``: how many states clear a margin of ``k`` standard errors; a copy of the start is
   fine-tuned (TRL's ``SFTTrainer``, the SFT config's optimiser settings, ``--epochs`` epochs) on the train states that
   clear it, labelled with the best proposal; on the held-out states the trained model's greedy choice and the start's
   are compared with the planner's, over every state and over the states that clear ``k``.

Writes ``<output_dir>/learnability.json`` (settings, counts, agreements, seconds) and prints a table.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recruit_trl.files import read_json, write_json_atomic
from recruit_trl.models.loading import load_for_inference
from recruit_trl.protocol import get_env_interface
from recruit_trl.ranges import parse_int_ranges
from recruit_trl.workflow.configs import read_sft_file
from recruit_trl.workflow.evaluation.evaluate import record_anchors
from recruit_trl.workflow.expert_iteration import fine_tune as fine_tune_rows
from recruit_trl.workflow.planner_labels import LabelSettings, clears, greedy_choices, label_states, margin_counts


@dataclass
class LearnabilityArguments:
    """The tool's flags."""

    start: str = field(metadata={"help": "The start: a model folder (full weights or a LoRA adapter)."})
    env: str = field(default="clinical", metadata={"help": "The environment."})
    task: list[str] = field(default_factory=lambda: ["hard_bench"], metadata={"help": "Tasks whose states are used."})
    train_seeds: str = field(default="40-59", metadata={"help": "Reset seeds of the states trained on."})
    heldout_seeds: str = field(default="60-69", metadata={"help": "Reset seeds of the held-out states."})
    days: str = field(default="0-175:5", metadata={"help": "Decision days whose states are labelled."})
    candidates: int = field(default=8, metadata={"help": "Proposals sampled per state besides the greedy answer."})
    continuations: int = field(default=8, metadata={"help": "Continuations per distinct proposal (>= 2)."})
    margins: list[float] = field(default_factory=lambda: [1.0, 2.0, 3.0],
                                 metadata={"help": "Margins k, in standard errors, a label must clear."})  # fmt: skip
    epochs: float = field(default=3.0, metadata={"help": "Epochs over the labelled train states."})
    sft_config: str = field(default="sft_clinical.yaml",
                            metadata={"help": "SFT config: the fine-tuning's optimiser settings."})  # fmt: skip
    seed: int = field(default=0, metadata={"help": "Seed of the proposals and of the fine-tuning."})
    output_dir: str = field(default="outputs/planner_learnability", metadata={"help": "Where results go."})


def labelled(args: LearnabilityArguments, split: str, seeds: list[int]) -> list[dict[str, Any]]:
    """The labelled states of one split, from ``<output_dir>/labels-<split>.json`` when made with these settings."""
    settings = LabelSettings(candidates=args.candidates, continuations=args.continuations)
    meta = {"start": str(Path(args.start).resolve()), "env": args.env, "tasks": args.task, "seeds": seeds,
            "days": args.days, "settings": asdict(settings), "seed": args.seed}  # fmt: skip
    path = Path(args.output_dir) / f"labels-{split}.json"
    cached = read_json(path)
    if cached is not None and cached["meta"] == meta:
        return cached["rows"]
    interface = get_env_interface(args.env)
    states = record_anchors(interface, args.start, args.task, seeds, parse_int_ranges(args.days), temperature=0.0,
                            label="model:start")  # fmt: skip
    rows = label_states(interface, args.start, states, settings, policy_seed=args.seed)
    write_json_atomic(path, {"meta": meta, "rows": rows})
    return rows


def fine_tune(args: LearnabilityArguments, rows: list[dict[str, Any]], out: Path) -> str:
    """A copy of the start fine-tuned on ``rows`` (their best proposals) into ``out``, as an expert-iteration round
    trains (:func:`~recruit_trl.workflow.expert_iteration.fine_tune`); returns the folder."""
    if (out / "trained.json").is_file():
        return str(out)
    _, _, sft_config, _ = read_sft_file(args.sft_config)
    sft_config.output_dir, sft_config.num_train_epochs, sft_config.max_steps = str(out), args.epochs, -1
    sft_config.save_strategy, sft_config.report_to, sft_config.seed = "no", [], args.seed
    seconds = fine_tune_rows(args.start, rows, sft_config, out)
    write_json_atomic(out / "trained.json", {"rows": len(rows), "seconds": seconds})
    return str(out)


def agreement(choices: list[int], rows: list[dict[str, Any]], k: float | None = None) -> dict[str, Any]:
    """How often ``choices`` equal the planner's best over ``rows`` (those clearing ``k`` when given)."""
    kept = [c == r["best"] for c, r in zip(choices, rows, strict=True) if k is None or clears(r, k)]
    return {"states": len(kept), "agree": sum(kept) / len(kept) if kept else None}


def main(args: LearnabilityArguments) -> dict[str, Any]:
    started = time.perf_counter()
    out = Path(args.output_dir)
    train = labelled(args, "train", parse_int_ranges(args.train_seeds))
    heldout = labelled(args, "heldout", parse_int_ranges(args.heldout_seeds))
    labelling = time.perf_counter() - started
    model, tokenizer = load_for_inference(args.start)
    start_choices = greedy_choices(model, tokenizer, heldout)
    report: dict[str, Any] = {
        "arguments": asdict(args),
        "counts": {"train": margin_counts(train, args.margins), "heldout": margin_counts(heldout, args.margins)},
        "planner_seconds": sum(r["seconds"] for r in train + heldout),
        "planner_env_steps": sum(r["env_steps"] for r in train + heldout),
        "start": {"all": agreement(start_choices, heldout)},
        "trained": {},
    }
    for k in args.margins:
        rows = [r for r in train if clears(r, k)]
        report["start"][f"clear_{k}se"] = agreement(start_choices, heldout, k)
        if not rows:
            report["trained"][str(k)] = {"rows": 0}
            continue
        folder = fine_tune(args, rows, out / f"trained-{k}se")
        model, tokenizer = load_for_inference(folder)
        choices = greedy_choices(model, tokenizer, heldout)
        report["trained"][str(k)] = {
            "rows": len(rows), "all": agreement(choices, heldout), f"clear_{k}se": agreement(choices, heldout, k),
        }  # fmt: skip
    report["seconds"] = {"labelling": labelling, "total": time.perf_counter() - started}
    write_json_atomic(out / "learnability.json", report)
    print(summary(report))
    return report


def summary(report: dict[str, Any]) -> str:
    """The report as a table: per margin, the states that clear it and the held-out agreement with the planner."""
    lines = [f"held-out states: {report['counts']['heldout']['states']}; the start picks the planner's choice on "
             f"{report['start']['all']['agree']:.3f} of them"]  # fmt: skip
    for k, trained in report["trained"].items():
        clear = f"clear_{float(k)}se"
        start = report["start"][clear]
        line = (f"k={k}: train states clearing it {report['counts']['train'][clear]}, held-out {start['states']}; "
                f"start agrees on those {start['agree']}")  # fmt: skip
        if trained["rows"]:
            line += f"; trained: all {trained['all']['agree']:.3f}, those {trained[clear]['agree']}"
        lines.append(line)
    return "\n".join(lines)


if __name__ == "__main__":
    from transformers import HfArgumentParser

    (parsed,) = HfArgumentParser(LearnabilityArguments).parse_args_into_dataclasses(sys.argv[1:])
    json.dumps(asdict(parsed))  # the settings are plain values (they are written with the report)
    main(parsed)

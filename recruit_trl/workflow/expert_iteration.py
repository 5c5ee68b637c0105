"""Expert iteration: distil the planner's choices on the model's own states, round by round.

A round: the current model (the start, then the previous round's) plays its round's block of training seeds
greedily; its states on the decision days are labelled by the planner over its own proposals
(:func:`~recruit_trl.workflow.planner_labels.label_states`: common random numbers, racing); a state is kept when the
best proposal beats the model's own choice by ``margin`` standard errors; the kept rows of every round so far train
the same weights (its LoRA adapter, or every weight of a model trained in full) for ``epochs`` with TRL's
``SFTTrainer``. Each round is saved in ``<output_dir>/round-K`` with ``round.json`` (states labelled, kept, rows,
environment steps, planner and training seconds) and reused on a re-run; the last round's model is saved in
``<output_dir>`` with ``expert_iteration.json``.

``labels`` picks what a kept state is labelled with, so that the controls of a learning claim run the same loop,
rows and epochs: ``planner`` (the treatment: the best proposal), ``self`` (the model's own greedy choice) and
``shuffled`` (the planner's mean scores permuted among the scored candidates at each state, the label their best).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from recruit_trl.files import read_json, write_json_atomic
from recruit_trl.models.loading import ADAPTER_CONFIG, is_adapter, load_trainable
from recruit_trl.protocol import EnvInterface
from recruit_trl.ranges import parse_int_ranges
from recruit_trl.workflow.evaluation.evaluate import record_anchors
from recruit_trl.workflow.planner_labels import LabelSettings, clears, label_states
from recruit_trl.workflow.sft_data import to_conversational

LABELS = ("planner", "self", "shuffled")
ROUND_FILE = "round.json"


@dataclass
class ExpertIterationArguments:
    """The expert-iteration recipe's own flags (its trainer's are ``SFTConfig``'s, its model's ``ModelConfig``'s)."""

    start: str = field(default="outputs/grpo_clinical/sft", metadata={
        "help": "The model folder the rounds start from (a warm start: full weights or a LoRA adapter, which the "
                "rounds continue); the default is the clinical main job's."})  # fmt: skip
    rounds: int = field(default=2, metadata={"help": "Rounds of play, label, train."})
    train_seeds: str = field(default="500-539", metadata={"help": "Reset seeds the rounds play, in blocks."})
    seeds_per_round: int = field(default=10, metadata={"help": "Seeds of --train_seeds each round plays (round K "
                                                             "plays the K-th block)."})  # fmt: skip
    days: str = field(default="0-175:5", metadata={"help": "Decision days whose states are labelled."})
    candidates: int = field(default=8, metadata={"help": "Proposals sampled per state besides the greedy answer."})
    continuations: int = field(default=8, metadata={"help": "Continuations per distinct proposal (>= 2)."})
    race: float = field(default=2.0, metadata={
        "help": "A proposal this many standard errors behind the leader stops early (0: every proposal plays every "
                "continuation)."})  # fmt: skip
    margin: float = field(default=2.0, metadata={
        "help": "A state is kept when the best proposal beats the model's own choice by this many standard "
                "errors."})  # fmt: skip
    keep_unclear: bool = field(default=False, metadata={
        "help": "Also train on the states whose best proposal does not clear --margin, labelled with the model's own "
                "greedy choice (in every --labels arm): the rows hold the whole state distribution."})  # fmt: skip
    replay_data: str = field(default="", metadata={
        "help": "A saved dataset of conversational rows (e.g. the warm start's <sft>/dataset/train) added to every "
                "round's rows: the start's own training data, as DAgger keeps the teacher's ("": none)."})  # fmt: skip
    labels: str = field(default="planner", metadata={
        "help": "What kept states are labelled with: planner (the best proposal), self or shuffled (the "
                "controls)."})  # fmt: skip

    def __post_init__(self) -> None:
        if self.labels not in LABELS:
            raise ValueError(f"--labels {self.labels!r} must be one of {', '.join(LABELS)}")
        if self.rounds < 1 or self.seeds_per_round < 1:
            raise ValueError(f"--rounds and --seeds_per_round must be >= 1 (got {self.rounds}, "
                             f"{self.seeds_per_round})")  # fmt: skip
        if self.margin < 0 or self.race < 0:
            raise ValueError(f"--margin and --race must be >= 0 (got {self.margin}, {self.race})")
        LabelSettings(candidates=self.candidates, continuations=self.continuations, race=self.race)  # checks them

    def round_seeds(self, r: int) -> list[int]:
        """Round ``r``'s block of ``--train_seeds``.

        Raises:
            ValueError: when ``--train_seeds`` has too few seeds for the rounds.
        """
        seeds = parse_int_ranges(self.train_seeds)
        block = seeds[r * self.seeds_per_round : (r + 1) * self.seeds_per_round]
        if len(block) < self.seeds_per_round:
            raise ValueError(f"--train_seeds {self.train_seeds} holds {len(seeds)} seeds: {self.rounds} rounds of "
                             f"{self.seeds_per_round} need {self.rounds * self.seeds_per_round}")  # fmt: skip
        return block


def relabel(row: dict[str, Any], labels: str, rng: random.Random) -> dict[str, Any]:
    """``row`` (a kept planner label) answering with what ``labels`` asks: its best proposal, the model's own greedy
    choice, or the best of its candidates' mean scores permuted among them (drawn from ``rng``)."""
    if labels == "planner":
        return row
    if labels == "self":
        k = row["greedy"]
    else:
        scored = list(row["means"])
        values = [row["means"][c] for c in scored]
        rng.shuffle(values)
        k = int(max(zip(scored, values, strict=True), key=lambda pair: pair[1])[0])
    return {**row, "completion": json.dumps({"action_index": k}), "action_type": row["candidate_types"][k]}


def fine_tune(model_path: str, rows: Sequence[dict[str, Any]], args: Any, out: Path, replay: str = "") -> float:
    """Train ``model_path``'s weights (its LoRA adapter, or every weight) on ``rows`` (and the saved dataset
    ``replay``, when given) with TRL's ``SFTTrainer`` (``args``: its ``SFTConfig``, output folder ``out``); saves the
    model and tokenizer there; returns seconds."""
    from datasets import concatenate_datasets, load_from_disk
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    started = time.perf_counter()
    # An adapter continues on its base; a whole model is loaded by the trainer (with the config's init kwargs).
    model: Any = load_saved(model_path, args.model_init_kwargs) if is_adapter(model_path) else model_path
    columns = ["prompt", "completion"]
    data = to_conversational(rows).select_columns(columns)
    if replay:
        data = concatenate_datasets([load_from_disk(replay).select_columns(columns), data])
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    trainer = SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    trainer.save_model(str(out))
    trainer.save_state()  # trainer_state.json: the round's losses, step by step
    tokenizer.save_pretrained(str(out))
    return time.perf_counter() - started


def run_expert_iteration(
    interface: EnvInterface,
    tasks: Sequence[str],
    iteration: ExpertIterationArguments,
    training_args: Any,
    model_loading: dict | None = None,
) -> dict[str, Any]:
    """The rounds (see the module docstring) into ``training_args.output_dir``; returns the summary it writes to
    ``expert_iteration.json``."""
    import copy

    if not Path(iteration.start, "config.json").is_file() and not is_adapter(iteration.start):
        raise FileNotFoundError(
            f"--start {iteration.start}: no model there (the main job's warm start is outputs/grpo_clinical/sft "
            "once `accelerate launch recipes/grpo_clinical.py` ran)"
        )
    out = Path(training_args.output_dir)
    settings = LabelSettings(candidates=iteration.candidates, continuations=iteration.continuations,
                             race=iteration.race)  # fmt: skip
    rows: list[dict[str, Any]] = []
    rounds: list[dict[str, Any]] = []
    replay_rows = 0
    if iteration.replay_data:
        from datasets import load_from_disk

        replay_rows = len(load_from_disk(iteration.replay_data))  # a missing or unreadable folder fails here, early
    current = iteration.start
    for r in range(iteration.rounds):
        folder = out / f"round-{r}"
        done = read_json(folder / ROUND_FILE)
        if done is not None:
            rows += read_json(folder / "rows.json")
            rounds.append(done)
            current = str(folder)
            print(f"expert iteration: round {r} already trained in {folder}")
            continue
        seeds = iteration.round_seeds(r)
        started = time.perf_counter()
        states = record_anchors(interface, current, tasks, seeds, parse_int_ranges(iteration.days), temperature=0.0,
                                label="model:current", model_loading=model_loading)  # fmt: skip
        labelled = label_states(interface, current, states, settings, model_loading=model_loading,
                                policy_seed=training_args.seed + r)  # fmt: skip
        rng = random.Random(f"{training_args.seed}|{r}|{iteration.labels}")
        kept = [relabel(row, iteration.labels, rng) for row in labelled if clears(row, iteration.margin)]
        clear = len(kept)
        if iteration.keep_unclear:
            own = [relabel(row, "self", rng) for row in labelled if not clears(row, iteration.margin)]
            kept += own
        planner_seconds = time.perf_counter() - started
        rows += kept
        if not rows:
            raise RuntimeError(f"expert iteration round {r}: no state of {len(labelled)} cleared --margin "
                               f"{iteration.margin}: lower it or label more states")  # fmt: skip
        args = copy.deepcopy(training_args)
        args.output_dir = str(folder)
        training_seconds = fine_tune(current, rows, args, folder, iteration.replay_data)
        info = {
            "round": r, "seeds": seeds, "states": len(labelled), "kept": len(kept), "clear": clear, "rows": len(rows),
            "replay_rows": replay_rows,
            "labels": iteration.labels, "env_steps": sum(row["env_steps"] for row in labelled),
            "planner_seconds": planner_seconds, "training_seconds": training_seconds,
            "best_not_greedy": sum(row["best"] != row["greedy"] for row in labelled),
        }  # fmt: skip
        write_json_atomic(folder / "rows.json", kept)
        write_json_atomic(folder / ROUND_FILE, info)  # written last: the round is finished
        print(f"expert iteration: round {r}: {info['kept']} of {info['states']} states kept, {info['rows']} rows, "
              f"planner {planner_seconds:.0f} s, training {training_seconds:.0f} s")  # fmt: skip
        rounds.append(info)
        current = str(folder)
    load_saved(current).save_pretrained(str(out))
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(current).save_pretrained(str(out))
    summary = {"arguments": asdict(iteration), "rounds": rounds, "final": current}
    write_json_atomic(out / "expert_iteration.json", summary)
    return summary


def load_saved(folder: str, init_kwargs: dict | None = None) -> Any:
    """The model saved in ``folder``, trainable: its LoRA adapter on the base its config names, or the whole model."""
    base = read_json(Path(folder) / ADAPTER_CONFIG)["base_model_name_or_path"] if is_adapter(folder) else folder
    return load_trainable(base, folder, init_kwargs)

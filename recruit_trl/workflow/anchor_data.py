"""The RL recipes' training prompts: anchors over tasks x seeds x days, replayed by an environment policy or
recorded from a model, as a dataset."""

from __future__ import annotations

from collections.abc import Sequence

from recruit_trl.models.loading import model_fingerprint
from recruit_trl.protocol import EnvInterface
from recruit_trl.ranges import parse_int_ranges
from recruit_trl.rollout.anchors import (
    MODEL_PREFIX,
    AnchorCache,
    anchor_dataset,
    build_anchors,
    load_states,
    save_states,
)
from recruit_trl.workflow.arguments import ScriptArguments
from recruit_trl.workflow.evaluation.evaluate import record_anchors


def make_anchor_dataset(
    args: ScriptArguments,
    interface: EnvInterface,
    cache: AnchorCache | None = None,
    *,
    tasks: Sequence[str] = (),
    student: str | None = None,
    temperature: float = 1.0,
    top_p: float = 1.0,
    states_file: str | None = None,
    model_loading: dict | None = None,
    min_rows: int = 0,
):
    """Anchors over ``args.anchor_tasks`` (default ``tasks``: the run's) x seeds x days whose prefix does not end the
    episode, as a Dataset (repeated up to ``min_rows`` rows: :func:`recruit_trl.rollout.anchors.anchor_dataset`).

    Args:
        args: the recipe arguments (``anchor_policy``, ``anchor_seeds``, ``anchor_days``, ``anchor_tasks``, ...).
        interface: the environment interface.
        cache: the rollout's anchor cache; states recorded from a model are pinned there.
        tasks: the run's tasks (:class:`recruit_trl.workflow.model_setup.RunSetup`), unless ``--anchor_tasks``.
        student: the model RL starts from (``--anchor_policy student``).
        temperature: sampling temperature of a recording model (the training temperature: on-policy states).
        top_p: its nucleus.
        states_file: where recorded states are kept (:func:`recruit_trl.rollout.anchors.save_states`: JSON, replayed on
            load), reused when produced by the same model weights, environment and settings.
        model_loading: how a recording model is loaded (:func:`recruit_trl.models.loading.loading_config`).
    """
    seeds, days = parse_int_ranges(args.anchor_seeds), parse_int_ranges(args.anchor_days)
    tasks = list(args.anchor_tasks or tasks)
    cache = cache or AnchorCache(interface, recent_k=args.recent_k)
    if args.anchor_policy == "student" or args.anchor_policy.startswith(MODEL_PREFIX):
        path = student if args.anchor_policy == "student" else args.anchor_policy[len(MODEL_PREFIX) :]
        if not path:
            raise ValueError("--anchor_policy student needs the model RL starts from (the warm start or base model)")
        label = args.anchor_policy if args.anchor_policy.startswith(MODEL_PREFIX) else f"{MODEL_PREFIX}student"
        meta = {
            "model": str(path), "weights": model_fingerprint(path), "env": interface.name, "label": label,
            "tasks": tasks, "seeds": seeds, "days": days, "temperature": temperature, "top_p": top_p,
            "contract": args.contract, "recent_k": args.recent_k, "model_loading": dict(model_loading or {}),
        }  # fmt: skip
        states = load_states(states_file, meta, interface) if states_file else None
        if states is None:
            states = record_anchors(
                interface, str(path), tasks, seeds, days, label=label,
                contract=args.contract, recent_k=args.recent_k, temperature=temperature, top_p=top_p,
                model_loading=model_loading,
            )  # fmt: skip
            if states_file:
                save_states(states_file, states, meta)
        cache.pin(states)
        anchors = list(states)
    else:
        anchors = build_anchors(interface, tasks, seeds, days, policy=args.anchor_policy, cache=cache)
    if not anchors:
        raise ValueError("No anchors: every (task, seed, day) prefix ended its episode; use earlier --anchor_days.")
    return anchor_dataset(anchors, min_rows)

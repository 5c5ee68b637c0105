"""The private parts of TRL that recruit_trl overrides or calls, and a check that the installed TRL still has them.

The RL trainers (:mod:`recruit_trl.training.trainer` and its mixins) override private ``GRPOTrainer`` methods and call
them through ``super()`` with fixed arguments, and the length-sorted split calls TRL's batch helpers. A TRL release may
rename, remove or re-sign any of them without notice; an override whose signature no longer matches would then be
skipped or called with the wrong arguments, or would silently drop a new argument; and a method the project overrides
or re-implements can keep its signature while its body changes what the override has to do (e.g. the buffering of
``_prepare_inputs``). :data:`TRL_PRIVATE_API` lists each one with its parameters (names and kinds, defaults and
annotations left out) as TRL 1.16.0 has them and, for those overridden or replaced, a hash of their source;
:data:`TRL_PRIVATE_ATTRIBUTES` lists the private attributes the trainers read or write (``_metrics``, ``_logs``, the
buffering's ``_step``) with a hash of the statements that create them in ``__init__``, and accelerate's private
``_reset_state`` (:mod:`recruit_trl.training.distributed`) is listed with the methods.
:func:`check_trl_private_api` fails loudly when the installed TRL is of another series or differs in any of them.
Nothing runs at import of this module; the trainer module and the warm start's run the check when they are imported,
and every recipe when it parses its arguments (:func:`recruit_trl.workflow.configs.parse_recipe`).
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import textwrap
from typing import Any, NamedTuple

TRL_SERIES = "1.16"  # the series pyproject.toml pins (trl==1.16.*)


class PrivateMethod(NamedTuple):
    """One private callable: ``qualname`` (``Class.method`` or a function) in ``module``, its ``parameters`` as
    ``inspect.signature`` prints them without defaults and annotations, who relies on it and, for one the project
    overrides or replaces, ``source``: the first 16 hex digits of the sha256 of its source in TRL 1.16.0
    (:func:`source_hash`)."""

    module: str
    qualname: str
    parameters: str
    used_by: str
    source: str = ""


TRL_PRIVATE_API = (
    PrivateMethod(
        "trl", "GRPOTrainer._prepare_inputs", "(self, generation_batch)",
        "overridden by training.length_batches.LengthSortedBatches", "f824e7fb07147956",
    ),
    PrivateMethod(
        "trl", "GRPOTrainer._generate_and_score_completions", "(self, inputs)",
        "overridden by training.trainer.RecruitGRPOTrainer and legal_logprobs; called by length_batches",
        "1fa48922792dcd5c",
    ),
    PrivateMethod(
        "trl", "GRPOTrainer._generate", "(self, prompts)",
        "overridden by training.legal_logprobs.LegalLogprobs (reads extra_fields, item 5 of its result)",
        "2a27fdf8f5e6f356",
    ),
    PrivateMethod(
        "trl", "GRPOTrainer._compute_loss", "(self, model, inputs)",
        "overridden by training.legal_logprobs.LegalLogprobs", "80295546bbdbf6f7",
    ),
    # With legal sets the override scores the text itself from the first seven parameters and refuses any other
    # input (images and the like), so a parameter TRL adds would be refused or ignored: every parameter is checked.
    PrivateMethod(
        "trl", "GRPOTrainer._get_per_token_logps_and_entropies",
        "(self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, compute_aux_loss, "
        "pixel_values, image_grid_thw, num_images, pixel_attention_mask, spatial_shapes, num_tiles, image_sizes, "
        "token_type_ids, mm_token_type_ids, image_position_ids)",
        "overridden by training.legal_logprobs.LegalLogprobs", "ea73c3909275851d",
    ),
    # SFTTrainer inherits this one from transformers' Trainer.
    PrivateMethod(
        "trl", "SFTTrainer._get_train_sampler", "(self, train_dataset)",
        "overridden by training.warm_start.WarmStartSFTTrainer", "1580d7493244e637",
    ),
    # Without a GPU, training.vllm_colocate replaces the engine's set-up and the weight sync of TRL's vLLM generator,
    # and patches the name GRPOTrainer builds it by.
    PrivateMethod(
        "trl.generation.vllm_generation", "VLLMGeneration._init_vllm", "(self)",
        "overridden by training.vllm_colocate.CPUColocateGeneration", "0e584002e0f6a9c0",
    ),
    PrivateMethod(
        "trl.generation.vllm_generation", "VLLMGeneration.sync_weights", "(self)",
        "overridden by training.vllm_colocate.CPUColocateGeneration", "63d669fb32304ff5",
    ),
    PrivateMethod(
        "trl.generation.vllm_generation", "VLLMGeneration._iter_named_params", "(self)",
        "called by training.vllm_colocate.CPUColocateGeneration.sync_weights",
    ),
    PrivateMethod(
        "trl.trainer.grpo_trainer", "VLLMGeneration", "(model, accelerator, processing_class, mode, "
        "structured_outputs_regex, server_base_url, server_host, server_port, server_timeout, group_port, "
        "tensor_parallel_size, gpu_memory_utilization, max_model_length, max_num_seqs, enable_sleep_mode, model_impl, "
        "trust_remote_code, repetition_penalty, temperature, top_p, top_k, min_p, max_completion_length, logprobs, "
        "generation_kwargs)",
        "replaced by training.vllm_colocate.cpu_vllm_generation while a trainer is built without a GPU",
        "4cc28317607b0ea9",
    ),
    PrivateMethod("trl.trainer.utils", "shuffle_sequence_dict", "(seq_dict)", "called by training.length_batches"),
    PrivateMethod(
        "trl.trainer.utils", "split_tensor_dict", "(tensor_dict, num_chunks)", "called by training.length_batches"
    ),
    PrivateMethod(
        "trl.trainer.utils", "split_pixel_values_by_grid", "(batch)", "called by training.length_batches"
    ),
    PrivateMethod(
        "trl.trainer.utils", "unsplit_pixel_values_by_grid", "(batch)", "called by training.length_batches"
    ),
    # Not TRL's, but as private: a Trainer after another in one process (warm start, then RL) needs it.
    PrivateMethod(
        "accelerate.state", "AcceleratorState._reset_state", "(reset_partial_state)",
        "called by training.distributed.release_accelerator",
    ),
)  # fmt: skip


class PrivateAttribute(NamedTuple):
    """One private attribute that ``owner``'s ``__init__`` (in ``module``) creates and the project reads or writes:
    ``source`` is the first 16 hex digits of the sha256 of the statements that assign it there in TRL 1.16.0 (its
    shape: the keys and containers the project indexes)."""

    module: str
    owner: str
    name: str
    used_by: str
    source: str


TRL_PRIVATE_ATTRIBUTES = (
    PrivateAttribute(
        "trl", "GRPOTrainer", "_metrics", "read and written by training.trainer and the rollout's metrics",
        "f62f285a31a26e3f",
    ),
    PrivateAttribute(
        "trl", "GRPOTrainer", "_logs", "read by training.trainer (the advantages TRL logged)", "e14ef01f7a74dac0"
    ),
    PrivateAttribute(
        "trl", "GRPOTrainer", "_step", "read by training.length_batches (which buffered batch)", "16ba781d986d9007"
    ),
    PrivateAttribute(
        "trl", "GRPOTrainer", "_buffered_inputs", "written by training.length_batches", "8d4be6990fd661f5"
    ),
)  # fmt: skip


def check_trl_private_api() -> None:
    """Compare the installed TRL with :data:`TRL_PRIVATE_API` and its series with :data:`TRL_SERIES`.

    Raises:
        RuntimeError: when TRL is of another series, or a listed callable is missing, its parameters differ in name,
            order or kind, or its source differs from the one the override was written against; the message names
            each one (with the signature recruit_trl expects and the one found) and the installed TRL version.
    """
    import trl

    problems = []
    if not trl.__version__.startswith(f"{TRL_SERIES}."):
        problems.append(f"recruit_trl was written against trl {TRL_SERIES}.*; trl {trl.__version__} is installed")
    for entry in TRL_PRIVATE_API:
        name = entry.qualname if entry.module == "trl" else f"{entry.module}.{entry.qualname}"
        expected = f"recruit_trl was written against trl {TRL_SERIES}'s {name}{entry.parameters} ({entry.used_by})"
        found = _find(entry.module, entry.qualname)
        if found is None:
            problems.append(f"{expected}; the installed trl {trl.__version__} has no {name}")
            continue
        parameters = _parameters(found)
        if parameters != entry.parameters:
            defined = f"{found.__module__}.{found.__qualname__}"
            where = "" if defined.startswith("trl.") else f" (defined in {defined})"
            problems.append(f"{expected}; the installed trl {trl.__version__} has {name}{parameters}{where}")
        elif entry.source and source_hash(found) != entry.source:
            problems.append(f"{expected}; the installed trl {trl.__version__}'s {name} has other source (sha256 "
                            f"{source_hash(found)}, not {entry.source}): re-read it against its override")  # fmt: skip
    for attribute in TRL_PRIVATE_ATTRIBUTES:
        name = f"{attribute.owner}.{attribute.name}"
        expected = f"recruit_trl was written against trl {TRL_SERIES}'s {name} ({attribute.used_by})"
        found = attribute_hash(attribute.module, attribute.owner, attribute.name)
        if found is None:
            problems.append(f"{expected}; the installed trl {trl.__version__}'s {attribute.owner}.__init__ no longer "
                            f"sets self.{attribute.name}")  # fmt: skip
        elif found != attribute.source:
            problems.append(f"{expected}; the installed trl {trl.__version__} sets it otherwise (sha256 {found}, not "
                            f"{attribute.source}): re-read its uses")  # fmt: skip
    if problems:
        raise RuntimeError("\n".join(problems) + f": pin trl=={TRL_SERIES}.*")


def _find(module: str, qualname: str) -> Any:
    """The callable ``qualname`` of ``module`` (inherited methods included), or None."""
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
        if found is None:
            return None
    return found if callable(found) else None


def _parameters(function: Any) -> str:
    """``function``'s parameters as ``inspect.signature`` prints them, without defaults and annotations (so
    ``/``, ``*``, ``*args`` and ``**kwargs`` show each parameter's kind)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return "(<no signature>)"
    empty = inspect.Parameter.empty
    bare = [p.replace(default=empty, annotation=empty) for p in signature.parameters.values()]
    return str(signature.replace(parameters=bare, return_annotation=empty))


def source_hash(function: Any) -> str:
    """The first 16 hex digits of the sha256 of ``function``'s source (``"<no source>"`` when it has none)."""
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError):
        return "<no source>"
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def attribute_hash(module: str, owner: str, name: str) -> str | None:
    """The first 16 hex digits of the sha256 of the statements in ``owner.__init__`` that assign ``self.<name>``
    (joined by newlines), or None when there is none."""
    init = _find(module, f"{owner}.__init__")
    if init is None:
        return None
    try:
        source = textwrap.dedent(inspect.getsource(init))
    except (OSError, TypeError):
        return None
    statements = []
    for node in ast.walk(ast.parse(source)):
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        if any(isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"
               and t.attr == name for t in targets):  # fmt: skip
            statements.append(ast.get_source_segment(source, node) or "")
    if not statements:
        return None
    return hashlib.sha256("\n".join(statements).encode()).hexdigest()[:16]

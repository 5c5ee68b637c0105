"""Action contracts: how a model states its action, the strict parser, and the prompt it is shown.

One contract, ``index``: the prompt lists the legal candidate actions with full arguments, numbered from 0, and the
model answers ``{"action_index": k}``. Cheap (a handful of tokens) and always legal once parsed. The functions take
the contract's name (``"index"``) so that a prompt, its answer and its parser name the same contract.

Parsing is strict: after stripping surrounding whitespace the text must be exactly one JSON object (no
prose, no second object, no duplicate keys) that passes the schema (index: only the key ``action_index``
holding an int in range). Anything else is *never* an exception: :func:`parse_action` returns the
fallback policy's action with ``valid=False`` and a short reason, and the rollout counts and logs it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from recruit_trl.protocol import Action, EnvInterface, Observation

CONTRACTS = ("index",)
# Generation limits per contract: {"action_index": 27} is 7-8 tokens with a small BPE tokenizer.
MAX_NEW_TOKENS = {"index": 12}

LISTING_HEADER = "Actions:\n"  # opens the numbered candidate list
INDEX_INSTRUCTIONS = 'Reply with one JSON object {"action_index": N} choosing an action from the list.'


@dataclass(frozen=True)
class ParsedAction:
    """The action to execute and how it was obtained.

    Attributes:
        action: the action that is executed (the model's, or the fallback's when ``valid`` is False).
        valid: the model's text parsed under the contract.
        error: why it did not (``None`` when valid).
        index: the chosen candidate's index (``None`` when not valid).
    """

    action: Action
    valid: bool
    error: str | None = None
    index: int | None = None


class _DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def check_contract(contract: str) -> None:
    """Refuse an action contract other than those of :data:`CONTRACTS` (a configuration error, not model output).

    Raises:
        ValueError: naming the contract and the known ones.
    """
    if contract not in CONTRACTS:
        raise ValueError(f"Unknown action contract {contract!r}; expected one of {CONTRACTS}")


def parse_json_object(text: str) -> tuple[dict[str, Any] | None, str | None]:
    """Exactly one JSON object (surrounding whitespace allowed); returns ``(object, None)`` or ``(None, reason)``.

    Reasons: ``not_text``, ``no_json_object``, ``duplicate_key``, ``malformed_json`` (also nesting deeper than the
    recursion limit) and ``number_too_long`` (an integer with more digits than ``int(str)`` accepts).
    """
    if not isinstance(text, str):
        return None, "not_text"
    stripped = text.strip()
    if not stripped.startswith("{"):
        return None, "no_json_object"
    try:
        obj = json.loads(stripped, object_pairs_hook=_no_duplicates)
    except _DuplicateKey:
        return None, "duplicate_key"
    except (json.JSONDecodeError, RecursionError):
        return None, "malformed_json"
    except ValueError:
        # The only other ValueError json.loads raises: an integer literal longer than int(str) accepts
        # (sys.get_int_max_str_digits(), 4,300 digits by default).
        return None, "number_too_long"
    if not isinstance(obj, dict):
        return None, "no_json_object"
    return obj, None


def parse_index(text: str, n_candidates: int) -> tuple[int | None, str | None]:
    """Parse ``{"action_index": k}`` with ``0 <= k < n_candidates``; returns ``(k, None)`` or ``(None, reason)``."""
    obj, error = parse_json_object(text)
    if obj is None:
        return None, error
    if set(obj) != {"action_index"}:
        return None, "wrong_keys"
    k = obj["action_index"]
    if type(k) is not int:
        return None, "index_not_int"
    if not 0 <= k < n_candidates:
        return None, "index_out_of_range"
    return k, None


def parse_action(
    text: str,
    contract: str,
    interface: EnvInterface,
    obs: Observation,
    candidates: Sequence[Action] | None = None,
) -> ParsedAction:
    """Turn model text into an action under ``contract``; never raises on bad model output.

    Any text the model can write (huge or non-finite numbers, deep nesting, lone surrogates included) gives either
    the parsed action or the fallback action with ``valid=False`` and a reason (see :func:`parse_json_object` and
    :func:`parse_index`).

    Raises:
        ValueError: only for an unknown ``contract`` (a configuration error, not model output).
    """
    check_contract(contract)
    candidates = interface.candidate_actions(obs) if candidates is None else candidates
    k, error = parse_index(text, len(candidates))
    if k is None:
        return ParsedAction(interface.fallback_action(obs), False, error)
    return ParsedAction(candidates[k], True, None, k)


def completion_text(action: Action, contract: str, candidates: Sequence[Action]) -> str:
    """The exact text a model should write to take ``action`` (SFT targets, tests).

    Raises:
        ValueError: when ``action`` is not among ``candidates``, or for an unknown ``contract``.
    """
    check_contract(contract)
    try:
        k = list(candidates).index(action)
    except ValueError:
        raise ValueError(f"action {action} is not a listed candidate") from None
    return json.dumps({"action_index": k})


def answer_texts(contract: str, candidates: Sequence[Action]) -> list[str]:
    """The texts a model may write to take one of ``candidates`` (constrained decoding's legal answers)."""
    check_contract(contract)
    return [json.dumps({"action_index": k}) for k in range(len(candidates))]


def numbered_listing(descriptions: Sequence[str]) -> str:
    """The candidate list of an index-contract prompt: ``Actions:`` and one numbered line per candidate."""
    return LISTING_HEADER + "\n".join(f"{k}: {text}" for k, text in enumerate(descriptions))


def build_messages(
    interface: EnvInterface,
    obs: Observation,
    recent: Sequence[str],
    contract: str,
    candidates: Sequence[Action] | None = None,
) -> list[dict[str, str]]:
    """The chat prompt for one decision: system prompt (+ answer format), then state (+ numbered candidates)."""
    check_contract(contract)
    candidates = interface.candidate_actions(obs) if candidates is None else candidates
    listing = numbered_listing([interface.describe_action(a, obs) for a in candidates])
    user = f"{interface.render(obs, recent)}\n{listing}"
    return [
        {"role": "system", "content": f"{interface.system_prompt}\n{INDEX_INSTRUCTIONS}"},
        {"role": "user", "content": user},
    ]


def digest(interface: EnvInterface, day: int, action: Action, info: Mapping[str, Any]) -> str:
    """One entry of the "recent actions" digest: ``d12 screen P-1149: eligible``."""
    return f"d{day} {interface.describe_action(action)}: {interface.outcome(info)}"

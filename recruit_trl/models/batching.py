"""Batches of similar length: fewer padding tokens per step on the CPU (the tiny model's warm-up and SFT)."""

from __future__ import annotations

import random
from collections.abc import Iterator


def length_bucketed_batches(lengths: list[int], batch_size: int, rng: random.Random) -> Iterator[list[int]]:
    """One epoch of length-bucketed batches: shuffle, sort within pools of 32 batches, shuffle the batches."""
    order = list(range(len(lengths)))
    rng.shuffle(order)
    pool = 32 * batch_size
    batches = []
    for start in range(0, len(order), pool):
        chunk = sorted(order[start : start + pool], key=lengths.__getitem__)
        batches.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    rng.shuffle(batches)
    yield from batches

"""Integer ranges as flags spell them: ``"0-15"``, ``"0-170:10"``, ``"3,7,9-11"``."""

from __future__ import annotations

import re


def parse_int_ranges(spec: str) -> list[int]:
    """``"0-15"``, ``"0-170:10"`` (step), ``"3,7,9-11"`` -> a sorted list of ints.

    Raises:
        ValueError: with the offending part.
    """
    out: set[int] = set()
    for part in str(spec).split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?(?::(\d+))?", part)
        if not m:
            raise ValueError(f"bad range {part!r} in {spec!r}: use forms like 0-15, 0-170:10 or 3,7,9-11")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) else lo
        step = int(m.group(3)) if m.group(3) else 1
        if hi < lo or step < 1:
            raise ValueError(f"bad range {part!r} in {spec!r}: the end must be >= the start and the step >= 1")
        out.update(range(lo, hi + 1, step))
    return sorted(out)

"""Fast exact rounding and clamping for the step hot path.

``R2[x]``, ``R3[x]`` and ``R4[x]`` equal ``round(x, 2)``, ``round(x, 3)`` and ``round(x, 4)`` bit for bit;
:func:`clamp01` equals ``max(0.0, min(1.0, x))``.
"""

from __future__ import annotations


class Rounded(dict):
    """``round(x, ndigits)`` for floats, memoised: ``R3[x] == round(x, 3)``, bit for bit.

    ``round`` with digits costs about half a microsecond (it goes through the decimal digits of ``x``) and a
    step rounds a few dozen values, most of them seen before (budgets, uncertainty levels, potentials), so a
    dict lookup pays. Zeros are not stored: ``0.0`` and ``-0.0`` are one dict key but round to different
    signs. Only floats may be looked up (``1`` and ``1.0`` are one key too). The memo is emptied when full.
    """

    def __init__(self, ndigits: int, limit: int = 1 << 16) -> None:
        super().__init__()
        self.ndigits = ndigits
        self.limit = limit

    def __missing__(self, x: float) -> float:
        if not x:
            return x  # a zero rounds to itself, sign included
        value = round(x, self.ndigits)
        if len(self) >= self.limit:
            self.clear()
        self[x] = value
        return value


R2, R3, R4 = Rounded(2), Rounded(3), Rounded(4)


# The per-step code clamps with conditional expressions, written to give exactly what the builtins give
# (``min(hi, x)`` is ``x if x < hi else hi``): in Python 3.11 each min() or max() call parses keyword arguments
# and costs several times more than the comparison.
def clamp01(x: float) -> float:
    """``max(0.0, min(1.0, x))``."""
    x = x if x < 1.0 else 1.0
    return x if x > 0.0 else 0.0

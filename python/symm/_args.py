"""The integer arguments of the host functions, as the runtime takes them.

The runtime takes world sizes, byte counts, channels, seeds and ranks as 64-bit integers. A
value that is not an integer is a ``TypeError``; one outside what the runtime holds is a
``ValueError`` naming the argument (not the ``OverflowError`` of the conversion), so every
host function refuses bad input with the errors its documentation names.
"""

from __future__ import annotations

from typing import Any

#: Bounds of a signed 64-bit integer: what the runtime takes.
_I64 = (-(1 << 63), (1 << 63) - 1)
#: Seeds are unsigned 64-bit.
_U64 = (0, (1 << 64) - 1)


def ints(**named: Any) -> None:
    """Checks each named argument: ``None`` passes (an optional one left out), ``seed`` is an
    unsigned 64-bit integer, every other one a signed 64-bit integer.
    """
    for name, v in named.items():
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name} must be an int, not {type(v).__name__}")
        lo, hi = _U64 if name == "seed" else _I64
        if not lo <= v <= hi:
            raise ValueError(f"{name}={v} is outside what symm takes ({lo} to {hi})")

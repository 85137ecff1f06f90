"""Optional numpy: arrays when numpy imports, else plain Python values."""

from __future__ import annotations

import array
from typing import Any, Optional

try:  # numpy is optional: everything works without it.
    import numpy as _np
except ImportError:  # pragma: no cover - exercised only where numpy is absent
    _np = None

#: numpy dtype of each symm dtype (bf16 has none in numpy: its raw 16-bit words are used).
NUMPY_DTYPES = {
    "f32": "<f4",
    "f16": "<f2",
    "bf16": "<u2",
    "f64": "<f8",
    "i32": "<i4",
    "u32": "<u4",
    "i64": "<i8",
    "u64": "<u8",
    "u8": "u1",
}


def numpy() -> Optional[Any]:
    """The numpy module, or None when it is not installed."""
    return _np


def buffer(data: bytes, dtype: str) -> Any:
    """``data`` as a numpy array of ``dtype`` when numpy is available, else the bytes."""
    if _np is None:
        return data
    return _np.frombuffer(data, dtype=NUMPY_DTYPES[dtype])


def column(data: bytes, code: str) -> Any:
    """A packed little-endian column (``array`` type code ``code``) as a numpy array or list."""
    if _np is not None:
        return _np.frombuffer(data, dtype=_np.dtype(code).newbyteorder("<"))
    a = array.array(code)
    a.frombytes(data)
    if array.array("H", [1]).tobytes()[0] != 1:  # big-endian host
        a.byteswap()
    return a.tolist()

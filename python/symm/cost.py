"""symm's cost model: predicted times and the algorithm and channels it picks.

Times are microseconds on a link model (``topology``: ``"nvlink"``, GPUs joined by NVLink 4,
or ``"shared_device"``, ranks sharing one GPU), launch included.
"""

from __future__ import annotations

from typing import Optional

from . import _args, _symm

__all__ = ["predict", "select", "tune"]


def predict(collective: str, algorithm: str, world: int, nbytes: int, dtype: str = "f32",
            op: str = "sum", channels: Optional[int] = None, topology: str = "nvlink",
            root: int = 0, src: int = 0, dst: Optional[int] = None) -> float:
    """Predicted time in microseconds of ``algorithm`` running ``collective`` over ``world``
    ranks on ``nbytes`` (per rank or per block, as the collective counts them).

    Raises ValueError for an unknown name or a request that does not schedule.
    """
    _args.ints(world=world, nbytes=nbytes, channels=channels, root=root, src=src, dst=dst)
    return _symm.predict(collective, algorithm, world, nbytes, dtype, op, channels, topology,
                         root, src, dst)


def select(collective: str, world: int, nbytes: int, dtype: str = "f32", op: str = "sum",
           channels: Optional[int] = None, topology: str = "nvlink", multicast: bool = False,
           root: int = 0, src: int = 0, dst: Optional[int] = None) -> str:
    """The name of the algorithm with the lowest predicted time (multicast only when
    ``multicast``).
    """
    _args.ints(world=world, nbytes=nbytes, channels=channels, root=root, src=src, dst=dst)
    return _symm.select(collective, world, nbytes, dtype, op, channels, topology, multicast,
                        root, src, dst)


def tune(collective: str, world: int, nbytes: int, dtype: str = "f32", op: str = "sum",
         topology: str = "nvlink", root: int = 0, src: int = 0,
         dst: Optional[int] = None) -> tuple[str, int, str]:
    """symm's default choice: ``(algorithm, channels, source)``, where ``source`` is
    ``"calibrated"`` (the measured table's nearest entry) or ``"model"`` (the cost model).
    """
    _args.ints(world=world, nbytes=nbytes, root=root, src=src, dst=dst)
    return _symm.tune(collective, world, nbytes, dtype, op, topology, root, src, dst)

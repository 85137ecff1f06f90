"""symm from Python.

On the GPU, from PyTorch (:func:`init` inside torchrun or symm-run): symmetric tensors
(:func:`empty`, :func:`zeros`), collectives on torch's current stream
(:func:`all_reduce`, :func:`all_gather_into_tensor`, :func:`reduce_scatter_tensor`,
:func:`all_to_all_single`, :func:`broadcast`, :func:`reduce`) that CUDA graphs can capture,
in a deterministic mode when asked (:func:`init`), a
``torch.cuda.MemPool`` over the symmetric heap (:func:`mem_pool`), the fused all-reduce,
residual add and RMSNorm (:func:`fused_all_reduce_rmsnorm`), peer memory
for users' own kernels (:func:`rendezvous`), and MoE dispatch and combine (:mod:`symm.moe`).
torch is imported by :func:`init`, not before. Existing ``torch.distributed`` code runs on
symm with ``init_process_group("cuda:symm,cpu:gloo")``: the backend ``"symm"``
(:mod:`symm.distributed`), registered by ``import symm`` when torch is imported already.

On the host, with no GPU: the deterministic simulator (:func:`simulate`) and its reference
(:func:`reference`), trace decoding (:class:`Trace`) and the cost model (:mod:`symm.cost`).
These need no GPU, CUDA or torch; numpy is optional (buffers and event columns are numpy
arrays when it imports, else ``bytes`` and lists).

Names are symm's own: collectives (``"all_reduce"``, ...), algorithms (``"ring"``, ...),
dtypes (``"f32"``, ``"bf16"``, ...) and ops (``"sum"``, ...); :func:`names` lists them all.
A :class:`Request` holds one call as symm runs it: the algorithm and channels are symm's
automatic choice (the calibration tables, else the cost model) unless the caller forces them.

Errors: ``ValueError`` for a wrong argument or ranks that called with different ones,
:class:`TimeoutError`, :class:`PeerLostError` and :class:`PoisonedError` for a running job's
failures, :class:`SymmError` for the rest (the C ABI's statuses follow the same kinds).
"""

from __future__ import annotations

import os
import stat
import sys
from dataclasses import dataclass
from typing import Any, Optional, Union

from . import _args, _arrays, _symm, cost, moe
from ._alltoall import all_to_all_single
from ._fused import fused_all_reduce_rmsnorm
from ._gpu import (
    SIGNAL_SLOTS,
    all_gather_into_tensor,
    all_reduce,
    broadcast,
    check,
    collect,
    device,
    empty,
    finalize,
    heap_usage,
    init,
    is_deterministic,
    is_initialized,
    is_symmetric,
    mem_pool,
    rank,
    reduce,
    reduce_scatter_tensor,
    reset,
    synchronize,
    world_size,
    zeros,
)
from ._handle import SymmHandle, rendezvous
from ._symm import Request
from .errors import PeerLostError, PoisonedError, SymmError, TimeoutError, TraceError

if "torch" in sys.modules:
    # torch is there already: register the torch.distributed backend "symm" now (else
    # `import symm.distributed` does).
    from . import distributed  # noqa: F401

#: The package's version (the Rust workspace's).
__version__: str = _symm.__version__

__all__ = [
    "SIGNAL_SLOTS",
    "SymmHandle",
    "all_gather_into_tensor",
    "all_reduce",
    "all_to_all_single",
    "broadcast",
    "check",
    "collect",
    "device",
    "empty",
    "finalize",
    "fused_all_reduce_rmsnorm",
    "heap_usage",
    "init",
    "is_deterministic",
    "is_initialized",
    "is_symmetric",
    "mem_pool",
    "rank",
    "reduce",
    "reduce_scatter_tensor",
    "rendezvous",
    "reset",
    "synchronize",
    "world_size",
    "zeros",
    "MAX_TRACE_BYTES",
    "PeerLostError",
    "PoisonedError",
    "Request",
    "SimResult",
    "SymmError",
    "TimeoutError",
    "Trace",
    "TraceError",
    "cost",
    "moe",
    "names",
    "reference",
    "simulate",
]

#: Largest trace :class:`Trace` reads unless told otherwise (bytes).
MAX_TRACE_BYTES = 1 << 30


def names() -> dict[str, list[str]]:
    """Every name the functions take: ``collectives``, ``algorithms``, ``dtypes``, ``ops``
    and ``topologies``.
    """
    return _symm.names()


@dataclass(frozen=True)
class SimResult:
    """The result of :func:`simulate`.

    ``inputs``, ``outputs`` and ``reference`` hold one buffer per rank (numpy arrays of the
    request's dtype when numpy imports, else ``bytes``; bf16 as raw 16-bit words). ``trace``
    is the run's trace in symm's format (read it with :class:`Trace`), ``time_us`` the
    simulated time in microseconds, ``ops`` the ops executed over all ranks and channels and
    ``matches`` whether the outputs equal the reference within the dtype's tolerance.
    """

    inputs: list[Any]
    outputs: list[Any]
    reference: list[Any]
    trace: bytes
    time_us: float
    ops: int
    matches: bool


def simulate(collective: str, algorithm: str, world: int, nbytes: int, dtype: str = "f32",
             op: str = "sum", channels: Optional[int] = None, seed: int = 0, root: int = 0,
             src: int = 0, dst: Optional[int] = None) -> SimResult:
    """Run ``collective`` with ``algorithm`` over ``world`` ranks in symm's deterministic
    simulator, on random inputs drawn from ``seed``, and check it against the reference.

    ``nbytes`` is the size the collective counts (per rank, or per block for reduce-scatter,
    all-gather, scatter, gather and all-to-all). ``root`` is the root of broadcast, reduce,
    scatter and gather; ``src`` and ``dst`` (default the last rank) the peers of send_recv.
    Raises ValueError for an unknown name, a request that does not schedule, inputs and
    outputs over 1 GiB in all, or a run whose whole memory (every rank's buffers, scratch and
    signal pad) is over the host backend's bound of 4 GiB.
    """
    _args.ints(world=world, nbytes=nbytes, channels=channels, seed=seed, root=root, src=src,
               dst=dst)
    d = _symm.simulate(collective, algorithm, world, nbytes, dtype, op, channels, seed, root,
                       src, dst)
    conv = [[_arrays.buffer(b, dtype) for b in d[k]] for k in ("inputs", "outputs", "reference")]
    return SimResult(conv[0], conv[1], conv[2], d["trace"], d["time_us"], d["ops"],
                     d["matches"])


def reference(collective: str, algorithm: str, world: int, nbytes: int, inputs: list[Any],
              dtype: str = "f32", op: str = "sum", channels: Optional[int] = None,
              root: int = 0, src: int = 0, dst: Optional[int] = None,
              rank_order: bool = False) -> list[Any]:
    """The outputs a request defines for ``inputs`` (one buffer per rank: ``bytes`` or any
    object with the buffer protocol, of the request's input size). Outputs the collective
    leaves undefined hold the poison byte 0xA5. Returned like :attr:`SimResult.outputs`.
    With ``rank_order=True`` every reduction is deterministic mode's rank-order sum: the bits
    a deterministic call gives (see :func:`init`), whatever its algorithm.
    """
    _args.ints(world=world, nbytes=nbytes, channels=channels, root=root, src=src, dst=dst)
    if isinstance(inputs, (bytes, bytearray, memoryview, str)):
        raise TypeError("inputs is one buffer per rank (a list), not a single "
                        f"{type(inputs).__name__}")
    try:
        raw = [bytes(memoryview(b).cast("B")) for b in inputs]
    except TypeError as e:
        raise TypeError(f"inputs holds one buffer per rank (bytes or a buffer object): {e}") \
            from None
    if not isinstance(rank_order, bool):
        raise TypeError(f"rank_order must be a bool, got {rank_order!r}")
    out = _symm.reference(collective, algorithm, world, nbytes, raw, dtype, op, channels, root,
                          src, dst, rank_order)
    return [_arrays.buffer(b, dtype) for b in out]


class Trace:
    """A decoded symm trace (any format version), from ``bytes`` or a file path.

    The input is untrusted: anything but a well-formed trace raises :class:`TraceError`
    naming the byte offset, inputs over ``max_bytes`` (a positive int) are refused having read
    at most one byte past it (a regular file by its size, before reading), and event times
    that overflow 64-bit nanoseconds are refused.
    A trace cut short (a crash while writing) reads up to the cut, with :attr:`warning` set.

    ``header`` is a dict (``collective``, ``algorithm``, ``world``, ``channels``, ``bytes``,
    ``dtype``, ``op``, ``time_unit_ns``, ``source``); the event columns ``time_ns``, ``rank``,
    ``channel``, ``op_index``, ``kind`` (0 begin, 1 end, 2 stall) and ``op`` (op kind tag;
    :attr:`op_names` maps tags to names) are numpy arrays when numpy imports, else lists.
    """

    def __init__(self, source: Union[bytes, bytearray, memoryview, str, os.PathLike],
                 max_bytes: int = MAX_TRACE_BYTES) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int):
            raise TypeError(f"max_bytes must be an int, not {type(max_bytes).__name__}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be positive, not {max_bytes}")
        if isinstance(source, (bytes, bytearray, memoryview)):
            if memoryview(source).nbytes > max_bytes:
                raise TraceError(f"the trace has {memoryview(source).nbytes} bytes; at most "
                                 f"{max_bytes} are read")
            data = bytes(source)
        elif isinstance(source, (str, os.PathLike)):
            with open(source, "rb") as f:
                st = os.fstat(f.fileno())
                # A regular file is refused by its size, before anything is read; any other
                # (a device, a pipe) is read up to the limit, and one byte more tells it is over.
                if stat.S_ISREG(st.st_mode) and st.st_size > max_bytes:
                    raise TraceError(f"{os.fspath(source)!r} is over {max_bytes} bytes")
                data = f.read(max_bytes)
                if f.read(1):
                    raise TraceError(f"{os.fspath(source)!r} is over {max_bytes} bytes")
        else:
            raise TypeError(f"Trace takes bytes or a path, not {type(source).__name__}")
        d = _symm.decode_trace(data)
        #: The trace format version.
        self.version: int = d["version"]
        #: The op tag layout the events were read with.
        self.layout: str = d["layout"]
        #: The header fields.
        self.header: dict[str, Any] = d["header"]
        #: A message when the trace was cut short, else None.
        self.warning: Optional[str] = d["warning"]
        #: Name of each op kind tag.
        self.op_names: dict[int, str] = d["op_names"]
        self._count: int = d["count"]
        unit = self.header["time_unit_ns"]
        time = _arrays.column(d["time"], "Q")
        np = _arrays.numpy()
        # Times are 64-bit nanoseconds: a trace whose times overflow them is refused, with or
        # without numpy (whose arithmetic would wrap where Python's ints would not).
        latest = (int(time.max()) if len(time) else 0) if np is not None else max(time, default=0)
        if unit and latest > ((1 << 64) - 1) // unit:
            raise TraceError(f"event time {latest} x {unit} ns overflows 64-bit nanoseconds")
        #: Event times in nanoseconds.
        self.time_ns: Any = time * unit if np is not None else [t * unit for t in time]
        #: Rank of each event.
        self.rank: Any = _arrays.column(d["rank"], "H")
        #: Channel of each event.
        self.channel: Any = _arrays.column(d["channel"], "H")
        #: Position of each event's op in its (rank, channel) stream.
        self.op_index: Any = _arrays.column(d["op_index"], "I")
        #: 0 begin, 1 end, 2 stall.
        self.kind: Any = _arrays.column(d["kind"], "B")
        #: Op kind tag of each event.
        self.op: Any = _arrays.column(d["op"], "B")

    def __len__(self) -> int:
        """The number of events."""
        return self._count

    @property
    def events(self) -> dict[str, Any]:
        """The event columns by name: ``time_ns``, ``rank``, ``channel``, ``op_index``,
        ``kind`` and ``op``.
        """
        return {
            "time_ns": self.time_ns,
            "rank": self.rank,
            "channel": self.channel,
            "op_index": self.op_index,
            "kind": self.kind,
            "op": self.op,
        }

    def __repr__(self) -> str:
        """A one-line summary."""
        h = self.header
        return (f"Trace({h['collective']}/{h['algorithm']}, world {h['world']}, "
                f"{h['channels']} channels, {h['bytes']} bytes, {len(self)} events)")

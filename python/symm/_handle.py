"""Peer access to a symmetric tensor: :func:`rendezvous` and its :class:`SymmHandle`."""

from __future__ import annotations

from typing import Any

from ._gpu import (
    SIGNAL_SLOTS,
    _check,
    _dtype_name,
    _get,
    _Job,
    _request,
    _stream,
    is_symmetric,
    zeros,
)


class SymmHandle:
    """Peer access to a symmetric tensor, from :func:`rendezvous`.

    ``buffer_ptrs[r]`` is the address, in this process, of rank ``r``'s copy of the tensor's
    data; ``signal_pad_ptrs[r]`` that of rank ``r``'s signal pad: ``SIGNAL_SLOTS * world``
    64-bit words, word ``slot * world + src`` written by rank ``src``. A user kernel may store
    to a peer's pad word and spin on its own (release/acquire at system scope); the stream
    methods below do the same with symm's deadline.
    """

    def __init__(self, j: _Job, t: Any, pad: Any, bar: Any) -> None:
        self._j = j
        self._t = t
        self._pad = pad
        self._bar = bar
        self.rank: int = j.rank
        self.world_size: int = j.world
        off = t.data_ptr() - j.base
        self._off = off
        self._nbytes = t.numel() * t.element_size()
        self.buffer_ptrs: list[int] = [j.comm.ptr(r, off) for r in range(j.world)]
        poff = pad.data_ptr() - j.base
        self._pad_off = poff
        self._pad_len = pad.numel() * pad.element_size()
        self.signal_pad_ptrs: list[int] = [j.comm.ptr(r, poff) for r in range(j.world)]

    def get_buffer(self, rank: int, shape: Any, dtype: Any, storage_offset: int = 0) -> Any:
        """A tensor view of rank ``rank``'s copy: ``shape`` elements of ``dtype`` from element
        ``storage_offset``; it must lie inside the tensor the handle was made from.
        """
        j = self._j
        torch = j.torch
        if not (isinstance(rank, int) and 0 <= rank < j.world):
            raise ValueError(f"rank must be below {j.world}, got {rank!r}")
        _dtype_name(j, dtype)
        if isinstance(shape, int):
            shape = (shape,)
        shape = tuple(int(s) for s in shape)
        esize = torch.empty((), dtype=dtype).element_size()
        numel = 1
        for s in shape:
            numel *= s
        start = int(storage_offset) * esize
        if storage_offset < 0 or min(shape, default=0) < 0 or start + numel * esize > self._nbytes:
            raise ValueError(f"{shape} of {dtype} at element {storage_offset} does not fit in "
                             f"the tensor's {self._nbytes} bytes")
        view = _PeerView(self, self.buffer_ptrs[rank] + start, numel * esize)
        raw = torch.as_tensor(view, device=j.device)
        return raw.view(dtype).view(shape)

    def barrier(self, stream: Any = None) -> None:
        """Every rank's earlier work on its stream happens before any rank's later work
        (on the stream; the host does not wait).
        """
        j = self._j
        p = self._bar.data_ptr()
        r = _request(j, "all_reduce", 8, "u64", "sum", None, None)
        j.collective(r, p, 8, p + 16, 8, _stream(j, stream))

    def put_signal(self, peer: int, slot: int = 0, stream: Any = None) -> None:
        """Set signal ``slot`` in ``peer``'s pad after this rank's earlier work on the stream."""
        j = self._j
        self._slot(slot)
        j.comm.put_signal(self._pad_off, self._pad_len, peer, slot, _stream(j, stream))

    def wait_signal(self, peer: int, slot: int = 0, stream: Any = None) -> None:
        """Hold the stream until ``peer`` has put signal ``slot`` here, then clear it (a wait
        past the deadline raises symm.TimeoutError at the next check).
        """
        j = self._j
        self._slot(slot)
        j.comm.wait_signal(self._pad_off, self._pad_len, peer, slot, _stream(j, stream))

    @staticmethod
    def _slot(slot: int) -> None:
        if not (isinstance(slot, int) and 0 <= slot < SIGNAL_SLOTS):
            raise ValueError(f"slot must be in 0..{SIGNAL_SLOTS - 1}, got {slot!r}")


class _PeerView:
    """Exposes a peer's memory to torch and keeps the handle (and its tensor) alive."""

    def __init__(self, handle: SymmHandle, ptr: int, nbytes: int) -> None:
        self._handle = handle
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
            "strides": None, "stream": None,
        }


def rendezvous(t: Any) -> SymmHandle:
    """Collective: a :class:`SymmHandle` over symmetric tensor ``t`` (every rank passes its
    tensor from the same :func:`empty` call), with a fresh signal pad.
    """
    j = _get()
    _check(j, t, "t")
    if not is_symmetric(t):
        raise ValueError("rendezvous needs a tensor from symm.empty or symm.zeros")
    torch = j.torch
    off = t.data_ptr() - j.base
    for r, theirs in enumerate(j.comm.exchange(str(off).encode())):
        if theirs != str(off).encode():
            raise ValueError(f"rank {r} passed a tensor at heap offset {theirs.decode()!r}, this "
                             f"rank one at {off}: every rank passes its copy of the same tensor")
    pad = zeros((SIGNAL_SLOTS * j.world,), dtype=torch.int64)
    bar = zeros((4,), dtype=torch.int64)
    j.comm.load_signals()
    torch.cuda.current_stream(j.device).synchronize()
    h = SymmHandle(j, t, pad, bar)
    h.barrier()
    return h

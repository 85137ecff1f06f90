"""The collectives of one host's ranks, as the backend composes them: :class:`SymmLocal` runs
them on a symm communicator (the job ``symm.init`` makes, or one per group), :class:`TorchLocal`
on a torch backend (the engine between hosts, and gloo where tests stand in for symm),
:class:`Alone` where a host holds one rank of the group.

Every method enqueues on torch's current stream and returns when it is enqueued; tensors are
contiguous, of a dtype symm takes (the routing table sent the rest elsewhere).
"""

from __future__ import annotations

import os
from typing import Any

from .. import _gpu

# NVLink multicast stays off in every process that loads torch through symm (`symm._gpu`
# assigns the same on import).
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"


class SymmLocal:
    """Collectives on a symm job (``_gpu._Job``)."""

    def __init__(self, job: Any) -> None:
        self.job = job
        self.rank = job.rank
        self.size = job.world

    def _go(self, collective: str, block: int, t: Any, src: Any, nin: int, dst: Any, nout: int,
            op: str = "sum", root: int = 0) -> None:
        """Runs ``collective`` over ``nin`` bytes of ``src`` into ``nout`` bytes of ``dst``, of
        ``t``'s dtype. Each side must be a tensor of exactly its bytes, of that dtype: the
        kernel reads and writes those spans, so a smaller tensor or a narrower dtype (which
        torch's front end lets through for some calls) is refused here, never run past.
        """
        j = self.job
        if block:
            dt = _gpu._check(j, t, "tensor")
            sides = (("input", src, nin), ("output", dst, nout))
            for what, x, _ in sides:
                if x is not t and _gpu._check(j, x, what) != dt:
                    raise TypeError(f"{collective}: the {what} is {x.dtype} and the tensor "
                                    f"{t.dtype}: they must match")
            for what, x, n in sides:
                if x.nbytes != n:
                    raise ValueError(f"{collective}: the {what} holds {x.nbytes} bytes where "
                                     f"the call needs {n}")
            r = _gpu._request(j, collective, block, dt, op, None, None, root)
            j.collective(r, src.data_ptr(), nin, dst.data_ptr(), nout, j.current_stream())

    def all_reduce(self, t: Any, op: str) -> None:
        """``t`` reduced over the ranks, in place."""
        j = self.job
        if op == "sum" and j.sum(t):  # a shape the runtime remembers: one call
            return
        n = t.nbytes
        if n:
            r = _gpu._request(j, "all_reduce", n, _gpu._check(j, t, "tensor"), op, None, None)
            if op == "sum":
                j.sums.remember(n, t.dtype, r)
            p = t.data_ptr()
            j.collective(r, p, n, p, n, j.current_stream())

    def reduce_scatter(self, out: Any, inp: Any, op: str) -> None:
        """Block ``rank`` of the reduction of every rank's ``inp`` into ``out``."""
        n = out.nbytes
        self._go("reduce_scatter", n, inp, inp, n * self.size, out, n, op)

    def all_gather(self, out: Any, inp: Any) -> None:
        """Every rank's ``inp``, rank by rank, into ``out``."""
        n = inp.nbytes
        self._go("all_gather", n, inp, inp, n, out, n * self.size)

    def all_to_all(self, out: Any, inp: Any) -> None:
        """Block ``q`` of ``inp`` to rank ``q``, block ``r`` of ``out`` from rank ``r``."""
        n = inp.nbytes
        self._go("all_to_all", n // self.size, inp, inp, n, out, n)

    def broadcast(self, t: Any, root: int) -> None:
        """Rank ``root``'s ``t`` into every rank's ``t``."""
        n = t.nbytes
        self._go("broadcast", n, t, t, n, t, n, root=root)

    def reduce(self, t: Any, root: int, op: str) -> None:
        """The reduction of every rank's ``t`` into rank ``root``'s."""
        n = t.nbytes
        self._go("reduce", n, t, t, n, t, n, op, root)

    def scatter(self, out: Any, inp: Any, root: int) -> None:
        """Block ``rank`` of rank ``root``'s ``inp`` (``size`` blocks) into ``out``; ``inp``
        is None off the root.
        """
        n = out.nbytes
        if inp is None:  # the request's input, unread off the root
            inp = out.new_empty(out.numel() * self.size)
        self._go("scatter", n, out, inp, n * self.size, out, n, root=root)

    def gather(self, out: Any, inp: Any, root: int) -> None:
        """Every rank's ``inp``, rank by rank, into rank ``root``'s ``out``; ``out`` is None
        off the root.
        """
        n = inp.nbytes
        if out is None:  # the request's output, unwritten off the root
            out = inp.new_empty(inp.numel() * self.size)
        self._go("gather", n, inp, inp, n, out, n * self.size, root=root)


class TorchLocal:
    """The same collectives on a torch backend (``ProcessGroupNCCL``, ``ProcessGroupGloo``),
    each waited for on the current stream.
    """

    def __init__(self, backend: Any, rank: int, size: int) -> None:
        self.backend = backend
        self.rank = rank
        self.size = size

    def all_reduce(self, t: Any, op: str) -> None:
        """As :meth:`SymmLocal.all_reduce`."""
        import torch.distributed as dist

        o = dist.AllreduceOptions()
        o.reduceOp = _torch_op(op)
        self.backend.allreduce([t], o).wait()

    def reduce_scatter(self, out: Any, inp: Any, op: str) -> None:
        """As :meth:`SymmLocal.reduce_scatter`."""
        import torch.distributed as dist

        o = dist.ReduceScatterOptions()
        o.reduceOp = _torch_op(op)
        self.backend._reduce_scatter_base(out, inp, o).wait()

    def all_gather(self, out: Any, inp: Any) -> None:
        """As :meth:`SymmLocal.all_gather`."""
        self.backend._allgather_base(out, inp).wait()


class Alone:
    """A host holding one rank of the group: nothing to exchange."""

    rank = 0
    size = 1

    def all_reduce(self, t: Any, op: str) -> None:
        """Nothing: the one rank's ``t`` is the reduction."""

    def reduce_scatter(self, out: Any, inp: Any, op: str) -> None:
        """``out`` is ``inp``."""
        out.view(-1).copy_(inp.view(-1))

    def all_gather(self, out: Any, inp: Any) -> None:
        """``out`` is ``inp``."""
        out.view(-1).copy_(inp.view(-1))


def _torch_op(op: str) -> Any:
    import torch.distributed as dist

    return {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN,
            "max": dist.ReduceOp.MAX}[op]

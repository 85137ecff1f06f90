"""The ``symm`` process group: every ``torch.distributed`` call of a group, routed.

One :class:`SymmGroup` per group (the default group and every ``new_group``, ``DeviceMesh``
dimension included), made when torch makes the group, on its members only; the members
publish their host names through the group's store then. It holds:

* gloo over the group, for CPU tensors and the host side of ``barrier``;
* the symm communicator of the group's ranks on this host, joined on the group's first call
  that symm serves (every member makes that call, so they join together): for the default
  group on one host, the job ``symm.init`` would join (so ``symm.empty`` tensors and
  ``symm.*`` calls share its heap); for any other group, a job of its own over the group's
  store;
* the engine, NCCL over the group (unless ``SYMM_DIST_ENGINE=none``), started on its first
  call; and, on a group that spans hosts, NCCL between the ranks of the same local rank on
  every host, for the hierarchical collectives.

A group whose calls symm serves never starts NCCL; one that only moves CPU tensors never joins
a symm job. Warm a group up before a CUDA graph captures it, as with NCCL.

Each call asks the routing table (``_route``) which path serves it, counts that path
(:meth:`SymmGroup.paths`) and, with ``SYMM_DIST_DEBUG=1``, logs it. A failure of symm is
raised as ``torch.distributed.DistBackendError`` naming the call, the group, the rank and the
path, with symm's own message and fields.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections import Counter
from datetime import timedelta
from typing import Any, Callable, Optional

# NVLink multicast stays off in every process that loads torch through symm (`symm._gpu`
# assigns the same on import).
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from .. import _gpu  # noqa: E402
from ..errors import SymmError  # noqa: E402
from . import _engine, _hier, _local, _route  # noqa: E402
from ._options import Options  # noqa: E402
from ._work import Each, Work  # noqa: E402

_log = logging.getLogger("symm.distributed")

#: What a failing symm call raises (wrapped as DistBackendError).
_SYMM_ERRORS = (SymmError, ValueError, TypeError)


def _dtype(t: Any) -> str:
    return str(t.dtype).rpartition(".")[2]


def _reduce(op: Any) -> str:
    return op.op.name.lower()


class SymmGroup(dist.ProcessGroup):
    """A ``torch.distributed`` process group served by symm (see the module's doc)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, name: str,
                 global_ranks: list[int], options: Options) -> None:
        super().__init__(rank, size)
        self._name = name
        self._options = options
        self._counts: Counter[tuple[str, str]] = Counter()
        self._store = store
        self._timeout = timeout
        self._jobs: list[Any] = []
        self._gloo = _engine.gloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
        self._engine: Any = None
        self._local: Any = None
        self._cross: Any = None
        self._default = not global_ranks
        hosts = _hosts(store, rank, size, list(global_ranks) or list(range(size)), options)
        count = len(set(hosts))
        per = size // count
        host_major = size % count == 0 and all(h == g // per for g, h in enumerate(hosts))
        self.shape = _route.Group(size, count, host_major, options.engine == "nccl")
        self._host = hosts[rank]
        self._mine = [g for g in range(size) if hosts[g] == self._host]

    # -- the engines, started on the first call that needs each ------------------------------

    @property
    def engine(self) -> Any:
        """NCCL over the group (started on its first call)."""
        if self._engine is None:
            self._engine = _engine.nccl(dist.PrefixStore("nccl/", self._store), self.rank(),
                                        self.size(), self._timeout)
        return self._engine

    @property
    def local(self) -> Any:
        """The collectives of this host's ranks of the group: symm's (joined on first use;
        every member makes the same first call, so they join together).
        """
        if self._local is None:
            me = self._mine.index(self.rank())
            if len(self._mine) == 1:
                self._local = _local.Alone()
            else:
                job = _join(self._store, f"symm/{self._host}", me, len(self._mine),
                            self._options, self._default and self.shape.hosts == 1)
                self._jobs.append(job)
                self._local = _local.SymmLocal(job)
        return self._local

    @property
    def cross(self) -> Any:
        """NCCL between the ranks of every host with this rank's local rank."""
        if self._cross is None:
            me, h, n = self._mine.index(self.rank()), self._host, self.shape.hosts
            b = _engine.nccl(dist.PrefixStore(f"cross/{me}/", self._store), h, n, self._timeout)
            self._cross = _local.TorchLocal(b, h, n)
        return self._cross

    # -- torch's view of the group ------------------------------------------------------------

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        """``"symm"``."""
        return "symm"

    @property
    def group_name(self) -> str:
        """The group's name in torch's registry."""
        return self._name

    def _set_group_name(self, name: str) -> None:
        self._name = name

    def _get_backend(self, device: Any) -> Any:
        """The torch backend behind ``device``'s calls where torch asks for one (to connect
        eagerly with ``init_process_group(device_id=...)``, to set timeouts): gloo for CPU,
        the engine for CUDA (gloo when there is none). symm itself is no torch backend.
        """
        kind = device if isinstance(device, str) else torch.device(device).type
        if kind == "cuda" and self._options.engine == "nccl":
            return self.engine
        return self._gloo

    def paths(self) -> dict[str, dict[str, int]]:
        """How many calls each path served, by call: ``{"allreduce": {"symm": 3}, ...}``."""
        out: dict[str, dict[str, int]] = {}
        for (op, path), n in sorted(self._counts.items()):
            out.setdefault(op, {})[path] = n
        return out

    def shutdown(self) -> None:
        """Ends the group's own symm job (the default group's ends with the process)."""
        for j in self._jobs:
            if j is not _gpu._job:
                j.comm.close()
        self._jobs.clear()

    # -- routing ----------------------------------------------------------------------------

    def _route(self, op: str, ts: list[Any], reduce: Optional[str] = None, even: bool = True,
               elements: Optional[int] = None, count: int = 1) -> str:
        """The path of call ``op`` on tensors ``ts`` (all of its tensors; ``count`` of them in
        one list argument), counted.
        """
        t = ts[0]
        try:
            r = _route.route(op, self.shape, device=t.device.type, dtype=_dtype(t),
                             reduce=reduce, tensors=count,
                             contiguous=all(x.is_contiguous() for x in ts), even=even,
                             elements=elements)
        except _route.RouteError as e:
            raise self._error(op, "none", e) from None
        self._counts[(op, r.path)] += 1
        if self._options.debug:
            _log.info("symm %s group %s rank %d: %s (%s)", op, self._name, self.rank(), r.path,
                      r.reason)
        return r.path

    def _error(self, op: str, path: str, e: BaseException) -> Exception:
        fields = {k: getattr(e, k) for k in ("rank", "peer", "slot", "expected", "found")
                  if getattr(e, k, None) is not None}
        extra = f" {fields}" if fields else ""
        return dist.DistBackendError(
            f"symm backend: {op} on group {self._name!r} (rank {self.rank()} of {self.size()}, "
            f"path {path}) failed: {type(e).__name__}: {e}{extra}")

    def _check(self) -> None:
        for j in self._jobs:
            try:
                j.comm.check()
            except _SYMM_ERRORS as e:
                raise self._error("wait", _route.SYMM, e) from e

    def _symm(self, op: str, path: str, run: Callable[[], None], result: list[Any],
              opts: Any) -> Work:
        try:
            run()
        except _SYMM_ERRORS as e:
            raise self._error(op, path, e) from e
        if path == _route.LOCAL:
            return Work(result)
        stream = torch.cuda.current_stream() if getattr(opts, "asyncOp", True) else None
        return Work(result, stream, self._check if self._jobs else None)

    def _other(self, path: str) -> Any:
        return self._gloo if path == _route.CPU else self.engine

    def _forward(self, op: str, ts: list[Any], call: Callable[[Any], Any]) -> Any:
        """A call symm never serves: gloo for CPU tensors, else the engine."""
        path = self._route(op, ts)
        return call(self._other(path))

    # -- the calls ----------------------------------------------------------------------------

    def allreduce(self, tensors: list[Any], opts: Any = None) -> Any:
        """``dist.all_reduce``."""
        opts = opts if opts is not None else dist.AllreduceOptions()
        red = _reduce(opts.reduceOp)
        t = tensors[0]
        path = self._route("allreduce", tensors, red, elements=t.numel(), count=len(tensors))
        if path in (_route.CPU, _route.ENGINE):
            return self._other(path).allreduce(tensors, opts)
        op = _route.REDUCE[red]

        def run() -> None:
            if path == _route.SYMM:
                self.local.all_reduce(t, op)
            elif path == _route.HIER:
                _hier.all_reduce(self.local, self.cross, t, op)
            if red == "avg":
                t.div_(self.size())
        return self._symm("allreduce", path, run, [t], opts)

    def _allgather_base(self, output: Any, input: Any, opts: Any = None) -> Any:
        """``dist.all_gather_into_tensor``."""
        path = self._route("_allgather_base", [output, input], elements=input.numel())
        if path in (_route.CPU, _route.ENGINE):
            return self._other(path)._allgather_base(output, input, opts or _gather_opts())
        _sizes("all_gather_into_tensor", output.numel(), input.numel() * self.size())

        def run() -> None:
            if path == _route.SYMM:
                self.local.all_gather(output, input)
            elif path == _route.HIER:
                _hier.all_gather(self.local, self.cross, output, input)
            else:
                output.view(-1).copy_(input.view(-1))
        return self._symm("_allgather_base", path, run, [output], opts)

    def allgather(self, outputs: list[list[Any]], inputs: list[Any], opts: Any = None) -> Any:
        """``dist.all_gather`` (a list of outputs)."""
        outs, inp = outputs[0], inputs[0]
        path = self._route("allgather", [*inputs, *outs], count=len(inputs))
        if path in (_route.CPU, _route.ENGINE):
            return self._other(path).allgather(outputs, inputs, opts or _gather_opts())
        _sizes("all_gather", len(outs), self.size())

        def run() -> None:
            flat = inp.new_empty(inp.numel() * self.size())
            if path == _route.SYMM:
                self.local.all_gather(flat, inp)
            else:
                flat.copy_(inp.view(-1))
            for o, part in zip(outs, flat.chunk(self.size())):
                o.copy_(part.view_as(o))
        return self._symm("allgather", path, run, outs, opts)

    def _reduce_scatter_base(self, output: Any, input: Any, opts: Any = None) -> Any:
        """``dist.reduce_scatter_tensor``."""
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        red = _reduce(opts.reduceOp)
        path = self._route("_reduce_scatter_base", [output, input], red,
                           elements=output.numel())
        if path in (_route.CPU, _route.ENGINE):
            return self._other(path)._reduce_scatter_base(output, input, opts)
        _sizes("reduce_scatter_tensor", input.numel(), output.numel() * self.size())
        op = _route.REDUCE[red]

        def run() -> None:
            if path == _route.SYMM:
                self.local.reduce_scatter(output, input, op)
            elif path == _route.HIER:
                _hier.reduce_scatter(self.local, self.cross, output, input, op)
            else:
                output.view(-1).copy_(input.view(-1))
            if red == "avg":
                output.div_(self.size())
        return self._symm("_reduce_scatter_base", path, run, [output], opts)

    def reduce_scatter(self, outputs: list[Any], inputs: list[list[Any]],
                       opts: Any = None) -> Any:
        """``dist.reduce_scatter`` (a list of inputs)."""
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        red = _reduce(opts.reduceOp)
        out, ins = outputs[0], inputs[0]
        path = self._route("reduce_scatter", [*outputs, *ins], red, count=len(outputs))
        if path in (_route.CPU, _route.ENGINE):
            return self._other(path).reduce_scatter(outputs, inputs, opts)
        _sizes("reduce_scatter", len(ins), self.size())
        op = _route.REDUCE[red]

        def run() -> None:
            flat = torch.cat([x.reshape(-1) for x in ins])
            if path == _route.SYMM:
                self.local.reduce_scatter(out, flat, op)
            else:
                out.view(-1).copy_(flat)
            if red == "avg":
                out.div_(self.size())
        return self._symm("reduce_scatter", path, run, [out], opts)

    def alltoall_base(self, output: Any, input: Any, output_split_sizes: list[int],
                      input_split_sizes: list[int], opts: Any = None) -> Any:
        """``dist.all_to_all_single``."""
        w = self.size()

        def equal(s: list[int], t: Any) -> bool:
            # No splits, or one count per rank, all the same, covering the tensor's rows.
            rows = t.shape[0] if t.dim() else 0
            return not s or (len(s) == w and len(set(s)) == 1 and s[0] * w == rows)
        even = equal(output_split_sizes, output) and equal(input_split_sizes, input)
        path = self._route("alltoall_base", [output, input], even=even)
        if path in (_route.CPU, _route.ENGINE):
            return self._other(path).alltoall_base(output, input, output_split_sizes,
                                                   input_split_sizes, opts or _a2a_opts())
        _sizes("all_to_all_single", output.numel(), input.numel())
        if input.numel() % w:
            raise ValueError(f"all_to_all_single: {input.numel()} elements do not split into "
                             f"{w} equal blocks")

        def run() -> None:
            if path == _route.SYMM:
                self.local.all_to_all(output, input)
            else:
                output.copy_(input)
        return self._symm("alltoall_base", path, run, [output], opts)

    def broadcast(self, tensors: list[Any], opts: Any = None) -> Any:
        """``dist.broadcast``."""
        opts = opts if opts is not None else dist.BroadcastOptions()
        t = tensors[0]
        path = self._route("broadcast", tensors, count=len(tensors))
        if path in (_route.CPU, _route.ENGINE):
            return self._other(path).broadcast(tensors, opts)

        def run() -> None:
            if path == _route.SYMM:
                self.local.broadcast(t, opts.rootRank)
        return self._symm("broadcast", path, run, [t], opts)

    def reduce(self, tensors: list[Any], opts: Any = None) -> Any:
        """``dist.reduce``."""
        opts = opts if opts is not None else dist.ReduceOptions()
        red = _reduce(opts.reduceOp)
        t = tensors[0]
        path = self._route("reduce", tensors, red, count=len(tensors))
        if path in (_route.CPU, _route.ENGINE):
            return self._other(path).reduce(tensors, opts)
        op, root = _route.REDUCE[red], opts.rootRank

        def run() -> None:
            if path == _route.SYMM:
                self.local.reduce(t, root, op)
            if red == "avg" and self.rank() == root:
                t.div_(self.size())
        return self._symm("reduce", path, run, [t], opts)

    def barrier(self, opts: Any = None) -> Any:
        """``dist.barrier``: this rank's GPU work so far, then every rank meets (gloo)."""
        opts = opts if opts is not None else dist.BarrierOptions()
        self._counts[("barrier", _route.CPU)] += 1
        if torch.cuda.is_initialized():
            torch.cuda.current_stream().synchronize()
            self._check()
        return self._gloo.barrier(opts)

    def send(self, tensors: list[Any], dst: int, tag: int = 0) -> Any:
        """``dist.send``: the engine (gloo for CPU tensors)."""
        return self._forward("send", tensors, lambda b: b.send(tensors, dst, tag))

    def recv(self, tensors: list[Any], src: int, tag: int = 0) -> Any:
        """``dist.recv``: the engine (gloo for CPU tensors)."""
        return self._forward("recv", tensors, lambda b: b.recv(tensors, src, tag))

    def recv_anysource(self, tensors: list[Any], tag: int = 0) -> Any:
        """``dist.recv`` from any rank: the engine (gloo for CPU tensors)."""
        return self._forward("recv_anysource", tensors, lambda b: b.recv_anysource(tensors, tag))

    def gather(self, outputs: list[list[Any]], inputs: list[Any], opts: Any = None) -> Any:
        """``dist.gather``."""
        opts = opts if opts is not None else torch._C._distributed_c10d.GatherOptions()
        root, inp = opts.rootRank, inputs[0]
        outs = outputs[0] if outputs else []
        path = self._route("gather", [*inputs, *outs], count=len(inputs))
        if path in (_route.CPU, _route.ENGINE):
            return self._other(path).gather(outputs, inputs, opts)
        if self.rank() == root:
            _sizes("gather", len(outs), self.size())

        def run() -> None:
            flat = inp.new_empty(inp.numel() * self.size()) if self.rank() == root else None
            if path == _route.SYMM:
                self.local.gather(flat, inp, root)
            elif flat is not None:
                flat.copy_(inp.reshape(-1))
            if flat is not None:
                for o, part in zip(outs, flat.chunk(self.size())):
                    o.copy_(part.view_as(o))
        return self._symm("gather", path, run, outs, opts)

    def scatter(self, outputs: list[Any], inputs: list[list[Any]], opts: Any = None) -> Any:
        """``dist.scatter``."""
        opts = opts if opts is not None else torch._C._distributed_c10d.ScatterOptions()
        root, out = opts.rootRank, outputs[0]
        ins = inputs[0] if inputs else []
        path = self._route("scatter", [*outputs, *ins], count=len(outputs))
        if path in (_route.CPU, _route.ENGINE):
            return self._other(path).scatter(outputs, inputs, opts)
        if self.rank() == root:
            _sizes("scatter", len(ins), self.size())

        def run() -> None:
            flat = torch.cat([x.reshape(-1) for x in ins]) if self.rank() == root else None
            if path == _route.SYMM:
                self.local.scatter(out, flat, root)
            else:
                out.view(-1).copy_(flat)
        return self._symm("scatter", path, run, [out], opts)

    def allreduce_coalesced(self, tensors: list[Any], opts: Any = None) -> Any:
        """``dist.all_reduce_coalesced``: one all-reduce per tensor."""
        opts = opts if opts is not None else torch._C._distributed_c10d.AllreduceCoalescedOptions()
        red = _reduce(opts.reduceOp)
        path = self._route("allreduce_coalesced", tensors, red, count=len(tensors))
        if path in (_route.CPU, _route.ENGINE):
            b = self._other(path)
            one = dist.AllreduceOptions()
            one.reduceOp = opts.reduceOp
            return _coalesced(b, "allreduce_coalesced", (tensors, opts),
                              [lambda t=t: b.allreduce([t], one) for t in tensors], tensors)
        op = _route.REDUCE[red]

        def run() -> None:
            for t in tensors:
                if path == _route.SYMM:
                    self.local.all_reduce(t, op)
                if red == "avg":
                    t.div_(self.size())
        return self._symm("allreduce_coalesced", path, run, tensors, opts)

    def allgather_into_tensor_coalesced(self, outputs: list[Any], inputs: list[Any],
                                        opts: Any = None) -> Any:
        """Coalesced ``all_gather_into_tensor`` (the functional all-gather): one per pair."""
        path = self._route("allgather_into_tensor_coalesced", [*outputs, *inputs],
                           count=len(inputs))
        if path in (_route.CPU, _route.ENGINE):
            b = self._other(path)
            return _coalesced(b, "allgather_into_tensor_coalesced",
                              (outputs, inputs, opts or _gather_opts()),
                              [lambda o=o, i=i: b._allgather_base(o, i, _gather_opts())
                               for o, i in zip(outputs, inputs)], outputs)
        for o, i in zip(outputs, inputs):
            _sizes("all_gather_into_tensor", o.numel(), i.numel() * self.size())

        def run() -> None:
            for o, i in zip(outputs, inputs):
                if path == _route.SYMM:
                    self.local.all_gather(o, i)
                else:
                    o.view(-1).copy_(i.view(-1))
        return self._symm("allgather_into_tensor_coalesced", path, run, outputs, opts)

    def reduce_scatter_tensor_coalesced(self, outputs: list[Any], inputs: list[Any],
                                        opts: Any = None) -> Any:
        """Coalesced ``reduce_scatter_tensor`` (the functional reduce-scatter): one per
        pair.
        """
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        red = _reduce(opts.reduceOp)
        path = self._route("reduce_scatter_tensor_coalesced", [*outputs, *inputs], red,
                           count=len(outputs))
        if path in (_route.CPU, _route.ENGINE):
            b = self._other(path)
            return _coalesced(b, "reduce_scatter_tensor_coalesced", (outputs, inputs, opts),
                              [lambda o=o, i=i: b._reduce_scatter_base(o, i, opts)
                               for o, i in zip(outputs, inputs)], outputs)
        for o, i in zip(outputs, inputs):
            _sizes("reduce_scatter_tensor", i.numel(), o.numel() * self.size())
        op = _route.REDUCE[red]

        def run() -> None:
            for o, i in zip(outputs, inputs):
                if path == _route.SYMM:
                    self.local.reduce_scatter(o, i, op)
                else:
                    o.view(-1).copy_(i.view(-1))
                if red == "avg":
                    o.div_(self.size())
        return self._symm("reduce_scatter_tensor_coalesced", path, run, outputs, opts)

    def alltoall(self, outputs: list[Any], inputs: list[Any], opts: Any = None) -> Any:
        """``dist.all_to_all`` (lists): the engine (gloo for CPU tensors)."""
        return self._forward("alltoall", inputs, lambda b: b.alltoall(outputs, inputs, opts))

def _coalesced(b: Any, name: str, args: tuple, each: list, results: list[Any]) -> Any:
    """Backend ``b``'s coalesced method ``name`` on ``args`` where its binding has one; else
    the single calls ``each`` in order, as one work over ``results`` (torch's bindings of the
    NCCL and gloo backends lack the coalesced forms).
    """
    method = getattr(b, name, None)
    if method is not None:
        return method(*args)
    return Each([call() for call in each], results)


def _gather_opts() -> Any:
    return torch._C._distributed_c10d.AllgatherOptions()


def _a2a_opts() -> Any:
    return torch._C._distributed_c10d.AllToAllOptions()


def _sizes(what: str, got: int, want: int) -> None:
    if got != want:
        raise ValueError(f"{what}: {got} where the group's size makes it {want}")


def _hosts(store: Any, rank: int, size: int, ranks: list[int], options: Options) -> list[int]:
    """The host of every rank of the group, numbered by first appearance: from the test-only
    ``host_size`` (global rank // host_size), else from the host names the ranks publish.
    """
    if options.host_size is not None:
        names = [str(r // options.host_size) for r in ranks]
    else:
        store.set(f"host/{rank}", socket.gethostname()[:255])
        names = [store.get(f"host/{g}")[:255].decode("utf-8", "replace") for g in range(size)]
    seen: dict[str, int] = {}
    return [seen.setdefault(n, len(seen)) for n in names]


def _join(store: Any, key: str, rank: int, world: int, options: Options, default: bool) -> Any:
    """The symm job of a group's ranks on this host (its name and secret drawn by its rank 0
    and shared through the group's store). The default group on one host joins the process's
    job (:func:`symm.init`'s), made here when there is none.
    """
    if default and _gpu._job is not None:
        j = _gpu._job
        if (j.rank, j.world) != (rank, world):
            raise SymmError(f"symm.init joined as rank {j.rank} of {j.world}; the default group "
                            f"is rank {rank} of {world}")
        return j
    if rank == 0:
        store.set(f"{key}/job", f"symm-{os.getpid()}-{secrets.token_hex(6)}")
        store.set(f"{key}/token", secrets.token_hex(32))
    secret = (store.get(f"{key}/job").decode(), store.get(f"{key}/token").decode())
    heap = options.heap_bytes if default else options.group_heap_bytes
    if default:  # the process's job: its GPU is where the placement puts LOCAL_RANK
        where = (rank, world, _gpu._env_int("LOCAL_RANK", _gpu._env_int("RANK", 0)))
        job = _gpu._open_job(torch, where, secret, heap, (options.timeout, 60.0))
    else:  # a group of the job: on the GPU the process uses already
        job = _gpu._open_job(torch, (rank, world, rank), secret, heap, (options.timeout, 60.0),
                             device=torch.cuda.current_device())
    if default:
        _gpu._install(job)
    return job

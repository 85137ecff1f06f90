"""Which engine serves a ``torch.distributed`` call on a symm group: the routing table.

A call is served by one of four paths:

* ``symm``: symm's kernels on the group's symm communicator (every rank of the group on this
  host);
* ``hier``: a group that spans hosts, hierarchically: symm inside each host, the engine
  (NCCL) between the hosts (all-reduce = symm reduce-scatter, engine all-reduce of each shard
  across hosts, symm all-gather; reduce-scatter and all-gather in the same shape);
* ``nccl``: the engine over the whole group, for what symm does not serve (an op it lacks, a
  dtype or reduction it does not take, a list of tensors, a strided tensor, a group that spans
  hosts where no hierarchical form fits);
* ``gloo``: CPU tensors.

A group of one rank needs no peer: its calls are local copies (``local``).

The table below is the one place that says what each ``torch.distributed`` call is to symm;
the backend (``_group``) asks :func:`route` and counts the path that served each call. What
symm takes (collectives, dtypes, reductions) is core's list (``symm.names()``); this only
translates torch's names and picks the engine. Nothing here imports torch, so the decisions
are tested without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .. import _symm

SYMM = "symm"
HIER = "hier"
ENGINE = "nccl"
CPU = "gloo"
LOCAL = "local"

#: Every path, in the order counters list them.
PATHS = (SYMM, HIER, ENGINE, CPU, LOCAL)

_NAMES = _symm.names()

#: torch dtypes (``str(dtype)`` without ``torch.``) symm takes, with symm's names: the
#: translation of torch's names, kept where core lists the dtype (``symm.names()``).
DTYPES = {t: n for t, n in (
    ("float32", "f32"), ("float16", "f16"), ("bfloat16", "bf16"), ("float64", "f64"),
    ("int32", "i32"), ("int64", "i64"), ("uint8", "u8"), ("uint32", "u32"), ("uint64", "u64"),
) if n in _NAMES["dtypes"]}

#: Floating dtypes: an average is a sum divided by the group's size only for these.
FLOATING = frozenset({"float32", "float16", "bfloat16", "float64"})

#: torch reduce ops (``ReduceOp.RedOpType`` names, lower case) symm serves, with symm's names
#: (kept where core lists the op). ``avg`` is symm's sum, then a division on the same stream.
REDUCE = {t: n for t, n in (
    ("sum", "sum"), ("product", "prod"), ("min", "min"), ("max", "max"), ("avg", "sum"),
) if n in _NAMES["ops"]}


@dataclass(frozen=True)
class Op:
    """One ``torch.distributed`` call as symm sees it (a row of :data:`OPS`)."""

    #: symm's collective, or None where symm has none (the engine serves it).
    collective: Optional[str]
    #: Whether the call takes a reduce op.
    reduces: bool = False
    #: Whether a group spanning hosts runs it hierarchically.
    hierarchical: bool = False
    #: Whether the call takes lists of tensors that symm serves one by one.
    coalesced: bool = False


#: The routing table: ``torch.distributed`` calls by the name of the ``ProcessGroup`` method
#: they reach.
OPS: dict[str, Op] = {
    "allreduce": Op("all_reduce", reduces=True, hierarchical=True),
    "_allgather_base": Op("all_gather", hierarchical=True),
    "allgather": Op("all_gather"),
    "_reduce_scatter_base": Op("reduce_scatter", reduces=True, hierarchical=True),
    "reduce_scatter": Op("reduce_scatter", reduces=True),
    "alltoall_base": Op("all_to_all"),
    "broadcast": Op("broadcast"),
    "reduce": Op("reduce", reduces=True),
    "barrier": Op("barrier"),
    "gather": Op("gather"),
    "scatter": Op("scatter"),
    "allreduce_coalesced": Op("all_reduce", reduces=True, coalesced=True),
    "allgather_into_tensor_coalesced": Op("all_gather", coalesced=True),
    "reduce_scatter_tensor_coalesced": Op("reduce_scatter", reduces=True, coalesced=True),
    "send": Op(None),
    "recv": Op(None),
    "recv_anysource": Op(None),
    "alltoall": Op(None),
}


class RouteError(ValueError):
    """A call no path can serve: ``op`` and why (``reason``)."""

    def __init__(self, op: str, reason: str) -> None:
        super().__init__(f"{op}: {reason}")
        self.op = op
        self.reason = reason


@dataclass(frozen=True)
class Group:
    """What routing needs to know of a group, as this rank sees it."""

    #: Ranks in the group.
    size: int
    #: Hosts its ranks are on.
    hosts: int = 1
    #: Whether the group's ranks are numbered host by host with as many on every host (the
    #: shape the hierarchical collectives need).
    host_major: bool = True
    #: Whether the engine (NCCL) is there for what symm does not serve.
    engine: bool = True


@dataclass(frozen=True)
class Route:
    """The path that serves a call, and why."""

    path: str
    reason: str


def route(op: str, group: Group, *, device: str = "cuda", dtype: Optional[str] = None,
          reduce: Optional[str] = None, tensors: int = 1, contiguous: bool = True,
          even: bool = True, elements: Optional[int] = None) -> Route:
    """The path that serves call ``op`` (a :data:`OPS` key) on ``group``.

    ``device`` is the tensors' device type, ``dtype`` their dtype (``"float32"``...), ``reduce``
    the reduce op (``"sum"``...), ``tensors`` how many tensors the call passes per argument,
    ``contiguous`` whether every tensor is, ``even`` whether an all-to-all's splits are equal
    (or absent), ``elements`` the elements of the call's per-rank
    block (a hierarchical call needs it to divide among the ranks of a host). Raises
    :class:`RouteError` when only the engine could serve the call and there is none.
    """
    if device == "cpu":
        return Route(CPU, "CPU tensors")
    if device != "cuda":
        raise RouteError(op, f"{device} tensors: symm serves cuda and cpu")
    row = OPS.get(op)
    if group.size == 1 and row is not None and row.collective is not None:
        return Route(LOCAL, "a group of one rank")
    if row is None or row.collective is None:
        return _engine(op, group, f"symm has no {op}")
    if op == "barrier":
        # The device's work, then the ranks meet on the host: no engine needed.
        return Route(CPU, "a barrier: the stream, then the ranks on the host")
    if dtype is not None and dtype not in DTYPES:
        return _engine(op, group, f"symm does not take {dtype}")
    if row.reduces:
        if reduce not in REDUCE:
            return _engine(op, group, f"symm has no {reduce} reduction")
        if reduce == "avg" and dtype not in FLOATING:
            return _engine(op, group, f"an average of {dtype} (integer division)")
    if tensors != 1 and not row.coalesced:
        return _engine(op, group, f"{tensors} tensors in one call")
    if not contiguous:
        return _engine(op, group, "a strided tensor")
    if not even:
        return _engine(op, group, "splits of different sizes")
    if group.hosts > 1:
        if not row.hierarchical or row.coalesced:
            return _engine(op, group, f"{op} on a group across {group.hosts} hosts")
        if not group.host_major:
            return _engine(op, group, "ranks not numbered host by host, as many on each")
        local = group.size // group.hosts
        if op == "allreduce" and (elements is None or elements % local):
            return _engine(op, group, f"{elements} elements do not divide among {local} ranks")
        return Route(HIER, f"symm in each of {group.hosts} hosts, the engine between them")
    return Route(SYMM, "symm serves it")


def _engine(op: str, group: Group, reason: str) -> Route:
    if not group.engine:
        raise RouteError(op, f"{reason}, and the backend has no engine (SYMM_DIST_ENGINE=none)")
    return Route(ENGINE, reason)

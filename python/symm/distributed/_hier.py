"""Collectives of a group that spans hosts: symm inside each host, the engine between them.

The group's ranks are numbered host by host, ``L`` on each of ``H`` hosts: rank ``g`` is
local rank ``l = g % L`` of host ``h = g // L``. ``local`` holds the ranks of this host
(local rank ``l``), ``cross`` the ranks of every host with the same local rank (cross rank
``h``). Each byte crosses between hosts once per direction, as in a flat ring, but the hops
inside a host run on NVLink at symm's speed:

* all-reduce of ``n`` elements (``L`` divides ``n``): ``local`` reduce-scatter into shards of
  ``n / L``, ``cross`` all-reduce of the shard, ``local`` all-gather of the shards;
* reduce-scatter of ``G = H * L`` blocks: the blocks are reordered so that local rank ``l``
  receives, reduced over its host, the blocks of ranks ``(h', l)`` for every host ``h'``;
  ``cross`` reduce-scatter then leaves block ``(h, l)``, reduced over every rank;
* all-gather: ``cross`` all-gather of the blocks of ranks ``(h', l)``, ``local`` all-gather of
  those, then the blocks reordered from ``[L, H]`` to ``[H, L]``.

Integer sums are the flat result exactly; floating sums round in another order (within the
dtype's tolerance of it). ``op`` is symm's name (``sum``, ``prod``, ``min``, ``max``).
"""

from __future__ import annotations

from typing import Any


def all_reduce(local: Any, cross: Any, t: Any, op: str) -> None:
    """``t`` (contiguous, ``local.size`` divides its elements) reduced over the group."""
    flat = t.view(-1)
    shard = flat.new_empty(flat.numel() // local.size)
    local.reduce_scatter(shard, flat, op)
    cross.all_reduce(shard, op)
    local.all_gather(flat, shard)


def reduce_scatter(local: Any, cross: Any, out: Any, inp: Any, op: str) -> None:
    """Block ``g`` of the reduction of every rank's ``inp`` (``H * L`` blocks) into ``out``."""
    n, hosts, ranks = out.numel(), cross.size, local.size
    blocks = inp.reshape(hosts, ranks, n).transpose(0, 1).contiguous()
    part = out.new_empty(hosts * n)
    local.reduce_scatter(part, blocks.view(-1), op)
    cross.reduce_scatter(out.view(-1), part, op)


def all_gather(local: Any, cross: Any, out: Any, inp: Any) -> None:
    """Every rank's ``inp``, rank by rank, into ``out`` (``H * L`` blocks)."""
    n, hosts, ranks = inp.numel(), cross.size, local.size
    column = inp.new_empty(hosts * n)
    cross.all_gather(column, inp.reshape(-1))
    gathered = inp.new_empty(ranks * hosts * n)
    local.all_gather(gathered, column)
    out.view(hosts, ranks, n).copy_(gathered.view(ranks, hosts, n).transpose(0, 1))

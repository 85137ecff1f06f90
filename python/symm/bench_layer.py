"""``python -m symm.bench --layer``: a tensor-parallel Llama-70B decoder layer's forward with
each all-reduce beside the others, where users run it.

Run under torchrun, one process per GPU (``world`` must divide the 8 key/value heads)::

    torchrun --nproc-per-node N -m symm.bench --layer --out DIR

Every rank builds the layer of :mod:`symm.layer` (hidden 8192, 64 query and 8 key/value heads
of 128, MLP 28672, bf16, seeded random weights) and keeps its shard. A forward of T tokens runs
T tokens at positions 0..T-1 with causal attention and no KV cache: T = 1, 8, 32, 128 are decode
shapes, 512 a prefill (``--layer-tokens``). The two all-reduces of a forward (after o_proj and
after down_proj, each ``T x 8192`` bf16 on a plain tensor) run through one backend at a time:

* ``none``: no communication (the output is wrong; the floor the others are measured against);
* ``nccl``: ``dist.all_reduce`` on an NCCL group (when every rank has a GPU of its own);
* ``torch_symm``: torch SymmetricMemory, the tensor copied into a symmetric buffer, reduced
  there with ``one_shot_all_reduce`` or ``two_shot_all_reduce_`` (whichever is faster at that
  size and mode, as a torch user would pick; ``variant`` says which) and copied back;
* ``symm``: :func:`symm.all_reduce` on the plain tensor, in place (used where it lies by the
  low-latency algorithms, staged by the others);
* ``symm_pool``: the same, the forward's tensors allocated from :func:`symm.mem_pool` (eager
  under ``torch.cuda.use_mem_pool``, the graph captured with ``pool=`` the pool's id): every
  all-reduce runs on its tensor where it lies;
* ``symm_fused``: ``symm_pool`` with the first all-reduce, the residual add and the
  post-attention RMSNorm in one kernel (:func:`symm.fused_all_reduce_rmsnorm`).

Each runs eager (``--iters`` forwards after ``--warmup``) and as a CUDA graph of
``--graph-calls`` forwards replayed ``--iters / 2`` times; a time is the slowest rank's CUDA-event
mean per forward. ``added_us`` is a backend's time less ``none``'s: what the two all-reduces
add. Every output (eager, and the graph's after a replay) is checked against the unsharded
layer on the same GPU (:func:`symm.layer.compare`); a mismatch is ``wrong`` and makes the exit
status 1, as does a symm cell that fails (a peer that fails is left out with a note). Rank 0
writes ``bench-layer-wN.json`` and ``bench-layer-wN.md`` into ``--out``.
"""

from __future__ import annotations

import os

# NVLink multicast off before torch (and NCCL) load.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse
import time
from typing import Any, Callable, Optional

from . import _gpu
from ._timing import graph_run, write_report
from .layer import LLAMA_70B, Layer, LayerShape, compare, make_weights, reference

#: Token counts timed by default: decode at 1..128, prefill at 512.
TOKENS = (1, 8, 32, 128, 512)
#: The backends, in the order they run and print.
BACKENDS = ("none", "nccl", "torch_symm", "symm", "symm_pool", "symm_fused")
#: symm's backends, each compared with the best peer.
MINE = ("symm", "symm_pool", "symm_fused")
#: The peers symm's added time is compared against.
PEERS = ("nccl", "torch_symm")


def parse_tokens(s: str) -> list[int]:
    """``--layer-tokens``: a comma list of distinct token counts, each in 1..65536."""
    try:
        out = [int(x) for x in s.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a comma list of token counts") from None
    if not out or any(not 1 <= t <= 65536 for t in out) or len(set(out)) != len(out):
        raise argparse.ArgumentTypeError(
            f"{s!r}: token counts must be distinct and in 1..65536")
    return out


def parse_shape(s: str) -> LayerShape:
    """``--layer-shape``: ``hidden,heads,kv_heads,intermediate``."""
    try:
        h, q, kv, f = (int(x) for x in s.split(","))
        shape = LayerShape(hidden=h, heads=q, kv_heads=kv, intermediate=f)
        shape.check()
    except ValueError as e:
        raise argparse.ArgumentTypeError(
            f"{s!r} is not hidden,heads,kv_heads,intermediate: {e}") from None
    return shape


class _TorchSymm:
    """torch SymmetricMemory's all-reduce of a plain tensor: copy in, reduce, copy back. Two
    buffers alternate, so a forward's two all-reduces never share one.
    """

    def __init__(self, torch: Any, bufs: list[Any], group: str, one_shot: bool) -> None:
        self.ops, self.bufs, self.group, self.one_shot = torch.ops.symm_mem, bufs, group, one_shot
        self.i = 0

    def __call__(self, t: Any) -> None:
        flat = t.view(-1)
        b = self.bufs[self.i][: flat.numel()]
        self.i ^= 1
        b.copy_(flat)
        if self.one_shot:
            flat.copy_(self.ops.one_shot_all_reduce(b, "sum", self.group))
        else:
            self.ops.two_shot_all_reduce_(b, "sum", self.group)
            flat.copy_(b)


def _eager(torch: Any, layer: Callable[[Any], Any], x: Any, iters: int,
           warmup: int) -> tuple[float, Any]:
    """Microseconds per eager forward: the fastest of three rounds of ``iters / 3`` forwards
    (an eager forward is bound by the host, whose jitter one round would keep).
    """
    out = layer(x)
    torch.cuda.synchronize()
    for _ in range(warmup):
        layer(x)
    torch.cuda.synchronize()
    per = max(1, iters // 3)
    best = float("inf")
    for _ in range(3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(per):
            layer(x)
        e.record()
        torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e) * 1000.0 / per)
    return best, out


def _backends(torch: Any, dist: Any, dev: Any, numel: int, own_gpus: bool,
              notes: dict[str, str]) -> dict[str, list[tuple[str, Callable[[Any], Any]]]]:
    """Each backend's candidates ``(variant, all_reduce)``; a backend that cannot run here is
    left out with a note.
    """
    out: dict[str, list[tuple[str, Callable[[Any], Any]]]] = {"none": [("", lambda t: None)]}
    if own_gpus:
        pg = dist.new_group(backend="nccl")
        out["nccl"] = [("", lambda t: dist.all_reduce(t, group=pg))]
    else:
        notes["nccl"] = "skipped: NCCL needs a GPU per rank"
    try:
        import torch.distributed._symmetric_memory as symm_mem

        name = dist.group.WORLD.group_name
        bufs = [symm_mem.empty(numel, dtype=torch.bfloat16, device=dev) for _ in range(2)]
        for b in bufs:
            symm_mem.rendezvous(b, name)
        out["torch_symm"] = [(v, _TorchSymm(torch, bufs, name, v == "one_shot"))
                             for v in ("one_shot", "two_shot")]
    except Exception as e:  # noqa: BLE001 - a peer that does not run here is noted
        notes["torch_symm"] = f"skipped: {e!r}"[:300]
    # Every rank runs the same cells: a backend missing on one rank is dropped on all.
    if _slowest(torch, dist, [0.0 if "torch_symm" in out else 1.0])[0]:
        notes.setdefault("torch_symm", "skipped: failed on another rank")
        out.pop("torch_symm", None)
    out["symm"] = [("", lambda t: _gpu.all_reduce(t))]
    out["symm_pool"] = [("", lambda t: _gpu.all_reduce(t))]
    out["symm_fused"] = [("", lambda t: _gpu.all_reduce(t))]
    return out


def _fused(o: Any, x: Any, weight: Any, eps: float) -> tuple[Any, Any]:
    """The layer's fused step with symm: the output over ``o``, a new residual."""
    from ._fused import fused_all_reduce_rmsnorm

    return fused_all_reduce_rmsnorm(o, x, weight, eps, out=o, residual_out=x.new_empty(x.shape))


class _Pooled:
    """A forward whose tensors torch allocates from ``pool``."""

    def __init__(self, torch: Any, layer: Layer, pool: Any) -> None:
        self.use, self.layer, self.pool = torch.cuda.use_mem_pool, layer, pool

    def __call__(self, x: Any) -> Any:
        with self.use(self.pool):
            return self.layer(x)


def _slowest(torch: Any, dist: Any, vals: list[float]) -> list[float]:
    """Each value's maximum over ranks (the gloo group)."""
    t = torch.tensor(vals, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [float(v) for v in t]


def run(a: argparse.Namespace) -> int:
    """Run the layer benchmark (see the module doc) with ``python -m symm.bench``'s arguments;
    returns the exit status.
    """
    import torch
    import torch.distributed as dist

    start = time.perf_counter()
    # A process group or job the caller made is left as it was at the end.
    own_group, own_job = not dist.is_initialized(), not _gpu.is_initialized()
    if own_group:
        dist.init_process_group("gloo")
    _gpu.init(heap_bytes=1 << 30, plans=a.plans)
    rank, world, dev = _gpu.rank(), _gpu.world_size(), _gpu.device()
    shape: LayerShape = a.layer_shape
    try:
        shape.check(world)
    except ValueError as e:
        if rank == 0:
            print(f"symm.bench --layer: {e}")
        _leave(dist, own_group, own_job)
        return 2
    tokens = a.layer_tokens
    iters, replays = a.iters, max(2, a.iters // 2)
    notes: dict[str, str] = {}

    # Full weights once per rank, the references, then only this rank's shard is kept.
    weights = make_weights(shape, seed=0, device=dev)
    g = torch.Generator(device=dev)
    g.manual_seed(1)
    xs = torch.randn(max(tokens), shape.hidden, generator=g, device=dev, dtype=torch.bfloat16)
    refs = {t: reference(weights, shape, xs[:t]) for t in tokens}
    layer = Layer(shape, weights, rank, world, max_tokens=max(tokens))
    del weights
    torch.cuda.empty_cache()
    backends = _backends(torch, dist, dev, max(tokens) * shape.hidden,
                         torch.cuda.device_count() >= world, notes)
    pool = _gpu.mem_pool()
    pooled = _Pooled(torch, layer, pool)
    forward: dict[str, Callable[[Any], Any]] = {"symm_pool": pooled, "symm_fused": pooled}
    graph_pool = {"symm_pool": pool.id, "symm_fused": pool.id}

    def cell(name: str, variant: str, t: int, mode: str) -> str:
        return f"{name}{':' + variant if variant else ''}@{t}/{mode}"

    samples: list[dict[str, Any]] = []
    failed = 0  # symm cells that did not run on every rank
    # Every backend's forward once before anything is timed (cuBLAS, the plans, the clocks), so
    # the first backend timed pays no warm-up the others skip.
    for name in BACKENDS:
        for _, fn in backends.get(name, []):
            layer.all_reduce = fn
            layer.fused = _fused if name == "symm_fused" else None
            try:
                for t in tokens:
                    forward.get(name, layer)(xs[:t])
                torch.cuda.synchronize()
            except Exception:  # noqa: BLE001 - the timed run reports the failure
                pass
    for t in tokens:
        x = xs[:t]
        for mode in ("eager", "graph"):
            base: Optional[float] = None
            for name in BACKENDS:
                best: Optional[dict[str, Any]] = None
                for variant, fn in backends.get(name, []):
                    layer.all_reduce = fn
                    layer.fused = _fused if name == "symm_fused" else None
                    fwd = forward.get(name, layer)
                    ok = 1.0
                    try:
                        if mode == "eager":
                            us, out = _eager(torch, fwd, x, iters, a.warmup)
                        else:
                            # Captured into the pool, the forward allocates there already
                            # (entering the pool again inside the capture is refused).
                            fwd(x)
                            us, out = graph_run(torch, lambda x=x: layer(x), a.graph_calls,
                                                replays, graph_pool.get(name),
                                                together=dist.barrier)
                        wrong, rel = (0, 0.0) if name == "none" else compare(out, refs[t])
                        del out
                        torch.cuda.synchronize()
                    except Exception as e:  # noqa: BLE001 - the cell is dropped with a note
                        notes[cell(name, variant, t, mode)] = repr(e)[:300]
                        ok, us, wrong, rel = 0.0, 0.0, 0, 0.0
                    # A cell counts only where every rank ran it.
                    neg_ok, us, wrong_f, rel = _slowest(torch, dist, [-ok, us, wrong, rel])
                    if neg_ok != -1.0:
                        notes.setdefault(cell(name, variant, t, mode), "failed on another rank")
                        failed += name in MINE
                        continue
                    smp = {"tokens": t, "mode": mode, "backend": name, "us": round(us, 3),
                           "added_us": None, "wrong": None if name == "none" else int(wrong_f),
                           "rel_err": None if name == "none" else float(f"{rel:.3g}")}
                    if variant:
                        smp["variant"] = variant
                    if best is None or us < best["us"]:
                        best = smp
                if best is None:
                    continue
                if name == "none":
                    base = best["us"]
                if base is not None:
                    best["added_us"] = round(best["us"] - base, 3)
                samples.append(best)
    layer.all_reduce, layer.fused = None, None
    torch.cuda.synchronize()

    model = "llama-70b" if shape == LLAMA_70B else "custom"
    doc = {"world": world, "dtype": "bf16", "model": model,
           "shape": {"hidden": shape.hidden, "heads": shape.heads, "kv_heads": shape.kv_heads,
                     "head_dim": shape.head_dim, "intermediate": shape.intermediate},
           "topology": _gpu._get().comm.topology, "plans": _gpu._get().comm.plans,
           "tokens": tokens, "iters": iters, "warmup": a.warmup, "graph_calls": a.graph_calls,
           "graph_replays": replays, "seconds": round(time.perf_counter() - start, 1),
           "samples": samples, "notes": notes}
    bad = failed > 0 or any(s["wrong"] for s in samples)
    if rank == 0:
        write_report(a.out, f"bench-layer-w{world}{a.tag}", doc, table(doc))
        for k, v in notes.items():
            print(f"note {k}: {v}")
        print(f"{doc['seconds']} s on rank 0, from joining the job to the table")
    _leave(dist, own_group, own_job)
    return 1 if bad else 0


def _leave(dist: Any, own_group: bool, own_job: bool) -> None:
    if own_job:
        _gpu.finalize()
    if own_group:
        dist.destroy_process_group()


def table(doc: dict[str, Any]) -> str:
    """The markdown table of a ``bench-layer-wN.json`` document: per (tokens, mode) each
    backend's us per forward with the time its all-reduces add, and each symm backend's added
    time over the best peer's (below 1: symm adds less).
    """
    s = doc["shape"]
    lines = [
        f"Decoder layer (hidden {s['hidden']}, {s['heads']}/{s['kv_heads']} heads of "
        f"{s['head_dim']}, MLP {s['intermediate']}, bf16), tensor-parallel over "
        f"{doc['world']} GPUs ({doc['topology']}, {doc['plans']} plans): us per forward, in "
        "parentheses what the two all-reduces add over `none`.",
        "",
        "| tokens | mode | " + " | ".join(BACKENDS) + " | "
        + " | ".join(f"{m} / best peer (added)" for m in MINE) + " |",
        "|---" * (len(BACKENDS) + 2 + len(MINE)) + "|",
    ]
    rows: dict[tuple[int, str], dict[str, dict[str, Any]]] = {}
    for smp in doc["samples"]:
        rows.setdefault((smp["tokens"], smp["mode"]), {})[smp["backend"]] = smp
    for (t, mode), row in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        cells = []
        for b in BACKENDS:
            smp = row.get(b)
            if smp is None:
                cells.append("-")
                continue
            c = f"{smp['us']:.1f}"
            if smp["added_us"] is not None and b != "none":
                c += f" (+{smp['added_us']:.1f})" if smp["added_us"] >= 0 else \
                    f" ({smp['added_us']:.1f})"
            if smp.get("variant"):
                c += f" {smp['variant'].replace('_', '-')}"
            if smp["wrong"]:
                c += " **wrong**"
            cells.append(c)
        peers = [row[p]["added_us"] for p in PEERS
                 if p in row and row[p]["added_us"] is not None and not row[p]["wrong"]]
        ratios = []
        for m in MINE:
            mine = row.get(m, {}).get("added_us")
            ratio = "-"
            if peers and mine is not None and min(peers) > 0:
                ratio = f"{mine / min(peers):.2f}"
            ratios.append(ratio)
        lines.append(f"| {t} | {mode} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines) + "\n"

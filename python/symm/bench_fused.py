"""``python -m symm.bench --fused``: the fused all-reduce + residual add + RMSNorm beside the same
three steps done one after another, where a tensor-parallel layer runs them.

Run under torchrun, one process per GPU::

    torchrun --nproc-per-node N -m symm.bench --fused --out DIR

For T tokens (``--layer-tokens``, default 1, 8, 32, 128) of ``hidden`` bf16 elements (the
first number of ``--layer-shape``, default 8192), each rank holds its partial ``x``, the
residual and the norm's weight, all plain tensors, and runs one of:

* ``nccl``: ``dist.all_reduce(x)`` on an NCCL group, then ``h = residual + x`` and the RMSNorm
  in torch (what :mod:`symm.layer` does), when every rank has a GPU of its own;
* ``symm``: :func:`symm.all_reduce` then the same torch steps;
* ``symm_fused``: :func:`symm.fused_all_reduce_rmsnorm`, one kernel.

Each is timed eager (the median of five rounds of ``--iters`` calls) and as a CUDA graph of
``--graph-calls`` calls replayed ``--iters / 2`` times: microseconds per call, the slowest
rank's. The fused output is checked
against the host reference bit for bit (``symm._symm.norm_reference``) and the unfused one
against it within bf16 tolerance. Rank 0 writes ``bench-fused-wN.json`` and ``.md`` into
``--out``; the exit status is 1 when a check fails.
"""

from __future__ import annotations

import os

# NVLink multicast off before torch (and NCCL) load.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse
import time
from typing import Any, Callable

from . import _fused, _gpu, _symm
from ._timing import eager_median, graph_run, write_report
from .layer import _rms_norm

#: Token counts timed by default.
TOKENS = (1, 8, 32, 128)
#: The ways, in the order they run and print.
WAYS = ("nccl", "symm", "symm_fused")
EPS = 1e-5


class _Case:
    """One size's tensors: this rank's partial (restored before every call), the residual,
    the weight, and the fused op's outputs.
    """

    def __init__(self, torch: Any, mine: Any, res: Any, w: Any) -> None:
        self.mine, self.res, self.w = mine, res, w
        self.x = mine.clone()
        self.out, self.h = torch.empty_like(mine), torch.empty_like(mine)

    def unfused(self, ar: Callable[[Any], Any]) -> Callable[[], Any]:
        def step() -> Any:
            self.x.copy_(self.mine)
            ar(self.x)
            return _rms_norm(self.res + self.x, self.w, EPS)
        return step

    def fused(self) -> Any:
        self.x.copy_(self.mine)
        _fused.fused_all_reduce_rmsnorm(self.x, self.res, self.w, EPS, out=self.out,
                                        residual_out=self.h)
        return self.out


def table(doc: dict[str, Any]) -> str:
    """The markdown table of a ``bench-fused-wN.json`` document."""
    lines = [
        f"All-reduce + residual add + RMSNorm of T x {doc['hidden']} bf16 over {doc['world']} "
        "GPUs: us per call (the slowest rank's).",
        "",
        "| tokens | mode | " + " | ".join(WAYS)
        + " | symm / symm_fused | best unfused / symm_fused |",
        "|---" * (len(WAYS) + 4) + "|",
    ]
    rows: dict[tuple[int, str], dict[str, float]] = {}
    for s in doc["samples"]:
        rows.setdefault((s["tokens"], s["mode"]), {})[s["way"]] = s["us"]
    for (t, mode), r in sorted(rows.items()):
        cells = [f"{r[w]:.2f}" if w in r else "-" for w in WAYS]
        f = r.get("symm_fused")
        ratio = f"{r['symm'] / f:.2f}" if f and "symm" in r else "-"
        unfused = [r[w] for w in ("nccl", "symm") if w in r]
        best = f"{min(unfused) / f:.2f}" if f and unfused else "-"
        lines.append(f"| {t} | {mode} | " + " | ".join(cells) + f" | {ratio} | {best} |")
    return "\n".join(lines) + "\n"


def run(a: argparse.Namespace) -> int:
    """Run the fused-op benchmark (see the module doc); returns the exit status."""
    import torch
    import torch.distributed as dist

    start = time.perf_counter()
    own_group, own_job = not dist.is_initialized(), not _gpu.is_initialized()
    if own_group:
        dist.init_process_group("gloo")
    _gpu.init(heap_bytes=1 << 30, plans=a.plans)
    rank, world, dev = _gpu.rank(), _gpu.world_size(), _gpu.device()
    hidden = a.layer_shape.hidden
    ways: dict[str, Callable[[Any], Any]] = {"symm": _gpu.all_reduce}
    if torch.cuda.device_count() >= world:
        pg = dist.new_group(backend="nccl")
        ways["nccl"] = lambda t: dist.all_reduce(t, group=pg)
    samples: list[dict[str, Any]] = []
    bad = 0
    g = torch.Generator(device=dev)
    for t in a.layer_tokens:
        xs = []
        for r in range(world):
            g.manual_seed(r * 1009 + t)
            xs.append(torch.randn(t, hidden, generator=g, device=dev).to(torch.bfloat16))
        g.manual_seed(7 + t)
        res = torch.randn(t, hidden, generator=g, device=dev).to(torch.bfloat16)
        w = (torch.rand(hidden, generator=g, device=dev) + 0.5).to(torch.bfloat16)
        raw = lambda v: v.contiguous().view(torch.int16).cpu().numpy().tobytes()  # noqa: E731
        want_h, want_o = _symm.norm_reference([raw(v) for v in xs], raw(res), raw(w), EPS)
        want = torch.frombuffer(bytearray(want_o), dtype=torch.bfloat16).to(dev).view(t, hidden)
        c = _Case(torch, xs[rank], res, w)
        steps = {name: c.unfused(ar) for name, ar in ways.items()}
        steps["symm_fused"] = c.fused
        for mode in ("eager", "graph"):
            for name in WAYS:
                if name not in steps:
                    continue
                fn = steps[name]
                if mode == "eager":
                    us = eager_median(torch, fn, a.iters, 1)
                    got = fn()
                else:
                    us, got = graph_run(torch, fn, a.graph_calls, max(2, a.iters // 2),
                                        together=dist.barrier)
                torch.cuda.synchronize()
                if name == "symm_fused":
                    wrong = int((got.view(torch.int16) != want.view(torch.int16)).sum().item())
                else:
                    d = (got.float() - want.float()).abs()
                    wrong = int((d > 0.02 + 0.02 * want.float().abs()).sum().item())
                vals = torch.tensor([us, float(wrong)], dtype=torch.float64)
                dist.all_reduce(vals, op=dist.ReduceOp.MAX)
                us, wrong = float(vals[0]), int(vals[1])
                bad += wrong > 0
                samples.append({"tokens": t, "mode": mode, "way": name, "us": round(us, 3),
                                "wrong": wrong})
    doc = {"world": world, "hidden": hidden, "dtype": "bf16", "tokens": a.layer_tokens,
           "iters": a.iters, "graph_calls": a.graph_calls,
           "seconds": round(time.perf_counter() - start, 1), "samples": samples}
    if rank == 0:
        write_report(a.out, f"bench-fused-w{world}{a.tag}", doc, table(doc))
        print(f"{doc['seconds']} s on rank 0; {bad} cells wrong")
    if own_job:
        _gpu.finalize()
    if own_group:
        dist.destroy_process_group()
    return 1 if bad else 0

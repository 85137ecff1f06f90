"""``python -m symm.bench``: symm's all-reduce from PyTorch beside its peers, in one run.

Run under torchrun (every rank runs it)::

    torchrun --nproc-per-node N -m symm.bench --out bench-py

For each size it times, with CUDA events on the current stream, eager and inside one CUDA graph
of ``--graph-calls`` calls:

* ``symm``: :func:`symm.all_reduce` on a symmetric bf16 tensor (in place);
* ``torch_one_shot`` / ``torch_two_shot``: torch SymmetricMemory's ``one_shot_all_reduce`` and
  ``two_shot_all_reduce_`` (where torch's symmetric memory runs here);
* ``nccl``: ``dist.all_reduce`` with NCCL, only when every rank has a GPU of its own
  (``nccl_pinned`` when ``NCCL_ALGO``, ``NCCL_PROTO`` or ``NCCL_MIN/MAX_NCHANNELS`` pin it, as
  deterministic serving does; NCCL reads them once per process, so pinning is a second run);
* ``symm_deterministic``: :func:`symm.all_reduce` with ``deterministic=True`` (unless the job
  is deterministic already), its cost over the fastest other choice printed per size.

It also measures the Python layer's cost: host microseconds per :func:`symm.all_reduce` call
against the same enqueue made from a Rust loop in the same process (``host_loop_us``), both
beside the floor under them, a bare launch of an empty kernel with the same grid and parameter
block size (``launch_floor_us``). It writes ``bench-py-wN.json`` in the Rust bench's format
(``samples`` of collective, size, system, mode, us, algbw, busbw, wrong) plus
``python_overhead`` (``rust_us``, ``python_us``, ``extra_us``, ``checks_us``,
``rust_one_call_us``: the same Rust enqueue timed inside, one call per turn of a Python loop,
``python_own_us``: the Python call's time above that, ``python_framed_us``: the same call
behind a Python function's frame, as ``symm.all_reduce`` was before the extension served it
itself, and where the
floor was measured ``floor_us``, ``rust_above_floor_us``, ``python_above_floor_us``, and the
same Rust loop into a second symmetric buffer, with no staging: ``rust_out_of_place_us``,
``rust_out_of_place_above_floor_us``), and
rank 0 prints a table of times and ratios.

With ``--layer`` it instead times a tensor-parallel Llama-70B decoder layer's forward with each
all-reduce (no communication, NCCL, torch SymmetricMemory, symm): see :mod:`symm.bench_layer`.
"""

from __future__ import annotations

import os

# NVLink multicast off before torch (and NCCL) load.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
from typing import Any, Callable, Optional  # noqa: E402

from . import _alltoall, _gpu, bench_fused, bench_layer  # noqa: E402
from ._timing import eager_median as _time_eager  # noqa: E402
from ._timing import graph_run  # noqa: E402
from .layer import LLAMA_70B  # noqa: E402


def _time_graph(torch: Any, fn: Callable[[], Any], calls: int, replays: int) -> float:
    """Microseconds per call of ``fn`` captured ``calls`` times in a CUDA graph and replayed
    ``replays`` times, the ranks meeting at a barrier just before the timed replays (else a
    rank that reaches them late adds its delay to every other rank's time, as the layer and
    fused benches already avoid).
    """
    dist = torch.distributed
    together = dist.barrier if dist.is_available() and dist.is_initialized() else None
    return graph_run(torch, fn, calls, replays, together=together)[0]


def _pin_thread() -> Optional[set[int]]:
    """Pins the calling thread to one CPU of those it may use, a different one per local rank
    (counted from the last); returns the CPUs to restore, or None where it cannot pin.
    """
    try:
        cpus = sorted(os.sched_getaffinity(0))
        local = _gpu._env_int("LOCAL_RANK", 0)
        os.sched_setaffinity(0, {cpus[-1 - local % len(cpus)]})
        return set(cpus)
    except (AttributeError, OSError, ValueError):
        return None


#: The variables that pin NCCL to one algorithm and channel count.
NCCL_PINNING = ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS")


def _sample(system: str, mode: str, size: int, us: float, world: int,
            wrong: Optional[int] = None, what: str = "") -> dict[str, Any]:
    algbw = size / us / 1e3 if us > 0 else 0.0
    return {"collective": "all_reduce", "size": size, "system": system, "mode": mode,
            "us": round(us, 3), "algbw": round(algbw, 3),
            "busbw": round(algbw * 2 * (world - 1) / world, 3), "wrong": wrong, "what": what}


def _call(coll: str, big: Any, n: int, world: int,
          algorithm: Optional[str]) -> Optional[Callable[[], Any]]:
    """One symm call of ``coll`` over ``n`` bf16 elements on slices of ``big``.

    Sizes count as nccl-tests counts them; None when ``n`` does not split into the world's
    blocks.
    """
    blocked = coll in ("all_gather", "reduce_scatter", "all_to_all")
    if blocked and n % world:
        return None
    part = n // world

    def run() -> Any:
        if coll == "all_reduce":
            return _gpu.all_reduce(big[:n], algorithm=algorithm)
        if coll == "broadcast":
            return _gpu.broadcast(big[:n], 0, algorithm=algorithm)
        if coll == "all_gather":
            return _gpu.all_gather_into_tensor(big[:n], big[n: n + part], algorithm=algorithm)
        if coll == "reduce_scatter":
            return _gpu.reduce_scatter_tensor(big[n: n + part], big[:n], algorithm=algorithm)
        if coll == "all_to_all":
            return _alltoall.all_to_all_single(big[n: 2 * n], big[:n], algorithm=algorithm)
        raise SystemExit(f"unknown collective {coll}")

    return run


def _sweep(torch: Any, a: Any, sizes: list[int], world: int, big: Any) -> list[dict[str, Any]]:
    """Times each of ``--collectives`` with each of ``--algorithms`` at every size.

    symm only, sizes as nccl-tests count them, eager and in a graph; an algorithm that does not
    serve a collective or size is skipped.
    """
    out: list[dict[str, Any]] = []
    names = [c for c in a.collectives.split(",") if c]
    algos = [x for x in a.algorithms.split(",") if x]
    for coll in names:
        for alg in algos:
            for size in sizes:
                fn = _call(coll, big, size // 2, world, None if alg == "auto" else alg)
                if fn is None:
                    continue
                try:
                    fn()
                    _gpu.synchronize()
                except Exception:  # noqa: BLE001 - an algorithm that does not serve this
                    _gpu.reset()
                    continue
                iters = a.iters if size <= (1 << 20) else max(5, a.iters // 5)
                for mode, us in (
                    ("eager", _time_eager(torch, fn, iters, a.warmup)),
                    ("graph", _time_graph(torch, fn, a.graph_calls, max(2, iters // 4))),
                ):
                    smp = _sample(f"symm:{alg}", mode, size, us, world)
                    smp["collective"] = coll
                    out.append(smp)
    return out


def main(argv: Optional[list[str]] = None) -> int:
    """Run the benchmark (see the module doc); returns the exit status."""
    ap = argparse.ArgumentParser(prog="python -m symm.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--min-bytes", type=int, default=4096)
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--factor", type=int, default=4)
    ap.add_argument("--iters", type=int, default=None, help="default 50; 40 with --layer")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--graph-calls", type=int, default=None, help="default 10; 5 with --layer")
    ap.add_argument("--overhead-calls", type=int, default=200)
    ap.add_argument("--out", default=".")
    ap.add_argument("--plans", choices=["auto", "interpreted", "compiled"], default=None,
                    help="the kernel that runs symm's plans (default: SYMM_PLANS, else auto)")
    ap.add_argument("--tag", default="", help="appended to the JSON file's name")
    ap.add_argument("--collectives", default="",
                    help="also time these collectives (comma list of all_reduce, all_gather, "
                         "reduce_scatter, all_to_all, broadcast) for each --algorithms entry, "
                         "symm only")
    ap.add_argument("--algorithms", default="auto",
                    help="comma list of symm algorithm names for --collectives; auto: symm's pick")
    ap.add_argument("--layer", action="store_true",
                    help="time a tensor-parallel Llama-70B decoder layer with each all-reduce "
                         "instead (symm.bench_layer)")
    ap.add_argument("--fused", action="store_true",
                    help="time the fused all-reduce + residual add + RMSNorm beside the "
                         "unfused steps instead (symm.bench_fused)")
    ap.add_argument("--layer-tokens", type=bench_layer.parse_tokens, default=None,
                    help="with --layer: comma list of token counts per forward "
                         "(default 1,8,32,128,512; with --fused 1,8,32,128)")
    ap.add_argument("--layer-shape", type=bench_layer.parse_shape, default=LLAMA_70B,
                    help="with --layer: hidden,heads,kv_heads,intermediate "
                         "(default 8192,64,8,28672)")
    a = ap.parse_args(argv)
    if a.fused:
        a.layer_tokens = list(bench_fused.TOKENS) if a.layer_tokens is None else a.layer_tokens
        a.iters = 40 if a.iters is None else a.iters
        a.graph_calls = 10 if a.graph_calls is None else a.graph_calls
        if a.iters < 1 or a.graph_calls < 1:
            ap.error("need iters >= 1, graph-calls >= 1")
        return bench_fused.run(a)
    if a.layer_tokens is None:
        a.layer_tokens = list(bench_layer.TOKENS)
    if a.layer:
        a.iters = 40 if a.iters is None else a.iters
        a.graph_calls = 5 if a.graph_calls is None else a.graph_calls
        if a.iters < 1 or a.warmup < 0 or a.graph_calls < 1:
            ap.error("need iters >= 1, warmup >= 0, graph-calls >= 1")
        return bench_layer.run(a)
    a.iters = 50 if a.iters is None else a.iters
    a.graph_calls = 10 if a.graph_calls is None else a.graph_calls
    known = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"}
    unknown = [c for c in a.collectives.split(",") if c and c not in known]
    if unknown:
        ap.error(f"unknown collectives {unknown}: choose from {sorted(known)}")
    if a.min_bytes < 2 or a.max_bytes < a.min_bytes or a.factor < 2 or a.iters < 1:
        ap.error("need 2 <= min-bytes <= max-bytes, factor >= 2, iters >= 1")

    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo")
    # `big` holds max-bytes elements (2 x max-bytes bytes); collectives on it take scratch and
    # workspaces of up to max-bytes more each.
    _gpu.init(heap_bytes=max(1 << 30, 6 * a.max_bytes), plans=a.plans)
    plans = _gpu._get().comm.plans
    det_job = _gpu.is_deterministic()
    rank, world = _gpu.rank(), _gpu.world_size()
    dev = _gpu.device()
    own_gpus = torch.cuda.device_count() >= world
    sizes = []
    n = a.min_bytes
    while n <= a.max_bytes:
        sizes.append(n)
        n *= a.factor
    samples: list[dict[str, Any]] = []
    notes: dict[str, str] = {}

    big = _gpu.zeros(a.max_bytes, dtype=torch.bfloat16)
    for size in sizes:
        t = big[: size // 2]
        t.fill_(1)
        _gpu.all_reduce(t)
        _gpu.synchronize()
        wrong = int((t != world).sum().item())
        t.zero_()
        iters = a.iters if size <= (1 << 20) else max(5, a.iters // 5)
        us = _time_eager(torch, lambda t=t: _gpu.all_reduce(t), iters, a.warmup)
        samples.append(_sample("symm", "eager", size, us, world, wrong))
        us = _time_graph(torch, lambda t=t: _gpu.all_reduce(t), a.graph_calls, max(2, iters // 4))
        samples.append(_sample("symm", "graph", size, us, world))
        if not det_job:
            # Deterministic mode beside the default, on the same tensor.
            t.fill_(1)
            _gpu.all_reduce(t, deterministic=True)
            _gpu.synchronize()
            wrong = int((t != world).sum().item())
            t.zero_()
            fn = lambda t=t: _gpu.all_reduce(t, deterministic=True)  # noqa: E731
            us = _time_eager(torch, fn, iters, a.warmup)
            samples.append(_sample("symm_deterministic", "eager", size, us, world, wrong))
            us = _time_graph(torch, fn, a.graph_calls, max(2, iters // 4))
            samples.append(_sample("symm_deterministic", "graph", size, us, world))
    _gpu.synchronize()
    samples += _sweep(torch, a, sizes, world, big)

    group = dist.group.WORLD
    try:
        import torch.distributed._symmetric_memory as symm_mem

        name = group.group_name
        tbuf = symm_mem.empty(a.max_bytes // 2, dtype=torch.bfloat16, device=dev)
        symm_mem.rendezvous(tbuf, name)
        ops = torch.ops.symm_mem
        for size in sizes:
            t = tbuf[: size // 2]
            t.zero_()
            iters = a.iters if size <= (1 << 20) else max(5, a.iters // 5)
            for system, fn in (
                ("torch_one_shot", lambda t=t: ops.one_shot_all_reduce(t, "sum", name)),
                ("torch_two_shot", lambda t=t: ops.two_shot_all_reduce_(t, "sum", name)),
            ):
                try:
                    us = _time_eager(torch, fn, iters, a.warmup)
                    samples.append(_sample(system, "eager", size, us, world))
                    us = _time_graph(torch, fn, a.graph_calls, max(2, iters // 4))
                    samples.append(_sample(system, "graph", size, us, world))
                except Exception as e:  # noqa: BLE001 - a peer that does not run here is noted
                    notes[f"{system}@{size}"] = repr(e)[:200]
    except Exception as e:  # noqa: BLE001
        notes["torch_symm_mem"] = repr(e)[:200]
    torch.cuda.synchronize()

    if own_gpus:
        pg = dist.new_group(backend="nccl")
        # NCCL pinned to one algorithm and channel count, as deterministic serving runs it, is
        # reported as its own system (the variables are read once per process: run it again).
        pinned = {k: os.environ[k] for k in NCCL_PINNING if k in os.environ}
        nccl = "nccl_pinned" if pinned else "nccl"
        if pinned:
            notes["nccl_pinned"] = ", ".join(f"{k}={v}" for k, v in sorted(pinned.items()))
        for size in sizes:
            x = torch.zeros(size // 2, dtype=torch.bfloat16, device=dev)
            iters = a.iters if size <= (1 << 20) else max(5, a.iters // 5)
            us = _time_eager(torch, lambda x=x: dist.all_reduce(x, group=pg), iters, a.warmup)
            samples.append(_sample(nccl, "eager", size, us, world))
    else:
        notes["nccl"] = "skipped: NCCL needs a GPU per rank"

    # The Python layer's cost: host time per enqueue, Python call against a Rust loop, both
    # against the floor under them (a bare launch of an empty kernel with the same grid).
    t = big[:2048]
    j = _gpu._get()
    comm = j.comm
    stream = j.current_stream()
    p = t.data_ptr()
    calls = a.overhead_calls
    req = _gpu._request(j, "all_reduce", 4096, "bf16", "sum", None, None)
    rust_us, py_us, floor_us, apart_us, one_us, frame_us = [], [], [], [], [], []

    def framed(t, op="sum", *, stream=None, algorithm=None, channels=None, deterministic=False):
        # The same one step behind a Python function's frame and argument checks: how
        # symm.all_reduce was called before the extension served it itself.
        if stream is None and op == "sum" and algorithm is None and channels is None \
                and deterministic is False and j.sum(t):
            return t
        return _gpu._all_reduce(t, op, stream=stream, algorithm=algorithm, channels=channels,
                                deterministic=deterministic)

    # In place (on the tensor itself where the request runs in place, `Request::runs_in_place`;
    # else the output staged through the workspace), and into a second symmetric buffer.
    q = big[2048:4096].data_ptr()
    loop = comm.host_loop_us
    # Host times move with the scheduler: this thread stays on one CPU while they are taken,
    # and each figure is the best of many rounds, every variant measured in every round.
    restore = _pin_thread()
    for _ in range(15):
        torch.cuda.synchronize()
        rust_us.append(loop(req, p, 4096, p, 4096, stream, calls))
        torch.cuda.synchronize()
        apart_us.append(loop(req, p, 4096, q, 4096, stream, calls))
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            _gpu.all_reduce(t)
        py_us.append((time.perf_counter() - t0) * 1e6 / calls)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            framed(t)
        frame_us.append((time.perf_counter() - t0) * 1e6 / calls)
        torch.cuda.synchronize()
        # The same enqueue one call per turn of a Python loop, timed inside Rust: what it costs
        # when other code runs between calls, as it does under any caller but a tight loop.
        one = 0.0
        for _ in range(calls):
            one += loop(req, p, 4096, p, 4096, stream, 1)
        one_us.append(one / calls)
        torch.cuda.synchronize()
        try:
            floor_us.append(comm.launch_floor_us(req, stream, calls))
        except Exception as e:  # noqa: BLE001 - no floor where the empty kernel does not build
            notes["launch_floor"] = repr(e)[:200]
        torch.cuda.synchronize()
    if restore is not None:
        os.sched_setaffinity(0, restore)
    _gpu.synchronize()
    # What the Python side's argument handling alone costs (all_reduce's hot path, no enqueue).
    t0 = time.perf_counter()
    for _ in range(calls):
        _ = type(t) is j.tensor, t.is_contiguous(), t.nbytes, t.dtype, t.data_ptr(), \
            j.current_stream()
    checks_us = (time.perf_counter() - t0) * 1e6 / calls
    rust, py, one = min(rust_us), min(py_us), min(one_us)
    overhead = {"calls": calls, "python_us": round(py, 3), "checks_us": round(checks_us, 3),
                "rust_us": round(rust, 3), "extra_us": round(py - rust, 3),
                "rust_one_call_us": round(one, 3), "python_own_us": round(py - one, 3),
                "python_framed_us": round(min(frame_us), 3)}
    if floor_us:
        floor = min(floor_us)
        overhead.update({"floor_us": round(floor, 3),
                         "rust_out_of_place_us": round(min(apart_us), 3),
                         "rust_out_of_place_above_floor_us": round(min(apart_us) - floor, 3),
                         "rust_above_floor_us": round(rust - floor, 3),
                         "python_above_floor_us": round(py - floor, 3)})

    doc = {"world": world, "dtype": "bf16", "redop": "sum", "topology": comm.topology,
           "plans": plans,
           "samples": samples, "python_overhead": overhead, "notes": notes}
    os.makedirs(a.out, exist_ok=True)
    if rank == 0:
        with open(os.path.join(a.out, f"bench-py-w{world}{a.tag}.json"), "w") as f:
            json.dump(doc, f, indent=1)
        _print_table(doc)
    _gpu.finalize()
    dist.destroy_process_group()
    return 0


def _print_sweep(doc: dict[str, Any]) -> None:
    by: dict[tuple[str, int, str], dict[str, float]] = {}
    algos: list[str] = []
    for s in doc["samples"]:
        if not s["system"].startswith("symm:"):
            continue
        alg = s["system"][5:]
        if alg not in algos:
            algos.append(alg)
        by.setdefault((s["collective"], s["size"], s["mode"]), {})[alg] = s["us"]
    if not by:
        return
    print(f"symm by algorithm, world {doc['world']}, {doc['plans']} plans: us per call "
          f"(ratio: algorithm / {algos[0]})")
    print(f"{'collective':>15} {'bytes':>9} {'mode':>6} " + " ".join(f"{x:>18}" for x in algos))
    for (coll, size, mode), row in sorted(by.items()):
        base = row.get(algos[0])
        cells = []
        for x in algos:
            v = row.get(x)
            if v is None:
                cells.append(f"{'-':>18}")
            elif x == algos[0] or not base:
                cells.append(f"{v:>18.2f}")
            else:
                cells.append(f"{v:>11.2f} ({v / base:4.2f})")
        print(f"{coll:>15} {size:>9} {mode:>6} " + " ".join(cells))


def _print_table(doc: dict[str, Any]) -> None:
    _print_sweep(doc)
    by: dict[tuple[int, str], dict[str, float]] = {}
    for s in doc["samples"]:
        if s["collective"] != "all_reduce" or s["system"].startswith("symm:"):
            continue
        by.setdefault((s["size"], s["mode"]), {})[s["system"]] = s["us"]
    systems = ["symm", "torch_one_shot", "torch_two_shot", "nccl", "nccl_pinned",
               "symm_deterministic"]
    systems = [x for x in systems if any(x in row for row in by.values())]
    print(f"all_reduce bf16, world {doc['world']}, {doc['topology']}, {doc['plans']} plans: "
          "us per call "
          "(ratio: peer / symm, > 1 means symm is faster)")
    print(f"{'bytes':>10} {'mode':>6} " + " ".join(f"{s:>16}" for s in systems))
    for (size, mode), row in sorted(by.items()):
        base = row.get("symm")
        cells = []
        for s in systems:
            v = row.get(s)
            if v is None:
                cells.append(f"{'-':>16}")
            elif s == "symm" or not base:
                cells.append(f"{v:>16.2f}")
            else:
                cells.append(f"{v:>9.2f} ({v / base:4.2f})")
        print(f"{size:>10} {mode:>6} " + " ".join(cells))
    _print_deterministic(by)
    o = doc["python_overhead"]
    floor = (f"bare launch {o['floor_us']} us (the floor), " if "floor_us" in o else "")
    above = (f", {o['rust_above_floor_us']} us above the floor" if "floor_us" in o else "")
    print(f"host time per cached 4 KiB symm.all_reduce call: {floor}"
          f"Rust {o['rust_us']} us{above}, Python {o['python_us']} us (in place)")
    if "rust_out_of_place_us" in o:
        print(f"the same call into a second symmetric buffer: Rust "
              f"{o['rust_out_of_place_us']} us, {o['rust_out_of_place_above_floor_us']} us above "
              "the floor")
    print(f"python layer: {o['extra_us']} us extra per eager call over the Rust loop; the "
          f"enqueue itself takes {o['rust_one_call_us']} us when called once per turn of a "
          f"Python loop, so Python's own work is {o['python_own_us']} us "
          f"({o['checks_us']} us of it the argument handling); 0 in a graph (replays run no "
          "Python)")
    if "python_framed_us" in o:
        print(f"the same call behind a Python function's frame (the former symm.all_reduce): "
              f"{o['python_framed_us']} us")
    for k, v in doc["notes"].items():
        print(f"note {k}: {v}")


def _print_deterministic(by: dict[tuple[int, str], dict[str, float]]) -> None:
    """Deterministic mode's cost: its time over the fastest other choice of symm and its peers,
    and NCCL pinned's time over it, per size and mode.
    """
    rows = [(k, r) for k, r in sorted(by.items()) if "symm_deterministic" in r]
    if not rows:
        return
    print("deterministic mode: symm_deterministic / fastest of the others (goal <= 1.15), "
          "nccl_pinned / symm_deterministic (> 1: symm faster)")
    for (size, mode), row in rows:
        det = row["symm_deterministic"]
        others = [v for s, v in row.items() if s != "symm_deterministic"]
        best = min(others) if others else None
        cost = f"{det / best:5.2f}" if best else "    -"
        pin = row.get("nccl_pinned")
        vs = f"{pin / det:5.2f}" if pin and det else "    -"
        print(f"{size:>10} {mode:>6} {det:>9.2f} us  cost {cost}  pinned NCCL {vs}")


if __name__ == "__main__":
    raise SystemExit(main())

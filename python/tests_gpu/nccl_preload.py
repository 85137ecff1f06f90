"""Unmodified torch code on NCCL with ``libsymm_nccl.so`` preloaded: the shim's default mode,
one process per GPU:

    LD_PRELOAD=LIB torchrun --nproc-per-node N python/tests_gpu/nccl_preload.py [TAG]

torch's NCCL backend makes its communicators through the shim, which serves the collectives
it can on symm and hands the rest (here the point-to-point calls) to the real library. Every
collective torch's backend makes for ``all_reduce``, ``all_gather_into_tensor``,
``reduce_scatter_tensor``, ``broadcast`` and ``reduce`` is compared exactly (small integers)
on every rank, eagerly and replayed from a CUDA graph, then a send and a receive; the shim's
counters (``symmNcclCounts``) say which path ran how many calls, and a graph captures a
shape never run before (NCCL's call) and one run before (symm's). Last, the bf16 all-reduce is
timed at a few sizes, eager and in a graph. Prints one line per rank, and on rank 0 the times
under ``TAG`` (run it again with ``SYMM_NCCL_SHIM=off`` for the same times on NCCL alone).
Exits non-zero on any difference, or when the shim is not loaded or served nothing while on.
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import ctypes  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from symm._timing import eager_median, graph_run  # noqa: E402


def counts(lib):
    served, forwarded = ctypes.c_uint64(), ctypes.c_uint64()
    if lib.symmNcclCounts(ctypes.byref(served), ctypes.byref(forwarded)) != 0:
        raise RuntimeError("symmNcclCounts failed")
    return served.value, forwarded.value


def inputs(r, n, dtype, salt=0):
    i = torch.arange(n, device="cuda", dtype=torch.int64)
    return ((i * 7 + r * 3 + salt) % 5 + 1).to(dtype)


def check(w, r):
    """Every collective against its expected values; returns how many were compared."""
    checked = 0

    def same(name, got, want):
        nonlocal checked
        torch.cuda.synchronize()
        if not torch.equal(got, want):
            raise AssertionError(f"{name}: {got.flatten()[:6].tolist()} against "
                                 f"{want.flatten()[:6].tolist()}")
        checked += 1

    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        for n in (1, 1000, 1 << 16):
            every = [inputs(q, n, dtype) for q in range(w)]
            t = every[r].clone()
            dist.all_reduce(t)
            same(f"all_reduce {dtype} {n}", t, sum(x.to(torch.float64) for x in every).to(dtype))
            t = every[r].clone()
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            same(f"all_reduce max {dtype} {n}", t, torch.stack(every).max(0).values)
            out = torch.empty(w * n, device="cuda", dtype=dtype)
            dist.all_gather_into_tensor(out, every[r])
            same(f"all_gather {dtype} {n}", out, torch.cat(every))
            big = [inputs(q, w * n, dtype, 1) for q in range(w)]
            out = torch.empty(n, device="cuda", dtype=dtype)
            dist.reduce_scatter_tensor(out, big[r])
            total = sum(x.to(torch.float64) for x in big).to(dtype)
            same(f"reduce_scatter {dtype} {n}", out, total[r * n:(r + 1) * n])
            root = n % w
            t = every[r].clone()
            dist.broadcast(t, root)
            same(f"broadcast {dtype} {n}", t, every[root])
            t = every[r].clone()
            dist.reduce(t, root)
            if r == root:
                same(f"reduce {dtype} {n}", t, sum(x.to(torch.float64) for x in every).to(dtype))
    # Graphs of torch's NCCL calls, each replayed twice: one of a shape never run before (its
    # first use needs the host, so the shim hands that call to NCCL to capture), one of a
    # shape run eagerly first (captured on symm).
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dist.all_reduce(torch.ones(8, device="cuda"))
    torch.cuda.current_stream().wait_stream(s)
    for n, warm in ((4096, False), (8192, True)):
        every = [inputs(q, n, torch.bfloat16, 2) for q in range(w)]
        want = sum(x.float() for x in every).to(torch.bfloat16)
        t = every[r].clone()
        if warm:
            dist.all_reduce(t)
            same(f"before the graph of {n}", t, want)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dist.all_reduce(t)
        for k in range(2):
            t.copy_(every[r])
            g.replay()
            same(f"graph of {n}, replay {k}", t, want)
    # Point to point: forwarded to the real library.
    x = inputs(r, 1000, torch.float32)
    if r % 2 == 0 and r + 1 < w:
        dist.send(x, r + 1)
    elif r % 2 == 1:
        y = torch.empty_like(x)
        dist.recv(y, r - 1)
        same("recv", y, inputs(r - 1, 1000, torch.float32))
    return checked


def timings(torch, r):
    rows = []
    for size in (4 << 10, 64 << 10, 1 << 20, 16 << 20):
        t = torch.zeros(size // 2, dtype=torch.bfloat16, device="cuda")
        iters = 50 if size <= (1 << 20) else 10
        eager = eager_median(torch, lambda t=t: dist.all_reduce(t), iters, 5)
        graph = graph_run(torch, lambda t=t: dist.all_reduce(t), 10, max(2, iters // 4))[0]
        rows.append((size, eager, graph))
    return rows


def main():
    tag = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("SYMM_NCCL_SHIM", "on")
    try:
        lib = ctypes.CDLL(None)
        lib.symmNcclCounts.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    except AttributeError:
        raise SystemExit("libsymm_nccl.so is not loaded: run under LD_PRELOAD=...") from None
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    w, r = dist.get_world_size(), dist.get_rank()
    checked = check(w, r)
    served, forwarded = counts(lib)
    rows = timings(torch, r)
    on = os.environ.get("SYMM_NCCL_SHIM", "on") == "on"
    ok = served > 0 if on else served == 0
    print(f"rank {r}: world {w}, SYMM_NCCL_SHIM={tag}: {checked} results exact; collectives "
          f"served by symm {served}, forwarded to NCCL {forwarded}; {'ok' if ok else 'FAIL'}",
          flush=True)
    if r == 0:
        for size, eager, graph in rows:
            print(f"time {tag} w{w} all_reduce bf16 {size} B: eager {eager:.2f} us, graph "
                  f"{graph:.2f} us", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

"""PyTorch beside symm in `cargo xtask hw bench`: all-reduce (bf16, sum) through NCCL
(torch.distributed) and through SymmetricMemory one-shot and two-shot, eager and in a CUDA
graph, at the sizes given (bytes, comma separated). Prints one tab-separated SAMPLE line per
measurement on rank 0: kind, size, system, mode, microseconds (slowest rank), wrong (not
checked: 2^64-1), label. Started by `torch.distributed.run`; multicast stays off."""
import os
import sys

# Set, never defaulted: a caller's NCCL_NVLS_ENABLE=1 must not reach NCCL.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
import torch
import torch.distributed as dist

UNCHECKED = 2**64 - 1
TARGET_US = 20000.0

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
local = int(os.environ.get("LOCAL_RANK", rank))
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
dist.init_process_group("nccl", device_id=dev)
group = dist.group.WORLD.group_name
sizes = [int(s) for s in sys.argv[1].split(",")]


def slowest(us):
    t = torch.tensor([us], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def eager(fn, n):
    fn()
    torch.cuda.synchronize()
    dist.barrier()
    s = torch.cuda.Event(enable_timing=True)
    e = torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record()
    torch.cuda.synchronize()
    return slowest(s.elapsed_time(e) * 1000.0 / n)


def graphed(fn, n):
    k = max(1, min(n, 50))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(k):
            fn()
    reps = max(2, (n + k - 1) // k)
    g.replay()
    torch.cuda.synchronize()
    dist.barrier()
    s = torch.cuda.Event(enable_timing=True)
    e = torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(reps):
        g.replay()
    e.record()
    torch.cuda.synchronize()
    return slowest(s.elapsed_time(e) * 1000.0 / (reps * k))


def measure(system, size, fn):
    try:
        n = int(min(1000, max(5, TARGET_US / max(1.0, eager(fn, 3)))))
        us = eager(fn, n)
        emit(size, system, "eager", us)
    except Exception as ex:  # a system that cannot run a size is reported, not fatal
        if rank == 0:
            print(f"# {system} {size} eager: {repr(ex)[:160]}", flush=True)
        return
    try:
        emit(size, system, "graph", graphed(fn, n))
    except Exception as ex:
        if rank == 0:
            print(f"# {system} {size} graph: {repr(ex)[:160]}", flush=True)


def emit(size, system, mode, us):
    if rank == 0:
        print(f"SAMPLE\tall_reduce\t{size}\t{system}\t{mode}\t{us:.3f}\t{UNCHECKED}\t{system}", flush=True)


for size in sizes:
    x = torch.ones(size // 2, dtype=torch.bfloat16, device=dev)
    measure("torch-nccl", size, lambda: dist.all_reduce(x))
    del x

try:
    import torch.distributed._symmetric_memory as symm_mem

    if hasattr(symm_mem, "enable_symm_mem_for_group"):
        symm_mem.enable_symm_mem_for_group(group)
    most = max(sizes)
    buf = symm_mem.empty(most // 2, dtype=torch.bfloat16, device=dev)
    symm_mem.rendezvous(buf, group)
    for size in sizes:
        t = buf[: size // 2]
        t.fill_(1)
        measure("torch-one-shot", size, lambda: torch.ops.symm_mem.one_shot_all_reduce(t, "sum", group))
        measure("torch-two-shot", size, lambda: torch.ops.symm_mem.two_shot_all_reduce_(t, "sum", group))
except Exception as ex:
    if rank == 0:
        print(f"# SymmetricMemory: {repr(ex)[:300]}", flush=True)

dist.barrier()
dist.destroy_process_group()

"""MoE dispatch + combine: symm.moe beside PyTorch in one job, started by torch.distributed.run.

    torchrun --nproc-per-node N bench/py/moe_bench.py [tokens,...]

For each token count (default 4096 and 128; 128 also in symm's low-latency mode), tokens of
7168 bf16, top-8 over 8 experts per rank, uniform routing, the same inputs for every system:

* symm: ``Buffer.dispatch`` then ``Buffer.combine`` (the expert is the identity), counts on the
  device, eager and replayed in a CUDA graph;
* NCCL with host-synchronised counts, the usual PyTorch MoE layer: per-rank token counts on the
  device, an all_to_all_single of the counts, ``.tolist()`` (the host waits), the tokens sorted by
  destination rank and exchanged with all_to_all_single, then back and summed with their weights
  (``index_add_``);
* ``torch.ops.symm_mem.all_to_all_vdev`` (counts on the device) for the token exchange there and
  back, where the torch build has NVSHMEM; otherwise the reason it is missing is printed.

Prints one tab-separated line per measurement on rank 0: tokens, system, mode, then the median,
the fastest and the slowest of ``MOE_BENCH_REPEATS`` (default 5) timings in microseconds, each
the slowest rank's mean over the timed iterations. Multicast stays off.
"""
import os
import sys

# Set, never defaulted: a caller's NCCL_NVLS_ENABLE=1 must not reach NCCL.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import symm  # noqa: E402
import symm.moe  # noqa: E402

HIDDEN = 7168
TOPK = 8
PER_RANK = 8
ITERS = 50
WARMUP = 5
try:
    REPEATS = int(os.environ.get("MOE_BENCH_REPEATS", "5"))
except ValueError:
    raise SystemExit(f"MOE_BENCH_REPEATS={os.environ['MOE_BENCH_REPEATS']!r}: a count") from None
if not 1 <= REPEATS <= 100:
    raise SystemExit(f"MOE_BENCH_REPEATS={REPEATS}: between 1 and 100")

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
local = int(os.environ.get("LOCAL_RANK", rank))
torch.cuda.set_device(local)
dev = torch.device("cuda", local)
dist.init_process_group("nccl", device_id=dev)
symm.init(heap_bytes=6 << 30, timeout=30.0)
experts = PER_RANK * world


def slowest(us):
    t = torch.tensor([us], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def timed(fn, iters=ITERS):
    for _ in range(WARMUP):
        fn()
    torch.cuda.synchronize()
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return slowest(start.elapsed_time(end) * 1000.0 / iters)


def repeated(fn):
    """``REPEATS`` timings of ``fn``, each after its own warm-up."""
    return sorted(timed(fn) for _ in range(REPEATS))


def report(tokens, system, mode, runs):
    if rank == 0:
        med = runs[len(runs) // 2]
        print(f"{tokens}\t{system}\t{mode}\t{med:.1f}\t{runs[0]:.1f}\t{runs[-1]:.1f}", flush=True)


def inputs(tokens):
    g = torch.Generator(device="cpu").manual_seed(1234 + rank)
    x = (torch.randint(-64, 64, (tokens, HIDDEN), generator=g) / 64).to(torch.bfloat16).to(dev)
    idx = torch.stack([torch.randperm(experts, generator=g)[:TOPK] for _ in range(tokens)])
    w = torch.rand((tokens, TOPK), generator=g).to(dev)
    return x, idx.to(dev), w


def symm_layer(tokens, x, idx, w):
    buf = symm.moe.Buffer(experts, TOPK, tokens, HIDDEN, rows_max=2 * tokens * TOPK)
    modes = ["normal"] + (["low_latency"] if tokens <= symm.moe.LL_MAX_TOKENS else [])
    for mode in modes:
        def step(mode=mode):
            expert_x, _spans, h = buf.dispatch(x, idx, w, mode=mode)
            buf.combine(expert_x, h)

        report(tokens, "symm", f"{mode} eager", repeated(step))
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        report(tokens, "symm", f"{mode} graph", repeated(graph.replay))
        del graph
    invalid, dropped = buf.status()
    if invalid or dropped:
        raise SystemExit(f"rank {rank}: {invalid} invalid, {dropped} dropped")


def routes(idx):
    """Per token and rank: whether the token goes there, its weight sum there."""
    owner = idx // PER_RANK
    mask = torch.zeros((idx.shape[0], world), dtype=torch.bool, device=dev)
    mask.scatter_(1, owner, True)
    return mask, owner


def nccl_layer(tokens, x, idx, w):
    mask, owner = routes(idx)
    wsum = torch.zeros((tokens, world), device=dev).scatter_add_(1, owner, w)

    def step():
        q, t = mask.t().nonzero(as_tuple=True)  # pairs sorted by destination, then token
        send = x.index_select(0, t)
        counts = mask.sum(0)
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts)
        sc, rc = counts.tolist(), recv_counts.tolist()  # the host waits here
        recv = torch.empty((sum(rc), HIDDEN), dtype=x.dtype, device=dev)
        dist.all_to_all_single(recv, send, rc, sc)
        back = torch.empty_like(send)
        dist.all_to_all_single(back, recv, sc, rc)
        out = torch.zeros((tokens, HIDDEN), dtype=torch.float32, device=dev)
        out.index_add_(0, t, back.float() * wsum[t, q].unsqueeze(1))
        return out.to(x.dtype)

    report(tokens, "nccl host-synced counts", "eager", repeated(step))


def vdev_layer(tokens, x, idx, w):
    try:
        import torch.distributed._symmetric_memory as symm_mem
        op = torch.ops.symm_mem.all_to_all_vdev
        group = dist.group.WORLD.group_name
        symm_mem.set_backend("NVSHMEM")
        mask, _owner = routes(idx)
        rows = tokens * world
        inp = symm_mem.empty((rows, HIDDEN), dtype=x.dtype, device=dev)
        out = symm_mem.empty((rows, HIDDEN), dtype=x.dtype, device=dev)
        back = symm_mem.empty((rows, HIDDEN), dtype=x.dtype, device=dev)
        # (input splits, then output splits and offsets) for the way there and back.
        sent = symm_mem.empty((world,), dtype=torch.int64, device=dev)
        got = symm_mem.empty((2, world), dtype=torch.int64, device=dev)
        sent2 = symm_mem.empty((world,), dtype=torch.int64, device=dev)
        got2 = symm_mem.empty((2, world), dtype=torch.int64, device=dev)
        for t in (inp, out, back, sent, got, sent2, got2):
            symm_mem.rendezvous(t, group)
    except Exception as e:  # noqa: BLE001 - the reason is the result
        report(tokens, "torch all_to_all_vdev", f"unavailable: {type(e).__name__}: {e}"[:200], [0.0])
        return

    # Pairs sorted by destination with static shapes (no host wait): a pair's key is
    # q * tokens + t, pairs that do not exist sort last and are not sent.
    keys = torch.arange(rows, device=dev).view(world, tokens)
    absent = torch.full_like(keys, 2 * rows)

    def step():
        order = torch.where(mask.t(), keys, absent).flatten().sort().values % tokens
        inp.copy_(x.index_select(0, order))
        sent.copy_(mask.sum(0))
        op(inp, out, sent, got, group)
        sent2.copy_(got[0])
        op(out, back, sent2, got2, group)

    report(tokens, "torch all_to_all_vdev (exchange only)", "eager", repeated(step))


if rank == 0:
    print("tokens\tsystem\tmode\tmedian_us\tmin_us\tmax_us", flush=True)
for tokens in [int(v) for v in (sys.argv[1].split(",") if len(sys.argv) > 1 else ["128", "4096"])]:
    x, idx, w = inputs(tokens)
    symm_layer(tokens, x, idx, w)
    nccl_layer(tokens, x, idx, w)
    vdev_layer(tokens, x, idx, w)

symm.finalize()
dist.destroy_process_group()

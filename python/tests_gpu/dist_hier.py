"""The hierarchical collectives of the backend beside flat NCCL, one process per GPU:

    SYMM_DIST_HOST_SIZE=2 torchrun --nproc-per-node 4 python/tests_gpu/dist_hier.py
    torchrun --nproc-per-node 4 python/tests_gpu/dist_hier.py nccl

With ``SYMM_DIST_HOST_SIZE=2`` the backend treats a 4-GPU machine as two hosts of two ranks:
an all-reduce is symm's reduce-scatter inside each host, NCCL's all-reduce of each shard
between the hosts, then symm's all-gather inside each host; reduce-scatter and all-gather
take the same shape. Each collective is compared exactly (sums of small integers in f32) on
every rank, then timed eagerly (the median of five rounds, CUDA events) at a few sizes. Prints
the times on rank 0 and the paths that served the calls; exits non-zero on a difference.
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import sys  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import symm.distributed  # noqa: E402
from symm._timing import eager_median  # noqa: E402

SIZES = (64 << 10, 1 << 20, 16 << 20)


def inputs(r, n, salt=0):
    i = torch.arange(n, device="cuda", dtype=torch.int64)
    return ((i * 7 + r * 3 + salt) % 5 + 1).to(torch.float32)


def main():
    backend = sys.argv[1] if len(sys.argv) > 1 else "cuda:symm,cpu:gloo"
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group(backend, device_id=torch.device("cuda", local))
    w, r = dist.get_world_size(), dist.get_rank()
    ok = True
    rows = []
    for size in SIZES:
        n = size // 4
        every = [inputs(q, n) for q in range(w)]
        total = sum(every)
        t = every[r].clone()
        dist.all_reduce(t)
        ok = ok and torch.equal(t, total)
        out = torch.empty(n // w, device="cuda")
        dist.reduce_scatter_tensor(out, every[r])
        ok = ok and torch.equal(out, total[r * (n // w):(r + 1) * (n // w)])
        part = every[r][: n // w].contiguous()
        full = torch.empty(n, device="cuda")
        dist.all_gather_into_tensor(full, part)
        ok = ok and torch.equal(full, torch.cat([x[: n // w] for x in every]))
        iters = 50 if size <= (1 << 20) else 10
        times = (
            eager_median(torch, lambda t=t: dist.all_reduce(t), iters, 5),
            eager_median(torch, lambda o=out, x=every[r]: dist.reduce_scatter_tensor(o, x),
                         iters, 5),
            eager_median(torch, lambda f=full, x=part: dist.all_gather_into_tensor(f, x),
                         iters, 5),
        )
        rows.append((size, times))
    paths = symm.distributed.paths() if "symm" in backend else {}
    host = os.environ.get("SYMM_DIST_HOST_SIZE", "-")
    print(f"rank {r}: world {w}, {backend}, SYMM_DIST_HOST_SIZE={host}: results "
          f"{'exact' if ok else 'WRONG'}; paths {paths}", flush=True)
    if r == 0:
        for size, (ar, rs, ag) in rows:
            print(f"time {backend} host_size={host} {size} B f32: all_reduce {ar:.2f} us, "
                  f"reduce_scatter {rs:.2f} us, all_gather {ag:.2f} us", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

"""One rank of a CPU job of the symm torch.distributed backend (run by test_distributed.py):

    python dist_worker.py SCENARIO RANK WORLD STORE_FILE

Prints one JSON line of results on success; exits non-zero with the error otherwise.
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import json  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.distributed import _functional_collectives as fc  # noqa: E402

import symm  # noqa: E402, F401 - registers the backend
import symm.distributed as sd  # noqa: E402
from symm.distributed import _hier, _local  # noqa: E402


def init(rank, world, path, backend="cuda:symm,cpu:gloo"):
    store = dist.FileStore(path, world)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=60))


def cpu(rank, world, path):
    """torch.distributed's semantics for CPU tensors through the backend (gloo serves)."""
    init(rank, world, path)
    out = {"backend": dist.get_backend(), "name": dist.group.WORLD.name()}
    t = torch.arange(6, dtype=torch.int64) + rank
    dist.all_reduce(t)
    out["all_reduce"] = t.tolist()
    w = dist.all_reduce(t, op=dist.ReduceOp.MAX, async_op=True)
    out["async_done"] = w.wait() is True and w.is_completed()
    out["max"] = t.tolist()
    g = torch.empty(3 * world, dtype=torch.float32)
    dist.all_gather_into_tensor(g, torch.full((3,), float(rank)))
    out["all_gather_into_tensor"] = g.tolist()
    parts = [torch.empty(2, dtype=torch.int32) for _ in range(world)]
    dist.all_gather(parts, torch.tensor([rank, -rank], dtype=torch.int32))
    out["all_gather"] = [p.tolist() for p in parts]
    b = torch.tensor([rank * 10.0])
    dist.broadcast(b, src=world - 1)
    out["broadcast"] = b.tolist()
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    out["objects"] = objs
    out["functional"] = fc.all_reduce(torch.ones(2) * (rank + 1), "sum",
                                      dist.group.WORLD).tolist()
    # The coalesced forms (DTensor's and FSDP's path), which gloo's binding lacks.
    ag = fc.all_gather_into_tensor_coalesced(
        [torch.full((2,), float(rank)), torch.full((1,), -1.0 - rank)], dist.group.WORLD)
    out["ag_coalesced"] = [p.tolist() for p in ag]
    rs = fc.reduce_scatter_tensor_coalesced(
        [torch.ones(world * 2), torch.arange(world, dtype=torch.float32)], "sum",
        [0, 0], dist.group.WORLD)
    out["rs_coalesced"] = [p.tolist() for p in rs]
    if rank == 0:
        dist.send(torch.tensor([42]), dst=1)
    elif rank == 1:
        r = torch.zeros(1, dtype=torch.int64)
        dist.recv(r, src=0)
        out["recv"] = r.tolist()
    sub = dist.new_group([0, 1])
    if rank < 2:
        s = torch.tensor([rank + 1.0])
        dist.all_reduce(s, group=sub)
        out["sub"] = s.tolist()
        out["sub_paths"] = sd.paths(sub)
    dist.barrier()
    out["paths"] = sd.paths()
    dist.destroy_process_group()
    return out


def errors(rank, world, path):
    """A call no path serves is a DistBackendError naming it; the job goes on after it."""
    init(rank, world, path)
    out = {}
    try:
        dist.all_reduce(torch.empty(2, device="meta"))
    except dist.DistBackendError as e:
        out["meta"] = str(e)
    t = torch.ones(2)
    dist.all_reduce(t)
    out["after"] = t.tolist()
    dist.destroy_process_group()
    return out


def bad_option(rank, world, path):
    """A bad SYMM_DIST_* variable fails init_process_group with a DistBackendError."""
    try:
        init(rank, world, path)
    except dist.DistBackendError as e:
        return {"error": str(e)}
    return {"error": None}


def hier(rank, world, path):
    """The hierarchical collectives over gloo stand-ins for symm (inside each "host" of two
    ranks) and NCCL (between them), against flat gloo.
    """
    init(rank, world, path, backend="gloo")
    per = 2
    hosts = world // per
    h, lrank = divmod(rank, per)
    locals_ = [dist.new_group([k * per + i for i in range(per)]) for k in range(hosts)]
    crosses = [dist.new_group([k * per + i for k in range(hosts)]) for i in range(per)]
    local = _local.TorchLocal(locals_[h], lrank, per)
    cross = _local.TorchLocal(crosses[lrank], h, hosts)
    out = {}
    for dtype in (torch.int64, torch.float32):
        gen = torch.Generator().manual_seed(rank)
        x = torch.randint(-1000, 1000, (8 * per,), generator=gen).to(dtype)
        if dtype.is_floating_point:
            x = x / 7
        flat = x.clone()
        dist.all_reduce(flat)
        hx = x.clone()
        _hier.all_reduce(local, cross, hx, "sum")
        mx = x.clone()
        _hier.all_reduce(local, cross, mx, "max")
        fmx = x.clone()
        dist.all_reduce(fmx, op=dist.ReduceOp.MAX)
        big = torch.cat([x + k for k in range(world)])
        rs_flat = torch.empty_like(x)
        dist.reduce_scatter_tensor(rs_flat, big.clone())
        rs = torch.empty_like(x)
        _hier.reduce_scatter(local, cross, rs, big.clone(), "sum")
        ag_flat = torch.empty(world * x.numel(), dtype=dtype)
        dist.all_gather_into_tensor(ag_flat, x)
        ag = torch.empty_like(ag_flat)
        _hier.all_gather(local, cross, ag, x)
        name = str(dtype).rpartition(".")[2]
        if dtype.is_floating_point:
            out[name] = [torch.allclose(hx, flat, rtol=1e-6, atol=1e-4),
                         torch.equal(mx, fmx),
                         torch.allclose(rs, rs_flat, rtol=1e-6, atol=1e-4),
                         torch.equal(ag, ag_flat)]
        else:
            out[name] = [torch.equal(hx, flat), torch.equal(mx, fmx), torch.equal(rs, rs_flat),
                         torch.equal(ag, ag_flat)]
    dist.destroy_process_group()
    return out


if __name__ == "__main__":
    scenario, rank, world, path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    result = globals()[scenario](rank, world, path)
    print(json.dumps(result))

"""The torch.distributed backend "symm" on the GPU, unmodified torch code on every rank:

    torchrun --nproc-per-node N python/tests_gpu/dist_backend.py

torch.distributed's semantics for the calls symm serves (shapes, dtypes, in place, async
handles, CUDA graphs), the functional collectives, sub-groups and DeviceMesh, DTensor tensor
parallelism and an FSDP2 training step, each against a reference computed on every rank
without communication. With ``SYMM_DIST_ENGINE=none`` (ranks sharing one GPU, where NCCL cannot
run) the calls only NCCL serves must fail with a DistBackendError naming why. With
``SYMM_DIST_HOST_SIZE=2`` on four GPUs (two "hosts"), the same checks run over the
hierarchical collectives and the NCCL engine. Prints one line per check on rank 0 and exits
non-zero when any fails.
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed import _functional_collectives as fc  # noqa: E402

import symm  # noqa: E402
import symm.distributed as sd  # noqa: E402

RESULTS = []


def check(name, ok, detail=""):
    RESULTS.append((name, bool(ok), detail))


def x_of(n, dtype, rank, salt=0):
    # Small integers: exact in every dtype and every sum over a few ranks.
    return ((torch.arange(n, device="cuda") + 3 * rank + salt) % 11).to(dtype)


def collectives(w, r):
    n = 4096
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32):
        xs = [x_of(n, torch.float64, q) for q in range(w)]
        stacked = torch.stack(xs)
        for op, want in ((dist.ReduceOp.SUM, sum(xs)), (dist.ReduceOp.MAX, stacked.max(0)[0]),
                         (dist.ReduceOp.MIN, stacked.min(0)[0])):
            t = x_of(n, dtype, r)
            ptr = t.data_ptr()
            dist.all_reduce(t, op=op)
            check(f"all_reduce {op} {dtype}", torch.equal(t, want.to(dtype)) and
                  t.data_ptr() == ptr)
        if dtype.is_floating_point:
            t = x_of(n, dtype, r) * w
            dist.all_reduce(t, op=dist.ReduceOp.AVG)
            check(f"all_reduce avg {dtype}", torch.equal(t, sum(xs).to(dtype)))
        out = torch.empty(n * w, dtype=dtype, device="cuda")
        dist.all_gather_into_tensor(out, x_of(n, dtype, r))
        check(f"all_gather_into_tensor {dtype}", torch.equal(out, torch.cat(xs).to(dtype)))
        big = [x_of(n * w, torch.float64, q) for q in range(w)]
        part = torch.empty(n, dtype=dtype, device="cuda")
        dist.reduce_scatter_tensor(part, x_of(n * w, dtype, r))
        check(f"reduce_scatter_tensor {dtype}",
              torch.equal(part, sum(big)[r * n:(r + 1) * n].to(dtype)))
        a = x_of(n * w, dtype, r)
        b = torch.empty_like(a)
        dist.all_to_all_single(b, a)
        want = torch.cat([x_of(n * w, dtype, q)[r * n:(r + 1) * n] for q in range(w)])
        check(f"all_to_all_single {dtype}", torch.equal(b, want))
        t = x_of(n, dtype, r)
        dist.broadcast(t, src=w - 1)
        check(f"broadcast {dtype}", torch.equal(t, x_of(n, dtype, w - 1)))
    # The list forms, reduce, and a sub-group.
    parts = [torch.empty(7, device="cuda") for _ in range(w)]
    dist.all_gather(parts, torch.full((7,), float(r), device="cuda"))
    check("all_gather (list)", all(torch.equal(p, torch.full((7,), float(q), device="cuda"))
                                   for q, p in enumerate(parts)))
    out = torch.empty(5, device="cuda")
    dist.reduce_scatter(out, [torch.full((5,), float(q + r), device="cuda") for q in range(w)])
    check("reduce_scatter (list)", torch.equal(out, torch.full((5,), float(
        sum(r + q for q in range(w))), device="cuda")))
    t = torch.full((9,), float(r + 1), device="cuda")
    dist.reduce(t, dst=1)
    check("reduce", torch.equal(t, torch.full((9,), float(r + 1 if r != 1 else
                                                         sum(range(1, w + 1))), device="cuda")))
    sub = dist.new_group([0, 1])
    if r < 2:
        t = torch.full((3,), float(r + 1), device="cuda")
        dist.all_reduce(t, group=sub)
        check("new_group all_reduce", torch.equal(t, torch.full((3,), 3.0, device="cuda")))
        check("new_group path", sd.paths(sub) == {"allreduce": {"symm": 1}}, sd.paths(sub))
    dist.barrier()


def asynchronous(w, r):
    # Issued on a side stream, waited for on the current one (as FSDP does).
    side = torch.cuda.Stream()
    t = x_of(1 << 20, torch.float32, r)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        work = dist.all_reduce(t, async_op=True)
    work.wait()
    want = sum(x_of(1 << 20, torch.float64, q) for q in range(w)).float()
    check("async all_reduce on a side stream, wait()", torch.equal(t, want))
    fut = dist.all_reduce(t, async_op=True).get_future()
    check("get_future value", torch.equal(fut.wait()[0], want * w))
    # Functional collectives (DTensor's path).
    x = x_of(1000, torch.float32, r)
    s = fc.all_reduce(x, "sum", dist.group.WORLD)
    check("functional all_reduce", torch.equal(s, sum(x_of(1000, torch.float64, q)
                                                      for q in range(w)).float()))
    g = fc.all_gather_tensor(x, 0, dist.group.WORLD)
    check("functional all_gather_tensor", torch.equal(g, torch.cat(
        [x_of(1000, torch.float32, q) for q in range(w)])))
    rs = fc.reduce_scatter_tensor(torch.cat([x] * w), "sum", 0, dist.group.WORLD)
    check("functional reduce_scatter_tensor", torch.equal(rs, s))


def graphs(w, r):
    t = torch.zeros(1 << 16, device="cuda")
    dist.all_reduce(t)  # warm up: the group joins its symm job before capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dist.all_reduce(t)
    for k in range(3):
        t.fill_(float(r + k))
        g.replay()
        torch.cuda.synchronize()
        check(f"CUDA graph replay {k}", torch.equal(t, torch.full_like(t, float(
            sum(q + k for q in range(w))))))


def tensor_parallel(w, r):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )
    mesh = init_device_mesh("cuda", (w,))
    x = torch.arange(64.0, device="cuda").reshape(8, 8)
    d = distribute_tensor(x, mesh, [Shard(0)])
    check("DTensor Shard(0) -> full_tensor", torch.equal(d.full_tensor(), x))
    check("DTensor redistribute Replicate", torch.equal(
        d.redistribute(mesh, [Replicate()]).to_local(), x))
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)).cuda()
    ref = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32)).cuda()
    ref.load_state_dict(mlp.state_dict())
    parallelize_module(mlp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    inp = torch.randn(4, 32, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    out = mlp(inp)
    want = ref(inp)
    check("TP MLP forward (ColwiseParallel/RowwiseParallel)",
          torch.allclose(out, want, rtol=1e-5, atol=1e-5), float((out - want).abs().max()))
    if w == 4:
        mesh2 = init_device_mesh("cuda", (2, 2), mesh_dim_names=("dp", "tp"))
        tp = mesh2["tp"].get_group()
        t = torch.full((4,), float(r), device="cuda")
        dist.all_reduce(t, group=tp)
        lo = r - r % 2
        check("DeviceMesh 2x2 tp all_reduce", torch.equal(t, torch.full(
            (4,), float(lo + lo + 1), device="cuda")))


def fsdp(w, r):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).cuda()
    ref = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).cuda()
    ref.load_state_dict(model.state_dict())
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    gen = torch.Generator("cuda").manual_seed(7)
    data = torch.randn(w, 8, 16, device="cuda", generator=gen)
    loss = model(data[r]).square().mean()
    loss.backward()
    ref_loss = sum(ref(data[q]).square().mean() for q in range(w)) / w
    ref_loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total, op=dist.ReduceOp.AVG)
    check("FSDP2 loss", torch.allclose(total, ref_loss, rtol=1e-5, atol=1e-6))
    worst = 0.0
    for p, q in zip(model.parameters(), ref.parameters()):
        full = p.grad.full_tensor()
        worst = max(worst, float((full - q.grad).abs().max()))
    check("FSDP2 gradients", worst < 1e-5, worst)


def errors(w, r):
    if os.environ.get("SYMM_DIST_ENGINE") != "none":
        return
    try:
        if r == 0:
            dist.send(torch.ones(1, device="cuda"), dst=1)
        elif r == 1:
            dist.recv(torch.ones(1, device="cuda"), src=0)
        ok = r > 1
    except dist.DistBackendError as e:
        ok = "send" in str(e) or "recv" in str(e)
    check("send without an engine: DistBackendError", ok)
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.bool, device="cuda"))
        ok = False
    except dist.DistBackendError as e:
        ok = "bool" in str(e)
    check("bool all_reduce without an engine: DistBackendError", ok)
    t = torch.ones(3, device="cuda")
    dist.all_reduce(t)
    check("the job goes on after refused calls", torch.equal(t, torch.full_like(t, float(w))))


def main():
    local = int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()
    torch.cuda.set_device(local)
    # device_id binds the group to the GPU, as torchtitan and others pass it.
    dist.init_process_group("cuda:symm,cpu:gloo", device_id=torch.device("cuda", local))
    w, r = dist.get_world_size(), dist.get_rank()
    t0 = time.time()
    for step in (collectives, asynchronous, graphs, tensor_parallel, fsdp, errors):
        try:
            step(w, r)
        except Exception as e:  # a failing step is reported, the others still run
            check(f"{step.__name__} raised", False, f"{type(e).__name__}: {e}"[:300])
    torch.cuda.synchronize()
    paths = sd.paths()
    host = int(os.environ.get("SYMM_DIST_HOST_SIZE", "0") or 0)
    if 0 < host < w:
        # Two or more "hosts": the default group joins a symm job of its own over this host's
        # ranks (it joins symm.init's job only when it lies on one host); all-reduces take the
        # hierarchical path, and what spans hosts otherwise goes to NCCL.
        check("default group's symm job is its host's, not the process's",
              not symm.is_initialized())
        check("all-reduces took the hierarchical path",
              paths.get("allreduce", {}).get("hier", 0) > 0, paths)
    else:
        check("default group joined symm's job",
              symm.is_initialized() and symm.world_size() == w)
        check("no call went to the engine", all("nccl" not in v for v in paths.values()),
              paths)
    dist.barrier()
    bad = [x for x in RESULTS if not x[1]]
    if r == 0 or bad:
        for name, ok, detail in RESULTS:
            if r == 0 or not ok:
                print(f"rank {r} {'ok  ' if ok else 'FAIL'} {name} {detail}", flush=True)
        print(f"rank {r}: world {w}: {len(RESULTS) - len(bad)}/{len(RESULTS)} passed in "
              f"{time.time() - t0:.1f} s; paths {paths}", flush=True)
    dist.destroy_process_group()
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

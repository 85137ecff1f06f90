"""The NCCL API of ``libsymm_nccl.so`` from a C caller's point of view (ctypes), one process per
rank:

    SYMM_NCCL_SHIM=alone torchrun --nproc-per-node N python/tests_gpu/nccl_shim.py LIB

``LIB`` is the shim (``target/release/libsymm_nccl.so``). Rank 0 draws the id, gloo hands it to
the others, and every rank makes its communicator with ``ncclCommInitRank`` on its GPU. Then
every collective the shim serves runs on torch's current stream over plain torch tensors, for
several types, reductions, sizes and roots, in place and not, eagerly and replayed from a CUDA
graph; each result is compared with the expected values exactly (integers and sums of small
integers) on every rank. Calls the shim does not serve alone (an int8 sum, a pre-multiplied sum,
a send) must be refused with NCCL's codes and symm's reason. Prints one line per rank; exits
non-zero on any difference.
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import ctypes  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

TYPES = {torch.int8: 0, torch.uint8: 1, torch.int32: 2, torch.int64: 4, torch.float16: 6,
         torch.float32: 7, torch.float64: 8, torch.bfloat16: 9}
SUM, PROD, MAX, MIN, AVG = 0, 1, 2, 3, 4


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * 128)]


def load(path):
    lib = ctypes.CDLL(path)
    vp, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    sigs = {
        "ncclGetUniqueId": [ctypes.POINTER(UniqueId)],
        "ncclCommInitRank": [ctypes.POINTER(vp), i, UniqueId, i],
        "ncclAllReduce": [vp, vp, sz, i, i, vp, vp],
        "ncclAllGather": [vp, vp, sz, i, vp, vp],
        "ncclReduceScatter": [vp, vp, sz, i, i, vp, vp],
        "ncclBroadcast": [vp, vp, sz, i, i, vp, vp],
        "ncclReduce": [vp, vp, sz, i, i, i, vp, vp],
        "ncclSend": [vp, sz, i, i, vp, vp],
        "ncclCommCount": [vp, ctypes.POINTER(i)],
        "ncclCommUserRank": [vp, ctypes.POINTER(i)],
        "ncclCommCuDevice": [vp, ctypes.POINTER(i)],
        "ncclCommGetAsyncError": [vp, ctypes.POINTER(i)],
        "ncclCommDestroy": [vp],
        "ncclCommSplit": [vp, i, i, ctypes.POINTER(vp), vp],
        "ncclGetLastError": [vp],
    }
    for name, args in sigs.items():
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = i
    lib.ncclGetLastError.restype = ctypes.c_char_p
    return lib


class Shim:
    def __init__(self, lib, comm):
        self.lib, self.comm = lib, comm

    def stream(self):
        return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def call(self, name, *args):
        rc = getattr(self.lib, name)(*args, self.comm, self.stream())
        if rc != 0:
            raise RuntimeError(f"{name}: {rc} {self.lib.ncclGetLastError(self.comm)!r}")

    def all_reduce(self, t, out, op):
        self.call("ncclAllReduce", t.data_ptr(), out.data_ptr(), t.numel(), TYPES[t.dtype], op)

    def all_gather(self, t, out):
        self.call("ncclAllGather", t.data_ptr(), out.data_ptr(), t.numel(), TYPES[t.dtype])

    def reduce_scatter(self, t, out, op):
        self.call("ncclReduceScatter", t.data_ptr(), out.data_ptr(), out.numel(),
                  TYPES[t.dtype], op)

    def broadcast(self, t, out, root):
        self.call("ncclBroadcast", t.data_ptr(), out.data_ptr(), t.numel(), TYPES[t.dtype], root)

    def reduce(self, t, out, op, root):
        self.call("ncclReduce", t.data_ptr(), out.data_ptr(), t.numel(), TYPES[t.dtype], op,
                  root)


def inputs(r, n, dtype, salt=0):
    """Small integers, so every sum, product, min and max is exact in every type."""
    i = torch.arange(n, device="cuda", dtype=torch.int64)
    return ((i * 7 + r * 3 + salt) % 5 + 1).to(dtype)


def expected(w, n, dtype, op, salt=0):
    ins = torch.stack([inputs(r, n, torch.float64, salt) for r in range(w)])
    got = {SUM: ins.sum(0), PROD: ins.prod(0), MAX: ins.max(0).values, MIN: ins.min(0).values,
           AVG: ins.sum(0) / w}[op]
    return got.to(dtype)


def checks(shim, w, r):
    """Every served call against its expected values; returns how many were compared."""
    n_checked = 0

    def same(name, got, want):
        nonlocal n_checked
        torch.cuda.synchronize()
        if not torch.equal(got, want):
            bad = (got != want).nonzero()[:3].flatten().tolist()
            raise AssertionError(f"{name}: differs at {bad}: {got.flatten()[:6].tolist()} "
                                 f"against {want.flatten()[:6].tolist()}")
        n_checked += 1

    # About a hundred distinct calls, each with a workspace in the heap: more than the heap's
    # blocks hold at once, so the least recently used workspaces are freed on the way.
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64):
        floats = dtype.is_floating_point
        for n in (1, 1000, 1 << 15):
            ops = (SUM, MAX, AVG) if floats else (SUM, MIN)
            if n == 1 and dtype in (torch.float32, torch.int32):
                ops += (PROD,)  # at most 5**4: exact in these types
            for op in ops:
                t = inputs(r, n, dtype)
                out = torch.empty_like(t)
                shim.all_reduce(t, out, op)
                same(f"all_reduce {dtype} {n} op {op}", out, expected(w, n, dtype, op))
            t = inputs(r, n, dtype, 1)
            shim.all_reduce(t, t, SUM)
            same(f"all_reduce in place {dtype} {n}", t, expected(w, n, dtype, SUM, 1))
            t = inputs(r, n, dtype)
            out = torch.empty(w * n, device="cuda", dtype=dtype)
            shim.all_gather(t, out)
            want = torch.cat([inputs(q, n, dtype) for q in range(w)])
            same(f"all_gather {dtype} {n}", out, want)
            t = torch.cat([inputs(r, n, dtype, q) for q in range(w)])
            out = torch.empty(n, device="cuda", dtype=dtype)
            shim.reduce_scatter(t, out, SUM)
            same(f"reduce_scatter {dtype} {n}", out, expected(w, n, dtype, SUM, r))
            root = w - 1
            t = inputs(r, n, dtype, 2)
            out = torch.zeros_like(t)
            shim.broadcast(t, out, root)
            same(f"broadcast {dtype} {n}", out, inputs(root, n, dtype, 2))
            t = inputs(r, n, dtype)
            out = torch.full_like(t, 9)
            shim.reduce(t, out, SUM, 0)
            want = expected(w, n, dtype, SUM) if r == 0 else torch.full_like(t, 9)
            same(f"reduce {dtype} {n}", out, want)
            same(f"reduce leaves its input {dtype} {n}", t, inputs(r, n, dtype))
    # A CUDA graph replays the captured call on new inputs.
    t = inputs(r, 4096, torch.bfloat16)
    out = torch.empty_like(t)
    shim.all_reduce(t, out, SUM)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        shim.all_reduce(t, out, SUM)
    for salt in (3, 4):
        t.copy_(inputs(r, 4096, torch.bfloat16, salt))
        g.replay()
        same(f"graph replay {salt}", out, expected(w, 4096, torch.bfloat16, SUM, salt))
    return n_checked


def refusals(shim):
    """What the shim alone does not serve: NCCL's code and symm's reason."""
    seen = []
    t = torch.ones(16, device="cuda", dtype=torch.int8)
    rc = shim.lib.ncclAllReduce(t.data_ptr(), t.data_ptr(), 16, 0, SUM, shim.comm, shim.stream())
    seen.append(("int8 sum", rc, shim.lib.ncclGetLastError(shim.comm)))
    f = torch.ones(16, device="cuda")
    rc = shim.lib.ncclAllReduce(f.data_ptr(), f.data_ptr(), 16, 7, 5, shim.comm, shim.stream())
    seen.append(("premul sum", rc, shim.lib.ncclGetLastError(shim.comm)))
    rc = shim.lib.ncclSend(f.data_ptr(), 16, 7, 0, shim.comm, shim.stream())
    seen.append(("send", rc, shim.lib.ncclGetLastError(shim.comm)))
    want = {"int8 sum": 4, "premul sum": 4, "send": 5}
    for name, rc, msg in seen:
        if rc != want[name] or not msg.startswith(b"symm: "):
            raise AssertionError(f"{name}: {rc} {msg!r}")
    return [f"{name} {rc}" for name, rc, _ in seen]


def split(shim, w, r):
    """ncclCommSplit into pairs (color r // 2), ranks reversed by key: the new communicator's
    size and ranks, and an all-reduce over its members only."""
    lib = shim.lib
    new = ctypes.c_void_p()
    rc = lib.ncclCommSplit(shim.comm, r // 2, -r, ctypes.byref(new), None)
    if rc != 0:
        raise RuntimeError(f"ncclCommSplit: {rc} {lib.ncclGetLastError(shim.comm)!r}")
    members = sorted((q for q in range(w) if q // 2 == r // 2), key=lambda q: -q)
    count, rank = ctypes.c_int(-1), ctypes.c_int(-1)
    lib.ncclCommCount(new, ctypes.byref(count))
    lib.ncclCommUserRank(new, ctypes.byref(rank))
    if (count.value, rank.value) != (len(members), members.index(r)):
        raise AssertionError(f"split: size {count.value} rank {rank.value}, members {members}")
    half = Shim(lib, new)
    t = inputs(r, 5000, torch.float32)
    out = torch.empty_like(t)
    half.all_reduce(t, out, SUM)
    torch.cuda.synchronize()
    want = sum(inputs(q, 5000, torch.float64) for q in members).float()
    if not torch.equal(out, want):
        raise AssertionError("split: the pair's all-reduce differs")
    rc = lib.ncclCommDestroy(new)
    if rc != 0:
        raise RuntimeError(f"split: destroy {rc}")
    return f"split into {len(members)}-rank communicators (rank {rank.value}): all-reduce exact"


def main():
    lib = load(sys.argv[1])
    dist.init_process_group("gloo")
    w, r = dist.get_world_size(), dist.get_rank()
    local = int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()
    torch.cuda.set_device(local)
    torch.zeros(1, device="cuda")
    uid = UniqueId()
    if r == 0:
        rc = lib.ncclGetUniqueId(ctypes.byref(uid))
        assert rc == 0, (rc, lib.ncclGetLastError(None))
    box = [bytes(uid.internal)]
    dist.broadcast_object_list(box, src=0)
    uid.internal[:] = box[0]
    comm = ctypes.c_void_p()
    t0 = time.perf_counter()
    rc = lib.ncclCommInitRank(ctypes.byref(comm), w, uid, r)
    init_ms = (time.perf_counter() - t0) * 1e3
    assert rc == 0, (rc, lib.ncclGetLastError(None))
    shim = Shim(lib, comm)
    q = {}
    for name in ("ncclCommCount", "ncclCommUserRank", "ncclCommCuDevice", "ncclCommGetAsyncError"):
        v = ctypes.c_int(-1)
        assert getattr(lib, name)(comm, ctypes.byref(v)) == 0
        q[name] = v.value
    ok = q["ncclCommCount"] == w and q["ncclCommUserRank"] == r and \
        q["ncclCommCuDevice"] == local and q["ncclCommGetAsyncError"] == 0
    try:
        n = checks(shim, w, r)
        refused = refusals(shim)
        split_note = split(shim, w, r)
        err = ctypes.c_int(-1)
        lib.ncclCommGetAsyncError(comm, ctypes.byref(err))
        ok = ok and err.value == 0
        summary = f"{n} calls exact, refused as NCCL codes: {', '.join(refused)}; {split_note}"
    except (AssertionError, RuntimeError) as e:
        ok, summary = False, f"FAIL {e}"
    rc = lib.ncclCommDestroy(comm)
    ok = ok and rc == 0
    print(f"rank {r}: world {w}: init {init_ms:.0f} ms, queries {q}; {summary}; "
          f"destroy {rc}; {'ok' if ok else 'FAIL'}", flush=True)
    dist.destroy_process_group()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

"""symm on the GPU under torchrun: run on every rank with

    torchrun --nproc-per-node N -m pytest python/tests_gpu -q

Every rank runs the same tests in the same order (the collectives pair up across ranks).
Inputs are exact in every dtype (small integers), so results are compared exactly.
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import gc  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import symm  # noqa: E402

if "WORLD_SIZE" not in os.environ:
    pytest.skip("run under torchrun", allow_module_level=True)

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32]


@pytest.fixture(scope="module", autouse=True)
def job():
    # The session's process group (conftest.py).
    symm.init(timeout=5.0)
    # init makes the rank's GPU torch's current device: device="cuda" below means it.
    assert torch.cuda.current_device() == symm.device().index
    yield
    symm.finalize()


def rank_input(n, dtype, rank, salt=0):
    # Small integers: exact in every dtype and in every sum over a few ranks.
    return ((torch.arange(n, device="cuda") + 3 * rank + salt) % 13).to(dtype)


def host_sum(n, dtype, world, salt=0):
    return sum(rank_input(n, torch.float64, r, salt) for r in range(world)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("n", [1, 1000, 1 << 18])
def test_all_reduce(dtype, symmetric, n):
    w, r = symm.world_size(), symm.rank()
    t = symm.empty(n, dtype=dtype) if symmetric else torch.empty(n, dtype=dtype, device="cuda")
    t.copy_(rank_input(n, dtype, r))
    symm.all_reduce(t)
    symm.synchronize()
    assert torch.equal(t, host_sum(n, dtype, w))


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_gather_reduce_scatter_all_to_all_broadcast(dtype):
    w, r = symm.world_size(), symm.rank()
    n = 4096
    inp = rank_input(n, dtype, r)
    out = torch.empty(n * w, dtype=dtype, device="cuda")
    symm.all_gather_into_tensor(out, inp)
    symm.synchronize()
    assert torch.equal(out, torch.cat([rank_input(n, dtype, q) for q in range(w)]))

    big = rank_input(n * w, dtype, r)
    part = symm.empty(n, dtype=dtype)
    symm.reduce_scatter_tensor(part, big)
    symm.synchronize()
    assert torch.equal(part, host_sum(n * w, dtype, w)[r * n:(r + 1) * n])

    a2a_in = rank_input(n * w, dtype, r)
    a2a_out = torch.empty_like(a2a_in)
    symm.all_to_all_single(a2a_out, a2a_in)
    symm.synchronize()
    want = torch.cat([rank_input(n * w, dtype, q)[r * n:(r + 1) * n] for q in range(w)])
    assert torch.equal(a2a_out, want)

    b = rank_input(n, dtype, r, salt=5)
    symm.broadcast(b, src=w - 1)
    symm.synchronize()
    assert torch.equal(b, rank_input(n, dtype, w - 1, salt=5))


def test_all_to_all_with_splits():
    w, r = symm.world_size(), symm.rank()
    # Rank q sends (q + p + 1) rows of 3 to rank p.
    ins = [r + p + 1 for p in range(w)]
    outs = [q + r + 1 for q in range(w)]
    inp = torch.cat([torch.full((ins[p], 3), float(10 * r + p), device="cuda") for p in range(w)])
    out = torch.empty((sum(outs), 3), device="cuda")
    symm.all_to_all_single(out, inp, outs, ins)
    symm.synchronize()
    want = torch.cat([torch.full((outs[q], 3), float(10 * q + r), device="cuda")
                      for q in range(w)])
    assert torch.equal(out, want)


def test_graph_capture_replayed_100_times():
    w, r = symm.world_size(), symm.rank()
    n = 1 << 14
    src = torch.empty(n, device="cuda")
    t = symm.empty(n)
    g_out = torch.empty(n * w, device="cuda")
    # Warm up eagerly (plans and workspaces exist before the capture).
    src.copy_(rank_input(n, torch.float32, r))
    t.copy_(src)
    symm.all_reduce(t)
    symm.all_gather_into_tensor(g_out, src)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        t.copy_(src)
        symm.all_reduce(t)
        symm.all_gather_into_tensor(g_out, src)
    for i in range(100):
        src.copy_(rank_input(n, torch.float32, r, salt=i))
        g.replay()
        if i % 10 == 9:
            torch.cuda.synchronize()
            symm.check()
            assert torch.equal(t, host_sum(n, torch.float32, w, salt=i))
            assert torch.equal(g_out, torch.cat([rank_input(n, torch.float32, q, salt=i)
                                                 for q in range(w)]))
    del g
    gc.collect()


def test_capture_without_warm_up_is_refused_cleanly():
    t = symm.empty(777)
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with pytest.raises(symm.SymmError, match="before capturing"):
        with torch.cuda.graph(g, stream=s):
            symm.all_reduce(t)
    torch.cuda.synchronize()
    # Eager use afterwards works (every rank refused the same capture).
    t.fill_(1.0)
    symm.all_reduce(t)
    symm.synchronize()
    assert torch.equal(t, torch.full_like(t, float(symm.world_size())))


def test_peer_views_and_signals():
    w, r = symm.world_size(), symm.rank()
    n = 1024
    t = symm.zeros(n, dtype=torch.float32)
    h = symm.rendezvous(t)
    assert h.rank == r and h.world_size == w and len(h.buffer_ptrs) == w
    assert len(h.signal_pad_ptrs) == w
    t.fill_(float(r))
    h.barrier()
    for q in range(w):
        peer = h.get_buffer(q, (n // 2,), torch.float32, storage_offset=n // 2)
        assert torch.equal(peer, torch.full((n // 2,), float(q), device="cuda"))
    h.barrier()
    # A ring of signals: write into the next rank's copy, signal it, wait for the previous.
    nxt, prv = (r + 1) % w, (r - 1) % w
    h.get_buffer(nxt, (4,), torch.float32).fill_(100.0 + r)
    h.put_signal(nxt, slot=3)
    h.wait_signal(prv, slot=3)
    got = t[:4].clone()
    symm.synchronize()
    assert torch.equal(got, torch.full((4,), 100.0 + prv, device="cuda"))
    with pytest.raises(ValueError):
        h.get_buffer(0, (n + 1,), torch.float32)
    with pytest.raises(ValueError):
        h.put_signal(nxt, slot=symm.SIGNAL_SLOTS)
    h.barrier()
    symm.synchronize()


def test_bad_arguments_raise_value_and_type_errors():
    t = symm.empty(8)
    with pytest.raises(ValueError, match="contiguous"):
        symm.all_reduce(torch.empty(8, 2, device="cuda").t())
    with pytest.raises(ValueError):
        symm.all_reduce(torch.empty(8))  # on the CPU
    with pytest.raises(TypeError):
        symm.all_reduce(torch.empty(8, dtype=torch.complex64, device="cuda"))
    with pytest.raises(TypeError):
        symm.all_reduce([1.0, 2.0])
    with pytest.raises(ValueError):
        symm.all_gather_into_tensor(torch.empty(3, device="cuda"), t)
    # Sizes that differ across ranks: every rank raises, nothing runs, the job goes on.
    bad = torch.ones(100 + symm.rank(), device="cuda")
    with pytest.raises(ValueError, match="different arguments"):
        symm.all_reduce(bad)
    # A symmetric view off the 16-byte grid is staged, not refused.
    base = symm.empty(65)
    view = base[1:]
    view.fill_(2.0)
    symm.all_reduce(view)
    ok = torch.ones(64, device="cuda")
    symm.all_reduce(ok)
    symm.synchronize()
    assert torch.equal(ok, torch.full_like(ok, float(symm.world_size())))
    assert torch.equal(view, torch.full_like(view, 2.0 * symm.world_size()))


def test_a_remembered_shape_still_refuses_tensors_it_cannot_take():
    # The repeated call of a shape is one step in the runtime: it must refuse what the first
    # call would have, with the same errors, and the job goes on.
    n = 48
    ok = torch.ones(n, device="cuda")
    symm.all_reduce(ok)
    symm.all_reduce(ok)  # remembered now
    with pytest.raises(ValueError, match="on cpu"):
        symm.all_reduce(torch.ones(n))
    with pytest.raises(ValueError, match="contiguous"):
        symm.all_reduce(torch.ones(n, 2, device="cuda")[:, 0])
    with pytest.raises(ValueError, match="contiguous"):
        symm.all_reduce(torch.ones(1, device="cuda").expand(n))
    if torch.cuda.device_count() > 1:
        other = (symm.device().index + 1) % torch.cuda.device_count()
        with pytest.raises(ValueError, match=f"cuda:{other}"):
            symm.all_reduce(torch.ones(n, device=f"cuda:{other}"))
    symm.all_reduce(ok)
    symm.synchronize()
    assert torch.equal(ok, torch.full_like(ok, float(symm.world_size() ** 3)))


def test_alloc_free_cycles_do_not_leak():
    torch.cuda.synchronize()
    symm.collect()
    blocks0, bytes0 = symm.heap_usage()
    torch0 = torch.cuda.memory_allocated()
    for _ in range(50):
        t = symm.zeros((257, 33), dtype=torch.bfloat16)
        v = t[1:]  # a view keeps the block alive after `del t`
        del t
        v.fill_(1)
        del v
    gc.collect()
    symm.collect()
    blocks1, bytes1 = symm.heap_usage()
    assert (blocks1, bytes1) == (blocks0, bytes0)
    assert torch.cuda.memory_allocated() == torch0


def test_beside_torch_allocator_and_a_collective_library():
    w = symm.world_size()
    x = torch.randn(1 << 20, device="cuda")  # the caching allocator's memory
    y = symm.empty(1 << 20)
    y.copy_(x.round())
    symm.all_reduce(y)
    g = x.round().cpu()
    dist.all_reduce(g)  # gloo here; NCCL where ranks have distinct GPUs (test below)
    symm.synchronize()
    assert torch.equal(y.cpu(), g)
    assert w == dist.get_world_size()


@pytest.mark.skipif(torch.cuda.device_count() < int(os.environ.get("WORLD_SIZE", "1")),
                    reason="NCCL needs a GPU per rank")
def test_beside_nccl():
    pg = dist.new_group(backend="nccl")
    x = torch.ones(1 << 16, device="cuda")
    dist.all_reduce(x, group=pg)
    y = symm.zeros(1 << 16)
    y += 1
    symm.all_reduce(y)
    symm.synchronize()
    assert torch.equal(x, y)


def test_triton_example():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
    triton = pytest.importorskip("triton")
    del triton
    import triton_one_shot

    n = 1 << 14
    t = symm.empty(n)
    h = symm.rendezvous(t)
    t.copy_(rank_input(n, torch.float32, symm.rank()))
    out = triton_one_shot.one_shot_all_reduce(h, n, torch.empty(n, device="cuda"))
    symm.synchronize()
    assert torch.equal(out, host_sum(n, torch.float32, symm.world_size()))

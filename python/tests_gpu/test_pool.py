"""symm.mem_pool(): tensors torch allocates in the pool are symmetric, collectives run on them
with no copy, eagerly and in a graph captured into the pool, and segments that differ across
ranks are refused on every rank (run under torchrun, one process per GPU)."""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

import symm  # noqa: E402
from symm import _symm  # noqa: E402

if "WORLD_SIZE" not in os.environ:
    pytest.skip("run under torchrun", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def job():
    symm.init(heap_bytes=512 << 20)
    yield
    symm.finalize()


def ranks_sum(k=0.0):
    w = symm.world_size()
    return float(sum(r + 1 + k for r in range(w)))


def copies(fn):
    """Memory copies the profiler saw the device run for ``fn``."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as p:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in p.events() if "memcpy" in e.name.lower())


def test_pool_tensors_are_symmetric_and_reduced_where_they_lie():
    pool = symm.mem_pool()
    assert symm.mem_pool() is pool
    r = symm.rank()
    with torch.cuda.use_mem_pool(pool):
        xs = [torch.full((n,), float(r + 1), device="cuda", dtype=torch.bfloat16)
              for n in (8, 8192, 1 << 20)]
    plain = torch.full((1 << 20,), float(r + 1), device="cuda", dtype=torch.bfloat16)
    assert not symm.is_symmetric(plain)
    for x in xs:
        assert symm.is_symmetric(x)
        symm.all_reduce(x)
    symm.synchronize()
    for x in xs:
        assert torch.equal(x, torch.full_like(x, ranks_sum()))
    # Two-shot (peers read the input and write the output): a plain tensor is staged through
    # the heap by copies, a pool tensor is not.
    big = xs[2]
    big.fill_(float(r + 1))
    plain.fill_(float(r + 1))
    for t in (big, plain):
        symm.all_reduce(t, algorithm="two_shot")  # first use: agreed, admitted
    symm.synchronize()
    assert copies(lambda: symm.all_reduce(big, algorithm="two_shot")) == 0
    assert copies(lambda: symm.all_reduce(plain, algorithm="two_shot")) >= 2
    symm.synchronize()
    w = symm.world_size()
    want = ranks_sum() * w  # the sum, summed again
    assert torch.equal(big, torch.full_like(big, want))
    assert torch.equal(plain, torch.full_like(plain, want))


def test_a_graph_captured_into_the_pool_reduces_its_own_tensors():
    pool = symm.mem_pool()
    r = symm.rank()
    x = torch.full((64 << 10,), float(r + 1), device="cuda")

    def step():
        y = x * 2.0  # allocated from the pool
        symm.all_reduce(y)
        return y

    with torch.cuda.use_mem_pool(pool):
        step()  # the request's first use, outside the capture
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool.id, stream=side):
        out = step()
    assert symm.is_symmetric(out)
    for k in range(3):
        x.fill_(float(r + 1 + k))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, torch.full_like(out, 2.0 * ranks_sum(k))), k
    del g, out
    symm.check()


def test_segments_that_differ_across_ranks_are_refused_on_every_rank():
    if symm.world_size() < 2:
        pytest.skip("needs two ranks")
    pool = symm.mem_pool()
    r = symm.rank()
    _symm.pool_refusal()
    with torch.cuda.use_mem_pool(pool):
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty((64 + 2 * r) << 20, dtype=torch.uint8, device="cuda")
    why = _symm.pool_refusal()
    assert why is not None and "diverged" in why, why
    # Every rank took its own segment back: the same segment on every rank is served, and a
    # collective on it is right.
    with torch.cuda.use_mem_pool(pool):
        t = torch.full((16 << 20,), float(r + 1), device="cuda")
    assert symm.is_symmetric(t)
    symm.all_reduce(t)
    symm.synchronize()
    assert torch.equal(t, torch.full_like(t, ranks_sum()))


def test_torch_retries_of_a_refused_segment_keep_the_ranks_in_step():
    """After a refusal torch frees its cache and asks again, once or twice depending on what
    this rank cached: rank 0 holds a cached free segment and the others do not, the heap
    refuses the size on every rank, and the next allocation is still collective and right."""
    pool = symm.mem_pool()
    r = symm.rank()
    with torch.cuda.use_mem_pool(pool):
        keep = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
    if r == 0:
        del keep  # cached by torch's allocator on this rank only
    _symm.pool_refusal()
    with torch.cuda.use_mem_pool(pool):
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    why = _symm.pool_refusal()
    assert why is not None and "no free block holds" in why, why
    with torch.cuda.use_mem_pool(pool):
        t = torch.full((4 << 20,), float(r + 1), device="cuda")
    assert symm.is_symmetric(t)
    symm.all_reduce(t)
    symm.synchronize()
    assert torch.equal(t, torch.full_like(t, ranks_sum()))


def test_a_pool_tensor_of_an_earlier_job_is_refused():
    """Last in the file: it ends the module's job and starts another."""
    r = symm.rank()
    with torch.cuda.use_mem_pool(symm.mem_pool()):
        old = torch.full((1 << 20,), float(r + 1), device="cuda")
    assert symm.is_symmetric(old)
    symm.finalize()
    symm.init(heap_bytes=512 << 20)
    assert not symm.is_symmetric(old)
    for algorithm in (None, "two_shot"):
        with pytest.raises(ValueError, match="another communicator"):
            symm.all_reduce(old, algorithm=algorithm)
    # The new job is unharmed, and its own pool serves.
    with torch.cuda.use_mem_pool(symm.mem_pool()):
        t = torch.full((1 << 20,), float(r + 1), device="cuda")
    assert symm.is_symmetric(t)
    symm.all_reduce(t)
    symm.synchronize()
    assert torch.equal(t, torch.full_like(t, ranks_sum()))
    del old

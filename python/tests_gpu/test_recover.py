"""A job survives a call that differs across ranks: every rank fails with an error that says
so, and ``symm.reset()`` brings the job back (run under torchrun, one process per GPU)."""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import time  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import symm  # noqa: E402

if "WORLD_SIZE" not in os.environ:
    pytest.skip("run under torchrun", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def job():
    # A short device deadline: the rank that launches alone waits this long.
    symm.init(timeout=2.0, bootstrap_timeout=30.0)
    yield
    symm.finalize()


def sums_are_right(calls):
    w = symm.world_size()
    for i in range(calls):
        t = torch.full((1000 + i % 17,), float(i % 5 + symm.rank()), device="cuda")
        symm.all_reduce(t)
        want = float(w * (i % 5) + w * (w - 1) // 2)
        symm.synchronize()
        assert torch.equal(t, torch.full_like(t, want)), i


def test_a_repeated_shape_on_one_rank_and_new_ones_elsewhere_then_reset():
    r = symm.rank()
    used = torch.ones(1000, device="cuda")
    symm.all_reduce(used)
    symm.all_reduce(used)
    symm.synchronize()
    # Rank 0 calls the shape it used (the runtime launches at once); every other rank a shape
    # of its own (it first meets the others to agree on it).
    bad = torch.ones(1000 + r, device="cuda")
    t0 = time.monotonic()
    with pytest.raises(symm.SymmError) as e:
        symm.all_reduce(bad)
        symm.synchronize()
    took = time.monotonic() - t0
    if r == 0:
        assert isinstance(e.value, symm.TimeoutError), e.value
    else:
        assert "rank 0 recovers" in str(e.value), e.value
    print(f"rank {r}: {type(e.value).__name__} after {took:.2f} s: {str(e.value)[:120]}")
    symm.reset()
    sums_are_right(100)


def test_reset_after_sizes_differ_on_first_use():
    bad = torch.ones(200 + symm.rank(), device="cuda")
    with pytest.raises(ValueError, match="different arguments"):
        symm.all_reduce(bad)
    symm.reset()
    sums_are_right(20)
    # A reset with nothing wrong is a meeting.
    symm.reset()
    sums_are_right(5)

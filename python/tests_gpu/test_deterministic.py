"""Deterministic mode from Python, under torchrun (``symm.init(deterministic=True)``).

Every rank builds every rank's inputs from one seed: sums that cancel, magnitudes far apart and
values near the type's largest, so the order of addition shows in the bits. The reference is
the rank-order sum (f32 accumulation for 16-bit floats, one rounding), computed on the CPU. Every
call, at every size, on symmetric and plain tensors, eager and replayed in a CUDA graph, must give
exactly its bits; an element gets the same bits in a small call and a large one.
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

import symm  # noqa: E402

if "WORLD_SIZE" not in os.environ:
    pytest.skip("run under torchrun", allow_module_level=True)

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
# Elements per call: odd counts, up to 4 Mi elements (8 MiB of bf16).
SIZES = [517, 24_581, 524_309, 4 << 20]


@pytest.fixture(scope="module", autouse=True)
def job():
    symm.init(timeout=20.0, deterministic=True)
    yield
    symm.finalize()


def hard_inputs(n, dtype, world, seed):
    """Every rank's input, the same on every rank: values that cancel across ranks, mixed
    magnitudes, and values near the type's largest."""
    g = torch.Generator().manual_seed(seed)
    big = torch.finfo(dtype).max
    kind = torch.randint(0, 4, (n,), generator=g)
    xs = []
    for _ in range(world):
        mag = 2.0 ** torch.randint(-10, 12, (n,), generator=g).float()
        sign = torch.randint(0, 2, (n,), generator=g).float() * 2 - 1
        frac = 1 + torch.randint(0, 1024, (n,), generator=g).float() / 1024
        x = sign * mag * frac
        x = torch.where(kind == 1, sign * big * (0.25 + frac / 8), x)
        xs.append(x)
    if world > 1:
        xs[-1] = torch.where(kind == 0, -xs[0] * (1 + 1 / 512), xs[-1])
    return [x.to(dtype) for x in xs]


def rank_order(xs, dtype):
    """The rank-order sum: f32 for 16-bit floats (f32 itself adds in f32), one rounding."""
    acc = xs[0].float().clone()
    for x in xs[1:]:
        acc += x.float()
    return acc.to(dtype)


def bits(t):
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32).cpu()


def same_bits(got, want):
    return torch.equal(bits(got), bits(want.to(got.device)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("symmetric", [True, False])
def test_all_reduce_gives_the_rank_order_bits_at_every_size(dtype, symmetric):
    w, r = symm.world_size(), symm.rank()
    assert symm.is_deterministic()
    xs = hard_inputs(max(SIZES), dtype, w, seed=7)
    want = rank_order(xs, dtype)
    for n in SIZES:
        t = symm.empty(n, dtype=dtype) if symmetric else torch.empty(n, dtype=dtype,
                                                                        device="cuda")
        t.copy_(xs[r][:n])
        symm.all_reduce(t)
        torch.cuda.synchronize()
        # The same element, the same bits, in a call of 517 elements and of 4 Mi.
        assert same_bits(t, want[:n]), (n, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter_and_reduce_give_the_rank_order_bits(dtype):
    w, r = symm.world_size(), symm.rank()
    for n in SIZES[:3]:
        xs = hard_inputs(n * w, dtype, w, seed=11 + n)
        want = rank_order(xs, dtype)
        out = torch.empty(n, dtype=dtype, device="cuda")
        symm.reduce_scatter_tensor(out, xs[r].cuda())
        t = xs[r].cuda()
        symm.reduce(t, dst=w - 1)
        torch.cuda.synchronize()
        assert same_bits(out, want[r * n:(r + 1) * n]), (n, dtype)
        if r == w - 1:
            assert same_bits(t, want), (n, dtype)
        else:
            assert same_bits(t, xs[r]), "reduce changed a rank that is not the root"


@pytest.mark.parametrize("dtype", DTYPES)
def test_graph_replays_give_the_rank_order_bits(dtype):
    w, r = symm.world_size(), symm.rank()
    n = SIZES[2]
    t = symm.empty(n, dtype=dtype)
    t.copy_(hard_inputs(n, dtype, w, seed=1)[r])
    symm.all_reduce(t)  # warm up: plans are built before capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        symm.all_reduce(t)
    for i in range(3):
        xs = hard_inputs(n, dtype, w, seed=100 + i)
        t.copy_(xs[r])
        g.replay()
        torch.cuda.synchronize()
        assert same_bits(t, rank_order(xs, dtype)), i


def test_a_forced_algorithm_outside_the_mode_is_refused():
    t = torch.ones(1 << 16, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="deterministic"):
        symm.all_reduce(t, algorithm="ring")
    # Integers add to the same bits in any order: a ring of them runs.
    i = torch.ones(1 << 16, dtype=torch.int32, device="cuda")
    symm.all_reduce(i, algorithm="ring")
    torch.cuda.synchronize()
    assert int(i[0]) == symm.world_size()

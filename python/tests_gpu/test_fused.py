"""symm.fused_all_reduce_rmsnorm under torchrun (one process per GPU): bit exact against the
host reference (symm-core's norm) for plain and pool tensors, in place, in a CUDA graph
replayed with new inputs, and every refusal typed."""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import time  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import symm  # noqa: E402
from symm import _symm  # noqa: E402

if "WORLD_SIZE" not in os.environ:
    pytest.skip("run under torchrun", allow_module_level=True)

EPS = 1e-5


@pytest.fixture(scope="module", autouse=True)
def job():
    symm.init(heap_bytes=512 << 20, timeout=10.0)
    yield
    symm.finalize()


def inputs(rows, hidden, salt, rank):
    g = torch.Generator(device="cuda")
    g.manual_seed(salt * 7919 + rank * 104729 + rows * 31 + hidden)
    return (torch.randn(rows, hidden, generator=g, device="cuda") * 2).to(torch.bfloat16)


def case(rows, hidden, salt):
    """Every rank's x (rank order), the residual and the weight of one call."""
    w = symm.world_size()
    xs = [inputs(rows, hidden, salt, r) for r in range(w)]
    res = inputs(rows, hidden, salt, 1000)
    weight = inputs(1, hidden, salt, 2000)[0]
    return xs, res, weight


def want(xs, res, weight, eps=EPS):
    raw = lambda t: t.contiguous().view(torch.int16).cpu().numpy().tobytes()  # noqa: E731
    r, o = _symm.norm_reference([raw(x) for x in xs], raw(res), raw(weight), eps)
    as_t = lambda b: torch.frombuffer(bytearray(b), dtype=torch.bfloat16).cuda()  # noqa: E731
    return as_t(r).view(res.shape), as_t(o).view(res.shape)


def same_bits(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("rows,hidden", [(1, 8192), (7, 8192), (128, 8192), (300, 1024),
                                         (2, 8)])
def test_plain_tensors_are_bit_exact(rows, hidden):
    xs, res, weight = case(rows, hidden, 1)
    x = xs[symm.rank()].clone()
    residual = res.clone()
    out, residual_out = symm.fused_all_reduce_rmsnorm(x, residual, weight, EPS)
    symm.synchronize()
    r, o = want(xs, res, weight)
    assert residual_out is residual
    assert same_bits(residual, r) and same_bits(out, o)
    assert torch.equal(x, xs[symm.rank()])  # the input is read, not written


def test_pool_tensors_in_place_over_the_input():
    rows, hidden = 64, 8192
    xs, res, weight = case(rows, hidden, 2)
    with torch.cuda.use_mem_pool(symm.mem_pool()):
        x = xs[symm.rank()].clone()
        new_res = torch.empty_like(res)
    assert symm.is_symmetric(x)
    out, h = symm.fused_all_reduce_rmsnorm(x, res, weight, EPS, out=x, residual_out=new_res)
    symm.synchronize()
    r, o = want(xs, res, weight)
    assert out is x and h is new_res
    assert same_bits(new_res, r) and same_bits(x, o)


def test_a_graph_replays_with_new_inputs():
    rows, hidden = 16, 8192
    x = torch.empty(rows, hidden, device="cuda", dtype=torch.bfloat16)
    res = torch.empty_like(x)
    weight = torch.empty(hidden, device="cuda", dtype=torch.bfloat16)
    out, h = torch.empty_like(x), torch.empty_like(x)

    def load(salt):
        xs, r0, w0 = case(rows, hidden, salt)
        x.copy_(xs[symm.rank()])
        res.copy_(r0)
        weight.copy_(w0)
        return want(xs, r0, w0)

    load(3)
    symm.fused_all_reduce_rmsnorm(x, res, weight, EPS, out=out, residual_out=h)  # first use
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        for _ in range(3):  # three calls a replay: the staging halves alternate
            symm.fused_all_reduce_rmsnorm(x, res, weight, EPS, out=out, residual_out=h)
    for salt in (4, 5, 6):
        r, o = load(salt)
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        symm.check()
        assert same_bits(h, r) and same_bits(out, o), salt
    del g


def test_nan_and_infinity_write_the_reference_nan():
    rows, hidden = 3, 1024
    xs, res, weight = case(rows, hidden, 5)
    for x in xs:
        x[0].zero_()  # row 0 all zero with eps 0: 0 * inf
    res[0].zero_()
    xs[0][1, 7] = float("-nan")
    xs[-1][2, 9] = float("inf")
    x = xs[symm.rank()].clone()
    out, h = symm.fused_all_reduce_rmsnorm(x, res.clone(), weight, 0.0)
    symm.synchronize()
    r, o = want(xs, res, weight, 0.0)
    assert same_bits(h, r) and same_bits(out, o)
    assert torch.isnan(out[0]).all() and torch.isnan(out[1]).all()


def test_calls_on_two_streams_run_in_the_order_they_were_enqueued():
    rows, hidden = 32, 8192
    cases = [case(rows, hidden, 40 + k) for k in range(4)]
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    mine = [(xs[symm.rank()].clone(), res.clone(), weight) for xs, res, weight in cases]
    torch.cuda.synchronize()
    outs = []
    for k, (x, res, weight) in enumerate(mine):
        with torch.cuda.stream(streams[k % 2]):
            outs.append(symm.fused_all_reduce_rmsnorm(x, res, weight, EPS))
    torch.cuda.synchronize()
    for (xs, res, weight), (out, h) in zip(cases, outs):
        r, o = want(xs, res, weight)
        assert same_bits(h, r) and same_bits(out, o)


def test_refusals_are_typed_and_the_op_still_works():
    hidden = 1024
    x = torch.zeros(4, hidden, device="cuda", dtype=torch.bfloat16)
    res, w = torch.zeros_like(x), torch.ones(hidden, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="bfloat16"):
        symm.fused_all_reduce_rmsnorm(x.float(), res, w)
    with pytest.raises(ValueError, match="shape"):
        symm.fused_all_reduce_rmsnorm(x, res[:2], w)
    with pytest.raises(ValueError, match="shape"):
        symm.fused_all_reduce_rmsnorm(x, res, w[:8])
    with pytest.raises(ValueError, match="contiguous"):
        symm.fused_all_reduce_rmsnorm(x.t(), res.t(), w[:4])
    with pytest.raises(ValueError, match="multiple of 8"):
        symm.fused_all_reduce_rmsnorm(x[:, :12].contiguous(), res[:, :12].contiguous(), w[:12])
    with pytest.raises(ValueError, match="epsilon"):
        symm.fused_all_reduce_rmsnorm(x, res, w, float("nan"))
    flat = torch.zeros(4 * hidden + 8, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="align"):
        symm.fused_all_reduce_rmsnorm(flat[1:1 + 4 * hidden].view(4, hidden), res, w)
    with pytest.raises(ValueError):  # an output over part of the residual
        symm.fused_all_reduce_rmsnorm(x, res, w, out=flat[8:8 + 4 * hidden].view(4, hidden),
                                      residual_out=flat[:4 * hidden].view(4, hidden))
    with pytest.raises(ValueError, match="this rank's GPU|is on"):
        symm.fused_all_reduce_rmsnorm(x.cpu(), res, w)
    # Rows that differ across ranks are named on every rank before any launch.
    r = symm.rank()
    if symm.world_size() > 1:
        # Row counts no rank used before (a rank that used its count before launches at once).
        xr = torch.zeros(5 + r, hidden, device="cuda", dtype=torch.bfloat16)
        with pytest.raises(ValueError, match="different shapes"):
            symm.fused_all_reduce_rmsnorm(xr, torch.zeros_like(xr), w)
    xs, r0, w0 = case(4, hidden, 9)
    out, h = symm.fused_all_reduce_rmsnorm(xs[r].clone(), r0.clone(), w0, EPS)
    symm.synchronize()
    rr, oo = want(xs, r0, w0)
    assert same_bits(h, rr) and same_bits(out, oo)


def test_rows_that_differ_on_a_repeated_call_are_named_on_the_device():
    # Both row counts were agreed by every rank, so no host exchange runs: the kernel's flag
    # words carry the rows, and every rank fails at once instead of waiting for its deadline.
    if symm.world_size() < 2:
        pytest.skip("needs two ranks")
    hidden = 1024
    w = torch.ones(hidden, device="cuda", dtype=torch.bfloat16)
    for rows in (3, 6):
        x = torch.zeros(rows, hidden, device="cuda", dtype=torch.bfloat16)
        symm.fused_all_reduce_rmsnorm(x, torch.zeros_like(x), w)
    symm.synchronize()
    rows = 3 if symm.rank() == 0 else 6
    x = torch.zeros(rows, hidden, device="cuda", dtype=torch.bfloat16)
    t0 = time.monotonic()
    with pytest.raises(ValueError, match="different arguments"):
        symm.fused_all_reduce_rmsnorm(x, torch.zeros_like(x), w)
        symm.synchronize()
    assert time.monotonic() - t0 < 5.0  # the deadline is 10 s
    symm.reset()
    xs, r0, w0 = case(4, hidden, 11)
    out, h = symm.fused_all_reduce_rmsnorm(xs[symm.rank()].clone(), r0.clone(), w0, EPS)
    symm.synchronize()
    rr, oo = want(xs, r0, w0)
    assert same_bits(h, rr) and same_bits(out, oo)

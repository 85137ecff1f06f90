"""symm.moe on the GPU under torchrun: run on every rank with

    torchrun --nproc-per-node N -m pytest python/tests_gpu/test_moe.py -q

Every rank runs the same tests in the same order (dispatch and combine pair up across ranks).
Each rank draws every rank's inputs from seeds, so it can compute, in plain torch, the expert
rows it must receive and the combined output it must get back, following the layout and the
summation order of ``symm_core::moe`` (expert major, then sender rank, then the sender's
(token, k) order; per destination rank an f32 partial over ascending k, the partials added
in ascending rank order in f32, one rounding to the output dtype).

The kernel's partials use fused multiply-adds, the reference a multiply then an add. With
dyadic weights and inputs (the default) every product and sum is exact in f32, so the results
must be *equal*; with random f32 weights the two may differ in the last bits of a partial, so
those cases are compared with a tolerance of about an output ulp.
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import math  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import symm  # noqa: E402
import symm.moe  # noqa: E402

if "WORLD_SIZE" not in os.environ:
    pytest.skip("run under torchrun", allow_module_level=True)


@pytest.fixture(scope="module", autouse=True)
def job():
    own_group = not dist.is_initialized()
    if own_group:
        dist.init_process_group("gloo")
    symm.init(timeout=10.0)
    torch.cuda.set_device(symm.device())
    yield
    symm.finalize()
    if own_group:
        dist.destroy_process_group()


def local_experts(world, topk):
    """Experts per rank so that there are at least 2 * topk experts in all."""
    return max(1, math.ceil(2 * topk / world))


def token_counts(case, world, tokens_max, zero_rank=None):
    g = torch.Generator().manual_seed(case)
    counts = torch.randint(0, tokens_max + 1, (world,), generator=g).tolist()
    if zero_rank == "all":
        counts = [0] * world
    elif zero_rank is not None:
        counts[zero_rank % world] = 0
    return counts


def rank_inputs(case, r, tokens, experts, topk, hidden, dtype, dyadic=True, invalid=False):
    """Rank ``r``'s tokens, routing and weights for ``case``, on the host (every rank can make
    every rank's).
    """
    g = torch.Generator().manual_seed(7919 * case + r)
    x = (torch.randint(-8, 9, (tokens, hidden), generator=g).float() / 4).to(dtype)
    idx = torch.rand(tokens, experts, generator=g).argsort(dim=1)[:, :topk].contiguous()
    idx = idx.masked_fill(torch.rand(tokens, topk, generator=g) < 0.1, -1)
    if invalid:
        bad = torch.rand(tokens, topk, generator=g) < 0.1
        idx = torch.where(bad, experts + torch.randint(0, 5, (tokens, topk), generator=g), idx)
    if dyadic:
        w = torch.randint(-4, 9, (tokens, topk), generator=g).float() / 8
    else:
        w = torch.rand(tokens, topk, generator=g) * 2 - 0.5
    return x, idx, w


def scale_of(e):
    """The test experts multiply their rows by a small dyadic number per expert."""
    return ((e % 7) + 1) * 0.5


def expert_scales(q, n_local):
    """``scale_of`` of rank ``q``'s local experts, then 0 for rows past the spans."""
    return torch.tensor([scale_of(q * n_local + j) for j in range(n_local)] + [0.0],
                        device="cuda")


def run_experts(expert_x, spans, scales):
    """The experts, on the device without reading ``spans`` on the host (so a graph can
    capture them): every row of local expert ``j`` times ``scales[j]``, rows past the spans
    times 0.
    """
    ends = (spans[:, 0].long() + spans[:, 1].long()).contiguous()
    rows = torch.arange(expert_x.shape[0], device=expert_x.device)
    j = torch.searchsorted(ends, rows, right=True)
    return (expert_x.float() * scales[j][:, None]).to(expert_x.dtype)


def entry_rows(all_idx, world, n_local):
    """For every sender's entry (t, k): its expert row on the expert's rank (unclipped), or
    -1 for no expert or an invalid one.
    """
    rows = [torch.full_like(i, -1) for i in all_idx]
    totals = []
    for q in range(world):
        base, ns = 0, []
        for j in range(n_local):
            e = q * n_local + j
            first = base
            for p, idx in enumerate(all_idx):
                nz = (idx == e).nonzero()
                rows[p][nz[:, 0], nz[:, 1]] = torch.arange(base, base + nz.shape[0])
                base += nz.shape[0]
            ns.append((first, base - first))
        totals.append(ns)
    return rows, totals


class Case:
    """One dispatch's inputs on every rank and what this rank must see."""

    def __init__(self, case, world, experts, topk, tokens_max, hidden, dtype, rows_max,
                 zero_rank=None, dyadic=True, invalid=False, counts=None):
        self.world, self.rank = world, symm.rank()
        self.experts, self.topk, self.hidden, self.dtype = experts, topk, hidden, dtype
        self.n_local = experts // world
        self.rows_max = rows_max
        counts = counts or token_counts(case, world, tokens_max, zero_rank)
        self.inputs = [rank_inputs(case, p, counts[p], experts, topk, hidden, dtype, dyadic,
                                   invalid) for p in range(world)]
        self.rows, self.spans_unclipped = entry_rows([i[1] for i in self.inputs], world,
                                                     self.n_local)

    def mine(self):
        x, idx, w = self.inputs[self.rank]
        return x.cuda(), idx.cuda(), w.cuda()

    def spans(self):
        q, rm = self.rank, self.rows_max
        out = []
        for first, n in self.spans_unclipped[q]:
            f = min(first, rm)
            out.append((f, min(n, rm - f)))
        return torch.tensor(out, dtype=torch.int32)

    def expert_rows(self):
        """The rows this rank must hold (values, and which rows are defined)."""
        q = self.rank
        exp = torch.zeros(self.rows_max, self.hidden, dtype=self.dtype)
        filled = torch.zeros(self.rows_max, dtype=torch.bool)
        for p, (x, idx, _) in enumerate(self.inputs):
            rows = self.rows[p]
            valid = (idx >= 0) & (idx < self.experts)
            sel = valid & (idx // self.n_local == q) & (rows >= 0) & (rows < self.rows_max)
            t = sel.nonzero()[:, 0]
            exp[rows[sel]] = x[t]
            filled[rows[sel]] = True
        return exp, filled

    def dropped(self):
        q = self.rank
        return sum(n for _, n in self.spans_unclipped[q]) - int(self.spans()[:, 1].sum())

    def invalid(self):
        idx = self.inputs[self.rank][1]
        return int((idx >= self.experts).sum())

    def combined(self):
        """This rank's combined tokens, by the module doc's rules with mul + add for fma."""
        x, idx, w = self.inputs[self.rank]
        rows = self.rows[self.rank]
        valid = (idx >= 0) & (idx < self.experts)
        owner = torch.where(valid, idx // self.n_local, torch.full_like(idx, -1))
        has_row = valid & (rows < self.rows_max)
        total = torch.zeros(x.shape[0], self.hidden, dtype=torch.float32)
        for q in range(self.world):
            partial = torch.zeros_like(total)
            for k in range(self.topk):
                e = idx[:, k].clamp(min=0)
                eo = (x.float() * scale_of(e).float()[:, None]).to(self.dtype).float()
                prod = w[:, k:k + 1] * eo
                take = ((owner[:, k] == q) & has_row[:, k])[:, None]
                partial = partial + torch.where(take, prod, torch.zeros_like(prod))
            total = total + partial
        return total.to(self.dtype)


def check_dispatch(c, expert_x, spans):
    exp, filled = c.expert_rows()
    got_spans = spans.cpu()
    assert torch.equal(got_spans, c.spans()), (got_spans, c.spans())
    assert torch.equal(expert_x.cpu()[filled], exp[filled])


def check_combined(c, out, exact=True):
    ref = c.combined()
    got = out.cpu()
    assert got.shape == ref.shape and got.dtype == ref.dtype
    if exact:
        assert torch.equal(got, ref), (got - ref).abs().max()
    else:
        # fma against mul + add: a few f32 ulps in a partial, at most one output rounding.
        rtol = 2.0 ** -7 if c.dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(got.float(), ref.float(), rtol=rtol, atol=1e-4)


def roundtrip(buf, c, mode):
    x, idx, w = c.mine()
    expert_x, spans, handle = buf.dispatch(x, idx, w, mode)
    assert expert_x.shape == (buf.rows_max, buf.hidden) and expert_x.dtype == buf.dtype
    assert spans.shape == (buf.num_local_experts, 2) and spans.dtype == torch.int32
    assert spans.is_cuda and handle.tokens == x.shape[0]
    expert_out = run_experts(expert_x, spans, expert_scales(c.rank, c.n_local))
    out = buf.combine(expert_out, handle)
    symm.synchronize()
    return expert_x, spans, out


@pytest.mark.parametrize("mode", ["normal", "low_latency"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("topk", [1, 8])
def test_dispatch_combine_random_routing(mode, dtype, topk):
    w = symm.world_size()
    experts = w * local_experts(w, topk)
    tokens_max, hidden = 96, 256
    buf = symm.moe.Buffer(experts, topk, tokens_max, hidden, dtype=dtype)
    assert buf.rows_max == w * tokens_max * topk
    for case in range(3):
        c = Case(100 * topk + case, w, experts, topk, tokens_max, hidden, dtype, buf.rows_max)
        expert_x, spans, out = roundtrip(buf, c, mode)
        check_dispatch(c, expert_x, spans)
        check_combined(c, out)
    assert buf.status() == (0, 0)


@pytest.mark.parametrize("zero_rank", [0, -1, "all"])
@pytest.mark.parametrize("mode", ["normal", "low_latency"])
def test_zero_tokens_on_a_rank(zero_rank, mode):
    w = symm.world_size()
    experts, topk = w * local_experts(w, 4), 4
    buf = symm.moe.Buffer(experts, topk, 64, 128)
    c = Case(7, w, experts, topk, 64, 128, torch.bfloat16, buf.rows_max, zero_rank=zero_rank)
    expert_x, spans, out = roundtrip(buf, c, mode)
    check_dispatch(c, expert_x, spans)
    check_combined(c, out)
    if zero_rank == "all":
        assert out.shape == (0, 128)
        assert int(spans[:, 1].sum()) == 0


def test_random_f32_weights_within_an_ulp():
    w = symm.world_size()
    experts, topk = w * local_experts(w, 8), 8
    for dtype in (torch.bfloat16, torch.float32):
        buf = symm.moe.Buffer(experts, topk, 128, 512, dtype=dtype)
        for mode in ("normal", "low_latency"):
            c = Case(11, w, experts, topk, 128, 512, dtype, buf.rows_max, dyadic=False)
            expert_x, spans, out = roundtrip(buf, c, mode)
            check_dispatch(c, expert_x, spans)
            check_combined(c, out, exact=False)


def test_modes_give_the_same_bits():
    w = symm.world_size()
    experts, topk = w * local_experts(w, 4), 4
    buf = symm.moe.Buffer(experts, topk, 128, 256)
    c = Case(13, w, experts, topk, 128, 256, torch.bfloat16, buf.rows_max, dyadic=False)
    outs = []
    for mode in ("normal", "low_latency", "normal"):
        expert_x, spans, out = roundtrip(buf, c, mode)
        check_dispatch(c, expert_x, spans)
        outs.append(out)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_invalid_indices_and_dropped_rows_are_counted():
    w = symm.world_size()
    experts, topk, tokens_max, hidden = w * local_experts(w, 4), 4, 64, 64
    rows_max = max(8, tokens_max * topk // 4)
    buf = symm.moe.Buffer(experts, topk, tokens_max, hidden, rows_max=rows_max)
    assert buf.rows_max == rows_max
    for mode in ("normal", "low_latency"):
        c = Case(17, w, experts, topk, tokens_max, hidden, torch.bfloat16, rows_max,
                 invalid=True, counts=[tokens_max] * w)
        expert_x, spans, out = roundtrip(buf, c, mode)
        check_dispatch(c, expert_x, spans)
        check_combined(c, out)
        assert c.dropped() > 0
        assert buf.status() == (c.invalid(), c.dropped())
        assert buf.status() == (0, 0)


def test_graph_capture_and_replay():
    w, r = symm.world_size(), symm.rank()
    experts, topk, tokens_max, hidden = w * local_experts(w, 8), 8, 64, 256
    buf = symm.moe.Buffer(experts, topk, tokens_max, hidden)
    counts = [min(tokens_max // 2 + p, tokens_max) for p in range(w)]
    cases = [Case(200 + i, w, experts, topk, tokens_max, hidden, torch.bfloat16, buf.rows_max,
                  counts=counts) for i in range(4)]
    x, idx, wt = (t.clone() for t in cases[0].mine())
    scales = expert_scales(r, buf.num_local_experts)
    for mode in ("normal", "low_latency"):
        # The first call runs eagerly.
        roundtrip(buf, cases[0], mode)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.graph(g, stream=s):
            expert_x, spans, handle = buf.dispatch(x, idx, wt, mode)
            out = buf.combine(run_experts(expert_x, spans, scales), handle)
        for c in cases[1:] + cases[:1]:
            for dst, src in zip((x, idx, wt), c.mine()):
                dst.copy_(src)
            g.replay()
            torch.cuda.synchronize()
            symm.check()
            check_dispatch(c, expert_x, spans)
            check_combined(c, out)
        del g
    assert buf.status() == (0, 0)


def test_a_buffer_made_while_capturing_is_refused_and_the_job_goes_on():
    w = symm.world_size()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with pytest.raises(symm.SymmError, match="before capturing"):
        with torch.cuda.graph(g, stream=s):
            symm.moe.Buffer(w * 2, 2, 16, 32)
    torch.cuda.synchronize()
    buf = symm.moe.Buffer(w * 2, 2, 16, 32)
    c = Case(29, w, w * 2, 2, 16, 32, torch.bfloat16, buf.rows_max, counts=[8] * w)
    expert_x, spans, out = roundtrip(buf, c, "normal")
    check_dispatch(c, expert_x, spans)
    check_combined(c, out)


def test_stale_handles_and_bad_arguments_are_refused():
    w = symm.world_size()
    experts, topk = w * 2, 2
    buf = symm.moe.Buffer(experts, topk, 16, 32)
    c = Case(23, w, experts, topk, 16, 32, torch.bfloat16, buf.rows_max, counts=[16] * w)
    x, idx, wt = c.mine()
    _, _, h1 = buf.dispatch(x, idx, wt)
    expert_x, spans, h2 = buf.dispatch(x, idx, wt)
    with pytest.raises(ValueError, match="stale"):
        buf.combine(expert_x, h1)
    with pytest.raises(TypeError, match="DispatchHandle"):
        buf.combine(expert_x, None)
    with pytest.raises(TypeError, match="x must be torch.bfloat16"):
        buf.dispatch(x.float(), idx, wt)
    with pytest.raises(TypeError, match="topk_idx must be torch.int64"):
        buf.dispatch(x, idx.int(), wt)
    with pytest.raises(ValueError, match="x is on cpu"):
        buf.dispatch(x.cpu(), idx, wt)
    with pytest.raises(ValueError, match="contiguous"):
        buf.dispatch(x.t().contiguous().t(), idx, wt)
    with pytest.raises(ValueError, match="17 tokens"):
        buf.dispatch(torch.cat([x, x[:1]]), torch.cat([idx, idx[:1]]), torch.cat([wt, wt[:1]]))
    with pytest.raises(ValueError, match="expert_out has shape"):
        buf.combine(expert_x[:1], h2)
    with pytest.raises(TypeError, match="bfloat16 or torch.float32"):
        symm.moe.Buffer(experts, topk, 16, 32, dtype=torch.float16)
    with pytest.raises(ValueError, match="multiple of the world size"):
        symm.moe.Buffer(w * 2 + 1 if w > 1 else 0, topk, 16, 32)
    # The refused calls reached nothing: the pending dispatch still combines.
    out = buf.combine(run_experts(expert_x, spans, expert_scales(c.rank, c.n_local)), h2)
    symm.synchronize()
    check_dispatch(c, expert_x, spans)
    check_combined(c, out)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_all_to_allv_with_device_counts(dtype):
    w, r = symm.world_size(), symm.rank()

    def counts_of(p):
        return [(3 * p + 5 * q) % 7 + (q == p) for q in range(w)]

    def block(p, q):
        n = counts_of(p)[q]
        return (torch.arange(n) + 100 * p + 10 * q).to(dtype)

    # The layer is collective: every rank asks for the same bound.
    out_max = max(sum(counts_of(p)[q] for p in range(w)) for q in range(w)) + 5
    inp = torch.cat([block(r, q) for q in range(w)]).cuda()
    for _ in range(2):
        # The counts come from a kernel: the host never sees them.
        send = torch.tensor(counts_of(r), dtype=torch.int64).cuda() * 1
        output, recv = symm.moe.all_to_allv(inp, send, out_max)
        symm.synchronize()
        want = [counts_of(p)[r] for p in range(w)]
        assert recv.cpu().tolist() == want
        expected = torch.cat([block(p, r) for p in range(w)])
        assert torch.equal(output[:expected.numel()].cpu(), expected)
    assert output.shape == (out_max,) and output.dtype == dtype


def test_all_to_allv_drops_past_the_output():
    w, r = symm.world_size(), symm.rank()
    a = symm.moe.AllToAllv(4, torch.float32)
    n = 3
    inp = torch.full((n * w,), float(r + 1), device="cuda")
    send = torch.full((w,), n, dtype=torch.int64, device="cuda")
    output, recv = a(inp, send)
    symm.synchronize()
    got = recv.cpu().tolist()
    assert sum(got) == min(4, n * w)
    assert a.dropped() == n * w - sum(got)
    assert a.dropped() == 0
    pos = 0
    for p, k in enumerate(got):
        assert torch.equal(output[pos:pos + k].cpu(), torch.full((k,), float(p + 1)))
        pos += k

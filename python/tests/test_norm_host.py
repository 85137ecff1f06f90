"""The fused all-reduce + RMSNorm's host reference (``symm._symm.norm_reference``, symm-core's
``norm``) against the rules written out again here with numpy, bit for bit, and its refusals."""

import pytest

import symm
from symm import _symm

np = pytest.importorskip("numpy")

THREADS = 256


def bf16_bits(f):
    """float32 array -> bf16 bits, round to nearest even (every NaN the one NaN, 0x7fc0)."""
    x = np.asarray(f, dtype=np.float32).view(np.uint32).astype(np.uint64)
    r = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16).astype(np.uint16)
    nan = np.isnan(np.asarray(f, dtype=np.float32))
    return np.where(nan, np.uint16(0x7FC0), r)


def bf16_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def reference(xs, res, w, eps):
    hidden = w.size
    rows = res.size // hidden
    res_out = np.empty_like(res)
    out = np.empty_like(res)
    f = np.float32
    for r in range(rows):
        sl = slice(r * hidden, (r + 1) * hidden)
        s = bf16_f32(xs[0][sl])
        for x in xs[1:]:
            s = (s + bf16_f32(x[sl])).astype(f)
        h = bf16_bits((s + bf16_f32(res[sl])).astype(f))
        res_out[sl] = h
        hf = bf16_f32(h)
        part = np.zeros(THREADS, dtype=f)
        for v in range(hidden // 8):
            for e in hf[v * 8:(v + 1) * 8]:
                part[v % THREADS] = f(part[v % THREADS] + f(e * e))
        s2 = THREADS // 2
        while s2:
            part[:s2] = (part[:s2] + part[s2:2 * s2]).astype(f)
            s2 //= 2
        rstd = f(f(1.0) / np.sqrt(f(f(part[0] / f(hidden)) + f(eps))))
        n = bf16_f32(bf16_bits((hf * rstd).astype(f)))
        out[sl] = bf16_bits((n * bf16_f32(w)).astype(f))
    return res_out, out


@pytest.mark.parametrize("world,rows,hidden", [(1, 1, 8), (2, 3, 64), (4, 2, 4096),
                                               (3, 1, 8200)])
def test_the_reference_is_the_rules_bit_for_bit(world, rows, hidden):
    rng = np.random.default_rng(world * 1000 + hidden)
    n = rows * hidden
    xs = [bf16_bits(rng.standard_normal(n).astype(np.float32) * 3) for _ in range(world)]
    res = bf16_bits(rng.standard_normal(n).astype(np.float32))
    w = bf16_bits(rng.standard_normal(hidden).astype(np.float32))
    got_res, got_out = _symm.norm_reference([x.tobytes() for x in xs], res.tobytes(),
                                            w.tobytes(), 1e-5)
    want_res, want_out = reference(xs, res, w, 1e-5)
    assert np.frombuffer(got_res, dtype=np.uint16).tolist() == want_res.tolist()
    assert np.frombuffer(got_out, dtype=np.uint16).tolist() == want_out.tolist()


def test_nan_and_infinity_give_the_one_nan():
    hidden = 16
    f = np.float32
    xs = [bf16_bits(np.zeros(hidden, f)) for _ in range(2)]
    xs[0][3] = 0xFFC1  # a negative NaN with a payload
    xs[1][5] = bf16_bits(np.array([np.inf], f))[0]
    res = bf16_bits(np.zeros(hidden, f))
    w = bf16_bits(np.ones(hidden, f))
    for eps in (0.0, 1e-6):
        got_res, got_out = _symm.norm_reference([x.tobytes() for x in xs], res.tobytes(),
                                                w.tobytes(), eps)
        want_res, want_out = reference(xs, res, w, eps)
        assert np.frombuffer(got_res, dtype=np.uint16).tolist() == want_res.tolist()
        assert np.frombuffer(got_out, dtype=np.uint16).tolist() == want_out.tolist()
        assert set(np.frombuffer(got_out, dtype=np.uint16).tolist()) == {0x7FC0}


def test_the_reference_refuses_bad_shapes():
    z8, z16 = bytes(16), bytes(32)
    with pytest.raises(ValueError, match="multiple of 8"):
        _symm.norm_reference([bytes(24)], bytes(24), bytes(24), 1e-6)
    with pytest.raises(ValueError, match="whole bf16"):
        _symm.norm_reference([z16], z16, bytes(15), 1e-6)
    with pytest.raises(ValueError, match="no rank"):
        _symm.norm_reference([], z16, z8, 1e-6)
    with pytest.raises(ValueError, match="elements"):
        _symm.norm_reference([z8], z16, z8, 1e-6)
    for eps in (float("nan"), -1.0, float("inf")):
        with pytest.raises(ValueError, match="epsilon"):
            _symm.norm_reference([z16], z16, z8, eps)


def test_the_fused_op_needs_a_job():
    with pytest.raises(symm.SymmError, match="not initialized"):
        symm.fused_all_reduce_rmsnorm(None, None, None)


def test_the_fused_bench_table():
    from symm import bench_fused

    doc = {"world": 2, "hidden": 8192, "samples": [
        {"tokens": 1, "mode": "graph", "way": "nccl", "us": 30.0, "wrong": 0},
        {"tokens": 1, "mode": "graph", "way": "symm", "us": 20.0, "wrong": 0},
        {"tokens": 1, "mode": "graph", "way": "symm_fused", "us": 10.0, "wrong": 0},
        {"tokens": 8, "mode": "eager", "way": "symm_fused", "us": 12.5, "wrong": 0}]}
    md = bench_fused.table(doc).splitlines()
    assert md[2] == ("| tokens | mode | nccl | symm | symm_fused | symm / symm_fused | "
                     "best unfused / symm_fused |")
    assert md[4] == "| 1 | graph | 30.00 | 20.00 | 10.00 | 2.00 | 2.00 |"
    assert md[5] == "| 8 | eager | - | - | 12.50 | - | - |"

"""symm.layer and ``python -m symm.bench --layer`` without a GPU: the shape checks and the
argument parsing need nothing; the sharded layer against the unsharded one runs on torch's CPU
where torch is installed (skipped where it is not).
"""

import subprocess
import sys

import pytest

from symm import bench, bench_layer
from symm.layer import LLAMA_70B, LayerShape

SMALL = LayerShape(hidden=256, heads=8, kv_heads=4, intermediate=512)


@pytest.fixture
def torch():
    return pytest.importorskip("torch")


def test_layer_imports_without_torch():
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import symm.layer, symm.bench\n"
        "symm.layer.LLAMA_70B.check(8)\n"
        "assert 'torch' not in sys.modules\n"
        "print(symm.layer.LLAMA_70B.head_dim)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "128"


def test_llama_70b_splits_over_worlds_dividing_eight():
    assert (LLAMA_70B.hidden, LLAMA_70B.heads, LLAMA_70B.kv_heads, LLAMA_70B.head_dim,
            LLAMA_70B.intermediate, LLAMA_70B.eps) == (8192, 64, 8, 128, 28672, 1e-5)
    for world in (1, 2, 4, 8):
        LLAMA_70B.check(world)
    for world in (3, 16):
        with pytest.raises(ValueError, match="does not split over"):
            LLAMA_70B.check(world)


@pytest.mark.parametrize("shape, world, match", [
    (LayerShape(hidden=384, heads=6, kv_heads=2, intermediate=512), 4, "heads 6 does not split"),
    (LayerShape(hidden=256, heads=8, kv_heads=2, intermediate=512), 4,
     "kv_heads 2 does not split"),
    (LayerShape(hidden=256, heads=8, kv_heads=4, intermediate=510), 4,
     "intermediate 510 does not split"),
    (LayerShape(hidden=250, heads=8, kv_heads=4, intermediate=512), 1,
     "hidden 250 is not a multiple of heads"),
    (LayerShape(hidden=256, heads=8, kv_heads=3, intermediate=512), 1,
     "heads 8 is not a multiple of kv_heads 3"),
    (LayerShape(hidden=24, heads=8, kv_heads=4, intermediate=512), 1, "must be even"),
    (LayerShape(hidden=256, heads=0, kv_heads=4, intermediate=512), 1, "heads must be a positive"),
    (SMALL, 0, "world must be a positive"),
])
def test_bad_shapes_raise_value_error(shape, world, match):
    with pytest.raises(ValueError, match=match):
        shape.check(world)


@pytest.mark.parametrize("tokens", ["0", "-1", "1,,8", "8,x", "", "1,1", "65537"])
def test_layer_tokens_rejected(tokens, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--layer", "--layer-tokens", tokens])
    assert e.value.code == 2
    assert "--layer-tokens" in capsys.readouterr().err


def test_layer_tokens_parsed():
    assert bench_layer.parse_tokens("1,8,512") == [1, 8, 512]
    assert list(bench_layer.TOKENS) == [1, 8, 32, 128, 512]


@pytest.mark.parametrize("shape", ["1024,16,8", "1024,16,8,2816,1", "1000,16,8,2816",
                                   "a,16,8,2816"])
def test_layer_shape_rejected(shape, capsys):
    with pytest.raises(SystemExit) as e:
        bench.main(["--layer", "--layer-shape", shape])
    assert e.value.code == 2
    assert "--layer-shape" in capsys.readouterr().err


def test_layer_shape_parsed():
    s = bench_layer.parse_shape("1024,16,8,2816")
    assert (s.hidden, s.heads, s.kv_heads, s.intermediate, s.head_dim) == (1024, 16, 8, 2816, 64)


def test_table_reports_added_time_and_ratio():
    def smp(t, mode, backend, us, added, wrong=0, variant=None):
        s = {"tokens": t, "mode": mode, "backend": backend, "us": us, "added_us": added,
             "wrong": None if backend == "none" else wrong}
        if variant:
            s["variant"] = variant
        return s

    doc = {"world": 4, "topology": "nvlink", "plans": "auto",
           "shape": {"hidden": 8192, "heads": 64, "kv_heads": 8, "head_dim": 128,
                     "intermediate": 28672},
           "samples": [smp(1, "eager", "none", 100.0, 0.0), smp(1, "eager", "nccl", 140.0, 40.0),
                       smp(1, "eager", "torch_symm", 120.0, 20.0, variant="one_shot"),
                       smp(1, "eager", "symm", 110.0, 10.0),
                       smp(8, "graph", "none", 100.0, 0.0), smp(8, "graph", "nccl", 130.0, 30.0),
                       smp(1, "eager", "symm_pool", 105.0, 5.0),
                       smp(8, "graph", "symm", 125.0, 25.0, wrong=3)]}
    md = bench_layer.table(doc).splitlines()
    assert md[2] == ("| tokens | mode | none | nccl | torch_symm | symm | symm_pool | symm_fused | "
                     "symm / best peer (added) | symm_pool / best peer (added) | "
                     "symm_fused / best peer (added) |")
    assert md[4] == ("| 1 | eager | 100.0 | 140.0 (+40.0) | 120.0 (+20.0) one-shot | "
                     "110.0 (+10.0) | 105.0 (+5.0) | - | 0.50 | 0.25 | - |")
    assert md[5] == ("| 8 | graph | 100.0 | 130.0 (+30.0) | - | 125.0 (+25.0) **wrong** | - | - | "
                     "0.83 | - | - |")


def test_sharded_layer_equals_unsharded(torch):
    from symm.layer import make_weights, reference, run_sharded_on_host

    w = make_weights(SMALL, seed=3, dtype=torch.float32)
    for tokens in (1, 17):
        g = torch.Generator().manual_seed(tokens)
        x = torch.randn(tokens, SMALL.hidden, generator=g)
        ref = reference(w, SMALL, x)
        assert ref.shape == (tokens, SMALL.hidden) and torch.isfinite(ref).all()
        for world in (1, 2, 4):
            outs = run_sharded_on_host(w, SMALL, world, x)
            for out in outs:
                torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_every_partial_matters(torch):
    """Without the all-reduce (each rank's partial alone) the output is far from the layer's."""
    from symm.layer import Layer, compare, make_weights, reference

    w = make_weights(SMALL, seed=3, dtype=torch.float32)
    x = torch.randn(5, SMALL.hidden, generator=torch.Generator().manual_seed(0))
    ref = reference(w, SMALL, x)
    for rank in range(2):
        out = Layer(SMALL, w, rank, 2)(x)
        wrong, rel = compare(out, ref)
        assert wrong > out.numel() // 2 and rel > 0.1


def test_bf16_sharded_layer_within_compare_tolerance(torch):
    from symm.layer import compare, make_weights, reference, run_sharded_on_host

    w = make_weights(SMALL, seed=5)
    assert w["q"].dtype == torch.bfloat16
    x = torch.randn(32, SMALL.hidden, generator=torch.Generator().manual_seed(1))
    x = x.to(torch.bfloat16)
    ref = reference(w, SMALL, x)
    for world in (2, 4):
        for out in run_sharded_on_host(w, SMALL, world, x):
            wrong, rel = compare(out, ref)
            assert wrong == 0 and rel < 0.01
    out[3, 7] = float("nan")
    assert compare(out, ref)[0] == 1


def test_weights_follow_the_seed(torch):
    from symm.layer import make_weights

    a, b = make_weights(SMALL, seed=1), make_weights(SMALL, seed=1)
    c = make_weights(SMALL, seed=2)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["down"], c["down"])
    assert a["gate"].shape == (SMALL.intermediate, SMALL.hidden)
    assert a["k"].shape == (SMALL.kv_heads * SMALL.head_dim, SMALL.hidden)


def test_shards_are_slices_of_the_full_weights(torch):
    from symm.layer import make_weights, shard

    w = make_weights(SMALL, seed=1)
    s = shard(w, SMALL, 1, 2)
    d = SMALL.head_dim
    assert torch.equal(s["qkv"][: 4 * d], w["q"][4 * d: 8 * d])
    assert torch.equal(s["qkv"][4 * d: 6 * d], w["k"][2 * d: 4 * d])
    assert torch.equal(s["qkv"][6 * d:], w["v"][2 * d: 4 * d])
    assert torch.equal(s["o"], w["o"][:, 4 * d:])
    assert torch.equal(s["gate_up"][:256], w["gate"][256:])
    assert torch.equal(s["down"], w["down"][:, 256:])
    with pytest.raises(ValueError, match="rank 2"):
        shard(w, SMALL, 2, 2)


def test_layer_rejects_bad_input(torch):
    from symm.layer import Layer, make_weights

    layer = Layer(SMALL, make_weights(SMALL, dtype=torch.float32), 0, 1, max_tokens=8)
    for bad in (torch.zeros(9, SMALL.hidden), torch.zeros(4, SMALL.hidden + 1),
                torch.zeros(0, SMALL.hidden)):
        with pytest.raises(ValueError, match="x must be"):
            layer(bad)


def test_torch_symm_backend_copies_through_alternating_buffers(torch):
    from types import SimpleNamespace

    seen = []

    class Ops:
        def one_shot_all_reduce(self, b, op, group):
            seen.append(("one", b.data_ptr(), b.numel(), op, group))
            return b * 2

        def two_shot_all_reduce_(self, b, op, group):
            seen.append(("two", b.data_ptr(), b.numel(), op, group))
            b.mul_(3)

    fake = SimpleNamespace(ops=SimpleNamespace(symm_mem=Ops()))
    bufs = [torch.zeros(64), torch.zeros(64)]
    for one_shot, factor in ((True, 2), (False, 3)):
        seen.clear()
        ar = bench_layer._TorchSymm(fake, bufs, "g0", one_shot)
        t = torch.arange(12.0).reshape(3, 4)
        ar(t)
        ar(t)
        assert torch.equal(t, torch.arange(12.0).reshape(3, 4) * factor * factor)
        assert [s[1] for s in seen] == [bufs[0].data_ptr(), bufs[1].data_ptr()]
        assert all(s[2:] == (12, "sum", "g0") for s in seen)


def test_the_bench_prints_deterministic_modes_cost_and_pinned_nccls_ratio(capsys):
    from symm import bench

    by = {
        (4096, "eager"): {"symm": 10.0, "torch_two_shot": 9.0, "nccl_pinned": 30.0,
                          "symm_deterministic": 9.9},
        (4096, "graph"): {"symm": 5.0},
    }
    bench._print_deterministic(by)
    out = capsys.readouterr().out.splitlines()
    # One row, for the size and mode that timed the mode: 9.9 / 9.0 and 30 / 9.9.
    assert len(out) == 2, out
    assert "cost  1.10" in out[1] and "pinned NCCL  3.03" in out[1], out

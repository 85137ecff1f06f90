"""The tensor-parallel decoder layer of symm.layer with symm's all-reduce, under torchrun:

    torchrun --nproc-per-node N -m pytest python/tests_gpu/test_layer.py -q

A small layer (hidden 1024, 16 query and 8 key/value heads, MLP 2816, bf16) sharded over the
ranks, its two all-reduces run by :func:`symm.all_reduce` on the plain tensors the projections
return, must match the unsharded layer on every rank (within :func:`symm.layer.compare`'s bf16
tolerance), eager and replayed from a CUDA graph with new inputs. N must divide 8. The last
test runs ``python -m symm.bench --layer`` on the same small layer.
"""

import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import gc  # noqa: E402
import json  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import symm  # noqa: E402
from symm import bench  # noqa: E402
from symm.layer import Layer, LayerShape, compare, make_weights, reference  # noqa: E402

if "WORLD_SIZE" not in os.environ:
    pytest.skip("run under torchrun", allow_module_level=True)

SHAPE = LayerShape(hidden=1024, heads=16, kv_heads=8, intermediate=2816)
TOKENS = (1, 8, 64)


@pytest.fixture(scope="module", autouse=True)
def job():
    # The session's process group (conftest.py).
    symm.init(timeout=10.0)
    yield
    symm.finalize()


@pytest.fixture(scope="module")
def model():
    w, r = symm.world_size(), symm.rank()
    if 8 % w:
        pytest.skip(f"the layer's 8 key/value heads do not split over {w} ranks")
    weights = make_weights(SHAPE, seed=7, device=symm.device())
    layer = Layer(SHAPE, weights, r, w, lambda t: symm.all_reduce(t), max_tokens=max(TOKENS))
    return weights, layer


def inputs(tokens, salt):
    g = torch.Generator(device=symm.device())
    g.manual_seed(1000 * salt + tokens)
    return torch.randn(tokens, SHAPE.hidden, generator=g, device=symm.device(),
                       dtype=torch.bfloat16)


@pytest.mark.parametrize("tokens", TOKENS)
def test_eager_layer_matches_unsharded(model, tokens):
    weights, layer = model
    x = inputs(tokens, 0)
    out = layer(x)
    symm.synchronize()
    wrong, rel = compare(out, reference(weights, SHAPE, x))
    assert (wrong, out.shape) == (0, x.shape), f"rank {symm.rank()}: rel err {rel}"


def test_without_the_all_reduce_the_check_fails(model):
    weights, layer = model
    if symm.world_size() == 1:
        pytest.skip("one rank holds the whole layer")
    x = inputs(8, 0)
    alone = Layer(SHAPE, weights, symm.rank(), symm.world_size(), None)
    assert compare(alone(x), reference(weights, SHAPE, x))[0] > 0


@pytest.mark.parametrize("tokens", TOKENS)
def test_graph_of_the_layer_replays_with_new_inputs(model, tokens):
    weights, layer = model
    x = inputs(tokens, 0).clone()
    layer(x)  # symm admits its plans before the capture
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        out = layer(x)
    for salt in (1, 2, 3):
        x.copy_(inputs(tokens, salt))
        out.zero_()
        g.replay()
        torch.cuda.synchronize()
        symm.check()
        wrong, rel = compare(out, reference(weights, SHAPE, x))
        assert wrong == 0, f"rank {symm.rank()}, replay {salt}: rel err {rel}"
    del g
    gc.collect()


def test_layer_bench_runs_and_checks_every_cell(model, tmp_path):
    out = tmp_path / "bench"
    rc = bench.main(["--layer", "--layer-shape", "1024,16,8,2816", "--layer-tokens", "1,8,64",
                     "--iters", "4", "--warmup", "1", "--graph-calls", "2", "--out", str(out)])
    assert rc == 0
    if symm.rank() != 0:
        return
    w = symm.world_size()
    doc = json.loads((out / f"bench-layer-w{w}.json").read_text())
    assert (out / f"bench-layer-w{w}.md").read_text().startswith("Decoder layer (hidden 1024")
    cells = {(s["tokens"], s["mode"], s["backend"]): s for s in doc["samples"]}
    for t in (1, 8, 64):
        for mode in ("eager", "graph"):
            assert cells[(t, mode, "none")]["added_us"] == 0.0
            for b in ("symm", "symm_pool", "symm_fused"):
                s = cells[(t, mode, b)]
                assert s["wrong"] == 0 and s["us"] > 0 and s["added_us"] is not None, s
    assert not any(s["wrong"] for s in doc["samples"]), doc["notes"]

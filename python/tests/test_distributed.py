"""The torch.distributed backend without a GPU: the routing table and the options (no torch),
then registration, torch's semantics for CPU tensors, errors, and the hierarchical
collectives' arithmetic (with torch, in processes of a CPU job; skipped without torch).
"""

import json
import os

os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import subprocess  # noqa: E402
import sys  # noqa: E402

import pytest  # noqa: E402

from symm.distributed import Group, OptionError, Options, RouteError, route  # noqa: E402

ONE_HOST = Group(4)
TWO_HOSTS = Group(4, hosts=2)


@pytest.mark.parametrize("op,kw,path", [
    ("allreduce", {"dtype": "bfloat16", "reduce": "sum"}, "symm"),
    ("allreduce", {"dtype": "float32", "reduce": "avg"}, "symm"),
    ("allreduce", {"dtype": "int32", "reduce": "avg"}, "nccl"),
    ("allreduce", {"dtype": "float32", "reduce": "premul_sum"}, "nccl"),
    ("allreduce", {"dtype": "float32", "reduce": "band"}, "nccl"),
    ("allreduce", {"dtype": "float8_e4m3fn", "reduce": "sum"}, "nccl"),
    ("allreduce", {"dtype": "bool", "reduce": "max"}, "nccl"),
    ("allreduce", {"dtype": "float32", "reduce": "sum", "tensors": 2}, "nccl"),
    ("allreduce", {"dtype": "float32", "reduce": "sum", "contiguous": False}, "nccl"),
    ("allreduce", {"dtype": "float32", "reduce": "sum", "device": "cpu"}, "gloo"),
    ("_allgather_base", {"dtype": "float16"}, "symm"),
    ("_reduce_scatter_base", {"dtype": "float32", "reduce": "max"}, "symm"),
    ("alltoall_base", {"dtype": "float32"}, "symm"),
    ("alltoall_base", {"dtype": "float32", "even": False}, "nccl"),
    ("broadcast", {"dtype": "int64"}, "symm"),
    ("reduce", {"dtype": "float32", "reduce": "product"}, "symm"),
    ("send", {"dtype": "float32"}, "nccl"),
    ("recv", {"dtype": "float32", "device": "cpu"}, "gloo"),
    ("gather", {"dtype": "float32"}, "symm"),
    ("scatter", {"dtype": "bfloat16"}, "symm"),
    ("alltoall", {"dtype": "float32"}, "nccl"),
    ("allreduce_coalesced", {"dtype": "float32", "reduce": "sum", "tensors": 3}, "symm"),
    ("allgather_into_tensor_coalesced", {"dtype": "float32", "tensors": 2}, "symm"),
    ("barrier", {}, "gloo"),
    ("some_future_op", {"dtype": "float32"}, "nccl"),
])
def test_route_one_host(op, kw, path):
    r = route(op, ONE_HOST, **kw)
    assert r.path == path, r
    assert r.reason


def test_table_names_what_core_serves():
    import symm
    from symm.distributed import OPS
    from symm.distributed._route import DTYPES, REDUCE

    names = symm.names()
    for op, row in OPS.items():
        assert row.collective in (None, "barrier") or row.collective in names["collectives"], op
    assert set(DTYPES.values()) <= set(names["dtypes"]) and "bf16" in DTYPES.values()
    assert set(REDUCE.values()) <= set(names["ops"]) and REDUCE["avg"] == "sum"


def test_route_two_hosts():
    # all-reduce, reduce-scatter, all-gather are hierarchical; the rest go to NCCL whole.
    assert route("allreduce", TWO_HOSTS, dtype="float32", reduce="sum",
                 elements=8).path == "hier"
    r = route("allreduce", TWO_HOSTS, dtype="float32", reduce="sum", elements=7)
    assert r.path == "nccl" and "divide" in r.reason
    assert route("_reduce_scatter_base", TWO_HOSTS, dtype="bfloat16", reduce="sum",
                 elements=3).path == "hier"
    assert route("_allgather_base", TWO_HOSTS, dtype="bfloat16", elements=3).path == "hier"
    assert route("broadcast", TWO_HOSTS, dtype="float32").path == "nccl"
    assert route("alltoall_base", TWO_HOSTS, dtype="float32").path == "nccl"
    assert route("allreduce_coalesced", TWO_HOSTS, dtype="float32", reduce="sum",
                 tensors=2).path == "nccl"
    scattered = Group(4, hosts=2, host_major=False)
    r = route("allreduce", scattered, dtype="float32", reduce="sum", elements=8)
    assert r.path == "nccl" and "host by host" in r.reason
    # CPU tensors stay on gloo whatever the placement.
    assert route("allreduce", TWO_HOSTS, device="cpu", dtype="float32").path == "gloo"


def test_route_group_of_one_and_no_engine():
    assert route("allreduce", Group(1), dtype="float32", reduce="sum").path == "local"
    assert route("send", Group(1), dtype="float32").path == "nccl"
    alone = Group(2, engine=False)
    assert route("allreduce", alone, dtype="float32", reduce="sum").path == "symm"
    with pytest.raises(RouteError) as e:
        route("send", alone, dtype="float32")
    assert e.value.op == "send" and "no engine" in str(e.value)
    with pytest.raises(RouteError, match="meta tensors"):
        route("allreduce", ONE_HOST, device="meta", dtype="float32", reduce="sum")


def test_options_from_env():
    o = Options.from_env({})
    assert (o.engine, o.heap_bytes, o.group_heap_bytes, o.debug, o.host_size) == \
        ("nccl", 1 << 30, 256 << 20, False, None)
    o = Options.from_env({"SYMM_DIST_ENGINE": "none", "SYMM_DIST_HEAP": "4096",
                          "SYMM_DIST_GROUP_HEAP": "8192", "SYMM_DIST_TIMEOUT": "2.5",
                          "SYMM_DIST_DEBUG": "1", "SYMM_DIST_HOST_SIZE": "2"})
    assert (o.engine, o.heap_bytes, o.group_heap_bytes, o.timeout, o.debug, o.host_size) == \
        ("none", 4096, 8192, 2.5, True, 2)
    # Given fields win over the environment.
    assert Options.from_env({"SYMM_DIST_ENGINE": "none"}, engine="nccl").engine == "nccl"


@pytest.mark.parametrize("var,value", [
    ("SYMM_DIST_ENGINE", "mpi"),
    ("SYMM_DIST_ENGINE", "x" * 10000),
    ("SYMM_DIST_HEAP", "-1"),
    ("SYMM_DIST_HEAP", "0"),
    ("SYMM_DIST_HEAP", "1e9"),
    ("SYMM_DIST_HEAP", "9" * 40),
    ("SYMM_DIST_HEAP", "\u0661\u0662"),
    ("SYMM_DIST_GROUP_HEAP", ""),
    ("SYMM_DIST_TIMEOUT", "nan"),
    ("SYMM_DIST_TIMEOUT", "inf"),
    ("SYMM_DIST_TIMEOUT", "0"),
    ("SYMM_DIST_TIMEOUT", "soon"),
    ("SYMM_DIST_DEBUG", "yes"),
    ("SYMM_DIST_HOST_SIZE", "0"),
])
def test_options_refuse_bad_variables(var, value):
    with pytest.raises(OptionError) as e:
        Options.from_env({var: value})
    assert e.value.name == var
    assert len(str(e.value)) < 200


def test_options_refuse_bad_fields():
    with pytest.raises(OptionError, match="heap_bytes"):
        Options(heap_bytes=True)
    with pytest.raises(OptionError, match="not an option"):
        Options.from_env({}, heaps=3)
    with pytest.raises(OptionError, match="timeout"):
        Options(timeout=-1.0)


# -- with torch: processes of a CPU job ------------------------------------------------------

WORKER = os.path.join(os.path.dirname(__file__), "dist_worker.py")


def run_job(tmp_path, scenario, world, env=None):
    pytest.importorskip("torch")
    store = tmp_path / f"store-{scenario}"
    e = dict(os.environ, **(env or {}))
    procs = [subprocess.Popen([sys.executable, WORKER, scenario, str(r), str(world), str(store)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
             for r in range(world)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


def test_registered_on_import():
    torch = pytest.importorskip("torch")
    import torch.distributed as dist

    import symm  # noqa: F401

    assert "symm" in dist.Backend.backend_list
    assert dist.Backend.backend_capability["symm"] == ["cuda", "cpu"]
    # NCCL and gloo stay the defaults for their devices.
    assert dist.Backend.default_device_backend_map["cuda"] == "nccl"
    assert torch is not None


def test_cpu_semantics(tmp_path):
    world = 3
    outs = run_job(tmp_path, "cpu", world)
    for rank, o in enumerate(outs):
        assert o["backend"] == "cuda:symm,cpu:gloo" and o["name"] == "symm"
        assert o["all_reduce"] == [3 + 3 * i for i in range(6)]
        assert o["async_done"] and o["max"] == o["all_reduce"]
        assert o["all_gather_into_tensor"] == [float(r) for r in range(world) for _ in range(3)]
        assert o["all_gather"] == [[r, -r] for r in range(world)]
        assert o["broadcast"] == [10.0 * (world - 1)]
        assert o["objects"] == [{"rank": r} for r in range(world)]
        assert o["functional"] == [6.0, 6.0]
        assert o["ag_coalesced"] == [[float(r) for r in range(world) for _ in range(2)],
                                     [-1.0 - r for r in range(world)]]
        assert o["rs_coalesced"] == [[3.0, 3.0], [3.0 * rank]]
        # Every call on CPU tensors was served by gloo, and counted.
        assert set(o["paths"]) >= {"allreduce", "_allgather_base", "allgather", "broadcast",
                                   "barrier", "allgather_into_tensor_coalesced",
                                   "reduce_scatter_tensor_coalesced"}
        assert all(set(v) == {"gloo"} for v in o["paths"].values())
        assert o["paths"]["allreduce"]["gloo"] == 3
        if rank < 2:
            assert o["sub"] == [3.0] and o["sub_paths"] == {"allreduce": {"gloo": 1}}
        else:
            assert "sub" not in o
    assert outs[1]["recv"] == [42]


def test_errors_name_the_call_and_the_job_goes_on(tmp_path):
    outs = run_job(tmp_path, "errors", 2, {"SYMM_DIST_ENGINE": "none"})
    for o in outs:
        assert "allreduce" in o["meta"] and "meta tensors" in o["meta"]
        assert "rank" in o["meta"] and "symm backend" in o["meta"]
        assert o["after"] == [2.0, 2.0]


def test_bad_variable_fails_init(tmp_path):
    outs = run_job(tmp_path, "bad_option", 2, {"SYMM_DIST_HEAP": "12x"})
    for o in outs:
        assert o["error"] is not None
        assert "SYMM_DIST_HEAP" in o["error"] and "12x" in o["error"]


def test_hierarchical_collectives_match_flat(tmp_path):
    # Two "hosts" of two ranks, gloo standing in for symm and NCCL: all-reduce (sum, max),
    # reduce-scatter and all-gather equal the flat collectives (exactly for integers).
    for o in run_job(tmp_path, "hier", 4):
        assert o == {"int64": [True] * 4, "float32": [True] * 4}


def test_host_names_from_peers_are_bounded():
    # Host names come from peers through the store: a huge or undecodable name is cut and
    # read as text, and ranks are numbered by host in order of first appearance.
    pytest.importorskip("torch")
    from symm.distributed._group import _hosts

    class Store:
        def __init__(self, names):
            self.kv = {f"host/{g}": n for g, n in enumerate(names)}

        def set(self, k, v):
            pass

        def get(self, k):
            return self.kv[k]

    names = [b"\xff" * 100000, b"b", b"\xff" * 100000, b"b"]
    assert _hosts(Store(names), 1, 4, [0, 1, 2, 3], Options()) == [0, 1, 0, 1]
    assert _hosts(Store(names), 1, 4, [4, 5, 6, 7], Options(host_size=2)) == [0, 0, 1, 1]

"""The GPU API's error paths that need no GPU (and no torch)."""

import os
import subprocess
import sys

import pytest

import symm
from symm import _symm


def test_every_public_name_has_a_docstring():
    for name in symm.__all__:
        obj = getattr(symm, name)
        if callable(obj) or isinstance(obj, type):
            assert (obj.__doc__ or "").strip(), name


@pytest.mark.parametrize("call", [
    lambda: symm.all_reduce(None),
    lambda: symm.empty(4),
    lambda: symm.rank(),
    lambda: symm.check(),
    lambda: symm.heap_usage(),
    lambda: symm.mem_pool(),
])
def test_calls_before_init_raise_symm_error(call):
    with pytest.raises(symm.SymmError, match="not initialized"):
        call()


def test_all_reduce_is_the_runtimes_callable_and_hands_other_calls_to_the_full_path():
    import inspect

    from symm import _gpu

    # No Python frame on the repeated sum: the public name is the extension's function.
    assert symm.all_reduce is _symm.all_reduce
    assert str(inspect.signature(symm.all_reduce)) == (
        "(t, op='sum', *, stream=None, algorithm=None, channels=None, deterministic=False)")
    assert "in place" in symm.all_reduce.__doc__
    seen = []

    def full(t, *args, **kwargs):
        seen.append((t, args, kwargs))
        return "full"

    _symm.all_reduce_paths(full, _gpu._explain)
    try:
        # No job: every call is the full path's, arguments as given.
        assert symm.all_reduce(1) == "full"
        assert symm.all_reduce(2, "max", stream=3, deterministic=True) == "full"
        assert seen == [(1, (), {}), (2, ("max",), {"stream": 3, "deterministic": True})]
    finally:
        _symm.all_reduce_paths(_gpu._all_reduce, _gpu._explain)
    with pytest.raises(TypeError):
        symm.all_reduce()


def test_the_pool_allocator_refuses_without_a_job():
    # What torch's pluggable allocator calls, called as torch would (the extension's own
    # symbols): with no job serving, a segment is refused with a null pointer and the cause
    # kept; a free of an address that is no segment is ignored.
    import ctypes

    lib = ctypes.CDLL(_symm.__file__)
    lib.symm_pool_alloc.restype = ctypes.c_void_p
    lib.symm_pool_alloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.symm_pool_free.restype = None
    lib.symm_pool_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                   ctypes.c_void_p]
    _symm.pool_stop()
    assert lib.symm_pool_alloc(2 << 20, 0, None) is None
    assert "no symm job serves the pool" in _symm.pool_refusal()
    assert _symm.pool_refusal() is None
    lib.symm_pool_free(ctypes.c_void_p(0xDEAD0000), 2 << 20, 0, None)
    lib.symm_pool_free(None, 0, -1, None)
    assert lib.symm_pool_alloc(0, -7, ctypes.c_void_p(1)) is None
    assert _symm.pool_refusal() is not None


def test_importing_sets_multicast_off():
    assert os.environ["NCCL_NVLS_ENABLE"] == "0"
    assert os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert os.environ["NVSHMEM_DISABLE_NVLS"] == "1"


def run_init(env):
    code = "import symm\ntry:\n    symm.init()\nexcept Exception as e:\n" \
           "    print(type(e).__name__ + ': ' + str(e))\n"
    base = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "SYMM_JOB", "SYMM_TOKEN")}
    out = subprocess.run([sys.executable, "-c", code], env={**base, **env},
                         capture_output=True, text=True, timeout=60)
    return out.stdout.strip()


def test_init_reads_the_job_environment_strictly():
    assert run_init({}).startswith("ValueError: RANK is not set")
    assert run_init({"RANK": "01", "WORLD_SIZE": "2"}).startswith("ValueError: RANK must be")
    assert run_init({"RANK": "2", "WORLD_SIZE": "2"}).startswith("ValueError: RANK 2 is not below")
    assert "ValueError: WORLD_SIZE" in run_init({"RANK": "0", "WORLD_SIZE": "x" * 500})


def test_init_refuses_a_deterministic_that_is_not_a_bool():
    code = "import symm\ntry:\n    symm.init(deterministic='yes')\nexcept Exception as e:\n" \
           "    print(type(e).__name__ + ': ' + str(e))\n"
    env = {k: v for k, v in os.environ.items() if k not in ("SYMM_JOB", "SYMM_TOKEN")}
    out = subprocess.run([sys.executable, "-c", code],
                         env={**env, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"},
                         capture_output=True, text=True, timeout=60).stdout.strip()
    assert out.startswith("TypeError: deterministic must be a bool or None"), out


def test_open_refuses_a_bad_job_before_touching_a_gpu():
    with pytest.raises(ValueError, match="SYMM_JOB"):
        _symm.GpuComm.open(0, 1, 0, "bad job/name", "ab" * 16, 1 << 20, 1000, 1000)
    with pytest.raises(ValueError, match="SYMM_TOKEN"):
        _symm.GpuComm.open(0, 1, 0, "job", "xyz", 1 << 20, 1000, 1000)
    with pytest.raises(ValueError):
        _symm.GpuComm.open(3, 2, 0, "job", "ab" * 16, 1 << 20, 1000, 1000)
    with pytest.raises(ValueError, match="plans"):
        _symm.GpuComm.open(0, 1, 0, "job", "ab" * 16, 1 << 20, 1000, 1000, "fastest")


def test_bench_refuses_an_unknown_collective_before_touching_a_gpu(capsys):
    from symm import bench

    with pytest.raises(SystemExit) as e:
        bench.main(["--collectives", "all_reduce,all_gathr"])
    assert e.value.code == 2
    assert "unknown collectives ['all_gathr']" in capsys.readouterr().err


def test_bench_graph_timing_meets_at_a_barrier_before_its_replays(monkeypatch):
    # Without it a rank that reaches the timed replays late adds its delay to every other
    # rank's time (the layer and fused benches wait on one too).
    from types import SimpleNamespace

    from symm import bench

    seen = []

    def graph_run(torch, fn, calls, replays, pool=None, together=None):
        seen.append(together)
        return 1.5, None

    monkeypatch.setattr(bench, "graph_run", graph_run)
    barrier = object()
    up = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True, barrier=barrier)
    down = SimpleNamespace(is_available=lambda: True, is_initialized=lambda: False)
    assert bench._time_graph(SimpleNamespace(distributed=up), lambda: None, 10, 2) == 1.5
    assert bench._time_graph(SimpleNamespace(distributed=down), lambda: None, 10, 2) == 1.5
    assert seen == [barrier, None]


def test_the_package_ships_its_kernels_for_sm90():
    from symm import _gpu

    names = sorted(os.listdir(_gpu.BUNDLED_KERNELS))
    assert any(n.startswith("interp-sm90-") and n.endswith(".cubin") for n in names), names
    assert any(n.startswith("moe-sm90-") for n in names), names
    assert not any("multimem" in n for n in names), names
    for n in names:
        with open(os.path.join(_gpu.BUNDLED_KERNELS, n), "rb") as f:
            assert f.read(8) == b"SYMMKC01", n


def test_the_kernel_folder_is_named_once():
    from symm import _gpu

    assert _symm.set_bundled_kernels(_gpu.BUNDLED_KERNELS)
    assert not _symm.set_bundled_kernels(os.path.join(_gpu.BUNDLED_KERNELS, "elsewhere"))
    assert _symm.set_bundled_kernels(_gpu.BUNDLED_KERNELS)


def test_init_says_it_sets_torchs_device():
    assert "torch.cuda.set_device" in symm.init.__doc__


_EXIT_AFTER_A_FAILURE = """
import atexit, sys
import symm
from symm import _gpu

class Comm:
    def close(self):
        raise symm.PeerLostError("rank 1 left the job (its process ended)")

class Job:
    rank = 3
    pool = None
    comm = Comm()

_gpu._job = Job()
atexit.register(getattr(_gpu, sys.argv[1]))
print("done")
"""


def _exit_with(hook):
    return subprocess.run([sys.executable, "-c", _EXIT_AFTER_A_FAILURE, hook],
                          capture_output=True, text=True, timeout=60)


def test_exit_after_a_failure_says_once_what_ended_the_job_without_a_traceback():
    p = _exit_with("_finalize_at_exit")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "done"
    lines = p.stderr.strip().splitlines()
    assert lines == ["symm: rank 3 ended the job after an error: "
                     "rank 1 left the job (its process ended)"], p.stderr
    # The plain finalize, registered as it was before, is what leaves the traceback.
    bare = _exit_with("finalize")
    assert "Traceback" in bare.stderr and "atexit" in bare.stderr, bare.stderr

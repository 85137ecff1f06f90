"""symm on the GPU from PyTorch: the job, symmetric tensors, collectives and peer memory.

Nothing here imports torch before :func:`init`, so ``import symm`` works without it.

Tensor lifetime and the collective free
---------------------------------------
:func:`empty` and :func:`zeros` are collective: every rank makes the same calls in the same
order, and a divergence raises ``ValueError`` naming the first call that differs. Freeing is
not collective, because each rank's garbage collector runs on its own schedule: when torch drops
the last tensor (or view) over a block, the block is only *released* on that rank. The next
allocation (or :func:`collect`) waits for the rank's GPU and returns to the heap the blocks that
every rank released and that no captured CUDA graph still names (a graph holds its blocks until
torch destroys it). So ``del t`` never blocks and never frees memory a peer or a graph may
still use; memory comes back one allocation later, once everyone let go.
"""

from __future__ import annotations

import atexit
import functools
import os
import secrets
import sys
import threading
from typing import Any, Optional

# NVLink multicast stays off in every process that loads NCCL or torch through symm: assigned
# on import, before torch is imported below; init() refuses if they were changed since.
_SAFETY_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

from . import _symm  # noqa: E402
from .errors import SymmError  # noqa: E402

#: Signal slots per rank and peer in a rendezvous handle's signal pad.
SIGNAL_SLOTS = 64

#: The kernels compiled when the wheel was built (sm_90), loaded instead of compiling them.
BUNDLED_KERNELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernels")

_lock = threading.RLock()
_job: Optional[_Job] = None
_generation = 0

_DTYPES: dict[Any, str] = {}

#: Call shapes whose request a job keeps before it starts over.
_MAX_REQUESTS = 4096


class _Job:
    """The state of the job this process joined."""

    def __init__(self, comm: Any, torch: Any) -> None:
        self.comm = comm
        self.torch = torch
        self.device = torch.device("cuda", comm.device)
        self.tensor = torch.Tensor
        self.index = comm.device
        self.rank = comm.rank
        self.world = comm.world
        stride, lo, hi = comm.layout()
        self.base = comm.ptr(comm.rank, 0)
        self.lo, self.hi = self.base + lo, self.base + hi
        # symm.Request per call shape (names and forced choices as the caller gave them); the
        # runtime decides and caches the automatic choice, this only saves rebuilding it.
        self.requests: dict[tuple[Any, ...], Any] = {}
        # all_reduce's requests by (bytes, torch dtype, op, algorithm, channels); the in-place
        # sums of symm's own choice are also remembered by the runtime (`sums`), so their
        # repeated call is one step.
        self.all_reduces: dict[tuple[Any, ...], Any] = {}
        # The bound method every collective calls (no attribute chain per call).
        self.collective = comm.collective
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        idx = self.index
        if raw is not None:
            self.current_stream = functools.partial(raw, idx)
        else:  # pragma: no cover - older torch
            self.current_stream = lambda: torch.cuda.current_stream(idx).cuda_stream
        self.sums = comm.all_reduces(torch.Tensor, self.current_stream)
        self.sum = self.sums.run
        # The job's torch.cuda.MemPool over the heap (mem_pool), made on first use; the
        # fused all-reduce + RMSNorm per width (symm._fused).
        self.pool: Any = None
        self.norms: dict[int, Any] = {}
        self.norm_shapes: set[tuple[int, int]] = set()


def _env_int(name: str, default: Optional[int] = None) -> int:
    v = os.environ.get(name)
    if v is None:
        if default is None:
            raise ValueError(f"{name} is not set: run under torchrun, symm-run, mpirun or srun")
        return default
    if not v.isdigit() or (len(v) > 1 and v[0] == "0") or len(v) > 5:
        raise ValueError(f"{name} must be a decimal rank, got {v[:64]!r}")
    return int(v)


def _job_and_token(rank: int, torch: Any) -> tuple[str, str]:
    """The job's name and secret: through torch.distributed's store when a process group
    exists (rank 0 draws them), else from SYMM_JOB and SYMM_TOKEN.
    """
    dist = getattr(torch, "distributed", None)
    if dist is not None and dist.is_available() and dist.is_initialized():
        from torch.distributed import distributed_c10d as c10d

        store = c10d._get_default_store()
        key = f"symm/{_generation}"
        if rank == 0:
            job = f"symm-{os.getpid()}-{secrets.token_hex(6)}"
            token = secrets.token_hex(32)
            store.set(f"{key}/job", job)
            store.set(f"{key}/token", token)
        else:
            job = store.get(f"{key}/job").decode()
            token = store.get(f"{key}/token").decode()
        return job, token
    job = os.environ.get("SYMM_JOB")
    token = os.environ.pop("SYMM_TOKEN", None)
    if not job or not token:
        raise ValueError(
            "no torch.distributed process group and no SYMM_JOB/SYMM_TOKEN: call "
            "torch.distributed.init_process_group() first, or run under symm-run")
    return job, token


def init(*, heap_bytes: int = 1 << 30, timeout: float = 10.0,
         bootstrap_timeout: float = 60.0, plans: Optional[str] = None,
         deterministic: Optional[bool] = None) -> None:
    """Join the job this process belongs to (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``).

    Under torchrun with a ``torch.distributed`` process group the job's name and secret travel
    through the group's store; otherwise ``SYMM_JOB`` and ``SYMM_TOKEN`` are read, as symm-run
    sets them. ``heap_bytes`` is each rank's symmetric heap, ``timeout`` the deadline (seconds)
    of every device wait, ``bootstrap_timeout`` that of joining and host exchanges. ``plans``
    picks the kernel that runs collectives: ``"auto"`` (plans compiled to their own kernels when
    the kernel holds at most 128 ops, channels of one shape counted once, at any size, at the
    first call of each shape: a
    fraction of a second to seconds of NVRTC the first time on a machine, then a disk cache;
    the interpreter otherwise), ``"interpreted"``
    or ``"compiled"``; default ``SYMM_PLANS``, else auto. The other variables that configure a
    communicator hold as they do for Rust and C programs (``SYMM_COPY_ENGINE``, ``SYMM_NVRTC``,
    ``SYMM_DEVICES``). Collective.

    ``deterministic=True`` (default ``SYMM_DETERMINISTIC``, else off) puts the job in
    deterministic mode: every reduction's element ``i`` is the sum over ranks ``0, 1, ..``
    in that order (16-bit floats accumulated in f32 and rounded once), so it has the same bits
    whatever the size of the call, the algorithm, the channels, eager or graph, plain or
    symmetric tensors. symm then picks only algorithms that honour it and refuses a forced one
    that does not. Every rank must pass the same.

    The rank's GPU becomes torch's current device (``torch.cuda.set_device``), so tensors made
    with ``device="cuda"`` afterwards land on it. Calling it again while joined does nothing;
    :func:`finalize` (also run at exit) ends it.
    """
    with _lock:
        if _job is not None:
            return
        for k, v in _SAFETY_ENV.items():
            if os.environ.get(k) != v:
                raise SymmError(f"symm needs {k}={v} (NVLink multicast off); it is "
                                f"{os.environ.get(k)!r}")
        rank = _env_int("RANK")
        world = _env_int("WORLD_SIZE")
        local = _env_int("LOCAL_RANK", rank)
        if rank >= world:
            raise ValueError(f"RANK {rank} is not below WORLD_SIZE {world}")
        for name, v in (("timeout", timeout), ("bootstrap_timeout", bootstrap_timeout)):
            if not (0 < v <= 3600):
                raise ValueError(f"{name} must be in (0, 3600] seconds, got {v}")
        if not isinstance(heap_bytes, int) or heap_bytes <= 0:
            raise ValueError(f"heap_bytes must be a positive int, got {heap_bytes!r}")
        if deterministic is not None and not isinstance(deterministic, bool):
            raise TypeError(f"deterministic must be a bool or None, got {deterministic!r}")
        try:
            import torch
        except ImportError as e:
            raise SymmError("symm.init needs PyTorch (pip install torch)") from e

        if not torch.cuda.is_available():
            raise SymmError("symm.init needs a CUDA GPU, and torch sees none")
        job, token = _job_and_token(rank, torch)
        _install(_open_job(torch, (rank, world, local), (job, token), heap_bytes,
                           (timeout, bootstrap_timeout), plans, deterministic))


def _open_job(torch: Any, where: tuple[int, int, int], secret: tuple[str, str], heap_bytes: int,
              timeouts: tuple[float, float], plans: Optional[str] = None,
              deterministic: Optional[bool] = None, device: Optional[int] = None) -> _Job:
    """Joins job ``secret`` (name, token) as (rank, world, local rank) ``where``, on GPU
    ``device`` when given (else where the placement puts the local rank); the rank's GPU
    becomes torch's current device. Collective.
    """
    # The kernels built with the wheel: no NVRTC wait on a machine's first Comm.
    _symm.set_bundled_kernels(BUNDLED_KERNELS)
    comm = _symm.GpuComm.open(*where, *secret, heap_bytes, int(timeouts[0] * 1000),
                              int(timeouts[1] * 1000), plans, deterministic, device)
    torch.cuda.set_device(comm.device)
    _DTYPES.update({
        torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
        torch.float64: "f64", torch.int32: "i32", torch.int64: "i64", torch.uint8: "u8",
    })
    for name, code in (("uint32", "u32"), ("uint64", "u64")):
        if hasattr(torch, name):
            _DTYPES[getattr(torch, name)] = code
    return _Job(comm, torch)


def _install(job: _Job) -> None:
    """Makes ``job`` the process's job (what :func:`init` joins), finalized at exit."""
    global _job, _generation
    with _lock:
        _job = job
        _generation += 1
        _symm.all_reduce_job(job.sums)
        if _generation == 1:
            atexit.register(_finalize_at_exit)


def finalize() -> None:
    """End this rank's part in the job in order (waits for its GPU, then a last barrier with
    every rank). Tensors still alive keep their memory mapped; collectives on them are refused.
    Run at exit when not called.
    """
    global _job
    with _lock:
        j, _job = _job, None
        _symm.all_reduce_job(None)
    if j is not None:
        if j.pool is not None:
            _symm.pool_stop()
        j.comm.close()


def _finalize_at_exit() -> None:
    """`finalize` at interpreter exit: a job that already failed (a peer lost, a call that
    differed, a timeout) ends with one line on stderr that says what ended it, not with a
    traceback from the atexit machinery. Everything is still released: the runtime ends its
    part of the job whatever the error, and the process's exit frees the rest.
    """
    rank = _job.rank if _job is not None else None
    try:
        finalize()
    except SymmError as e:
        who = f"rank {rank}" if rank is not None else "this rank"
        print(f"symm: {who} ended the job after an error: {e}", file=sys.stderr)


def is_initialized() -> bool:
    """Whether this process joined a job (:func:`init`) and has not finalized it."""
    return _job is not None


def _get() -> _Job:
    j = _job
    if j is None:
        raise SymmError("symm is not initialized: call symm.init() first")
    return j


def rank() -> int:
    """The rank of this process in the job."""
    return _get().rank


def world_size() -> int:
    """Ranks in the job."""
    return _get().world


def device() -> Any:
    """The ``torch.device`` of this rank's GPU."""
    return _get().device


def _stream(j: _Job, stream: Any) -> int:
    """The handle of ``stream``: a ``torch.cuda.Stream`` (or ``ExternalStream``) of this rank's
    GPU. Anything else is refused: the handle is handed to the driver as it is.
    """
    if stream is None:
        return j.current_stream()
    if not isinstance(stream, j.torch.cuda.Stream) or stream.device != j.device:
        raise ValueError("stream must be a torch.cuda.Stream of this rank's GPU")
    return int(stream.cuda_stream)


def _dtype_name(j: _Job, dtype: Any) -> str:
    name = _DTYPES.get(dtype)
    if name is None:
        raise TypeError(f"unsupported dtype {dtype}: symm takes {sorted(map(str, _DTYPES))}")
    return name


def _check(j: _Job, t: Any, what: str) -> str:
    """Validates a tensor argument; returns symm's dtype name (the hot path of every call:
    a type check, two int compares and a dict lookup).
    """
    if type(t) is not j.tensor and not isinstance(t, j.tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.get_device() != j.index:
        raise ValueError(f"{what} is on {t.device}; this rank's GPU is {j.device}")
    if not t.is_contiguous():
        raise ValueError(f"{what} must be contiguous")
    name = _DTYPES.get(t.dtype)
    if name is None:
        return _dtype_name(j, t.dtype)
    return name


def _request(j: _Job, collective: str, nbytes: int, dtype: str, op: str,
             algorithm: Optional[str], channels: Optional[int], root: int = 0,
             deterministic: bool = False) -> Any:
    """The job's :class:`symm.Request` for a call (made by the runtime once per shape; in
    deterministic mode when the job or ``deterministic`` asks for it).
    """
    key = (collective, nbytes, dtype, op, algorithm, channels, root, deterministic)
    r = j.requests.get(key)
    if r is None:
        if type(deterministic) is not bool:
            raise TypeError(f"deterministic must be a bool, got {deterministic!r}")
        if len(j.requests) >= _MAX_REQUESTS:
            j.requests.clear()
        r = j.comm.request(collective, nbytes, dtype, op, algorithm, channels, root,
                           deterministic)
        j.requests[key] = r
    return r


def empty(shape: Any, *, dtype: Any = None, device: Any = None) -> Any:
    """A ``torch.Tensor`` on this rank's GPU whose storage is in the symmetric heap (contents
    undefined). Collective: every rank makes the same calls in the same order.
    """
    j = _get()
    torch = j.torch
    dtype = torch.get_default_dtype() if dtype is None else dtype
    _dtype_name(j, dtype)
    if device is not None and torch.device(device) not in (j.device, torch.device("cuda")):
        raise ValueError(f"symmetric tensors live on this rank's GPU {j.device}, not {device}")
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"negative dimension in {shape}")
    numel = 1
    for s in shape:
        numel *= s
    esize = torch.empty((), dtype=dtype).element_size()
    block = j.comm.alloc(max(numel * esize, 1), j.current_stream())
    raw = torch.as_tensor(block, device=j.device)
    return raw[: numel * esize].view(dtype).view(shape)


_oom_observed = False


def _attach_oom_observer(torch: Any) -> None:
    """Once per process: when torch raises its out-of-memory error, the pool's latch of a
    refused size ends (torch's retries of it were local; see python/src/gpu/pool.rs).
    """
    global _oom_observed
    if not _oom_observed:
        torch._C._cuda_attach_out_of_memory_observer(lambda *_: _symm.pool_unlatch())
        _oom_observed = True


def mem_pool() -> Any:
    """The job's ``torch.cuda.MemPool`` whose memory is the symmetric heap: tensors torch
    allocates under ``with torch.cuda.use_mem_pool(symm.mem_pool()):`` are symmetric, so a
    model's activations are, and collectives on them run where they lie, with no copy.

    torch's caching allocator asks the heap for segments (2 MiB and up) and splits them into
    tensors. A segment is a collective allocation, as :func:`empty` is: every rank must run
    the same allocations in the same order (the same code, on one stream). Ranks whose heaps
    would differ refuse the segment on every rank and stay as they were; torch raises
    ``torch.OutOfMemoryError``, and the cause is printed to stderr. Ranks whose tensors land
    at different places of a segment are named by the first collective over them
    (``ValueError``). A graph captured with
    ``torch.cuda.graph(g, pool=symm.mem_pool().id)`` allocates in the pool (torch refuses
    ``use_mem_pool`` of the same pool inside it); a segment allocated then waits for nothing.
    Segments go back to the heap when torch frees them (``torch.cuda.empty_cache()``, or the
    pool dropped) and every rank did. The same pool is returned on every call.
    """
    j = _get()
    with _lock:
        if j.pool is None:
            from torch.cuda.memory import CUDAPluggableAllocator

            _symm.pool_serve(j.comm)
            _attach_oom_observer(j.torch)
            alloc = CUDAPluggableAllocator(_symm.__file__, "symm_pool_alloc", "symm_pool_free")
            j.pool = j.torch.cuda.MemPool(alloc.allocator())
        return j.pool


def zeros(shape: Any, *, dtype: Any = None, device: Any = None) -> Any:
    """:func:`empty`, filled with zeros (on the current stream). Collective."""
    t = empty(shape, dtype=dtype, device=device)
    t.zero_()
    return t


def collect() -> int:
    """Collective: return to the heap every block all ranks released (see the module doc);
    returns how many. Allocation does this itself.
    """
    return _get().comm.collect()


def heap_usage() -> tuple[int, int]:
    """Live symmetric blocks on this rank and their bytes."""
    return _get().comm.usage()


def is_symmetric(t: Any) -> bool:
    """Whether tensor ``t``'s data lies in this rank's symmetric heap."""
    j = _get()
    p = t.data_ptr()
    return j.lo <= p and p + t.numel() * t.element_size() <= j.hi


def _all_reduce(t: Any, op: str = "sum", *, stream: Any = None, algorithm: Optional[str] = None,
                channels: Optional[int] = None, deterministic: bool = False) -> Any:
    """The full path of :func:`all_reduce` (``symm._symm.all_reduce``), which runs a sum of a
    shape the job remembers in one step and hands every other call here.
    """
    j = _get()
    dt = _check(j, t, "t")  # an empty tensor of a dtype symm does not take is refused too
    n = t.nbytes
    if n:
        key = (n, t.dtype, op, algorithm, channels, deterministic)
        r = j.all_reduces.get(key)
        if r is None:
            r = _request(j, "all_reduce", n, dt, op, algorithm, channels, 0, deterministic)
            if len(j.all_reduces) >= _MAX_REQUESTS:
                j.all_reduces.clear()
            j.all_reduces[key] = r
            if op == "sum" and algorithm is None and channels is None and not deterministic:
                j.sums.remember(n, t.dtype, r)
        p = t.data_ptr()
        j.collective(r, p, n, p, n, j.current_stream() if stream is None else _stream(j, stream))
    return t


def _explain(t: Any) -> None:
    """Raises what :func:`_check` says of ``t``, when it refuses it."""
    _check(_get(), t, "t")


# `all_reduce` is the runtime's own callable: a repeated sum is one call from Python, with no
# Python frame; everything else comes back to `_all_reduce`.
_symm.all_reduce_paths(_all_reduce, _explain)
all_reduce = _symm.all_reduce


def broadcast(t: Any, src: int = 0, *, stream: Any = None, algorithm: Optional[str] = None,
              channels: Optional[int] = None) -> Any:
    """Copy rank ``src``'s ``t`` into every rank's ``t``, in place. Returns ``t``."""
    j = _get()
    dt = _check(j, t, "t")
    if not (isinstance(src, int) and 0 <= src < j.world):
        raise ValueError(f"src must be a rank below {j.world}, got {src!r}")
    n = t.numel() * t.element_size()
    if n:
        p = t.data_ptr()
        r = _request(j, "broadcast", n, dt, "sum", algorithm, channels, src)
        j.collective(r, p, n, p, n, _stream(j, stream))
    return t


def reduce(t: Any, dst: int = 0, op: str = "sum", *, stream: Any = None,
           algorithm: Optional[str] = None, channels: Optional[int] = None,
           deterministic: bool = False) -> Any:
    """Reduce every rank's ``t`` into rank ``dst``'s ``t``, in place (the other ranks' ``t``
    are left as they were). ``deterministic``: as for :func:`all_reduce`. Returns ``t``.
    """
    j = _get()
    dt = _check(j, t, "t")
    if not (isinstance(dst, int) and 0 <= dst < j.world):
        raise ValueError(f"dst must be a rank below {j.world}, got {dst!r}")
    n = t.numel() * t.element_size()
    if n:
        p = t.data_ptr()
        r = _request(j, "reduce", n, dt, op, algorithm, channels, dst, deterministic)
        j.collective(r, p, n, p, n, _stream(j, stream))
    return t


def is_deterministic() -> bool:
    """Whether the job runs in deterministic mode (see :func:`init`)."""
    return bool(_get().comm.deterministic)


def _pair(j: _Job, output: Any, input: Any, out_blocks: int, in_blocks: int) -> tuple[str, int]:
    dt = _check(j, output, "output")
    if _check(j, input, "input") != dt:
        raise TypeError(f"input is {input.dtype} and output {output.dtype}: they must match")
    nin, nout = input.numel() * input.element_size(), output.numel() * output.element_size()
    if nin % in_blocks or nout % out_blocks or nin // in_blocks != nout // out_blocks:
        raise ValueError(
            f"sizes do not fit: input holds {input.numel()} elements and output "
            f"{output.numel()}; expected output = input * {out_blocks} / {in_blocks}")
    return dt, nin // in_blocks


def all_gather_into_tensor(output: Any, input: Any, *, stream: Any = None,
                           algorithm: Optional[str] = None, channels: Optional[int] = None) -> Any:
    """Every rank's ``input`` concatenated, rank by rank, into ``output`` (world × input)."""
    j = _get()
    dt, block = _pair(j, output, input, j.world, 1)
    if block:
        r = _request(j, "all_gather", block, dt, "sum", algorithm, channels)
        j.collective(r, input.data_ptr(), block, output.data_ptr(), block * j.world,
                     _stream(j, stream))
    return output


def reduce_scatter_tensor(output: Any, input: Any, op: str = "sum", *, stream: Any = None,
                          algorithm: Optional[str] = None, channels: Optional[int] = None,
                          deterministic: bool = False) -> Any:
    """Block ``rank`` of the reduction of every rank's ``input`` (world × output) into
    ``output``. ``deterministic``: as for :func:`all_reduce`.
    """
    j = _get()
    dt, block = _pair(j, output, input, 1, j.world)
    if block:
        r = _request(j, "reduce_scatter", block, dt, op, algorithm, channels, 0, deterministic)
        j.collective(r, input.data_ptr(), block * j.world, output.data_ptr(), block,
                     _stream(j, stream))
    return output


def check() -> None:
    """Raise the asynchronous error of any collective enqueued so far (``TimeoutError``,
    ``PeerLostError``, then ``PoisonedError`` until :func:`reset`) without waiting.
    """
    _get().comm.check()


def synchronize(stream: Any = None) -> None:
    """Wait for the current stream (or ``stream``), then :func:`check`."""
    j = _get()
    j.comm.synchronize(_stream(j, stream))


def reset() -> None:
    """Collective: after a failure (a timeout, calls that differed across ranks), bring the job
    back: the ranks meet again even when the failure left them in different exchanges, every
    rank's signals are cleared, the arguments of later calls are agreed again, and the poison
    is lifted. A rank that is gone stays gone (``PeerLost``).
    """
    j = _get()
    j.norms.clear()  # a failed call may leave their epochs apart: new ones start together
    j.norm_shapes.clear()
    j.comm.reset()

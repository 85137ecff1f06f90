"""Type stubs of the extension module ``symm._symm`` (see the package for documentation)."""

from typing import Any, Optional

MAX_SIM_BYTES: int
NORM_MAX_ROWS: int
__version__: str

def names() -> dict[str, list[str]]:
    """Every name the functions take."""

def dtype_size(name: str) -> int:
    """Element size in bytes of a dtype."""

def buffer_sizes(collective: str, algorithm: str, world: int, nbytes: int, dtype: str = ...,
                 op: str = ..., channels: Optional[int] = ..., root: int = ..., src: int = ...,
                 dst: Optional[int] = ...) -> tuple[int, int, int]:
    """Buffer sizes per rank: (input, output, scratch)."""

def simulate(collective: str, algorithm: str, world: int, nbytes: int, dtype: str = ...,
             op: str = ..., channels: Optional[int] = ..., seed: int = ..., root: int = ...,
             src: int = ..., dst: Optional[int] = ...) -> dict[str, Any]:
    """Simulated run and reference: inputs, outputs, reference, trace, time_us, ops, matches."""

def reference(collective: str, algorithm: str, world: int, nbytes: int, inputs: list[bytes],
              dtype: str = ..., op: str = ..., channels: Optional[int] = ..., root: int = ...,
              src: int = ..., dst: Optional[int] = ...,
              rank_order: bool = ...) -> list[bytes]:
    """The outputs a request defines for its inputs (rank_order: deterministic mode's)."""

def predict(collective: str, algorithm: str, world: int, nbytes: int, dtype: str = ...,
            op: str = ..., channels: Optional[int] = ..., topology: str = ..., root: int = ...,
            src: int = ..., dst: Optional[int] = ...) -> float:
    """Predicted time in microseconds."""

def select(collective: str, world: int, nbytes: int, dtype: str = ..., op: str = ...,
           channels: Optional[int] = ..., topology: str = ..., multicast: bool = ...,
           root: int = ..., src: int = ..., dst: Optional[int] = ...) -> str:
    """The algorithm with the lowest predicted time."""

def tune(collective: str, world: int, nbytes: int, dtype: str = ..., op: str = ...,
         topology: str = ..., root: int = ..., src: int = ...,
         dst: Optional[int] = ...) -> tuple[str, int, str]:
    """(algorithm, channels, "calibrated" or "model")."""

def decode_trace(data: bytes) -> dict[str, Any]:
    """A decoded trace: version, layout, header, count, packed event columns, warning."""

def set_bundled_kernels(path: str) -> bool:
    """Names the folder of the kernels the package ships (first call wins); True if in use."""

class Request:
    """A collective request: what to compute and how symm runs it."""

    collective: str
    algorithm: str
    channels: int
    world: int
    nbytes: int
    dtype: str
    op: str
    root: Optional[int]
    deterministic: bool
    def __init__(self, collective: str, world: int, nbytes: int, dtype: str = ...,
                 op: str = ..., *, algorithm: Optional[str] = ..., channels: Optional[int] = ...,
                 root: int = ..., src: int = ..., dst: Optional[int] = ...,
                 topology: str = ..., deterministic: bool = ...) -> None: ...
    def buffer_sizes(self) -> tuple[int, int, int]: ...

class Block:
    """A block of the symmetric heap a tensor's storage lives in (released when dropped)."""

    offset: int
    ptr: int
    nbytes: int
    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...

class MoeLayer:
    """A MoE layer's symmetric block (released when dropped)."""

    rows_ptr: int
    spans_ptr: int
    experts: int
    topk: int
    tokens_max: int
    hidden: int
    rows_max: int
    local_experts: int
    dtype: str
    block: tuple[int, int]
    tokens: int

class A2avLayer:
    """An all-to-allv layer whose output holds ``out_max`` elements of ``elem`` bytes."""

    output_ptr: int
    elem: int
    out_max: int

class AllReduces:
    """The job's remembered in-place sums: :func:`symm.all_reduce`'s repeated call in one step."""

    def run(self, t: Any) -> bool: ...
    def remember(self, nbytes: int, dtype: Any, request: Request) -> None: ...
    def __len__(self) -> int: ...

def all_reduce(t: Any, op: str = "sum", *, stream: Any = None, algorithm: Optional[str] = None,
               channels: Optional[int] = None, deterministic: bool = False) -> Any: ...
def all_reduce_paths(full: Any, explain: Any) -> None: ...
def all_reduce_job(sums: Optional[AllReduces]) -> None: ...
def pool_serve(comm: GpuComm) -> None: ...
def pool_stop() -> None: ...
def pool_refusal() -> Optional[str]: ...
def pool_unlatch() -> None: ...
def norm_reference(inputs: list[bytes], residual: bytes, weight: bytes,
                   eps: float) -> tuple[bytes, bytes]: ...
def fused_norm(comm: GpuComm, hidden: int, max_rows: int, stream_handle: int) -> FusedNorm: ...

class FusedNorm:
    """The fused all-reduce + RMSNorm of one width (:func:`symm.fused_all_reduce_rmsnorm`)."""

    hidden: int
    max_rows: int
    def run(self, x: tuple[int, int], residual: tuple[int, int], residual_out: tuple[int, int],
            weight: tuple[int, int], out: tuple[int, int], eps: float,
            stream_handle: int) -> None: ...

class GpuComm:
    """One rank of a GPU job (the runtime behind :mod:`symm`'s torch functions)."""

    rank: int
    world: int
    device: int
    topology: str
    plans: str
    deterministic: bool
    @staticmethod
    def open(rank: int, world: int, local_rank: int, job: str, token: str, heap_bytes: int,
             timeout_ms: int, bootstrap_timeout_ms: int,
             plans: Optional[str] = ..., deterministic: Optional[bool] = ...,
             device: Optional[int] = ...) -> GpuComm: ...
    def alloc(self, nbytes: int, stream_handle: int) -> Block: ...
    def release(self, offset: int) -> None: ...
    def collect(self) -> int: ...
    def usage(self) -> tuple[int, int]: ...
    def ptr(self, peer: int, offset: int) -> int: ...
    def layout(self) -> tuple[int, int, int]: ...
    def request(self, collective: str, nbytes: int, dtype: str, op: str = ...,
                algorithm: Optional[str] = ..., channels: Optional[int] = ...,
                root: int = ..., deterministic: bool = ...) -> Request: ...
    def collective(self, request: Request, in_ptr: int, in_len: int, out_ptr: int,
                   out_len: int, stream_handle: int) -> None: ...
    def all_reduces(self, tensor: Any, current_stream: Any) -> AllReduces: ...
    def load_signals(self) -> None: ...
    def put_signal(self, pad: int, pad_len: int, peer: int, slot: int,
                   stream_handle: int) -> None: ...
    def wait_signal(self, pad: int, pad_len: int, peer: int, slot: int,
                    stream_handle: int) -> None: ...
    def check(self) -> None: ...
    def synchronize(self, stream_handle: int) -> None: ...
    def reset(self) -> None: ...
    def close(self) -> None: ...
    def exchange(self, data: bytes) -> list[bytes]: ...
    def host_loop_us(self, request: Request, in_ptr: int, in_len: int, out_ptr: int,
                     out_len: int, stream_handle: int, iters: int) -> float: ...
    def launch_floor_us(self, request: Request, stream_handle: int, calls: int) -> float: ...
    def moe_layer(self, experts: int, topk: int, tokens_max: int, hidden: int, dtype: str,
                  stream_handle: int, rows_max: Optional[int] = ...) -> MoeLayer: ...
    def moe_dispatch(self, layer: MoeLayer, mode: str, tokens: int, x_ptr: int, x_len: int,
                     idx_ptr: int, idx_len: int, weights_ptr: int, weights_len: int,
                     stream_handle: int) -> None: ...
    def moe_combine(self, layer: MoeLayer, mode: str, expert_out_ptr: int, expert_out_len: int,
                    out_ptr: int, out_len: int, stream_handle: int) -> None: ...
    def moe_status(self, layer: MoeLayer) -> tuple[int, int]: ...
    def a2av_layer(self, elem: int, out_max: int, stream_handle: int) -> A2avLayer: ...
    def all_to_allv_device(self, layer: A2avLayer, send_counts_ptr: int, send_counts_len: int,
                           input_ptr: int, input_len: int, recv_counts_ptr: int,
                           recv_counts_len: int, stream_handle: int) -> None: ...
    def a2av_dropped(self, layer: A2avLayer) -> int: ...

"""Mixture-of-experts dispatch and combine on the GPU, for PyTorch, after :func:`symm.init`.

A :class:`Buffer` is one MoE layer's communication buffer, in the style of DeepEP's
``Buffer``: ``experts`` experts spread evenly over the ranks (expert ``e`` lives on rank
``e // L`` as local expert ``e % L``, ``L = experts // world``), ``topk`` experts per token,
at most ``tokens_max`` tokens of ``hidden`` elements per rank::

    buf = symm.moe.Buffer(experts=64, topk=8, tokens_max=4096, hidden=7168)
    expert_x, spans, handle = buf.dispatch(x, topk_idx, topk_weights)
    # local expert j's tokens are expert_x[spans[j, 0] : spans[j, 0] + spans[j, 1]]
    out = buf.combine(expert_out, handle)   # [T, hidden]: sum over k of weight * expert output

Nothing waits for the GPU on the host: routing, counts and offsets are computed on the device
(``spans`` is read by the experts' kernels, not by Python), so ``dispatch`` and ``combine`` can
be captured in a CUDA graph (``torch.cuda.graph``) and replayed; only creating a
:class:`Buffer` or an :class:`AllToAllv` (collective, it allocates) must happen outside a
capture. Every rank calls ``dispatch`` and ``combine`` on a buffer in the same order; token
counts may differ between ranks (0 included).

Buffer reuse: ``expert_x`` and ``spans`` are views of the buffer's own memory, the same
tensors on every call. Like DeepEP's low-latency buffers they are overwritten by the next
``dispatch`` on the buffer: finish (or copy) what you need from them before dispatching again.
A ``combine`` uses the routing of the buffer's last ``dispatch``; a handle from an older one
is refused. ``combine`` returns a fresh tensor.

Modes: ``"normal"`` (a send and a receive kernel, many blocks: large batches) and
``"low_latency"`` (one kernel per call, a few blocks, at most 128 tokens per rank, and
``tokens_max`` at most). The results are the same, bit for bit.

Sums: each rank that holds some of a token's experts sums ``weight * expert_out`` over them
in float32 (ascending ``k``, fused multiply-add); the token's rank adds those partials in
ascending rank order, in float32, and rounds once to the buffer's dtype. Negative expert
indices mean "no expert"; indices at or past ``experts`` are skipped and counted, expert rows
past ``rows_max`` dropped and counted (:meth:`Buffer.status`). A token with no expert comes
back as zeros.

:func:`all_to_allv` exchanges variable-size blocks whose counts are in device memory (written
by a kernel), with no host synchronisation either.

This module imports torch only when a :class:`Buffer` or :class:`AllToAllv` is made, so
``import symm.moe`` works without it.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Any, Optional

from . import _gpu
from .errors import SymmError

__all__ = [
    "LL_MAX_TOKENS",
    "MAX_EXPERTS",
    "MAX_TOPK",
    "MAX_WORLD",
    "MODES",
    "AllToAllv",
    "Buffer",
    "DispatchHandle",
    "all_to_allv",
]

#: The dispatch and combine modes.
MODES = ("normal", "low_latency")
#: Most tokens per rank in low-latency mode.
LL_MAX_TOKENS = 128
#: Most ranks a buffer spans.
MAX_WORLD = 64
#: Most experts a token picks.
MAX_TOPK = 32
#: Most experts a buffer may have on the GPU.
MAX_EXPERTS = 4096
#: Expert spans are int32: rows past this do not fit.
_MAX_ROWS = (1 << 31) - 1
_U32 = (1 << 32) - 1
#: Element sizes :func:`all_to_allv` moves.
_A2AV_ELEMS = (1, 2, 4, 8, 16)


def _int(v: Any, what: str) -> int:
    """``v`` as a Python int (ints and integer scalars such as numpy's; not bools)."""
    if isinstance(v, bool):
        raise TypeError(f"{what} must be an int, got bool")
    try:
        return operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be an int, got {type(v).__name__}") from None


def _mode(mode: Any) -> str:
    """Checks a mode name."""
    if not isinstance(mode, str):
        raise TypeError(f"mode must be a str ({' or '.join(map(repr, MODES))}), got "
                        f"{type(mode).__name__}")
    if mode not in MODES:
        raise ValueError(f"mode must be {' or '.join(map(repr, MODES))}, got {mode[:32]!r}")
    return mode


def _shape(world: int, experts: Any, topk: Any, tokens_max: Any, hidden: Any,
           rows_max: Any) -> tuple[int, int, int, int, int]:
    """Checks a buffer's shape against ``world`` ranks; returns (experts, topk, tokens_max,
    hidden, rows_max) with ``rows_max`` defaulting to room for every entry.
    """
    experts = _int(experts, "experts")
    topk = _int(topk, "topk")
    tokens_max = _int(tokens_max, "tokens_max")
    hidden = _int(hidden, "hidden")
    if not 1 <= world <= MAX_WORLD:
        raise ValueError(f"MoE buffers span 1 to {MAX_WORLD} ranks; this job has {world}")
    if experts <= 0 or experts % world:
        raise ValueError(f"experts must be a positive multiple of the world size {world}, got "
                         f"{experts}")
    if experts > MAX_EXPERTS:
        raise ValueError(f"experts must be at most {MAX_EXPERTS}, got {experts}")
    if not 1 <= topk <= min(MAX_TOPK, experts):
        raise ValueError(f"topk must be in 1..{min(MAX_TOPK, experts)} (at most {MAX_TOPK} and "
                         f"the number of experts), got {topk}")
    if not 1 <= tokens_max <= _U32:
        raise ValueError(f"tokens_max must be in 1..{_U32}, got {tokens_max}")
    if not 1 <= hidden <= _U32:
        raise ValueError(f"hidden must be in 1..{_U32}, got {hidden}")
    if rows_max is None:
        rows = world * tokens_max * topk
        if rows > _MAX_ROWS:
            raise ValueError(f"room for every entry is world * tokens_max * topk = {rows} expert "
                             f"rows, past {_MAX_ROWS}: give a smaller rows_max")
    else:
        rows = _int(rows_max, "rows_max")
        if not 1 <= rows <= _MAX_ROWS:
            raise ValueError(f"rows_max must be in 1..{_MAX_ROWS}, got {rows}")
    return experts, topk, tokens_max, hidden, rows


def _token_dtype(dtype: Any, bf16: Any, f32: Any) -> str:
    """symm's name of a token dtype: ``bf16`` or ``f32`` (given torch's two)."""
    if dtype == bf16:
        return "bf16"
    if dtype == f32:
        return "f32"
    raise TypeError(f"MoE tokens are torch.bfloat16 or torch.float32, not {dtype}")


class _Spec:
    """What a buffer's tensor arguments must be: torch's tensor type, this rank's GPU index,
    the dtypes and the shape.
    """

    __slots__ = ("tensor", "device", "dtype", "idx_dtype", "weight_dtype", "hidden", "topk",
                 "tokens_max", "rows_max")

    def __init__(self, tensor: Any, device: int, dtype: Any, idx_dtype: Any, weight_dtype: Any,
                 hidden: int, topk: int, tokens_max: int, rows_max: int) -> None:
        self.tensor = tensor
        self.device = device
        self.dtype = dtype
        self.idx_dtype = idx_dtype
        self.weight_dtype = weight_dtype
        self.hidden = hidden
        self.topk = topk
        self.tokens_max = tokens_max
        self.rows_max = rows_max


def _tensor(t: Any, what: str, tensor: Any, device: int, dtype: Any, ndim: int) -> None:
    """Checks a tensor argument: its type, dtype, rank, device and contiguity."""
    if not isinstance(t, tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{what} must be {dtype}, got {t.dtype}")
    if t.dim() != ndim:
        raise ValueError(f"{what} must have {ndim} dimension{'s' if ndim > 1 else ''}, got "
                         f"shape {tuple(t.shape)}")
    if t.get_device() != device:
        raise ValueError(f"{what} is on {t.device}; this rank's GPU is cuda:{device}")
    if not t.is_contiguous():
        raise ValueError(f"{what} must be contiguous")


def _check_dispatch(s: _Spec, x: Any, topk_idx: Any, topk_weights: Any, mode: Any) -> int:
    """Checks dispatch's arguments; returns the token count."""
    mode = _mode(mode)
    _tensor(x, "x", s.tensor, s.device, s.dtype, 2)
    _tensor(topk_idx, "topk_idx", s.tensor, s.device, s.idx_dtype, 2)
    _tensor(topk_weights, "topk_weights", s.tensor, s.device, s.weight_dtype, 2)
    tokens, hidden = tuple(x.shape)
    if hidden != s.hidden:
        raise ValueError(f"x has shape {tuple(x.shape)}; the buffer's hidden size is {s.hidden}")
    for what, t in (("topk_idx", topk_idx), ("topk_weights", topk_weights)):
        if tuple(t.shape) != (tokens, s.topk):
            raise ValueError(f"{what} has shape {tuple(t.shape)}; x has {tokens} tokens and the "
                             f"buffer's topk is {s.topk}, so ({tokens}, {s.topk}) is expected")
    bound = s.tokens_max if mode == "normal" else min(s.tokens_max, LL_MAX_TOKENS)
    if tokens > bound:
        raise ValueError(f"{tokens} tokens: a {mode} dispatch on this buffer takes at most "
                         f"{bound} per rank")
    return tokens


def _check_combine(s: _Spec, expert_out: Any) -> None:
    """Checks combine's expert output."""
    _tensor(expert_out, "expert_out", s.tensor, s.device, s.dtype, 2)
    if tuple(expert_out.shape) != (s.rows_max, s.hidden):
        raise ValueError(f"expert_out has shape {tuple(expert_out.shape)}; the buffer's expert "
                         f"rows are ({s.rows_max}, {s.hidden})")


def _check_a2av(tensor: Any, device: int, world: int, dtype: Any, count_dtype: Any, input: Any,
                send_counts: Any) -> None:
    """Checks all-to-allv's arguments (the input is read as a flat array of ``dtype``)."""
    _tensor(send_counts, "send_counts", tensor, device, count_dtype, 1)
    if tuple(send_counts.shape) != (world,):
        raise ValueError(f"send_counts has shape {tuple(send_counts.shape)}; one count per rank "
                         f"({world},) is expected")
    if not isinstance(input, tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    _tensor(input, "input", tensor, device, dtype, input.dim())


def _check_out_max(out_max: Any) -> int:
    out_max = _int(out_max, "out_max")
    if out_max < 1:
        raise ValueError(f"out_max must be at least 1 element, got {out_max}")
    return out_max


class _DeviceView:
    """Exposes a region of the buffer's memory to torch and keeps its layer alive."""

    def __init__(self, owner: Any, ptr: int, nbytes: int) -> None:
        self._owner = owner
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (ptr, False), "version": 3,
            "strides": None, "stream": None,
        }


def _view(j: Any, owner: Any, ptr: int, nbytes: int, dtype: Any, shape: tuple[int, ...]) -> Any:
    torch = j.torch
    raw = torch.as_tensor(_DeviceView(owner, ptr, nbytes), device=j.device)
    return raw.view(dtype).view(shape)


def _not_capturing(torch: Any, what: str) -> None:
    if torch.cuda.is_current_stream_capturing():
        raise SymmError(f"{what} allocates and meets every rank: make it before capturing a "
                        "CUDA graph")


class DispatchHandle:
    """What :meth:`Buffer.combine` needs from a :meth:`Buffer.dispatch`: the buffer, the
    mode and the number of tokens (``tokens``), which is the number of rows combine returns.
    """

    __slots__ = ("_buffer", "_seq", "mode", "tokens")

    def __init__(self, buffer: Buffer, seq: int, mode: str, tokens: int) -> None:
        self._buffer = buffer
        self._seq = seq
        self.mode = mode
        self.tokens = tokens

    def __repr__(self) -> str:
        """A one-line summary."""
        return f"DispatchHandle(mode={self.mode!r}, tokens={self.tokens})"


class Buffer:
    """One MoE layer's dispatch and combine buffer (see the module doc). Collective: every
    rank makes it with the same arguments, after :func:`symm.init` and outside a graph capture.

    ``dtype`` is the tokens' dtype, ``torch.bfloat16`` (default) or ``torch.float32``;
    ``rows_max`` the expert rows this rank holds (default ``world * tokens_max * topk``, room
    for every entry; a smaller bound saves memory, and rows past it are dropped and counted).
    """

    def __init__(self, experts: int, topk: int, tokens_max: int, hidden: int,
                 dtype: Any = None, rows_max: Optional[int] = None) -> None:
        j = _gpu._get()
        torch = j.torch
        dtype = torch.bfloat16 if dtype is None else dtype
        name = _token_dtype(dtype, torch.bfloat16, torch.float32)
        experts, topk, tokens_max, hidden, rows = _shape(j.world, experts, topk, tokens_max,
                                                         hidden, rows_max)
        _not_capturing(torch, "a MoE buffer")
        layer = j.comm.moe_layer(experts, topk, tokens_max, hidden, name, j.current_stream(),
                                 rows)
        self._j = j
        self._layer = layer
        self._seq = 0
        self._spec = _Spec(j.tensor, j.index, dtype, torch.int64, torch.float32, hidden, topk,
                           tokens_max, rows)
        #: Experts over all ranks.
        self.experts: int = experts
        #: Experts per token.
        self.topk: int = topk
        #: Most tokens per rank and dispatch.
        self.tokens_max: int = tokens_max
        #: Elements per token.
        self.hidden: int = hidden
        #: Expert rows this rank holds.
        self.rows_max: int = rows
        #: Experts per rank.
        self.num_local_experts: int = layer.local_experts
        #: The tokens' dtype.
        self.dtype: Any = dtype
        esize = 2 if name == "bf16" else 4
        self._expert_x = _view(j, layer, layer.rows_ptr, rows * hidden * esize, dtype,
                               (rows, hidden))
        self._spans = _view(j, layer, layer.spans_ptr, self.num_local_experts * 8, torch.int32,
                            (self.num_local_experts, 2))

    @property
    def expert_x(self) -> Any:
        """The expert rows, ``[rows_max, hidden]`` of the buffer's dtype: local expert ``j``'s
        tokens are rows ``spans[j, 0]`` to ``spans[j, 0] + spans[j, 1]``, in sender rank order,
        then in each sender's token order. Overwritten by every dispatch.
        """
        return self._expert_x

    @property
    def expert_spans(self) -> Any:
        """The spans of the last dispatch, int32 ``[num_local_experts, 2]`` on the GPU:
        (first row, rows) of each local expert, clipped to ``rows_max``.
        """
        return self._spans

    def dispatch(self, x: Any, topk_idx: Any, topk_weights: Any, mode: str = "normal", *,
                 stream: Any = None) -> tuple[Any, Any, DispatchHandle]:
        """Send each token to the ranks of its experts, on the current stream (or ``stream``).

        ``x`` is ``[T, hidden]`` of the buffer's dtype, ``topk_idx`` ``[T, topk]`` int64
        (negative: no expert), ``topk_weights`` ``[T, topk]`` float32, all contiguous on this
        rank's GPU, ``T <= tokens_max`` (and at most 128 in ``"low_latency"`` mode). Returns
        ``(expert_x, expert_spans, handle)``: the views :attr:`expert_x` and
        :attr:`expert_spans` (filled once the stream reaches the dispatch; overwritten by the
        next one) and the handle :meth:`combine` takes. Collective.
        """
        s = self._spec
        tokens = _check_dispatch(s, x, topk_idx, topk_weights, mode)
        j = self._j
        st = j.current_stream() if stream is None else _gpu._stream(j, stream)
        j.comm.moe_dispatch(self._layer, mode, tokens,
                            x.data_ptr(), x.numel() * x.element_size(),
                            topk_idx.data_ptr(), topk_idx.numel() * 8,
                            topk_weights.data_ptr(), topk_weights.numel() * 4, st)
        self._seq += 1
        return self._expert_x, self._spans, DispatchHandle(self, self._seq, mode, tokens)

    def combine(self, expert_out: Any, handle: DispatchHandle, *, stream: Any = None) -> Any:
        """Bring the experts' outputs back to their tokens, on the current stream (or
        ``stream``): ``expert_out`` is ``[rows_max, hidden]`` of the buffer's dtype, row ``i``
        the output for row ``i`` of ``expert_x`` (it may be ``expert_x`` itself). Returns a new
        ``[T, hidden]`` tensor: each token's sum of ``weight * expert output`` over its
        experts, in its original place. ``handle`` is the last :meth:`dispatch`'s. Collective.
        """
        if not isinstance(handle, DispatchHandle):
            raise TypeError(f"handle must be the DispatchHandle dispatch returned, got "
                            f"{type(handle).__name__}")
        if handle._buffer is not self:
            raise ValueError("handle comes from a dispatch on another buffer")
        if handle._seq != self._seq:
            raise ValueError("handle is stale: a later dispatch on this buffer replaced its "
                             "routing; combine after each dispatch")
        s = self._spec
        _check_combine(s, expert_out)
        j = self._j
        torch = j.torch
        st = j.current_stream() if stream is None else _gpu._stream(j, stream)
        ctx = contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)
        with ctx:
            out = torch.empty((handle.tokens, s.hidden), dtype=s.dtype, device=j.device)
        j.comm.moe_combine(self._layer, handle.mode,
                           expert_out.data_ptr(), expert_out.numel() * expert_out.element_size(),
                           out.data_ptr(), out.numel() * out.element_size(), st)
        return out

    def status(self) -> tuple[int, int]:
        """``(invalid, dropped)`` since the last call: expert indices at or past ``experts``
        (skipped) and expert rows past ``rows_max`` (dropped), then clears them. Waits for this
        rank's GPU: not for a graph capture.
        """
        return self._j.comm.moe_status(self._layer)

    def __repr__(self) -> str:
        """A one-line summary."""
        return (f"Buffer(experts={self.experts}, topk={self.topk}, "
                f"tokens_max={self.tokens_max}, hidden={self.hidden}, dtype={self.dtype}, "
                f"rows_max={self.rows_max})")


class AllToAllv:
    """An all-to-allv whose counts stay on the GPU, with an output region of ``out_max``
    elements of ``dtype`` (of 1, 2, 4, 8 or 16 bytes). Collective: every rank makes it with
    the same arguments, outside a graph capture; calls can be captured.
    """

    def __init__(self, out_max: int, dtype: Any) -> None:
        j = _gpu._get()
        torch = j.torch
        out_max = _check_out_max(out_max)
        _gpu._dtype_name(j, dtype)
        elem = torch.empty((), dtype=dtype).element_size()
        if elem not in _A2AV_ELEMS:
            raise TypeError(f"all-to-allv moves elements of {_A2AV_ELEMS} bytes; {dtype} has "
                            f"{elem}")
        _not_capturing(torch, "an all-to-allv")
        layer = j.comm.a2av_layer(elem, out_max, j.current_stream())
        self._j = j
        self._layer = layer
        #: Elements the output holds.
        self.out_max: int = out_max
        #: The elements' dtype.
        self.dtype: Any = dtype
        self._output = _view(j, layer, layer.output_ptr, out_max * elem, dtype, (out_max,))

    def __call__(self, input: Any, send_counts: Any, *, stream: Any = None) -> tuple[Any, Any]:
        """Send ``send_counts[q]`` elements to rank ``q``, on the current stream (or
        ``stream``).

        ``input`` (contiguous, of the dtype, read as a flat array) holds the blocks packed by
        destination; ``send_counts`` is an int64 ``[world]`` tensor on this rank's GPU, which a
        kernel may have just written (the host never reads it). Returns ``(output,
        recv_counts)``: the output view ``[out_max]`` (rank ``r``'s block after those of lower
        ranks; overwritten by the next call) and a new int64 ``[world]`` tensor of what each
        rank's block holds, clipped to the output. Collective.
        """
        j = self._j
        torch = j.torch
        _check_a2av(j.tensor, j.index, j.world, self.dtype, torch.int64, input, send_counts)
        st = j.current_stream() if stream is None else _gpu._stream(j, stream)
        ctx = contextlib.nullcontext() if stream is None else torch.cuda.stream(stream)
        with ctx:
            recv = torch.empty((j.world,), dtype=torch.int64, device=j.device)
        j.comm.all_to_allv_device(self._layer, send_counts.data_ptr(), j.world * 8,
                                  input.data_ptr(), input.numel() * input.element_size(),
                                  recv.data_ptr(), j.world * 8, st)
        return self._output, recv

    def dropped(self) -> int:
        """Elements past the output since the last call (dropped), then clears the count.
        Waits for this rank's GPU.
        """
        return self._j.comm.a2av_dropped(self._layer)


_a2av_cache: dict[tuple[Any, Any, int], AllToAllv] = {}

#: Layers :func:`all_to_allv` keeps (each holds heap memory and a kernel); past it, the least
#: recently used is let go (every rank makes the same calls, so the same one) and its memory
#: returns to the heap once no rank, tensor or captured graph holds it.
_A2AV_KEPT = 8


def all_to_allv(input: Any, send_counts: Any, out_max: int, *,
                stream: Any = None) -> tuple[Any, Any]:
    """:class:`AllToAllv` as a function: the first call for a dtype and ``out_max`` makes
    the layer (collective, not in a graph capture: every rank passes the same ``out_max``),
    later ones reuse it, so their outputs share memory. Returns
    ``(output view [out_max], recv_counts)``.
    """
    j = _gpu._get()
    out_max = _check_out_max(out_max)
    dtype = getattr(input, "dtype", None)
    if not isinstance(input, j.tensor):
        raise TypeError(f"input must be a torch.Tensor, got {type(input).__name__}")
    key = (j.comm, dtype, out_max)
    a = _a2av_cache.pop(key, None)
    if a is not None:
        _a2av_cache[key] = a  # the most recently used goes last
    else:
        for k in [k for k in _a2av_cache if k[0] is not j.comm]:
            del _a2av_cache[k]
        a = AllToAllv(out_max, dtype)
        while len(_a2av_cache) >= _A2AV_KEPT:
            del _a2av_cache[next(iter(_a2av_cache))]
        _a2av_cache[key] = a
    return a(input, send_counts, stream=stream)

"""The fused ops of a tensor-parallel layer: :func:`fused_all_reduce_rmsnorm`."""

from __future__ import annotations

from typing import Any

from . import _gpu, _symm

#: Rows a fused op holds room for at first (it grows, collectively, for larger calls).
_MIN_ROWS = 512

#: Widths whose fused op a job keeps (each holds heap memory and a kernel).
_NORMS_KEPT = 16


def fused_all_reduce_rmsnorm(x: Any, residual: Any, weight: Any, eps: float = 1e-6, *,
                             out: Any = None, residual_out: Any = None) -> tuple[Any, Any]:
    """Sum ``x`` over every rank, add ``residual`` and normalise, in one kernel on the current
    stream: ``residual_out = residual + all_reduce(x)`` and
    ``out = rmsnorm(residual_out) * weight``. Returns ``(out, residual_out)``.

    Every tensor is bfloat16, contiguous, on this rank's GPU (plain or symmetric): ``x``,
    ``residual``, ``out`` and ``residual_out`` of one shape ``(..., hidden)`` with ``hidden`` a
    multiple of 8, ``weight`` of shape ``(hidden,)``. ``residual_out`` defaults to ``residual``
    (updated in place) and ``out`` to a new tensor; an output may be one of the inputs, not
    part of one. Collective: every rank calls with the same shapes, in the same order. CUDA
    graphs capture it once it ran for that width and as many rows.

    The result is bit for bit that of ``symm_core::norm`` (on the host:
    ``symm._symm.norm_reference``): the ranks' ``x`` summed in f32 in rank order, the residual
    added and rounded to bfloat16 once, the squares summed in a fixed order,
    ``1 / sqrt(mean + eps)`` correctly rounded, the normalised value rounded to bfloat16 before
    the weight, as PyTorch's RMSNorm does.
    """
    j = _gpu._get()
    if out is None:
        out = j.torch.empty_like(x) if isinstance(x, j.tensor) else x
    if residual_out is None:
        residual_out = residual
    named = (("x", x), ("residual", residual), ("weight", weight), ("out", out),
             ("residual_out", residual_out))
    for name, t in named:
        if _gpu._check(j, t, name) != "bf16":
            raise TypeError(f"{name} is {t.dtype}: the fused all-reduce + RMSNorm takes "
                            "torch.bfloat16")
    if x.dim() == 0:
        raise ValueError("x must have a last dimension (hidden)")
    hidden = x.shape[-1]
    for name, t in named[1:]:
        want = (hidden,) if name == "weight" else x.shape
        if tuple(t.shape) != tuple(want):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, the call needs {tuple(want)}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"eps must be a float, got {type(eps).__name__}")
    rows = x.numel() // hidden if hidden else 0
    if (hidden, rows) not in j.norm_shapes:
        # A shape's first use: the ranks compare it (the kernel's blocks would wait for
        # rows another rank does not have).
        mine = f"{hidden},{rows}".encode()
        theirs = j.comm.exchange(mine)
        if any(t != mine for t in theirs):
            shapes = ", ".join(f"rank {r}: {t.decode(errors='replace')}"
                               for r, t in enumerate(theirs))
            raise ValueError("fused_all_reduce_rmsnorm: ranks called with different shapes "
                             f"(hidden,rows: {shapes})")
        if len(j.norm_shapes) >= 4096:
            j.norm_shapes.clear()
        j.norm_shapes.add((hidden, rows))
    stream = j.current_stream()
    op = j.norms.pop(hidden, None)
    if op is not None:
        j.norms[hidden] = op  # the most recently used goes last
    if op is None or op.max_rows < rows:
        # Doubling stops at the most rows an op holds (a larger call is refused there).
        cap = max(rows, _symm.NORM_MAX_ROWS)
        grow = min(max(rows, _MIN_ROWS, 2 * op.max_rows if op is not None else 0), cap)
        op = _symm.fused_norm(j.comm, hidden, grow, stream)
        j.norms.pop(hidden, None)
        while len(j.norms) >= _NORMS_KEPT:
            # The least recently used width is let go (every rank makes the same calls, so
            # the same one); its memory returns to the heap once nothing holds it.
            del j.norms[next(iter(j.norms))]
        j.norms[hidden] = op
    span = lambda t: (t.data_ptr(), t.numel() * 2)  # noqa: E731
    op.run(span(x), span(residual), span(residual_out), span(weight), span(out), float(eps),
           stream)
    return out, residual_out

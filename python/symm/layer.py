"""A Llama-shaped decoder layer in plain torch, sharded tensor-parallel over ``world`` ranks.

The layer is the one a 70B Llama model stacks 80 times (:data:`LLAMA_70B`): RMSNorm, grouped
query attention with rotary position embeddings and a causal mask
(``torch.nn.functional.scaled_dot_product_attention``), a residual add, RMSNorm, a SwiGLU MLP
and a second residual add. Every shape is a parameter (:class:`LayerShape`), so the same code
runs small on a CPU.

Sharding (Megatron-style tensor parallelism): the q, k and v projections and the MLP's gate and
up projections are split by output columns (each rank holds ``heads / world`` query heads, the
``kv_heads / world`` key/value heads they read, and ``intermediate / world`` MLP columns; a
rank's q/k/v and gate/up slices are fused into one matrix each, as inference engines do), the
o and down projections by input rows. Each of those two returns a partial sum of the full
output on every rank, so the layer calls an all-reduce on that plain tensor twice per forward.
The all-reduce is a callable the caller passes, ``all_reduce(t)``, which must leave the sum over
ranks in ``t`` (in place; its return value is ignored): NCCL's ``dist.all_reduce``, a copy
through torch SymmetricMemory, :func:`symm.all_reduce`, or a host stand-in all serve. A rank's
weights are slices of the full weights (:func:`shard`), so the sharded layer computes the
unsharded one (:func:`reference`) up to rounding.

"A forward of T tokens" runs T tokens of one sequence at positions 0..T-1 with causal attention
among them and no KV cache: at small T that is the decode step's matrix shapes (T rows against
every weight), at large T a prefill.

Nothing here imports torch until a function that needs it runs.
"""

from __future__ import annotations

import os

# NVLink multicast off before torch (and NCCL) load.
os.environ["NCCL_NVLS_ENABLE"] = "0"
os.environ["TORCH_SYMM_MEM_DISABLE_MULTICAST"] = "1"
os.environ["NVSHMEM_DISABLE_NVLS"] = "1"

import math
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

__all__ = ["ATOL", "LLAMA_70B", "MAX_REL_ERR", "RTOL", "HostAllReduce", "Layer", "LayerShape",
           "compare", "make_weights", "reference", "run_sharded_on_host", "shard"]


@dataclass(frozen=True)
class LayerShape:
    """The dimensions of one decoder layer (Llama's names)."""

    #: Model width: the rows of a token's hidden state.
    hidden: int = 8192
    #: Query heads.
    heads: int = 64
    #: Key/value heads (grouped-query attention: ``heads / kv_heads`` queries share one).
    kv_heads: int = 8
    #: The MLP's inner width.
    intermediate: int = 28672
    #: RMSNorm's epsilon.
    eps: float = 1e-5
    #: The rotary embedding's base.
    rope_theta: float = 500000.0

    @property
    def head_dim(self) -> int:
        """Width of one head: ``hidden / heads``."""
        return self.hidden // self.heads

    def check(self, world: int = 1) -> None:
        """Raise ``ValueError`` unless the layer is well formed and splits over ``world`` ranks."""
        for name in ("hidden", "heads", "kv_heads", "intermediate"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not isinstance(world, int) or isinstance(world, bool) or world <= 0:
            raise ValueError(f"world must be a positive int, got {world!r}")
        if not (self.eps > 0 and self.rope_theta > 1):
            raise ValueError(f"need eps > 0 and rope_theta > 1, got {self.eps}, {self.rope_theta}")
        if self.hidden % self.heads:
            raise ValueError(f"hidden {self.hidden} is not a multiple of heads {self.heads}")
        if self.head_dim % 2:
            raise ValueError(f"head width {self.head_dim} must be even for rotary embeddings")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        for name in ("heads", "kv_heads", "intermediate"):
            v = getattr(self, name)
            if v % world:
                raise ValueError(f"{name} {v} does not split over {world} ranks "
                                 f"(tensor parallelism needs world to divide {name})")


#: Llama 3 70B's decoder layer.
LLAMA_70B = LayerShape()


def make_weights(shape: LayerShape, *, seed: int = 0, device: Any = "cpu",
                 dtype: Any = None) -> dict[str, Any]:
    """The full (unsharded) weights of one layer, drawn from a generator seeded with ``seed``.

    Matrices are ``(out, in)`` as ``torch.nn.Linear`` holds them, normal with standard
    deviation ``1 / sqrt(in)`` (so activations keep unit scale); the norms' weights are
    ``1 + 0.1 * normal``. The same seed, device kind and dtype give the same weights in every
    process. ``dtype`` defaults to bf16.
    """
    import torch

    shape.check()
    dtype = torch.bfloat16 if dtype is None else dtype
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    h, d = shape.hidden, shape.head_dim

    def mat(rows: int, cols: int) -> Any:
        w = torch.randn(rows, cols, generator=g, device=device, dtype=torch.float32)
        return w.mul_(1.0 / math.sqrt(cols)).to(dtype)

    def norm() -> Any:
        w = torch.randn(h, generator=g, device=device, dtype=torch.float32)
        return w.mul_(0.1).add_(1.0).to(dtype)

    return {
        "input_norm": norm(),
        "q": mat(shape.heads * d, h),
        "k": mat(shape.kv_heads * d, h),
        "v": mat(shape.kv_heads * d, h),
        "o": mat(h, shape.heads * d),
        "post_norm": norm(),
        "gate": mat(shape.intermediate, h),
        "up": mat(shape.intermediate, h),
        "down": mat(h, shape.intermediate),
    }


def shard(weights: dict[str, Any], shape: LayerShape, rank: int, world: int) -> dict[str, Any]:
    """Rank ``rank``'s slices of the full ``weights``, fused and contiguous.

    ``qkv``: its query heads' rows of q, then its key/value heads' rows of k and v; ``gate_up``:
    its gate rows then its up rows; ``o`` and ``down``: its columns (input rows). The norms are
    whole on every rank.
    """
    import torch

    shape.check(world)
    if not (isinstance(rank, int) and 0 <= rank < world):
        raise ValueError(f"rank {rank!r} is not in 0..{world - 1}")
    d = shape.head_dim
    q = shape.heads // world * d
    kv = shape.kv_heads // world * d
    f = shape.intermediate // world

    def rows(w: Any, n: int) -> Any:
        return w[rank * n:(rank + 1) * n]

    return {
        "input_norm": weights["input_norm"],
        "qkv": torch.cat([rows(weights["q"], q), rows(weights["k"], kv),
                          rows(weights["v"], kv)]).contiguous(),
        "o": weights["o"][:, rank * q:(rank + 1) * q].contiguous(),
        "post_norm": weights["post_norm"],
        "gate_up": torch.cat([rows(weights["gate"], f), rows(weights["up"], f)]).contiguous(),
        "down": weights["down"][:, rank * f:(rank + 1) * f].contiguous(),
    }


def _rms_norm(x: Any, w: Any, eps: float) -> Any:
    import torch

    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(x.dtype)


def _rope_table(shape: LayerShape, tokens: int, device: Any, dtype: Any) -> tuple[Any, Any]:
    """cos and sin of every (position, channel), ``(tokens, head_dim)``, in ``dtype``."""
    import torch

    d = shape.head_dim
    inv = 1.0 / (shape.rope_theta ** (torch.arange(0, d, 2, device=device,
                                                     dtype=torch.float32) / d))
    ang = torch.outer(torch.arange(tokens, device=device, dtype=torch.float32), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def _rope(x: Any, cos: Any, sin: Any) -> Any:
    """Rotate ``x`` ``(heads, tokens, head_dim)``: the two halves of each head pair up."""
    import torch

    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


def _attend(q: Any, k: Any, v: Any, group: int) -> Any:
    """Causal attention of ``(heads, T, d)`` queries over ``(kv_heads, T, d)`` keys/values;
    ``group`` query heads read each key/value head. Returns ``(T, heads * d)``.
    """
    import torch.nn.functional as F

    if group > 1:  # each key/value head repeated for its queries (expand: no host sync)
        n, t, d = k.shape
        k = k[:, None].expand(n, group, t, d).reshape(n * group, t, d)
        v = v[:, None].expand(n, group, t, d).reshape(n * group, t, d)
    a = F.scaled_dot_product_attention(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0),
                                       is_causal=True)[0]
    return a.transpose(0, 1).reshape(q.shape[1], -1)


class Layer:
    """One rank's shard of the decoder layer; ``layer(x)`` runs a forward.

    ``x`` is the ``(T, hidden)`` hidden state of T tokens, the same on every rank; the output
    (``(T, hidden)``, a new tensor) is too, once ``all_reduce`` sums the two row-parallel
    partials. Every rank calls ``all_reduce`` twice per forward, in the same order, on a
    contiguous ``(T, hidden)`` tensor. ``max_tokens`` bounds T (the rotary table's length).

    ``fused``, when set, replaces the first all-reduce, the residual add and the post-attention
    norm: ``fused(o, x, weight, eps)`` returns ``(rmsnorm(x + all_reduce(o)) * weight,
    x + all_reduce(o))`` (as :func:`symm.fused_all_reduce_rmsnorm` does) and must not change
    ``x``.
    """

    def __init__(self, shape: LayerShape, weights: dict[str, Any], rank: int, world: int,
                 all_reduce: Optional[Callable[[Any], Any]] = None, *,
                 max_tokens: int = 4096) -> None:
        shape.check(world)
        if max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {max_tokens}")
        self.shape, self.rank, self.world = shape, rank, world
        self.all_reduce = all_reduce
        self.fused: Optional[Callable[[Any, Any, Any, float], tuple[Any, Any]]] = None
        self.w = shard(weights, shape, rank, world)
        self.heads = shape.heads // world
        self.kv_heads = shape.kv_heads // world
        self.ffn = shape.intermediate // world
        w = self.w["qkv"]
        self.cos, self.sin = _rope_table(shape, max_tokens, w.device, w.dtype)
        self.max_tokens = max_tokens

    def __call__(self, x: Any) -> Any:
        """The layer's output for hidden states ``x`` (see the class doc)."""
        import torch.nn.functional as F

        s, w = self.shape, self.w
        t = x.shape[0]
        if x.dim() != 2 or x.shape[1] != s.hidden or not (0 < t <= self.max_tokens):
            raise ValueError(f"x must be (T, {s.hidden}) with 0 < T <= {self.max_tokens}, "
                             f"got {tuple(x.shape)}")
        d = s.head_dim
        qkv = F.linear(_rms_norm(x, w["input_norm"], s.eps), w["qkv"])
        q, k, v = qkv.split([self.heads * d, self.kv_heads * d, self.kv_heads * d], dim=-1)
        q = q.reshape(t, self.heads, d).transpose(0, 1)
        k = k.reshape(t, self.kv_heads, d).transpose(0, 1)
        v = v.reshape(t, self.kv_heads, d).transpose(0, 1)
        cos, sin = self.cos[:t], self.sin[:t]
        a = _attend(_rope(q, cos, sin), _rope(k, cos, sin), v, s.heads // s.kv_heads)
        o = F.linear(a, w["o"])
        if self.fused is not None:
            n, h = self.fused(o, x, w["post_norm"], s.eps)
        else:
            if self.all_reduce is not None:
                self.all_reduce(o)
            h = x + o
            n = _rms_norm(h, w["post_norm"], s.eps)
        gate, up = F.linear(n, w["gate_up"]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w["down"])
        if self.all_reduce is not None:
            self.all_reduce(y)
        return h + y


def reference(weights: dict[str, Any], shape: LayerShape, x: Any) -> Any:
    """The unsharded layer on the full ``weights``: what every rank's sharded output must equal
    up to rounding. Written apart from :class:`Layer`: separate q, k, v, gate and up matrices,
    every head at once, and attention as softmax of masked scores in f32 rather than
    ``scaled_dot_product_attention``.
    """
    import torch

    # Full-precision reductions inside cuBLAS's bf16 GEMMs for the reference (restored after).
    mm = torch.backends.cuda.matmul
    prev = mm.allow_bf16_reduced_precision_reduction
    mm.allow_bf16_reduced_precision_reduction = False
    try:
        return _reference(weights, shape, x)
    finally:
        mm.allow_bf16_reduced_precision_reduction = prev


def _reference(weights: dict[str, Any], shape: LayerShape, x: Any) -> Any:
    import torch
    import torch.nn.functional as F

    shape.check()
    t, d = x.shape[0], shape.head_dim
    n = _rms_norm(x, weights["input_norm"], shape.eps)
    q = F.linear(n, weights["q"]).reshape(t, shape.heads, d).transpose(0, 1)
    k = F.linear(n, weights["k"]).reshape(t, shape.kv_heads, d).transpose(0, 1)
    v = F.linear(n, weights["v"]).reshape(t, shape.kv_heads, d).transpose(0, 1)
    cos, sin = _rope_table(shape, t, x.device, x.dtype)
    q, k = _rope(q, cos, sin).float(), _rope(k, cos, sin).float()
    # Attention spelled out in f32: query head i reads key/value head i // (heads / kv_heads).
    kv_of = torch.arange(shape.heads, device=x.device) // (shape.heads // shape.kv_heads)
    k, v = k[kv_of], v.float()[kv_of]
    scores = q @ k.transpose(1, 2) / math.sqrt(d)
    future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
    a = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v
    a = a.to(x.dtype).transpose(0, 1).reshape(t, shape.heads * d)
    h = x + F.linear(a, weights["o"])
    m = _rms_norm(h, weights["post_norm"], shape.eps)
    g, u = F.linear(m, weights["gate"]), F.linear(m, weights["up"])
    return h + F.linear(F.silu(g) * u, weights["down"])


class HostAllReduce:
    """A stand-in all-reduce among ``world`` threads of one process: ``fake[rank](t)`` leaves
    in ``t`` the sum of every rank's ``t`` (in rank order), once every rank called it.
    """

    def __init__(self, world: int) -> None:
        self.world = world
        self._parts: list[Any] = [None] * world
        self._barrier = threading.Barrier(world, timeout=60)

    def __getitem__(self, rank: int) -> Callable[[Any], None]:
        def all_reduce(t: Any) -> None:
            self._parts[rank] = t.clone()
            self._barrier.wait()
            total = self._parts[0].clone()
            for p in self._parts[1:]:
                total += p
            self._barrier.wait()  # every rank read every part before any is overwritten
            t.copy_(total)

        return all_reduce


def run_sharded_on_host(weights: dict[str, Any], shape: LayerShape, world: int,
                        x: Any) -> list[Any]:
    """Every rank's output of the sharded layer, the ranks run as threads of this process
    with :class:`HostAllReduce` between them.
    """
    shape.check(world)
    fake = HostAllReduce(world)
    layers = [Layer(shape, weights, r, world, fake[r], max_tokens=x.shape[0])
              for r in range(world)]
    outs: list[Any] = [None] * world
    errors: list[BaseException] = []

    def run(r: int) -> None:
        try:
            outs[r] = layers[r](x)
        except BaseException as e:  # noqa: BLE001 - handed to the caller below
            errors.append(e)
            fake._barrier.abort()

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return outs


#: The tolerance of :func:`compare` per element: ``|out - ref| <= ATOL + RTOL * |ref|``.
#: Sharded and unsharded bf16 layers round different partial sums (each rank's o and down
#: partials are rounded to bf16 before they are added, and the residual adds round again), so
#: an output element may differ by a few units in the last place of bf16 (2**-8 relative):
#: RTOL is 4 of them (2**-5). Elements near zero inherit absolute errors from the larger
#: values they were computed from: ATOL is 2**-4 for outputs of unit scale (the layer keeps
#: its residual stream near unit variance). Measured on the host (hidden 1024, 1..512 tokens,
#: world 1..8), the worst element reaches half of this bound; a missing partial misses it in
#: most elements.
ATOL, RTOL = 2.0 ** -4, 2.0 ** -5
#: The bound of :func:`compare` on the relative 2-norm of the error. Rounding alone gave 0.003
#: to 0.005 in the same measurement, a missing partial about 0.5.
MAX_REL_ERR = 2e-2


def compare(out: Any, ref: Any) -> tuple[int, float]:
    """``(wrong, rel_err)`` of a bf16 layer output against the reference: ``wrong`` counts the
    elements outside ``ATOL + RTOL * |ref|`` (a NaN is outside), at least 1 when the relative
    2-norm error ``rel_err`` exceeds :data:`MAX_REL_ERR`.
    """
    o, r = out.float(), ref.float()
    d = (o - r).abs()
    wrong = int((~(d <= ATOL + RTOL * r.abs())).sum().item())
    rel = float((o - r).norm().item() / max(float(r.norm().item()), 1e-30))
    if not rel <= MAX_REL_ERR:
        wrong = max(wrong, 1)
    return wrong, rel

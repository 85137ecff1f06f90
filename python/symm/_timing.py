"""Timing a callable in a CUDA graph, shared by the collective and the layer benchmarks."""

from __future__ import annotations

from typing import Any, Callable


def graph_run(torch: Any, fn: Callable[[], Any], calls: int, replays: int,
              pool: Any = None) -> tuple[float, Any]:
    """Runs ``fn`` once eagerly (what symm admits before a capture), captures ``calls`` calls of
    it in a CUDA graph on a side stream, and times ``replays`` replays after one untimed replay:
    microseconds per call, and the last call's result after that first replay (zeroed before
    it, when it is a tensor, so the replay must write it: what a check of the graph's output
    needs). ``pool``: the memory pool the capture allocates from (a ``MemPool``'s id).
    """
    fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    out = None
    with torch.cuda.graph(g, pool=pool, stream=side):
        for _ in range(calls):
            out = fn()
    if isinstance(out, torch.Tensor):
        out.zero_()
    g.replay()
    torch.cuda.synchronize()
    if isinstance(out, torch.Tensor):
        out = out.clone()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(replays):
        g.replay()
    e.record()
    torch.cuda.synchronize()
    del g
    return s.elapsed_time(e) * 1000.0 / (replays * calls), out

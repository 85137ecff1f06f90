"""What the benchmarks share: timing a callable eagerly and in a CUDA graph, and writing a
run's report (``bench-*.json`` and its markdown table).
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Optional


def graph_run(torch: Any, fn: Callable[[], Any], calls: int, replays: int,
              pool: Any = None, together: Optional[Callable[[], Any]] = None
              ) -> tuple[float, Any]:
    """Runs ``fn`` once eagerly (what symm admits before a capture), captures ``calls`` calls of
    it in a CUDA graph on a side stream, and times ``replays`` replays after one untimed replay:
    microseconds per call, and the last call's result after that first replay (zeroed before
    it, when it is a tensor, so the replay must write it: what a check of the graph's output
    needs). ``pool``: the memory pool the capture allocates from (a ``MemPool``'s id).
    ``together``: a host barrier of the ranks, run just before the timed replays, so no rank's
    time holds the wait for a rank that came late to them.
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
    if together is not None:
        torch.cuda.synchronize()
        together()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(replays):
        g.replay()
    e.record()
    torch.cuda.synchronize()
    del g
    return s.elapsed_time(e) * 1000.0 / (replays * calls), out


def eager_median(torch: Any, fn: Callable[[], Any], iters: int, warmup: int,
                rounds: int = 5) -> float:
    """Microseconds per eager call of ``fn``: the median of ``rounds`` runs of ``iters`` calls
    each, timed with CUDA events on the current stream after ``warmup`` calls (one slow round,
    as the first after a change of size often is, does not decide).
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    per: list[float] = []
    for _ in range(rounds):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        torch.cuda.synchronize()
        per.append(s.elapsed_time(e) * 1000.0 / iters)
    per.sort()
    return per[len(per) // 2]


def write_report(out: str, stem: str, doc: dict[str, Any], md: str) -> None:
    """Writes ``doc`` to ``out/stem.json`` and the table ``md`` to ``out/stem.md``, and prints
    the table.
    """
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, stem)
    with open(path + ".json", "w") as f:
        json.dump(doc, f, indent=1)
    with open(path + ".md", "w") as f:
        f.write(md)
    print(md, end="")

"""The all-to-all of :mod:`symm`: equal blocks in one collective, blocks of any rows per rank
(``output_split_sizes`` / ``input_split_sizes``) through one host exchange of the splits and
an equal all-to-all of padded blocks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, Optional

from . import _gpu


def all_to_all_single(output: Any, input: Any, output_split_sizes: Optional[Sequence[int]] = None,
                      input_split_sizes: Optional[Sequence[int]] = None, *, stream: Any = None,
                      algorithm: Optional[str] = None, channels: Optional[int] = None) -> Any:
    """Block ``q`` of this rank's ``input`` goes to rank ``q``; ``output``'s block ``r`` comes
    from rank ``r``. Without splits the blocks are equal (dim 0 divided by the world); with
    splits (rows of dim 0 per rank) they may differ, at the cost of one host exchange of the
    splits per call (no GPU synchronisation, so it can still be captured).
    """
    j = _gpu._get()
    w = j.world
    if output_split_sizes is None and input_split_sizes is None:
        dt, _ = _gpu._pair(j, output, input, 1, 1)
        nin = input.numel() * input.element_size()
        if nin % w:
            raise ValueError(f"input's {nin} bytes do not split into {w} equal blocks")
        if nin:
            r = _gpu._request(j, "all_to_all", nin // w, dt, "sum", algorithm, channels)
            j.collective(r, input.data_ptr(), nin, output.data_ptr(), nin,
                         _gpu._stream(j, stream))
        return output
    _gpu._check(j, output, "output")
    _gpu._check(j, input, "input")
    if output.dtype != input.dtype or output.shape[1:] != input.shape[1:]:
        raise ValueError("input and output must share dtype and every dimension past the first")
    ins = _splits(input_split_sizes, input.shape[0], w, "input_split_sizes")
    outs = _splits(output_split_sizes, output.shape[0], w, "output_split_sizes")
    # Every rank's sends and receives, so that every rank checks the whole exchange and a
    # divergence is named alike on all of them (none goes on to wait for the others).
    mine = (",".join(map(str, ins)) + ";" + ",".join(map(str, outs))).encode()
    sends, recvs = _matrix(j.comm.exchange(mine), w)
    for r in range(w):
        for q in range(w):
            if sends[r][q] != recvs[q][r]:
                raise ValueError(f"all_to_all_single: rank {r} sends {sends[r][q]} rows to rank "
                                 f"{q}, which expects {recvs[q][r]}")
    most = max(max(r) for r in sends)
    torch = j.torch
    s = None if stream is None else torch.cuda.stream(stream)
    with s if s is not None else contextlib.nullcontext():
        tail = tuple(input.shape[1:])
        send = torch.zeros((w, most) + tail, dtype=input.dtype, device=j.device)
        recv = torch.empty_like(send)
        for q, (off, n) in enumerate(_offsets(ins)):
            send[q, :n].copy_(input[off:off + n])
        all_to_all_single(recv.view(-1), send.view(-1), stream=stream, algorithm=algorithm,
                          channels=channels)
        for r, (off, n) in enumerate(_offsets(outs)):
            output[off:off + n].copy_(recv[r, :n])
    return output


def _splits(s: Optional[Sequence[int]], rows: int, w: int, what: str) -> list[int]:
    if s is None:
        if rows % w:
            raise ValueError(f"{rows} rows do not split into {w} equal blocks: give {what}")
        return [rows // w] * w
    s = [int(x) for x in s]
    if len(s) != w or any(x < 0 for x in s) or sum(s) != rows:
        raise ValueError(f"{what} must be {w} non-negative counts summing to {rows}, got {s}")
    return s


def _matrix(parts: list[bytes], w: int) -> tuple[list[list[int]], list[list[int]]]:
    """Each rank's (send rows, receive rows) from its exchanged ``sends;receives``; a part
    that is not two lists of ``w`` non-negative counts is named.
    """
    sends, recvs = [], []
    for r, b in enumerate(parts):
        try:
            a, _, c = b.decode("ascii").partition(";")
            row, col = [int(x) for x in a.split(",")], [int(x) for x in c.split(",")]
        except (UnicodeDecodeError, ValueError):
            row, col = [], []
        if len(row) != w or len(col) != w or min(row + col) < 0:
            raise ValueError(f"all_to_all_single: rank {r} sent splits that are not {w} "
                             "non-negative counts each way")
        sends.append(row)
        recvs.append(col)
    return sends, recvs


def _offsets(s: list[int]) -> list[tuple[int, int]]:
    out, off = [], 0
    for n in s:
        out.append((off, n))
        off += n
    return out

//! All-to-all with per-pair counts (all-to-allv), pairwise.
//!
//! `counts[r * world + q]` is the number of elements rank r sends to rank q. Rank r's input holds
//! its blocks for q = 0, 1, ... back to back (block q starts at the sum of `counts[r][k]` for
//! k < q); rank q's output holds the blocks it receives in sender order (the block from r starts
//! at the sum of `counts[k][q]` for k < r). Symmetric buffers have one size on every rank, the
//! request's `bytes`; every row and column sum must fit in it.
//!
//! The ops are those of the pairwise all-to-all: a `Ready` handshake with every peer, at step s a
//! copy of block r+s straight into rank r+s's output and a `Data` signal, then a wait for `Data`
//! from every peer. Each block is split across channels like every other schedule. Offsets are
//! recomputed from the counts (O(world) per block), so the iterator holds no tables.

use super::part::part;
use super::{Batch, Collective, Ctx, Cursor, Request, SchedError};
use crate::op::{Buf, Op};
use crate::signal::SlotKind::{Data, Ready};

/// One (rank, channel)'s ops of an all-to-allv.
#[derive(Clone, Debug)]
pub struct AllToAllV<'a> {
    ctx: Ctx,
    counts: &'a [u64],
    cursor: Cursor,
}

/// Rank i's send (row) and receive (column) totals, `None` on overflow.
fn totals(w: usize, counts: &[u64], i: usize) -> Option<(u64, u64)> {
    let row = counts[i * w..(i + 1) * w]
        .iter()
        .try_fold(0u64, |a, &c| a.checked_add(c))?;
    let col = (0..w).try_fold(0u64, |a, k| a.checked_add(counts[k * w + i]))?;
    Some((row, col))
}

/// The buffer size in elements an all-to-allv with these counts needs on every rank: the largest
/// row (send) or column (receive) total; `None` when `counts` is not `world * world` long or a
/// total overflows.
pub fn capacity(world: u16, counts: &[u64]) -> Option<u64> {
    let w = world as usize;
    if counts.len() != w * w {
        return None;
    }
    (0..w).try_fold(0u64, |m, i| {
        totals(w, counts, i).map(|(r, c)| m.max(r).max(c))
    })
}

/// Checks `counts` against `req` (an `AllToAllV` request) and returns the schedule of
/// (`rank`, `channel`).
pub fn alltoallv(
    req: Request,
    rank: u16,
    channel: u16,
    counts: &[u64],
) -> Result<AllToAllV<'_>, SchedError> {
    if req.collective != Collective::AllToAllV {
        return Err(SchedError::Unsupported {
            collective: req.collective,
            algorithm: req.algorithm,
        });
    }
    let ctx = Ctx::new(req, rank, channel)?;
    let w = req.world as usize;
    if counts.len() != w * w {
        return Err(SchedError::BadCounts {
            len: counts.len() as u64,
        });
    }
    let cap = req.elems();
    for i in 0..w {
        if !totals(w, counts, i).is_some_and(|(r, c)| r <= cap && c <= cap) {
            return Err(SchedError::CountsExceedBuffer { rank: i as u16 });
        }
    }
    Ok(AllToAllV {
        ctx,
        counts,
        cursor: Cursor::default(),
    })
}

/// Elements `from` sends to `to`.
fn n(ctx: &Ctx, counts: &[u64], from: u64, to: u64) -> u64 {
    counts[(from * ctx.req.world as u64 + to) as usize]
}

/// Emits unit `u` of phase `p`: 0 `Ready` to peer +u, 1 `Ready` from peer -u, 2 the block for
/// peer +u and its `Data`, 3 `Data` from peer -u.
fn emit(c: &Ctx, counts: &[u64], p: u8, u: u64, out: &mut Batch) {
    let me = c.rank;
    let w = c.req.world as u64;
    let to = ((me as u64 + u) % w) as u16;
    let from = ((me as u64 + w - u) % w) as u16;
    match p {
        0 if to != me => {
            let _ = out.push(c.signal(to, Ready));
        }
        1 if from != me => {
            let _ = out.push(c.wait(from, Ready, 1));
        }
        2 => {
            let (r, q) = (me as u64, to as u64);
            let send_displ: u64 = (0..q).map(|k| n(c, counts, r, k)).sum();
            let recv_displ: u64 = (0..r).map(|k| n(c, counts, k, q)).sum();
            let blk = part(n(c, counts, r, q), c.channel as u64, c.req.channels as u64);
            let src = c.loc(me, Buf::Input, send_displ + blk.start);
            let dst = c.loc(to, Buf::Output, recv_displ + blk.start);
            let _ = out.push(c.copy(src, dst, blk.len));
            if to != me {
                let _ = out.push(c.signal(to, Data));
            }
        }
        3 if from != me => {
            let _ = out.push(c.wait(from, Data, 1));
        }
        _ => {}
    }
}

impl Iterator for AllToAllV<'_> {
    type Item = Op;

    fn next(&mut self) -> Option<Op> {
        let (c, counts) = (&self.ctx, self.counts);
        let world = c.req.world as u64;
        self.cursor.next(
            4,
            |p| if p < 4 { world } else { 0 },
            |p, u, out| emit(c, counts, p, u, out),
        )
    }
}

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
use super::{Batch, Collective, Ctx, Request, SchedError, BATCH};
use crate::op::{Buf, Op};
use crate::signal::SlotKind::{Data, Ready};

/// One (rank, channel)'s ops of an all-to-allv.
#[derive(Clone, Debug)]
pub struct AllToAllV<'a> {
    ctx: Ctx,
    counts: &'a [u64],
    phase: u8,
    unit: u64,
    batch: Batch,
    pos: usize,
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
    req.validate()?;
    if req.collective != Collective::AllToAllV {
        return Err(SchedError::Unsupported {
            collective: req.collective,
            algorithm: req.algorithm,
        });
    }
    if rank >= req.world {
        return Err(SchedError::BadRank { rank });
    }
    if channel >= req.channels {
        return Err(SchedError::BadChannel { channel });
    }
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
    let ctx = Ctx {
        req,
        rank,
        channel,
        esize: req.dtype.size(),
        layout: req.layout(),
    };
    Ok(AllToAllV {
        ctx,
        counts,
        phase: 0,
        unit: 0,
        batch: Batch::new(),
        pos: 0,
    })
}

impl AllToAllV<'_> {
    fn n(&self, from: u64, to: u64) -> u64 {
        self.counts[(from * self.ctx.req.world as u64 + to) as usize]
    }

    fn send_displ(&self, from: u64, to: u64) -> u64 {
        (0..to).map(|k| self.n(from, k)).sum()
    }

    fn recv_displ(&self, to: u64, from: u64) -> u64 {
        (0..from).map(|k| self.n(k, to)).sum()
    }

    fn emit(&mut self, p: u8, u: u64) {
        self.batch.clear();
        self.pos = 0;
        let c = &self.ctx;
        let me = c.rank;
        let w = c.req.world as u64;
        let to = ((me as u64 + u) % w) as u16;
        let from = ((me as u64 + w - u) % w) as u16;
        let mut ops: heapless::Vec<Op, BATCH> = heapless::Vec::new();
        match p {
            0 if to != me => {
                let _ = ops.push(c.signal(to, Ready));
            }
            1 if from != me => {
                let _ = ops.push(c.wait(from, Ready, 1));
            }
            2 => {
                let (r, q) = (me as u64, to as u64);
                let blk = part(self.n(r, q), c.channel as u64, c.req.channels as u64);
                let src = c.loc(me, Buf::Input, self.send_displ(r, q) + blk.start);
                let dst = c.loc(to, Buf::Output, self.recv_displ(q, r) + blk.start);
                let _ = ops.push(c.copy(src, dst, blk.len));
                if to != me {
                    let _ = ops.push(c.signal(to, Data));
                }
            }
            3 if from != me => {
                let _ = ops.push(c.wait(from, Data, 1));
            }
            _ => {}
        }
        self.batch = ops;
    }
}

impl Iterator for AllToAllV<'_> {
    type Item = Op;

    fn next(&mut self) -> Option<Op> {
        loop {
            if let Some(op) = self.batch.get(self.pos) {
                self.pos += 1;
                return Some(*op);
            }
            if self.phase >= 4 {
                return None;
            }
            if self.unit >= self.ctx.req.world as u64 {
                self.phase += 1;
                self.unit = 0;
                continue;
            }
            let (p, u) = (self.phase, self.unit);
            self.unit += 1;
            self.emit(p, u);
        }
    }
}

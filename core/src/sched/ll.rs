//! One-shot all-reduce over the low-latency protocol ([`crate::ll`]), for small messages.
//!
//! Each rank advances its epoch (a signal to its own `Epoch` slot and a wait for it, both
//! local), writes its whole input as LL lines into region `rank` of every rank's scratch (its
//! own included), and folds the `world` regions of its own scratch, in rank order, into its
//! output as their lines arrive ([`Op::LlReduce`], the arithmetic of [`Op::ReduceN`]). There is
//! no `Ready` and no `Done` handshake: the flags say when data is in place, and the two halves
//! of the regions (by epoch parity) say when a region may be written again. One trip over the
//! link, against three signalled hops of the one-shot all-reduce.
//!
//! Only channel 0 carries the message (the other channels have no ops), and the scratch layout
//! is the same for every message size of a world: `2 x world` regions of
//! `ll::line_bytes(ll::MAX_BYTES)` bytes, half `h` and source `s` at `(h * world + s) * REGION`.
//! Messages above [`crate::ll::MAX_BYTES`] are refused (`SchedError::AboveLimit`).

use super::table::{no_streams, one_slot, serves, Desc};
use super::{Batch, Collective, Ctx, Program, Request};
use crate::cost::{Path, Shape};
use crate::ll;
use crate::op::{Buf, Loc, Op};
use crate::signal::SlotKind::Epoch;

/// Bytes of one source's region in one half.
pub(crate) const REGION: u64 = ll::line_bytes(ll::MAX_BYTES);

#[derive(Clone, Copy, Debug)]
pub(crate) struct OneShotLl;

impl Program for OneShotLl {
    const PHASES: u8 = 3;

    fn new(_ctx: &Ctx) -> Self {
        OneShotLl
    }

    fn units(&self, ctx: &Ctx, p: u8) -> u64 {
        if ctx.channel != 0 {
            return 0;
        }
        match p {
            1 => ctx.world() as u64,
            _ => 1,
        }
    }

    fn emit(&self, ctx: &Ctx, p: u8, u: u64, out: &mut Batch) {
        let me = ctx.rank;
        let w = ctx.world() as u64;
        let epoch = ctx.wait(me, Epoch, 1);
        let Op::Wait { slot, .. } = epoch else {
            return;
        };
        let flip = w * REGION;
        match p {
            0 => {
                let _ = out.push(ctx.signal(me, Epoch));
                let _ = out.push(epoch);
            }
            1 => {
                let q = ((me as u64 + u) % w) as u16;
                let _ = out.push(Op::LlPut {
                    src: Loc::new(me, Buf::Input, 0),
                    dst: Loc::new(q, Buf::Scratch, me as u64 * REGION),
                    bytes: ctx.req.bytes,
                    slot,
                    flip,
                });
            }
            _ => {
                let _ = out.push(Op::LlReduce {
                    src: Loc::new(me, Buf::Scratch, 0),
                    stride: REGION,
                    sources: w as u16,
                    dst: Loc::new(me, Buf::Output, 0),
                    elems: ctx.req.elems(),
                    dtype: ctx.req.dtype,
                    op: ctx.req.op,
                    div: ctx.div(true),
                    slot,
                    flip,
                });
            }
        }
    }
}

fn scratch(r: &Request) -> u64 {
    2u64.saturating_mul(r.world as u64).saturating_mul(REGION)
}

fn cost(r: &Request, s: &Shape) -> Path {
    match r.collective {
        // A put of its lines (twice the data) to each peer, as the simulator issues them one
        // after another, then one local pass over the arrived lines.
        Collective::AllReduce => {
            let n = r.bytes as f64;
            Path::new(s.pf - 1.0, (2.0 * (s.pf - 1.0) + 1.0) * n)
        }
        _ => s.serial(),
    }
}

/// One-shot all-reduce over LL lines.
pub(crate) const ONE_SHOT_LL: Desc = Desc {
    serves: serves::ALL_REDUCE,
    streams: no_streams,
    min_slots: one_slot,
    cost,
    scratch,
    max_bytes: ll::MAX_BYTES,
};

/// The low-latency exchange for the collectives in which every rank sends to and receives from
/// every rank: all-gather, reduce-scatter and all-to-all, `bytes` per block up to
/// [`ll::MAX_BYTES`].
///
/// The scratch layout, the epoch and the halves are one-shot-ll's: rank `me` writes its block for
/// rank `q` (all-gather: its whole input; reduce-scatter and all-to-all: input block `q`) as LL
/// lines into region `me` of `q`'s scratch, its own included, then reads its `world` regions as
/// their lines arrive: reduce-scatter folds them in rank order into its output (the arithmetic
/// of [`Op::ReduceN`]); all-gather and all-to-all copy region `s` to output block `s` (an
/// [`Op::LlReduce`] of one source, which keeps the data's bits). Every rank both sends to and
/// receives from every rank in every call, which is what the reuse argument of [`crate::ll`]
/// needs, so rooted collectives (broadcast, gather, scatter, reduce) are not served.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DirectLl;

impl Program for DirectLl {
    const PHASES: u8 = 3;

    fn new(_ctx: &Ctx) -> Self {
        DirectLl
    }

    fn units(&self, ctx: &Ctx, p: u8) -> u64 {
        if ctx.channel != 0 {
            return 0;
        }
        match p {
            0 => 1,
            2 if ctx.req.collective == Collective::ReduceScatter => 1,
            _ => ctx.world() as u64,
        }
    }

    fn emit(&self, ctx: &Ctx, p: u8, u: u64, out: &mut Batch) {
        let me = ctx.rank;
        let w = ctx.world() as u64;
        let b = ctx.req.bytes;
        let epoch = ctx.wait(me, Epoch, 1);
        let Op::Wait { slot, .. } = epoch else {
            return;
        };
        let flip = w * REGION;
        match p {
            0 => {
                let _ = out.push(ctx.signal(me, Epoch));
                let _ = out.push(epoch);
            }
            1 => {
                let q = (me as u64 + u) % w;
                let from = match ctx.req.collective {
                    Collective::AllGather => 0,
                    _ => q * b,
                };
                let _ = out.push(Op::LlPut {
                    src: Loc::new(me, Buf::Input, from),
                    dst: Loc::new(q as u16, Buf::Scratch, me as u64 * REGION),
                    bytes: b,
                    slot,
                    flip,
                });
            }
            _ => {
                let (sources, from, to, div) = match ctx.req.collective {
                    Collective::ReduceScatter => (w as u16, 0, 0, ctx.div(true)),
                    _ => (1, u * REGION, u * b, 1),
                };
                let _ = out.push(Op::LlReduce {
                    src: Loc::new(me, Buf::Scratch, from),
                    stride: REGION,
                    sources,
                    dst: Loc::new(me, Buf::Output, to),
                    elems: ctx.req.elems(),
                    dtype: ctx.req.dtype,
                    op: ctx.req.op,
                    div,
                    slot,
                    flip,
                });
            }
        }
    }
}

fn direct_cost(r: &Request, s: &Shape) -> Path {
    // A put of the lines (twice the block) to each peer, one after another, then one local
    // pass over the arrived lines of every block.
    let n = r.bytes as f64;
    Path::new(s.pf - 1.0, (2.0 * (s.pf - 1.0) + s.pf) * n)
}

/// The low-latency exchange: all-gather, reduce-scatter and all-to-all over LL lines.
pub(crate) const DIRECT_LL: Desc = Desc {
    serves: serves::ALL_GATHER | serves::REDUCE_SCATTER | serves::ALL_TO_ALL,
    streams: no_streams,
    min_slots: one_slot,
    cost: direct_cost,
    scratch,
    max_bytes: ll::MAX_BYTES,
};

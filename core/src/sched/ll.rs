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

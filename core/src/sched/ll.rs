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
//! **Channels.** A message is split over `k = ll::channels(req.channels)` channels (at most
//! [`ll::MAX_CHANNELS`]), channel `c` carrying part `c` of the elements ([`part`]) as an LL
//! instance of its own: its own `Epoch` slot, and its own regions at a place that depends only
//! on `(world, c)`: `2 x world` regions of `ll::line_bytes(ll::MAX_BYTES)` bytes from
//! `c x 2 x world x REGION`, half `h` and source `s` at `(h * world + s) * REGION` within them.
//! So a region is only ever written and read by the same channel of every call, whatever the
//! message size and channel count, and the reuse argument of [`crate::ll`] holds per channel.
//! Channels past `k`, and channels whose part is empty (on every rank alike), do nothing. A
//! channel's part is at most [`ll::MAX_BYTES`], so a request takes `k x ll::MAX_BYTES`
//! (`SchedError::AboveLimit` past that).

use super::part::{part, Part};
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
        if share(ctx).len == 0 {
            return 0;
        }
        match p {
            1 => ctx.world() as u64,
            _ => 1,
        }
    }

    fn emit(&self, ctx: &Ctx, p: u8, u: u64, out: &mut Batch) {
        let Some(c) = Call::of(ctx) else {
            return;
        };
        match p {
            0 => c.epoch(ctx, out),
            1 => c.put((c.me as u64 + u) % c.w, 0, out),
            _ => {
                let _ = out.push(Op::LlReduce {
                    src: Loc::new(c.me, Buf::Scratch, c.base),
                    stride: REGION,
                    sources: c.w as u16,
                    dst: Loc::new(c.me, Buf::Output, c.at),
                    elems: c.part.len,
                    dtype: ctx.req.dtype,
                    op: ctx.req.op,
                    div: ctx.div(true),
                    slot: c.slot,
                    flip: c.flip,
                });
            }
        }
    }
}

/// What every op of one (rank, channel) of an LL call shares: this channel's part of the data
/// (its byte offset `at` and length `bytes`), where its regions start, the epoch slot and the
/// half offset.
struct Call {
    me: u16,
    w: u64,
    part: Part,
    at: u64,
    bytes: u64,
    base: u64,
    slot: u32,
    flip: u64,
}

impl Call {
    fn of(ctx: &Ctx) -> Option<Call> {
        let part = share(ctx);
        let Op::Wait { slot, .. } = ctx.wait(ctx.rank, Epoch, 1) else {
            return None;
        };
        let w = ctx.world() as u64;
        Some(Call {
            me: ctx.rank,
            w,
            part,
            at: part.start * ctx.esize,
            bytes: part.len * ctx.esize,
            base: base(ctx),
            slot,
            flip: w * REGION,
        })
    }

    /// The call's epoch: a signal to this rank's own `Epoch` slot and the wait for it.
    fn epoch(&self, ctx: &Ctx, out: &mut Batch) {
        let _ = out.push(ctx.signal(self.me, Epoch));
        let _ = out.push(ctx.wait(self.me, Epoch, 1));
    }

    /// This channel's part of the input from byte `block` on, as lines into region `me` of
    /// rank `q`'s regions of this channel.
    fn put(&self, q: u64, block: u64, out: &mut Batch) {
        let _ = out.push(Op::LlPut {
            src: Loc::new(self.me, Buf::Input, block + self.at),
            dst: Loc::new(q as u16, Buf::Scratch, self.base + self.me as u64 * REGION),
            bytes: self.bytes,
            slot: self.slot,
            flip: self.flip,
        });
    }
}

/// This channel's part of a rank-level unit's elements: part `c` of `ll::channels` parts, or
/// nothing past them.
fn share(ctx: &Ctx) -> Part {
    let k = ll::channels(ctx.req.channels) as u64;
    part(ctx.req.elems(), ctx.channel as u64, k)
}

/// Where this channel's regions start in the scratch buffer.
fn base(ctx: &Ctx) -> u64 {
    ctx.channel as u64 * 2 * ctx.world() as u64 * REGION
}

/// The most data a request on `channels` channels takes: [`ll::MAX_BYTES`] per channel used.
fn max_bytes(channels: u16) -> u64 {
    ll::MAX_BYTES * ll::channels(channels) as u64
}

fn scratch(r: &Request) -> u64 {
    2u64.saturating_mul(r.world as u64)
        .saturating_mul(REGION)
        .saturating_mul(ll::channels(r.channels) as u64)
}

/// The LL exchange as the simulator runs it: the epoch's signal to itself and its wait (an issue
/// and a hop), the lines (twice the data) to itself through the memory port and to the `p - 1`
/// peers one after another through the egress port (posted), the last landing a hop later, then
/// `passes` local passes over the data. Every channel's lines cross the same ports, so the port
/// terms carry the whole message, spread over the request's channels (the model multiplies
/// them back).
fn lines(r: &Request, s: &Shape, passes: f64) -> Path {
    let n = r.bytes as f64 / s.ch;
    let lines = 2.0 * n;
    Path::issues(1.0)
        + Path::hops(2.0)
        + Path::mem(lines + passes * n)
        + Path::link((s.pf - 1.0) * lines)
}

fn cost(r: &Request, s: &Shape) -> Path {
    match r.collective {
        Collective::AllReduce => lines(r, s, 1.0),
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
    max_bytes,
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
        if share(ctx).len == 0 {
            return 0;
        }
        match p {
            0 => 1,
            2 if ctx.req.collective == Collective::ReduceScatter => 1,
            _ => ctx.world() as u64,
        }
    }

    fn emit(&self, ctx: &Ctx, p: u8, u: u64, out: &mut Batch) {
        let Some(c) = Call::of(ctx) else {
            return;
        };
        let b = ctx.req.bytes;
        match p {
            0 => c.epoch(ctx, out),
            1 => {
                let q = (c.me as u64 + u) % c.w;
                let block = match ctx.req.collective {
                    Collective::AllGather => 0,
                    _ => q * b,
                };
                c.put(q, block, out);
            }
            _ => {
                let (sources, from, to, div) = match ctx.req.collective {
                    Collective::ReduceScatter => (c.w as u16, 0, 0, ctx.div(true)),
                    _ => (1, u * REGION, u * b, 1),
                };
                let _ = out.push(Op::LlReduce {
                    src: Loc::new(c.me, Buf::Scratch, c.base + from),
                    stride: REGION,
                    sources,
                    dst: Loc::new(c.me, Buf::Output, to + c.at),
                    elems: c.part.len,
                    dtype: ctx.req.dtype,
                    op: ctx.req.op,
                    div,
                    slot: c.slot,
                    flip: c.flip,
                });
            }
        }
    }
}

fn direct_cost(r: &Request, s: &Shape) -> Path {
    // Reduce-scatter folds its regions in one pass; all-gather and all-to-all copy each of
    // the `p` regions out with a pass of its own, after the last one landed.
    let passes = match r.collective {
        Collective::ReduceScatter => 1.0,
        _ => s.pf,
    };
    lines(r, s, passes)
}

/// The low-latency exchange: all-gather, reduce-scatter and all-to-all over LL lines.
pub(crate) const DIRECT_LL: Desc = Desc {
    serves: serves::ALL_GATHER | serves::REDUCE_SCATTER | serves::ALL_TO_ALL,
    streams: no_streams,
    min_slots: one_slot,
    cost: direct_cost,
    scratch,
    max_bytes,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DType, ReduceOp};
    use crate::sched::{Algorithm, Schedule, SchedError};

    fn req(c: Collective, a: Algorithm, bytes: u64, channels: u16) -> Request {
        Request::new(c, a, 3, bytes, DType::Bf16, ReduceOp::Sum).with_channels(channels)
    }

    #[test]
    fn a_message_splits_over_at_most_sixteen_channels_of_64_kib() {
        for a in [Algorithm::OneShotLl, Algorithm::DirectLl] {
            let c = if a == Algorithm::OneShotLl {
                Collective::AllReduce
            } else {
                Collective::AllToAll
            };
            assert!(req(c, a, 1 << 20, 16).validate().is_ok());
            assert!(req(c, a, 1 << 20, 64).validate().is_ok());
            assert_eq!(
                req(c, a, 1 << 20, 15).validate(),
                Err(SchedError::AboveLimit {
                    algorithm: a,
                    bytes: 1 << 20,
                    max: 15 * ll::MAX_BYTES
                })
            );
            assert!(a.takes(ll::MAX_BYTES) && !a.takes(ll::MAX_BYTES + 2));
            assert!(a.takes_on(16 * ll::MAX_BYTES, 64) && !a.takes_on(16 * ll::MAX_BYTES + 2, 64));
        }
    }

    /// Every op of channel `c` touches only channel `c`'s regions, at every size and channel
    /// count: the regions of a channel are its own across calls.
    #[test]
    fn each_channel_keeps_to_its_own_regions() {
        let span = 2 * 3 * REGION;
        for bytes in [2, 1024, 96 << 10, 1 << 20] {
            for channels in [16, 20] {
                for (c, a) in [
                    (Collective::AllReduce, Algorithm::OneShotLl),
                    (Collective::AllGather, Algorithm::DirectLl),
                    (Collective::ReduceScatter, Algorithm::DirectLl),
                    (Collective::AllToAll, Algorithm::DirectLl),
                ] {
                    let r = req(c, a, bytes, channels);
                    for ch in 0..channels {
                        let ops: alloc::vec::Vec<Op> = Schedule::new(r, 1, ch).unwrap().collect();
                        if ch >= ll::MAX_CHANNELS || (bytes / 2) <= ch as u64 {
                            assert!(ops.is_empty(), "{c:?} {bytes} B channel {ch}");
                            continue;
                        }
                        let lo = ch as u64 * span;
                        for op in &ops {
                            let scratch = match *op {
                                Op::LlPut { dst, .. } => dst,
                                Op::LlReduce { src, .. } => src,
                                _ => continue,
                            };
                            assert!(
                                scratch.offset >= lo && scratch.offset < lo + span,
                                "{c:?} {bytes} B channel {ch}: {op:?}"
                            );
                        }
                    }
                }
            }
        }
    }
}

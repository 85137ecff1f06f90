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
//! instance of its own: its own `Epoch` slot, and its own regions: `2 x world` regions of
//! `REGION` bytes (the lines of the largest channel part of this message, so at most
//! [`ll::Format::region`]) from `c x 2 x world x REGION`, half `h` and source `s` at
//! `(h * world + s) * REGION` within them. So the scratch a request takes is sized by its message and channels (a 4-byte call at
//! world 1024 takes 32 KiB per rank, not 256 MiB), and within the scratch of one request a region
//! is only ever written and read by the same channel of every call: the reuse argument of
//! [`crate::ll`] holds per channel. A scratch buffer is laid out for one request: requests of
//! another size or channel count place their regions elsewhere in it, so they must not share it
//! (the runtime gives every request a workspace of its own).
//! Channels past `k`, and channels whose part is empty (on every rank alike), do nothing. A
//! channel's part is at most the format's bound ([`ll::MAX_BYTES`] for 16-byte lines), so a
//! request takes `k` times that (`SchedError::AboveLimit` past that).
//!
//! **128-byte lines.** `one_shot_ll128` and `direct_ll128` are the same programs over
//! [`ll::Format::Ll128`] lines ([`Op::LlPut`], [`Op::LlReduce`] with that `format`): a sixteenth of overhead
//! instead of a half, [`ll::MAX_BYTES_128`] per channel, and regions of their own lines, so a
//! scratch buffer holds one format's lines at a time.

use super::part::{part, Part};
use super::table::{no_streams, one_slot, serves, Desc};
use super::{Batch, Collective, Ctx, Program, Request};
use crate::cost::{Path, Shape};
use crate::ll;
use crate::op::{Buf, Loc, Op};
use crate::signal::SlotKind::Epoch;

/// The line format of a program: 128-byte lines when `L128`.
const fn format(l128: bool) -> ll::Format {
    if l128 {
        ll::Format::Ll128
    } else {
        ll::Format::Ll
    }
}

/// One-shot all-reduce over lines of [`format`]`(L128)`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OneShotLines<const L128: bool>;

/// One-shot all-reduce over 16-byte lines.
pub(crate) type OneShotLl = OneShotLines<false>;
/// One-shot all-reduce over 128-byte lines.
pub(crate) type OneShotLl128 = OneShotLines<true>;

impl<const L128: bool> Program for OneShotLines<L128> {
    const PHASES: u8 = 3;

    fn new(_ctx: &Ctx) -> Self {
        OneShotLines
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
        let Some(c) = Call::of(ctx, format(L128)) else {
            return;
        };
        match p {
            0 => c.epoch(ctx, out),
            1 => c.put((c.me as u64 + u) % c.w, 0, out),
            _ => c.reduce(ctx, c.w as u16, 0, 0, ctx.div(true), out),
        }
    }
}

/// What every op of one (rank, channel) of an LL call shares: this channel's part of the data
/// (its byte offset `at` and length `bytes`), where its regions start, the epoch slot and the
/// half offset.
struct Call {
    format: ll::Format,
    region: u64,
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
    fn of(ctx: &Ctx, format: ll::Format) -> Option<Call> {
        let part = share(ctx);
        let region = region_of(format, &ctx.req);
        let Op::Wait { slot, .. } = ctx.wait(ctx.rank, Epoch, 1) else {
            return None;
        };
        let w = ctx.world() as u64;
        Some(Call {
            format,
            region,
            me: ctx.rank,
            w,
            part,
            at: part.start * ctx.esize,
            bytes: part.len * ctx.esize,
            base: ctx.channel as u64 * 2 * w * region,
            slot,
            flip: w * region,
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
        let op = Op::LlPut {
            format: self.format,
            src: Loc::new(self.me, Buf::Input, block + self.at),
            dst: Loc::new(q as u16, Buf::Scratch, self.base + self.me as u64 * self.region),
            bytes: self.bytes,
            slot: self.slot,
            flip: self.flip,
        };
        let _ = out.push(op);
    }

    /// Folds `sources` of this rank's regions, from region `from` on, into its output at
    /// element byte `to` of this channel's part, divided by `div`.
    fn reduce(&self, ctx: &Ctx, sources: u16, from: u64, to: u64, div: u32, out: &mut Batch) {
        let op = Op::LlReduce {
            format: self.format,
            src: Loc::new(self.me, Buf::Scratch, self.base + from * self.region),
            stride: self.region,
            sources,
            dst: Loc::new(self.me, Buf::Output, to + self.at),
            elems: self.part.len,
            dtype: ctx.req.dtype,
            op: ctx.req.op,
            div,
            slot: self.slot,
            flip: self.flip,
        };
        let _ = out.push(op);
    }
}

/// This channel's part of a rank-level unit's elements: part `c` of `ll::channels` parts, or
/// nothing past them.
fn share(ctx: &Ctx) -> Part {
    let k = ll::channels(ctx.req.channels) as u64;
    part(ctx.req.elems(), ctx.channel as u64, k)
}

/// The most data a request on `channels` channels takes: the format's
/// [`ll::Format::max_bytes`] per channel used.
fn max_bytes<const L128: bool>(channels: u16) -> u64 {
    format(L128).max_bytes() * ll::channels(channels) as u64
}

/// Bytes of one source's region in one half for `r` over lines of `format`: the lines of the
/// largest channel part (part 0), at least one line.
fn region_of(format: ll::Format, r: &Request) -> u64 {
    let k = ll::channels(r.channels) as u64;
    let largest = part(r.elems(), 0, k).len.saturating_mul(r.dtype.size());
    format.line_bytes(largest).max(format.line())
}

fn scratch<const L128: bool>(r: &Request) -> u64 {
    2u64.saturating_mul(r.world as u64)
        .saturating_mul(region_of(format(L128), r))
        .saturating_mul(ll::channels(r.channels) as u64)
}

/// The LL exchange as the simulator runs it: the epoch's signal to itself and its wait (an issue
/// and a hop; 128-byte lines a hop more per peer, each put's flags going out once its data
/// landed), the
/// lines (the data times `line / data` of the format) to itself through the memory port and to the `p - 1`
/// peers one after another through the egress port (posted), the last landing a hop later, then
/// `passes` local passes over the data. Every channel's lines cross the same ports, so the port
/// terms carry the whole message, spread over the request's channels (the model multiplies
/// them back).
fn lines(f: ll::Format, r: &Request, s: &Shape, passes: f64) -> Path {
    let n = r.bytes as f64 / s.ch;
    let lines = n * f.line() as f64 / f.data() as f64;
    // 128-byte lines release their flags once the data landed: each put to a peer waits a
    // hop for its data before its flags go out.
    let release = match f {
        ll::Format::Ll => 0.0,
        ll::Format::Ll128 => s.pf - 1.0,
    };
    Path::issues(1.0)
        + Path::hops(2.0 + release)
        + Path::mem(lines + passes * n)
        + Path::link((s.pf - 1.0) * lines)
}

fn cost<const L128: bool>(r: &Request, s: &Shape) -> Path {
    match r.collective {
        Collective::AllReduce => lines(format(L128), r, s, 1.0),
        _ => s.serial(),
    }
}

/// One-shot all-reduce over LL lines.
pub(crate) const ONE_SHOT_LL: Desc = Desc {
    serves: serves::ALL_REDUCE,
    streams: no_streams,
    min_slots: one_slot,
    cost: cost::<false>,
    scratch: scratch::<false>,
    max_bytes: max_bytes::<false>,
    in_place: serves::ALL_REDUCE,
    own: [serves::ALL_REDUCE, serves::ALL_REDUCE],
    combines: super::Combines::RankOrderLines,
};

/// One-shot all-reduce over 128-byte lines.
pub(crate) const ONE_SHOT_LL128: Desc = Desc {
    serves: serves::ALL_REDUCE,
    streams: no_streams,
    min_slots: one_slot,
    cost: cost::<true>,
    scratch: scratch::<true>,
    max_bytes: max_bytes::<true>,
    in_place: serves::ALL_REDUCE,
    own: [serves::ALL_REDUCE, serves::ALL_REDUCE],
    combines: super::Combines::RankOrderLines,
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
pub(crate) struct DirectLines<const L128: bool>;

/// The low-latency exchange over 16-byte lines.
pub(crate) type DirectLl = DirectLines<false>;
/// The low-latency exchange over 128-byte lines.
pub(crate) type DirectLl128 = DirectLines<true>;

impl<const L128: bool> Program for DirectLines<L128> {
    const PHASES: u8 = 3;

    fn new(_ctx: &Ctx) -> Self {
        DirectLines
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
        let Some(c) = Call::of(ctx, format(L128)) else {
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
                    _ => (1, u, u * b, 1),
                };
                c.reduce(ctx, sources, from, to, div, out);
            }
        }
    }
}

fn direct_cost<const L128: bool>(r: &Request, s: &Shape) -> Path {
    // Reduce-scatter folds its regions in one pass; all-gather and all-to-all copy each of
    // the `p` regions out with a pass of its own, after the last one landed.
    let passes = match r.collective {
        Collective::ReduceScatter => 1.0,
        _ => s.pf,
    };
    lines(format(L128), r, s, passes)
}

/// The low-latency exchange: all-gather, reduce-scatter and all-to-all over LL lines.
pub(crate) const DIRECT_LL: Desc = Desc {
    serves: serves::ALL_GATHER | serves::REDUCE_SCATTER | serves::ALL_TO_ALL,
    streams: no_streams,
    min_slots: one_slot,
    cost: direct_cost::<false>,
    scratch: scratch::<false>,
    max_bytes: max_bytes::<false>,
    in_place: 0,
    own: [serves::ALL_GATHER | serves::REDUCE_SCATTER | serves::ALL_TO_ALL, serves::ALL_GATHER | serves::REDUCE_SCATTER | serves::ALL_TO_ALL],
    combines: super::Combines::RankOrderLines,
};

/// The low-latency exchange over 128-byte lines.
pub(crate) const DIRECT_LL128: Desc = Desc {
    serves: serves::ALL_GATHER | serves::REDUCE_SCATTER | serves::ALL_TO_ALL,
    streams: no_streams,
    min_slots: one_slot,
    cost: direct_cost::<true>,
    scratch: scratch::<true>,
    max_bytes: max_bytes::<true>,
    in_place: 0,
    own: [serves::ALL_GATHER | serves::REDUCE_SCATTER | serves::ALL_TO_ALL, serves::ALL_GATHER | serves::REDUCE_SCATTER | serves::ALL_TO_ALL],
    combines: super::Combines::RankOrderLines,
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DType, ReduceOp};
    use crate::sched::{Algorithm, Schedule, SchedError};

    fn req(c: Collective, a: Algorithm, bytes: u64, channels: u16) -> Request {
        Request::new(c, a, 3, bytes, DType::Bf16, ReduceOp::Sum).with_channels(channels)
    }

    /// The low-latency algorithms, each with a collective it serves and its line format.
    const LL: [(Algorithm, Collective, ll::Format); 4] = [
        (Algorithm::OneShotLl, Collective::AllReduce, ll::Format::Ll),
        (Algorithm::DirectLl, Collective::AllToAll, ll::Format::Ll),
        (Algorithm::OneShotLl128, Collective::AllReduce, ll::Format::Ll128),
        (Algorithm::DirectLl128, Collective::ReduceScatter, ll::Format::Ll128),
    ];

    #[test]
    fn a_message_splits_over_at_most_sixteen_channels_of_the_format_s_bound() {
        for (a, c, f) in LL {
            let max = f.max_bytes();
            // 16 channels of the bound, in whole bf16 elements (a reduce-scatter's block).
            let top = 16 * max;
            assert!(req(c, a, top, 16).validate().is_ok(), "{a:?}");
            assert!(req(c, a, top, 64).validate().is_ok(), "{a:?}");
            assert_eq!(
                req(c, a, top, 15).validate(),
                Err(SchedError::AboveLimit {
                    algorithm: a,
                    bytes: top,
                    max: 15 * max
                })
            );
            assert!(a.takes(max) && !a.takes(max + 2));
            assert!(a.takes_on(16 * max, 64) && !a.takes_on(16 * max + 2, 64));
        }
        assert_eq!(ll::Format::Ll.max_bytes(), ll::MAX_BYTES);
    }

    /// Every op of channel `c` touches only channel `c`'s regions, at every size and channel
    /// count, in both line formats: the regions of a channel are its own across calls.
    #[test]
    fn each_channel_keeps_to_its_own_regions() {
        for bytes in [2, 1024, 96 << 10, 1 << 20] {
            for channels in [16, 20] {
                for (c, a, f) in [
                    (Collective::AllReduce, Algorithm::OneShotLl, ll::Format::Ll),
                    (Collective::AllGather, Algorithm::DirectLl, ll::Format::Ll),
                    (Collective::ReduceScatter, Algorithm::DirectLl, ll::Format::Ll),
                    (Collective::AllToAll, Algorithm::DirectLl, ll::Format::Ll),
                    (Collective::AllReduce, Algorithm::OneShotLl128, ll::Format::Ll128),
                    (Collective::AllGather, Algorithm::DirectLl128, ll::Format::Ll128),
                    (Collective::AllToAll, Algorithm::DirectLl128, ll::Format::Ll128),
                ] {
                    let r = req(c, a, bytes, channels);
                    let span = region_of(f, &r) * 2 * 3;
                    assert!(span <= 2 * 3 * f.region());
                    for ch in 0..channels {
                        let ops: alloc::vec::Vec<Op> = Schedule::new(r, 1, ch).unwrap().collect();
                        if ch >= ll::MAX_CHANNELS || (bytes / 2) <= ch as u64 {
                            assert!(ops.is_empty(), "{c:?} {bytes} B channel {ch}");
                            continue;
                        }
                        let lo = ch as u64 * span;
                        for op in &ops {
                            let scratch = match *op {
                                Op::LlPut { dst, format, .. } => {
                                    assert_eq!(format, f);
                                    dst
                                }
                                Op::LlReduce { src, format, .. } => {
                                    assert_eq!(format, f);
                                    src
                                }
                                Op::Copy { .. }
                                | Op::Reduce { .. }
                                | Op::Signal { .. }
                                | Op::Wait { .. }
                                | Op::ReduceN { .. }
                                | Op::McReduce { .. }
                                | Op::McStore { .. } => continue,
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

//! Recursive halving-doubling all-reduce for any world size.
//!
//! Let P be the largest power of two not above the world size and E = world - P. The first 2E
//! ranks pair up: each even rank r (an *extra*) folds its whole input into r+1 and sits out; the
//! remaining P ranks get virtual ranks v (odd r < 2E: v = r/2; r >= 2E: v = r - E).
//!
//! * Halving, step i (bit b = P >> (i+1)): a rank holds the segments `[lo, lo+2b)` of its channel
//!   part (cut into P segments), keeps the half selected by bit b of v and exchanges the other
//!   half with virtual rank `v ^ b`: it streams its partial of that half into the partner's scratch
//!   and combines the partner's partial of its own half into its output. After log2 P steps,
//!   virtual rank v holds segment v fully reduced.
//! * Doubling, step j (bit b = 1 << j): partners swap their complete ranges by writing straight
//!   into each other's output, doubling the range each step.
//! * Unfold: each folded-into rank copies the whole result into its extra's output.
//!
//! Each exchange of the fold and of the halving steps is a credited stream with its own scratch
//! region (the partner of step i+1 may start writing before this rank has drained step i).

use super::part::{chunks, part, Part};
use super::table::{no_scratch, no_streams, one_slot, serves, Desc};
use super::{Batch, Collective, Ctx, Program, Request};
use crate::cost::{depth, div_ceil, Path, Shape};
use crate::op::Buf;
use crate::signal::SlotKind::{Credit, Data, Ready};

/// Scratch regions (streams) per channel for a world: the fold plus one per halving step.
pub(crate) fn regions(world: u16) -> u32 {
    levels(world) + 1
}

fn levels(world: u16) -> u32 {
    if world == 0 {
        0
    } else {
        15 - world.leading_zeros()
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Rhd {
    /// Power of two participating.
    p: u64,
    /// Extra ranks.
    e: u64,
    /// Halving levels.
    l: u32,
    part: Part,
}

enum Role {
    /// Folds into `partner` and waits for the result.
    Extra { partner: u16 },
    /// Virtual rank `v`; `fold` is the extra folding into it, if any.
    Active { v: u64, fold: Option<u16> },
}

impl Rhd {
    pub fn new(ctx: &Ctx) -> Rhd {
        let w = ctx.world() as u64;
        let l = levels(ctx.world());
        let p = 1u64 << l;
        Rhd {
            p,
            e: w - p,
            l,
            part: part(ctx.req.elems(), ctx.channel as u64, ctx.req.channels as u64),
        }
    }

    fn role(&self, rank: u16) -> Role {
        let r = rank as u64;
        if r < 2 * self.e {
            if r.is_multiple_of(2) {
                Role::Extra { partner: rank + 1 }
            } else {
                Role::Active {
                    v: r / 2,
                    fold: Some(rank - 1),
                }
            }
        } else {
            Role::Active {
                v: r - self.e,
                fold: None,
            }
        }
    }

    fn rank_of(&self, v: u64) -> u16 {
        (if v < self.e { 2 * v + 1 } else { v + self.e }) as u16
    }

    fn segs(&self, a: u64, b: u64) -> Part {
        self.part.span(a, b, self.p)
    }

    /// (keep, send, chunks) of halving step i for virtual rank v.
    fn halving(&self, ctx: &Ctx, v: u64, i: u32) -> (Part, Part, u64) {
        let b = self.p >> (i + 1);
        let lo = v / (2 * b) * (2 * b);
        let (lower, upper) = (self.segs(lo, lo + b), self.segs(lo + b, lo + 2 * b));
        let (keep, send) = if v & b != 0 {
            (upper, lower)
        } else {
            (lower, upper)
        };
        let k = chunks(keep.len.max(send.len), ctx.req.chunk_elems());
        (keep, send, k)
    }

    fn fold_chunks(&self, ctx: &Ctx) -> u64 {
        chunks(self.part.len, ctx.req.chunk_elems())
    }
}

impl Program for Rhd {
    const PHASES: u8 = 6;

    fn new(ctx: &Ctx) -> Self {
        Rhd::new(ctx)
    }

    fn units(&self, ctx: &Ctx, p: u8) -> u64 {
        let role = self.role(ctx.rank);
        match (p, role) {
            (0 | 1, _) => self.l as u64 + 1,
            (2, Role::Extra { .. }) | (2, Role::Active { fold: Some(_), .. }) => {
                self.fold_chunks(ctx)
            }
            (3, Role::Active { v, .. }) => (0..self.l).map(|i| self.halving(ctx, v, i).2).sum(),
            (4, Role::Active { .. }) => self.l as u64,
            (5, Role::Extra { .. }) | (5, Role::Active { fold: Some(_), .. }) => 1,
            (5, _) if ctx.world() == 1 => 1,
            _ => 0,
        }
    }

    fn emit(&self, ctx: &Ctx, p: u8, u: u64, out: &mut Batch) {
        let me = ctx.rank;
        let slots = ctx.req.slot_count();
        let regions = regions(ctx.world()) as u64;
        let scratch = |rank: u16, region: u64, k: u64| {
            ctx.loc(rank, Buf::Scratch, ctx.scratch(regions, region, k % slots))
        };
        let role = self.role(me);
        match p {
            0 | 1 => {
                let peer = match (&role, u) {
                    (Role::Extra { partner }, 0) => Some(*partner),
                    (Role::Active { fold, .. }, 0) => *fold,
                    (Role::Active { v, .. }, i) => Some(self.rank_of(v ^ (self.p >> i))),
                    _ => None,
                };
                if let Some(q) = peer {
                    let op = if p == 0 {
                        ctx.signal(q, Ready)
                    } else {
                        ctx.wait(q, Ready, 1)
                    };
                    let _ = out.push(op);
                }
            }
            2 => {
                let kf = self.fold_chunks(ctx);
                let c = self.part.sub(u, kf);
                match role {
                    Role::Extra { partner } => {
                        if u >= slots {
                            let _ = out.push(ctx.wait(partner, Credit, 1));
                        }
                        let src = ctx.loc(me, Buf::Input, c.start);
                        let _ = out.push(ctx.copy(src, scratch(partner, 0, u), c.len));
                        let _ = out.push(ctx.signal(partner, Data));
                    }
                    Role::Active { fold: Some(x), .. } => {
                        let _ = out.push(ctx.wait(x, Data, 1));
                        let a = ctx.loc(me, Buf::Input, c.start);
                        let dst = ctx.loc(me, Buf::Output, c.start);
                        let _ = out.push(ctx.reduce(a, scratch(me, 0, u), dst, c.len, false));
                        if u + slots < kf {
                            let _ = out.push(ctx.signal(x, Credit));
                        }
                    }
                    Role::Active { fold: None, .. } => {}
                }
            }
            3 => {
                let Role::Active { v, fold } = role else {
                    return;
                };
                let mut u = u;
                let mut i = 0;
                let (keep, send, kc) = loop {
                    let h = self.halving(ctx, v, i);
                    if u < h.2 || i + 1 >= self.l {
                        break h;
                    }
                    u -= h.2;
                    i += 1;
                };
                let partner = self.rank_of(v ^ (self.p >> (i + 1)));
                let cur = if i == 0 && fold.is_none() {
                    Buf::Input
                } else {
                    Buf::Output
                };
                let (sk, kk) = (send.sub(u, kc), keep.sub(u, kc));
                let region = i as u64 + 1;
                if u >= slots {
                    let _ = out.push(ctx.wait(partner, Credit, 1));
                }
                let src = ctx.loc(me, cur, sk.start);
                let _ = out.push(ctx.copy(src, scratch(partner, region, u), sk.len));
                let _ = out.push(ctx.signal(partner, Data));
                let _ = out.push(ctx.wait(partner, Data, 1));
                let a = ctx.loc(me, cur, kk.start);
                let dst = ctx.loc(me, Buf::Output, kk.start);
                let last = i + 1 == self.l;
                let _ = out.push(ctx.reduce(a, scratch(me, region, u), dst, kk.len, last));
                if u + slots < kc {
                    let _ = out.push(ctx.signal(partner, Credit));
                }
            }
            4 => {
                let Role::Active { v, .. } = role else {
                    return;
                };
                let b = 1u64 << u;
                let lo = v / b * b;
                let mine = self.segs(lo, lo + b);
                let partner = self.rank_of(v ^ b);
                let at = ctx.loc(me, Buf::Output, mine.start);
                let _ = out.push(ctx.copy(at, ctx.loc(partner, Buf::Output, mine.start), mine.len));
                let _ = out.push(ctx.signal(partner, Data));
                let _ = out.push(ctx.wait(partner, Data, 1));
            }
            _ => {
                let whole = self.part;
                match role {
                    Role::Extra { partner } => {
                        let _ = out.push(ctx.wait(partner, Data, 1));
                    }
                    Role::Active { fold: Some(x), .. } => {
                        let at = ctx.loc(me, Buf::Output, whole.start);
                        let _ =
                            out.push(ctx.copy(at, ctx.loc(x, Buf::Output, whole.start), whole.len));
                        let _ = out.push(ctx.signal(x, Data));
                    }
                    Role::Active { fold: None, .. } => {
                        let src = ctx.loc(me, Buf::Input, whole.start);
                        let _ = out.push(ctx.copy(
                            src,
                            ctx.loc(me, Buf::Output, whole.start),
                            whole.len,
                        ));
                    }
                }
            }
        }
    }
}

fn streams(r: &Request) -> u64 {
    match r.collective {
        Collective::AllReduce => regions(r.world) as u64,
        _ => no_streams(r),
    }
}

/// Recursive halving-doubling as the simulator runs it (`P` the power of two, `E` extras):
///
/// * `Ready` to the fold partner and to each halving partner, and the waits: issues and a hop.
/// * Fold (when `E > 0`): the extra streams its input in credited chunks, the partner combines
///   each locally: per chunk the slower of the extra's put and issue and the slot loop (put,
///   the signal's issue and hop, the combine, the credit's issue and hop, per `slots` chunks).
/// * Halving, step `i`: per chunk a rank puts half its range's chunk to its partner, signals,
///   waits for the partner's (which it sent at the same time: it lands a hop after its issue),
///   combines it locally and returns the credit: a put, two issues, a hop and a local pass.
/// * Doubling: `lg P` swaps of the growing range, each a put, an issue and the partner's hop;
///   the ranges add up to `(P-1)/P` of the data.
/// * Unfold (when `E > 0`): the partner puts the whole result to its extra: a put, an issue
///   and a hop.
fn rhd_cost(s: &Shape) -> Path {
    let (p, n, e) = (s.p, s.n, s.e);
    let big = 1u64 << depth(p);
    let extra = p - big;
    let lgp = depth(big) as f64;
    let (link, mem, iss, hop) = (Path::link, Path::mem, Path::issues, Path::hops);
    let mut path = iss(lgp + (extra > 0) as u64 as f64) + hop(1.0);
    let mut range = n;
    for _ in 0..depth(big) {
        let send = div_ceil(range, 2 * e) * e;
        let (k, _) = s.pipe(send);
        path = path + link(send as f64) + mem(send as f64) + (iss(2.0) + hop(1.0)) * k;
        range = send;
    }
    let doubling = (big - 1) as f64 / big as f64 * n as f64;
    path = path + link(doubling) + (iss(1.0) + hop(1.0)) * lgp;
    if extra > 0 {
        let (kf, cf) = s.pipe(n);
        let stage = link(cf) + iss(1.0);
        let round = link(cf) + iss(2.0) + hop(2.0) + mem(cf);
        path = path + s.steady(kf, stage, round) + link(n as f64) + iss(1.0) + hop(1.0);
    }
    path
}

fn cost(r: &Request, s: &Shape) -> Path {
    match r.collective {
        Collective::AllReduce => rhd_cost(s),
        Collective::ReduceScatter
        | Collective::AllGather
        | Collective::Broadcast { .. }
        | Collective::Reduce { .. }
        | Collective::Scatter { .. }
        | Collective::Gather { .. }
        | Collective::AllToAll
        | Collective::AllToAllV
        | Collective::SendRecv { .. } => s.serial(),
    }
}

/// Recursive halving-doubling: all-reduce at any world size.
pub(crate) const DESC: Desc = Desc {
    serves: serves::ALL_REDUCE,
    streams,
    min_slots: one_slot,
    cost,
    scratch: no_scratch,
    max_bytes: super::table::unbounded,
    in_place: 0,
    own: [serves::ALL_REDUCE, 0],
    combines: super::Combines::Unordered,
};

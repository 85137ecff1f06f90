//! Ring reduce-scatter, all-gather and all-reduce, pipelined with credits.
//!
//! Rank r sends to r+1 and receives from r-1. Each channel's data is cut into `world` segments and
//! each segment into `K` chunks; the loop runs chunk by chunk so that ranks work on different
//! chunks at once.
//!
//! * Reduce-scatter, step s (0 <= s < world): rank r sends segment `r - s - 1`. At step 0 it copies
//!   its own input into r+1's scratch; at step s > 0 it waits for r-1's partial of that segment,
//!   combines it with its own input and writes the result straight into r+1's scratch (receive,
//!   reduce, send in one op); at the last step the result is complete and lands in its own
//!   output, so rank r ends with segment r.
//! * All-gather, step s: rank r copies segment `r - s` from its output (its own input for a pure
//!   all-gather) into r+1's output at the same offset and signals; at s > 0 it first waits for r-1.
//!
//! Scratch: one stream r -> r+1 per channel with `slots` chunk-sized slots; chunk j of the stream
//! uses slot `j % slots`, and a send with `j >= slots` first waits for the credit of chunk
//! `j - slots`. Output bytes are written once, by their final value, so the all-gather can never
//! overwrite data a neighbour still has to send.

use super::part::{chunks, part, Part};
use super::table::{no_scratch, no_streams, serves, Desc};
use super::tree::Tree;
use super::{Batch, Collective, Ctx, Program, Request};
use crate::cost::{Path, Shape};
use crate::op::{Buf, Loc};
use crate::signal::SlotKind::{Credit, Data, Ready};

#[derive(Clone, Copy, Debug)]
pub(crate) struct Ring {
    /// Whether there is a reduce-scatter pass.
    rs: bool,
    /// Whether there is an all-gather pass.
    ag: bool,
    /// The channel's part of a segment (block collectives) or of the whole buffer (all-reduce).
    part: Part,
    /// Block size in elements for block collectives (0 for all-reduce).
    block: u64,
    /// Chunks per segment.
    k: u64,
}

impl Ring {
    pub fn new(ctx: &Ctx) -> Ring {
        let r = &ctx.req;
        let n = r.elems();
        let c = ctx.channel as u64;
        let nc = r.channels as u64;
        let w = r.world as u64;
        let (rs, ag, block) = match r.collective {
            Collective::AllReduce => (true, true, 0),
            Collective::ReduceScatter => (true, false, n),
            _ => (false, true, n),
        };
        let part = part(n, c, nc);
        let seg_max = if block == 0 {
            part.len.div_ceil(w)
        } else {
            part.len
        };
        Ring {
            rs,
            ag,
            part,
            block,
            k: chunks(seg_max, r.chunk_elems()),
        }
    }

    fn steps(&self, ctx: &Ctx) -> u64 {
        let w = ctx.world() as u64;
        if w == 1 {
            return 1;
        }
        (self.rs as u64 + self.ag as u64) * w
    }

    /// Chunk `k` of segment `seg`: (input element offset, output element offset, length).
    fn chunk(&self, ctx: &Ctx, seg: u64, k: u64) -> (u64, u64, u64) {
        let w = ctx.world() as u64;
        if self.block == 0 {
            let p = self.part.sub(seg, w).sub(k, self.k);
            (p.start, p.start, p.len)
        } else {
            let p = self.part.sub(k, self.k);
            let (i, o) = if self.rs {
                (seg * self.block + p.start, p.start)
            } else {
                (p.start, seg * self.block + p.start)
            };
            (i, o, p.len)
        }
    }
}

impl Program for Ring {
    const PHASES: u8 = 2;

    fn new(ctx: &Ctx) -> Self {
        Ring::new(ctx)
    }

    fn units(&self, ctx: &Ctx, p: u8) -> u64 {
        match p {
            0 if ctx.world() > 1 => 2,
            1 => self.k * self.steps(ctx),
            _ => 0,
        }
    }

    fn emit(&self, ctx: &Ctx, p: u8, u: u64, out: &mut Batch) {
        let w = ctx.world() as u64;
        let me = ctx.rank;
        let next = ((me as u64 + 1) % w) as u16;
        let prev = ((me as u64 + w - 1) % w) as u16;
        if p == 0 {
            let _ = if u == 0 {
                out.push(ctx.signal(prev, Ready))
            } else {
                out.push(ctx.wait(next, Ready, 1))
            };
            return;
        }
        let steps = self.steps(ctx);
        let (k, s) = (u / steps, u % steps);
        let r = me as u64;
        if w == 1 {
            let (i, o, len) = self.chunk(ctx, 0, k);
            let _ =
                out.push(ctx.copy(ctx.loc(me, Buf::Input, i), ctx.loc(me, Buf::Output, o), len));
            return;
        }
        let slots = ctx.req.slot_count();
        let total = self.k * (w - 1);
        let scratch = |j: u64| ctx.loc(0, Buf::Scratch, ctx.scratch(1, 0, j % slots));
        let at = |rank: u16, l: Loc| Loc { rank, ..l };
        if self.rs && s < w {
            let seg = (r + 2 * w - s - 1) % w;
            let (i, o, len) = self.chunk(ctx, seg, k);
            let send = k * (w - 1) + s;
            let recv = send.wrapping_sub(1);
            if s > 0 {
                let _ = out.push(ctx.wait(prev, Data, 1));
            }
            if s < w - 1 && send >= slots {
                let _ = out.push(ctx.wait(next, Credit, 1));
            }
            let input = ctx.loc(me, Buf::Input, i);
            let op = if s == 0 {
                ctx.copy(input, at(next, scratch(send)), len)
            } else if s < w - 1 {
                ctx.reduce(
                    input,
                    at(me, scratch(recv)),
                    at(next, scratch(send)),
                    len,
                    false,
                )
            } else {
                ctx.reduce(
                    input,
                    at(me, scratch(recv)),
                    ctx.loc(me, Buf::Output, o),
                    len,
                    true,
                )
            };
            let _ = out.push(op);
            if s > 0 && recv + slots < total {
                let _ = out.push(ctx.signal(prev, Credit));
            }
            if s < w - 1 {
                let _ = out.push(ctx.signal(next, Data));
            }
            return;
        }
        let s = if self.rs { s - w } else { s };
        let seg = (r + w - s) % w;
        let (i, o, len) = self.chunk(ctx, seg, k);
        if s > 0 {
            let _ = out.push(ctx.wait(prev, Data, 1));
        }
        if s < w - 1 {
            let src = if s == 0 && !self.rs {
                let own = ctx.loc(me, Buf::Input, i);
                let _ = out.push(ctx.copy(own, ctx.loc(me, Buf::Output, o), len));
                own
            } else {
                ctx.loc(me, Buf::Output, o)
            };
            let _ = out.push(ctx.copy(src, ctx.loc(next, Buf::Output, o), len));
            let _ = out.push(ctx.signal(next, Data));
        }
    }
}

/// The ring algorithm's program: the ring for all-reduce, reduce-scatter and all-gather; for
/// broadcast, a pipelined chain (the tree program in its chain shape).
#[derive(Clone, Copy, Debug)]
pub(crate) enum RingOrChain {
    Ring(Ring),
    Chain(Tree),
}

impl Program for RingOrChain {
    const PHASES: u8 = if Ring::PHASES > Tree::PHASES {
        Ring::PHASES
    } else {
        Tree::PHASES
    };

    fn new(ctx: &Ctx) -> Self {
        match ctx.req.collective {
            Collective::AllReduce | Collective::ReduceScatter | Collective::AllGather => {
                RingOrChain::Ring(Ring::new(ctx))
            }
            _ => RingOrChain::Chain(Tree::new(ctx)),
        }
    }

    fn units(&self, ctx: &Ctx, p: u8) -> u64 {
        match self {
            RingOrChain::Ring(r) => r.units(ctx, p),
            RingOrChain::Chain(t) => t.units(ctx, p),
        }
    }

    fn emit(&self, ctx: &Ctx, p: u8, u: u64, out: &mut Batch) {
        match self {
            RingOrChain::Ring(r) => r.emit(ctx, p, u, out),
            RingOrChain::Chain(t) => t.emit(ctx, p, u, out),
        }
    }
}

/// Ring reduce-scatter (and the reduce-scatter half of ring all-reduce) receives, combines and
/// forwards in one op: a rank frees its slot only after it wrote into its successor's. With one
/// slot per rank and three or more ranks, every slot of the ring fills at the first step and
/// every rank then waits for its successor's credit, so they need two.
fn min_slots(r: &Request) -> u8 {
    match r.collective {
        Collective::AllReduce | Collective::ReduceScatter if r.world >= 3 => 2,
        _ => 1,
    }
}

fn streams(r: &Request) -> u64 {
    match r.collective {
        Collective::AllReduce | Collective::ReduceScatter => 1,
        _ => no_streams(r),
    }
}

/// The ring as the simulator runs it. The loop is chunk-major: a rank runs every step of chunk
/// `j` before chunk `j + 1`, and step `s > 0` waits for its predecessor's step `s - 1` of the same
/// chunk, which every rank ran at the same time. So each of the `p - 1` forwarding steps of a
/// chunk costs its put, the issue of its signal and the signal's hop (the latency is exposed
/// once per step and chunk, the puts' bytes add up to the data), and a reduce-scatter step also
/// issues the credit of the slot it consumed. Credits never bind: a slot is reused two steps
/// later, long after its credit landed. Local copies and the final combine use the memory port.
///
/// * all-gather: the own copy, then per chunk `(p-1)(put + issue + hop)`;
/// * reduce-scatter: per chunk `(p-1)(put + hop)`, `2p - 2` issues (a data signal and a
///   credit a step, but none at the ends), and the final combine into the output;
/// * all-reduce: both, on blocks of `n / p`, the all-gather's source being the result.
///
/// Every run begins with a `Ready` to the predecessor and the wait for the successor's: an
/// issue and a hop.
fn ring_cost(r: &Request, s: &Shape) -> Path {
    let (q, n) = (s.pf - 1.0, s.n as f64);
    let ready = Path::issues(1.0) + Path::hops(1.0);
    match r.collective {
        Collective::AllReduce => {
            let b = s.block();
            let (k, _) = s.pipe(b);
            let b = b as f64;
            ready
                + Path::link(2.0 * q * b)
                + Path::mem(b)
                + (Path::hops(2.0 * q) + Path::issues(3.0 * q)) * k
        }
        Collective::ReduceScatter => {
            let (k, _) = s.pipe(s.n);
            ready + Path::link(q * n) + Path::mem(n) + (Path::hops(q) + Path::issues(2.0 * q)) * k
        }
        _ => {
            let (k, _) = s.pipe(s.n);
            ready + Path::mem(n) + Path::link(q * n) + (Path::hops(q) + Path::issues(q)) * k
        }
    }
}

/// The chain broadcast (the tree program's chain): the root copies each chunk into its own
/// output and puts it to its child, with a signal; every other rank waits, forwards and
/// signals, faster than the root (no copy), so the root sets the pace: its memory and egress
/// ports carry the data and it issues one signal a chunk. The last chunk then crosses the
/// remaining `p - 2` links, a put, an issue and a hop each, and lands a hop after it left the
/// root. Before: a `Ready` to each neighbour and the waits for theirs.
pub(crate) fn chain_cost(s: &Shape) -> Path {
    let (k, c) = s.pipe(s.n);
    let n = s.n as f64;
    let ready = Path::issues(2.0) + Path::hops(1.0);
    ready
        + Path::mem(n)
        + Path::link(n)
        + Path::issues(k)
        + Path::hops(1.0)
        + (Path::link(c) + Path::issues(1.0) + Path::hops(1.0)) * (s.pf - 2.0)
}

fn cost(r: &Request, s: &Shape) -> Path {
    match r.collective {
        Collective::AllReduce | Collective::ReduceScatter | Collective::AllGather => {
            ring_cost(r, s)
        }
        Collective::Broadcast { .. } => chain_cost(s),
        Collective::Reduce { .. }
        | Collective::Scatter { .. }
        | Collective::Gather { .. }
        | Collective::AllToAll
        | Collective::AllToAllV
        | Collective::SendRecv { .. } => s.serial(),
    }
}

/// Ring: all-reduce, reduce-scatter, all-gather, and broadcast as a chain.
pub(crate) const DESC: Desc = Desc {
    serves: serves::ALL_REDUCE | serves::REDUCE_SCATTER | serves::ALL_GATHER | serves::BROADCAST,
    streams,
    min_slots,
    cost,
    scratch: no_scratch,
    max_bytes: super::table::unbounded,
    in_place: 0,
    own: [serves::ALL_REDUCE | serves::REDUCE_SCATTER | serves::ALL_GATHER | serves::BROADCAST, serves::REDUCE_SCATTER],
    combines: super::Combines::Unordered,
};

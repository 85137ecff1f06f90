//! Direct algorithms: every rank reads or writes its peers' buffers itself, in one hop.
//!
//! They share one shape: a `Ready` handshake with the peers whose buffers will be touched, a body
//! of copies and reductions, and a completion handshake (`Data`: "your output is written";
//! `Done`: "I finished reading your input, you may reuse it").
//!
//! * one-shot all-reduce: each rank reduces every rank's input, in rank order, into its output.
//! * two-shot all-reduce: rank r reduces segment r of every input (a direct reduce-scatter), then
//!   writes it into every peer's output (a direct all-gather).
//! * direct reduce-scatter / reduce: rank r (the root) reduces its block of every input.
//! * direct all-gather / broadcast / scatter / gather / send-recv / pairwise all-to-all: writes of
//!   the sender's input straight into the receivers' outputs, then a `Data` signal.
//! * multicast (the host model of NVLS): `McReduce` of the rank's segment of the inputs, and
//!   `McStore` of the result into every rank's output.
//!
//! Reductions always combine contributions in rank order 0, 1, ..., world-1, so every rank of a
//! one-shot all-reduce computes the same bits. Up to [`MAX_FANIN`] ranks they are one fused
//! k-way reduce ([`Op::ReduceN`]: one pass, one accumulator, one rounding); beyond, a chain of
//! binary reduces. The `binary-reduce` feature builds every direct reduction as that chain (the
//! schedules as they were before the k-way reduce): a measurement build, which `symm-bench`
//! runs beside the default one to measure what the k-way reduce gains at a world.

mod desc;

pub(crate) use desc::{DIRECT, MULTICAST, ONE_SHOT, PAIRWISE, TWO_SHOT};

use super::part::{part, Part};
use super::{Algorithm, Batch, Collective, Ctx, Program};
use crate::op::{Buf, McLoc, Op, Ranks, MAX_FANIN};
use crate::signal::SlotKind::{self, Data, Done, Ready};

/// A set of peers, seen from one rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Peers {
    None,
    /// Every other rank.
    All,
    /// The root, if this rank is not the root.
    Root(u16),
    /// Every other rank, if this rank is the root.
    Leaves(u16),
    /// One rank, if it is not this rank.
    One(u16),
}

impl Peers {
    fn has(self, me: u16, q: u16) -> bool {
        if q == me {
            return false;
        }
        match self {
            Peers::None => false,
            Peers::All => true,
            Peers::Root(r) => q == r,
            Peers::Leaves(r) => me == r,
            Peers::One(x) => q == x,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Body {
    /// Reduce over every rank's input at `src` (element offset) into own output at `dst`,
    /// then, if `push`, copy the result into every peer's output and signal `Data`.
    Reduce {
        src: u64,
        dst: u64,
        len: u64,
        push: bool,
    },
    /// Copy own input at `src` to `dst` in the output of `to` peers (and own), with `Data`.
    /// `stride` > 0 offsets the source by `stride * peer` (scatter, all-to-all).
    Send {
        src: u64,
        dst: u64,
        len: u64,
        stride: u64,
        to: Peers,
        own: bool,
    },
    /// Multicast reduce of the input at `src` into own output at `dst`, then, if `store`,
    /// multicast store of it to every rank's output.
    Mc {
        src: u64,
        dst: u64,
        len: u64,
        reduce: bool,
        store: bool,
    },
    /// Nothing.
    Nothing,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Direct {
    ready_to: Peers,
    ready_from: Peers,
    body: Body,
    done_kind: SlotKind,
    done_to: Peers,
    done_from: Peers,
}

impl Direct {
    pub fn new(ctx: &Ctx) -> Direct {
        let r = &ctx.req;
        let me = ctx.rank as u64;
        let w = r.world as u64;
        let n = r.elems();
        let p: Part = part(n, ctx.channel as u64, r.channels as u64);
        let seg = p.sub(me, w);
        let mut d = Direct {
            ready_to: Peers::All,
            ready_from: Peers::All,
            body: Body::Nothing,
            done_kind: Data,
            done_to: Peers::None,
            done_from: Peers::All,
        };
        match (r.collective, r.algorithm) {
            (Collective::AllReduce, Algorithm::OneShot) => {
                d.body = Body::Reduce {
                    src: p.start,
                    dst: p.start,
                    len: p.len,
                    push: false,
                };
                (d.done_kind, d.done_to) = (Done, Peers::All);
            }
            (Collective::AllReduce, Algorithm::TwoShot) => {
                d.body = Body::Reduce {
                    src: seg.start,
                    dst: seg.start,
                    len: seg.len,
                    push: true,
                };
            }
            (Collective::AllReduce, _) => {
                d.body = Body::Mc {
                    src: seg.start,
                    dst: seg.start,
                    len: seg.len,
                    reduce: true,
                    store: true,
                };
                d.done_to = Peers::All;
            }
            (Collective::ReduceScatter, Algorithm::Multicast) => {
                d.body = Body::Mc {
                    src: me * n + p.start,
                    dst: p.start,
                    len: p.len,
                    reduce: true,
                    store: false,
                };
                (d.done_kind, d.done_to) = (Done, Peers::All);
            }
            (Collective::ReduceScatter, _) => {
                d.body = Body::Reduce {
                    src: me * n + p.start,
                    dst: p.start,
                    len: p.len,
                    push: false,
                };
                (d.done_kind, d.done_to) = (Done, Peers::All);
            }
            (Collective::AllGather, Algorithm::Multicast) => {
                d.body = Body::Mc {
                    src: p.start,
                    dst: me * n + p.start,
                    len: p.len,
                    reduce: false,
                    store: true,
                };
                d.done_to = Peers::All;
            }
            (Collective::AllGather, _) => {
                d.body = Body::Send {
                    src: p.start,
                    dst: me * n + p.start,
                    len: p.len,
                    stride: 0,
                    to: Peers::All,
                    own: true,
                };
            }
            (Collective::Broadcast { root }, alg) => {
                (d.ready_to, d.ready_from) = (Peers::Root(root), Peers::Leaves(root));
                d.done_from = Peers::Root(root);
                d.body = if alg == Algorithm::Multicast {
                    d.done_to = Peers::Leaves(root);
                    if ctx.rank == root {
                        Body::Mc {
                            src: p.start,
                            dst: p.start,
                            len: p.len,
                            reduce: false,
                            store: true,
                        }
                    } else {
                        Body::Nothing
                    }
                } else {
                    Body::Send {
                        src: p.start,
                        dst: p.start,
                        len: p.len,
                        stride: 0,
                        to: Peers::Leaves(root),
                        own: ctx.rank == root,
                    }
                };
            }
            (Collective::Reduce { root }, _) => {
                (d.ready_to, d.ready_from) = (Peers::Root(root), Peers::Leaves(root));
                (d.done_kind, d.done_to, d.done_from) =
                    (Done, Peers::Leaves(root), Peers::Root(root));
                if ctx.rank == root {
                    d.body = Body::Reduce {
                        src: p.start,
                        dst: p.start,
                        len: p.len,
                        push: false,
                    };
                }
            }
            (Collective::Scatter { root }, _) => {
                (d.ready_to, d.ready_from) = (Peers::Root(root), Peers::Leaves(root));
                d.done_from = Peers::Root(root);
                let own = ctx.rank == root;
                d.body = Body::Send {
                    src: p.start,
                    dst: p.start,
                    len: p.len,
                    stride: n,
                    to: Peers::Leaves(root),
                    own,
                };
            }
            (Collective::Gather { root }, _) => {
                (d.ready_to, d.ready_from) = (Peers::Leaves(root), Peers::Root(root));
                d.done_from = Peers::Leaves(root);
                d.body = Body::Send {
                    src: p.start,
                    dst: me * n + p.start,
                    len: p.len,
                    stride: 0,
                    to: Peers::Root(root),
                    own: ctx.rank == root,
                };
            }
            (Collective::AllToAll | Collective::AllToAllV, _) => {
                d.body = Body::Send {
                    src: p.start,
                    dst: me * n + p.start,
                    len: p.len,
                    stride: n,
                    to: Peers::All,
                    own: true,
                };
            }
            (Collective::SendRecv { src, dst }, _) => {
                let me = ctx.rank;
                (d.ready_to, d.ready_from, d.done_from) = (Peers::None, Peers::None, Peers::None);
                if me == dst {
                    (d.ready_to, d.done_from) = (Peers::One(src), Peers::One(src));
                }
                if me == src {
                    d.ready_from = Peers::One(dst);
                    d.body = Body::Send {
                        src: p.start,
                        dst: p.start,
                        len: p.len,
                        stride: 0,
                        to: Peers::One(dst),
                        own: src == dst,
                    };
                }
            }
        }
        // A body that writes peers' outputs tells them in the completion phase, after every
        // write: the writes of a channel go out together and one fence releases them all.
        match d.body {
            Body::Reduce { push: true, .. } => (d.done_kind, d.done_to) = (Data, Peers::All),
            Body::Send { to, .. } => (d.done_kind, d.done_to) = (Data, to),
            _ => {}
        }
        d
    }

    fn body_units(&self, ctx: &Ctx) -> u64 {
        let w = ctx.world() as u64;
        match self.body {
            Body::Reduce { push, .. } => reduce_steps(w) + if push { w } else { 0 },
            Body::Send { .. } => w,
            Body::Mc { .. } => 1,
            Body::Nothing => 0,
        }
    }
}

/// The most ranks one direct reduction combines in one k-way reduce: [`MAX_FANIN`], or 1 in the
/// `binary-reduce` measurement build (every reduction a chain of binary reduces).
pub(crate) const FUSED_FANIN: usize = if cfg!(feature = "binary-reduce") {
    1
} else {
    MAX_FANIN
};

/// Ops of a direct reduction's combining part: one k-way reduce up to [`FUSED_FANIN`] ranks, a
/// chain of binary reduces beyond.
fn reduce_steps(w: u64) -> u64 {
    if w as usize <= FUSED_FANIN {
        1
    } else {
        w - 1
    }
}

impl Program for Direct {
    const PHASES: u8 = 5;

    fn new(ctx: &Ctx) -> Self {
        Direct::new(ctx)
    }

    fn units(&self, ctx: &Ctx, p: u8) -> u64 {
        match p {
            2 => self.body_units(ctx),
            _ => ctx.world() as u64,
        }
    }

    fn emit(&self, ctx: &Ctx, p: u8, u: u64, out: &mut Batch) {
        let me = ctx.rank;
        let w = ctx.world() as u64;
        let to = ((me as u64 + u % w) % w) as u16;
        let from = ((me as u64 + w - u % w) % w) as u16;
        match p {
            0 if self.ready_to.has(me, to) => {
                let _ = out.push(ctx.signal(to, Ready));
            }
            1 if self.ready_from.has(me, from) => {
                let _ = out.push(ctx.wait(from, Ready, 1));
            }
            2 => self.emit_body(ctx, u, out),
            3 if self.done_to.has(me, to) => {
                let _ = out.push(ctx.signal(to, self.done_kind));
            }
            4 if self.done_from.has(me, from) => {
                let _ = out.push(ctx.wait(from, self.done_kind, 1));
            }
            _ => {}
        }
    }
}

impl Direct {
    fn emit_body(&self, ctx: &Ctx, u: u64, out: &mut Batch) {
        let me = ctx.rank;
        let w = ctx.world() as u64;
        match self.body {
            Body::Reduce {
                src,
                dst,
                len,
                push,
            } => {
                let steps = reduce_steps(w);
                let own = ctx.loc(me, Buf::Output, dst);
                if u < steps {
                    let fused = Ranks::first(w as u16).filter(|_| w > 1 && w as usize <= FUSED_FANIN);
                    let op = if let Some(ranks) = fused {
                        Op::ReduceN {
                            buf: Buf::Input,
                            offset: src * ctx.esize,
                            ranks,
                            dst: own,
                            elems: len,
                            dtype: ctx.req.dtype,
                            op: ctx.req.op,
                            div: ctx.div(true),
                        }
                    } else if w == 1 {
                        ctx.copy(ctx.loc(0, Buf::Input, src), own, len)
                    } else {
                        let a = if u == 0 {
                            ctx.loc(0, Buf::Input, src)
                        } else {
                            own
                        };
                        let b = ctx.loc((u + 1) as u16, Buf::Input, src);
                        ctx.reduce(a, b, own, len, u + 1 == steps)
                    };
                    let _ = out.push(op);
                    return;
                }
                let q = ((me as u64 + (u - steps)) % w) as u16;
                if push && q != me {
                    let _ = out.push(ctx.copy(own, ctx.loc(q, Buf::Output, dst), len));
                }
            }
            Body::Send {
                src,
                dst,
                len,
                stride,
                to,
                own,
            } => {
                let q = ((me as u64 + u) % w) as u16;
                let from = ctx.loc(me, Buf::Input, src + stride * q as u64);
                if q == me {
                    if own {
                        let _ = out.push(ctx.copy(from, ctx.loc(me, Buf::Output, dst), len));
                    }
                } else if to.has(me, q) {
                    let _ = out.push(ctx.copy(from, ctx.loc(q, Buf::Output, dst), len));
                }
            }
            Body::Mc {
                src,
                dst,
                len,
                reduce,
                store,
            } => {
                let es = ctx.esize;
                let local = ctx.loc(me, Buf::Output, dst);
                if reduce {
                    let _ = out.push(Op::McReduce {
                        src: McLoc {
                            buf: Buf::Input,
                            offset: src * es,
                        },
                        dst: local,
                        elems: len,
                        dtype: ctx.req.dtype,
                        op: ctx.req.op,
                        div: ctx.div(true),
                    });
                }
                if store {
                    let from = if reduce {
                        local
                    } else {
                        ctx.loc(me, Buf::Input, src)
                    };
                    let _ = out.push(Op::McStore {
                        src: from,
                        dst: McLoc {
                            buf: Buf::Output,
                            offset: dst * es,
                        },
                        bytes: len * es,
                    });
                }
            }
            Body::Nothing => {}
        }
    }
}

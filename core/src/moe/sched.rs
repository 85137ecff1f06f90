//! MoE dispatch and combine as op streams: the data movement of the layout above, in the op
//! set every executor runs ([`crate::op::Op`]), so the host simulator can run it, the symbolic
//! checker can check it and the viz can replay its trace.
//!
//! The streams are built from every rank's routing ([`Routing`]: the expert indices and what
//! [`route`] computed from them) and run under a request of their own ([`MoePlan::dispatch_request`],
//! [`MoePlan::combine_request`]): an f32 all-to-allv request of one channel, used for its
//! symmetric input and output buffers of `bytes` each; the ops are not the library's all-to-allv.
//! One element stands for one hidden unit, a row is `hidden` elements.
//!
//! ## Dispatch
//! Input: rank `r`'s token `t` at element [`token_elem`]. Output: the staging rows, row
//! `stage_row(p, slot)` at [`stage_elem`], then the expert rows, row `i` at [`expert_elem`].
//! Rank `r`'s stream:
//! 1. for each rank `q`, starting with itself and going up (pairwise, so no rank is every
//!    sender's first target), a copy of each token that goes to `q` into `q`'s staging row
//!    `stage_row(r, slot(t, q))`, once however many of its experts live on `q`, then one `Data`
//!    signal to `q` (to itself too). The signal stands for the tagged header, which the kernels
//!    write after the rows and which is their only signal; the op model does not carry the header
//!    words, because the counts are known when the streams are built.
//! 2. a wait for `Data` from every rank.
//! 3. the fan-out: for each staging row, sender by sender and slot by slot, for each entry `k` of
//!    the token with a local expert and a row, a local copy into the expert row (by default
//!    [`expert_row`]; a row past `rows_max` is dropped). Several entries of one token on `r` make
//!    several copies of one staging row.
//!
//! No `Ready` handshake: on the GPU a call writes the half of the staging area its epoch names and
//! the epoch-tagged headers make reuse safe without a barrier (the module above gives the
//! argument). The op model runs one call over fresh buffers, so it shows neither halves nor tags.
//!
//! ## Combine
//! Input of expert rank `q`: the partial it computed for rank `r`'s token `t` at [`partial_elem`].
//! The expert-side weighted sum over `q`'s expert rows is local compute, outside the op set, so
//! the partials are given; they are indexed by the token rather than by the staging row so that
//! the partials of one token are one logical element to the symbolic checker, which only sums
//! contributions to the same element. Output of rank `r`: its tokens at [`out_elem`], then its
//! combine staging, row `stage_row(q, slot)` at [`combine_stage_elem`]. Rank `q`'s stream:
//! 1. for each rank `r` (pairwise as above), a copy of the partial of each of `r`'s tokens that
//!    came to `q` into `r`'s combine staging row `stage_row(q, slot(t, q))`, then `Data` to `r`;
//! 2. a wait for `Data` from every rank;
//! 3. for each of its own tokens, the sum of the partials of its destination ranks in ascending
//!    rank order: a copy of the first, then one `Reduce` (f32 sum) per further rank, in place in
//!    the output.
//!
//! What the op model does not cover: the kernels start the sum from 0, so a token whose only
//! partial is `-0.0` comes back as `+0.0` there and as `-0.0` here; a token with no destination
//! comes back as zeros from the kernels and is left unwritten here (the op set has no fill).
//! Everything else is the same value, bit for bit, as the f32 sums run in the same order.

#![cfg(feature = "alloc")]

use super::{expert_row, route, Mode, MoeConfig, MoeError, NONE};
use crate::dtype::{DType, ReduceOp};
use crate::op::{Buf, Loc, Op, SignalOp};
use crate::sched::{Algorithm, Collective, Request, SchedError};
use crate::signal::SlotKind;
use alloc::vec;
use alloc::vec::Vec;
use core::fmt;

/// A receiver's placement of an entry: [`expert_row`]'s signature (receiver's column of
/// expert counts, sender, local expert, eslot) -> row, `None` when dropped.
pub type RowFn<'a> = &'a dyn Fn(&MoeConfig, &[u32], u16, u32, u32) -> Option<u32>;

/// One rank's routing: its expert indices and the sender's side computed from them, in the
/// layout [`route`] fills (`slots[t * world + q]`, `eslots[t * topk + k]`, `counts[q]`,
/// `ecounts[e]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Routing {
    /// `topk` expert indices per token.
    pub idx: Vec<i64>,
    /// `slot(t, q)` or [`NONE`].
    pub slots: Vec<u32>,
    /// `eslot(t, k)` or [`NONE`].
    pub eslots: Vec<u32>,
    /// Tokens sent to each rank.
    pub counts: Vec<u32>,
    /// Entries of each expert.
    pub ecounts: Vec<u32>,
}

impl Routing {
    /// Routes `idx` (`topk` indices per token) with [`route`].
    pub fn new(cfg: &MoeConfig, idx: &[i64]) -> Result<Routing, MoeError> {
        let (w, k) = (cfg.world as usize, cfg.topk as usize);
        let tokens = idx.len() / k;
        let mut r = Routing {
            idx: idx.to_vec(),
            slots: vec![0; tokens * w],
            eslots: vec![0; tokens * k],
            counts: vec![0; w],
            ecounts: vec![0; cfg.experts as usize],
        };
        route(
            cfg,
            idx,
            &mut r.slots,
            &mut r.eslots,
            &mut r.counts,
            &mut r.ecounts,
        )?;
        Ok(r)
    }

    /// Tokens of the rank.
    pub fn tokens(&self, cfg: &MoeConfig) -> u32 {
        (self.idx.len() / cfg.topk.max(1) as usize) as u32
    }
}

/// What is wrong with the routings a plan is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PlanError {
    /// The shape, a rank's token count or a slice's length.
    Moe(MoeError),
    /// There is not one routing per rank.
    Ranks {
        /// Routings given.
        len: usize,
        /// World size.
        world: u16,
    },
    /// A staging slot at or past `tokens_max`.
    Slot {
        /// Sender.
        sender: u16,
        /// Its token.
        token: u32,
        /// The destination rank.
        rank: u16,
        /// The slot.
        slot: u32,
    },
    /// A row function placed an entry at or past `rows_max`.
    Row {
        /// The receiving rank.
        rank: u16,
        /// Sender.
        sender: u16,
        /// Its token.
        token: u32,
        /// Entry of the token.
        k: u16,
        /// The row.
        row: u32,
    },
    /// The request of the streams does not validate (buffers too large).
    Sched(SchedError),
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            PlanError::Moe(e) => write!(f, "{e}"),
            PlanError::Ranks { len, world } => {
                write!(f, "{len} routings for a world of {world} ranks")
            }
            PlanError::Slot {
                sender,
                token,
                rank,
                slot,
            } => write!(
                f,
                "rank {sender}'s token {token} has slot {slot} on rank {rank}, past the staging rows"
            ),
            PlanError::Row {
                rank,
                sender,
                token,
                k,
                row,
            } => write!(
                f,
                "rank {sender}'s token {token} entry {k} is placed in row {row} on rank {rank}, \
                 past rows_max"
            ),
            PlanError::Sched(e) => write!(f, "{e}"),
        }
    }
}

impl core::error::Error for PlanError {}

/// A token's arrival on a receiver, and where each of its entries for that receiver goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arrival {
    /// Sender.
    pub sender: u16,
    /// The sender's token.
    pub token: u32,
    /// Entry of the token.
    pub k: u16,
    /// The token's slot on the receiver (its staging row is `stage_row(sender, slot)`).
    pub slot: u32,
    /// Local expert on the receiver.
    pub expert: u32,
    /// The entry's expert row, `None` when dropped.
    pub row: Option<u32>,
}

/// Element of rank `r`'s dispatch input where its token `t` starts.
pub fn token_elem(cfg: &MoeConfig, t: u32) -> u64 {
    u64::from(t) * u64::from(cfg.hidden)
}

/// Element of a dispatch output where staging row `stage_row(sender, slot)` starts.
pub fn stage_elem(cfg: &MoeConfig, sender: u16, slot: u32) -> u64 {
    cfg.stage_row(sender, slot) * u64::from(cfg.hidden)
}

/// Element of a dispatch output where expert row `row` starts (after the staging rows).
pub fn expert_elem(cfg: &MoeConfig, row: u32) -> u64 {
    (cfg.stage_rows() + u64::from(row)) * u64::from(cfg.hidden)
}

/// Element of an expert rank's combine input holding its partial for `sender`'s token `t`.
pub fn partial_elem(cfg: &MoeConfig, sender: u16, t: u32) -> u64 {
    cfg.stage_row(sender, t) * u64::from(cfg.hidden)
}

/// Element of a combine output where the rank's token `t` ends.
pub fn out_elem(cfg: &MoeConfig, t: u32) -> u64 {
    token_elem(cfg, t)
}

/// Element of a combine output where combine staging row `stage_row(q, slot)` starts.
pub fn combine_stage_elem(cfg: &MoeConfig, q: u16, slot: u32) -> u64 {
    (u64::from(cfg.tokens_max) + cfg.stage_row(q, slot)) * u64::from(cfg.hidden)
}

/// Dispatch and combine of one batch, every rank's routing known: builds each rank's ops.
#[derive(Clone, Debug)]
pub struct MoePlan<'a> {
    cfg: MoeConfig,
    senders: &'a [Routing],
    /// Per receiver, its arrivals in staging order (sender, slot, entry).
    arrivals: Vec<Vec<Arrival>>,
}

impl<'a> MoePlan<'a> {
    /// The plan of `senders` (one routing per rank), expert rows by [`expert_row`].
    pub fn new(cfg: MoeConfig, senders: &'a [Routing]) -> Result<MoePlan<'a>, PlanError> {
        MoePlan::with_rows(cfg, senders, &expert_row)
    }

    /// The plan with expert rows placed by `rows` instead (every row it gives is checked
    /// against `rows_max`).
    pub fn with_rows(
        cfg: MoeConfig,
        senders: &'a [Routing],
        rows: RowFn,
    ) -> Result<MoePlan<'a>, PlanError> {
        let cfg = cfg.checked().map_err(PlanError::Moe)?;
        let w = cfg.world as usize;
        if senders.len() != w {
            return Err(PlanError::Ranks {
                len: senders.len(),
                world: cfg.world,
            });
        }
        for s in senders {
            check_lengths(&cfg, s)?;
        }
        let l = cfg.local_experts() as usize;
        let k = cfg.topk as usize;
        let mut arrivals = vec![Vec::new(); w];
        for (q, arr) in arrivals.iter_mut().enumerate() {
            let ecol: Vec<u32> = (0..w * l)
                .map(|i| senders[i / l].ecounts[q * l + i % l])
                .collect();
            for (p, s) in senders.iter().enumerate() {
                let mut toks: Vec<(u32, u32)> = (0..s.tokens(&cfg))
                    .filter_map(|t| {
                        let slot = s.slots[t as usize * w + q];
                        (slot != NONE).then_some((slot, t))
                    })
                    .collect();
                toks.sort_unstable();
                for (slot, t) in toks {
                    if slot >= cfg.tokens_max {
                        return Err(PlanError::Slot {
                            sender: p as u16,
                            token: t,
                            rank: q as u16,
                            slot,
                        });
                    }
                    for j in 0..k {
                        let i = t as usize * k + j;
                        let (Some((owner, expert)), eslot) = (cfg.owner(s.idx[i]), s.eslots[i])
                        else {
                            continue;
                        };
                        if owner as usize != q || eslot == NONE {
                            continue;
                        }
                        let row = rows(&cfg, &ecol, p as u16, expert, eslot);
                        if let Some(row) = row.filter(|&r| r >= cfg.rows_max) {
                            return Err(PlanError::Row {
                                rank: q as u16,
                                sender: p as u16,
                                token: t,
                                k: j as u16,
                                row,
                            });
                        }
                        arr.push(Arrival {
                            sender: p as u16,
                            token: t,
                            k: j as u16,
                            slot,
                            expert,
                            row,
                        });
                    }
                }
            }
        }
        let plan = MoePlan {
            cfg,
            senders,
            arrivals,
        };
        for req in [plan.dispatch_request(), plan.combine_request()] {
            req.validate().map_err(PlanError::Sched)?;
        }
        Ok(plan)
    }

    /// The shape.
    pub fn config(&self) -> &MoeConfig {
        &self.cfg
    }

    /// Rank `q`'s arrivals: every entry of a token that came to `q` with a local expert, in
    /// staging order (sender, then slot, then entry).
    pub fn arrivals(&self, q: u16) -> &[Arrival] {
        self.arrivals.get(q as usize).map_or(&[], |a| a.as_slice())
    }

    /// Entries dropped on rank `q` (their row was at or past `rows_max`).
    pub fn dropped(&self, q: u16) -> u32 {
        self.arrivals(q).iter().filter(|a| a.row.is_none()).count() as u32
    }

    fn request(&self, rows: u64) -> Request {
        Request::new(
            Collective::AllToAllV,
            Algorithm::Pairwise,
            self.cfg.world,
            rows * u64::from(self.cfg.hidden) * 4,
            DType::F32,
            ReduceOp::Sum,
        )
    }

    /// The request the dispatch streams run under: input and output of
    /// `(world * tokens_max + rows_max) * hidden` f32 each (the staging rows and the expert rows).
    pub fn dispatch_request(&self) -> Request {
        self.request(self.cfg.stage_rows() + u64::from(self.cfg.rows_max))
    }

    /// The request the combine streams run under: input and output of
    /// `(world + 1) * tokens_max * hidden` f32 each (the output tokens and the combine staging).
    pub fn combine_request(&self) -> Request {
        self.request(self.cfg.stage_rows() + u64::from(self.cfg.tokens_max))
    }

    fn data_slot(&self, from: u16) -> u32 {
        self.dispatch_request()
            .layout()
            .index_unchecked(0, 0, SlotKind::Data, from)
    }

    fn signal(&self, me: u16, peer: u16) -> Op {
        Op::Signal {
            peer,
            slot: self.data_slot(me),
            op: SignalOp::Add,
            value: 1,
        }
    }

    fn wait_all(&self, ops: &mut Vec<Op>) {
        ops.extend((0..self.cfg.world).map(|p| Op::Wait {
            slot: self.data_slot(p),
            count: 1,
        }));
    }

    fn copy(&self, src: Loc, dst: Loc) -> Op {
        Op::Copy {
            src,
            dst,
            bytes: u64::from(self.cfg.hidden) * 4,
        }
    }

    /// The ranks from `me` up, wrapping: the pairwise order of the sends.
    fn peers(&self, me: u16) -> impl Iterator<Item = u16> {
        let w = self.cfg.world;
        (0..w).map(move |s| ((u32::from(me) + u32::from(s)) % u32::from(w)) as u16)
    }

    /// Rank `rank`'s dispatch ops (empty for a rank outside the world).
    pub fn dispatch(&self, rank: u16) -> Vec<Op> {
        let (cfg, w) = (&self.cfg, self.cfg.world as usize);
        let mut ops = Vec::new();
        let Some(me) = self.senders.get(rank as usize) else {
            return ops;
        };
        let at = |r: u16, buf: Buf, elem: u64| Loc::new(r, buf, elem * 4);
        for q in self.peers(rank) {
            for t in 0..me.tokens(cfg) {
                let slot = me.slots[t as usize * w + q as usize];
                if slot != NONE {
                    let src = at(rank, Buf::Input, token_elem(cfg, t));
                    let dst = at(q, Buf::Output, stage_elem(cfg, rank, slot));
                    ops.push(self.copy(src, dst));
                }
            }
            ops.push(self.signal(rank, q));
        }
        self.wait_all(&mut ops);
        for a in self.arrivals(rank) {
            if let Some(row) = a.row {
                let src = at(rank, Buf::Output, stage_elem(cfg, a.sender, a.slot));
                ops.push(self.copy(src, at(rank, Buf::Output, expert_elem(cfg, row))));
            }
        }
        ops
    }

    /// Rank `rank`'s combine ops (empty for a rank outside the world).
    pub fn combine(&self, rank: u16) -> Vec<Op> {
        let (cfg, w) = (&self.cfg, self.cfg.world as usize);
        let mut ops = Vec::new();
        let Some(me) = self.senders.get(rank as usize) else {
            return ops;
        };
        let at = |r: u16, buf: Buf, elem: u64| Loc::new(r, buf, elem * 4);
        for r in self.peers(rank) {
            let s = &self.senders[r as usize];
            for t in 0..s.tokens(cfg) {
                let slot = s.slots[t as usize * w + rank as usize];
                if slot != NONE {
                    let src = at(rank, Buf::Input, partial_elem(cfg, r, t));
                    let dst = at(r, Buf::Output, combine_stage_elem(cfg, rank, slot));
                    ops.push(self.copy(src, dst));
                }
            }
            ops.push(self.signal(rank, r));
        }
        self.wait_all(&mut ops);
        for t in 0..me.tokens(cfg) {
            let out = at(rank, Buf::Output, out_elem(cfg, t));
            let mut parts = (0..cfg.world).filter_map(|q| {
                let slot = me.slots[t as usize * w + q as usize];
                (slot != NONE).then(|| at(rank, Buf::Output, combine_stage_elem(cfg, q, slot)))
            });
            let Some(first) = parts.next() else {
                continue;
            };
            let mut acc = first;
            let mut copied = true;
            for p in parts {
                ops.push(Op::Reduce {
                    a: acc,
                    b: p,
                    dst: out,
                    elems: u64::from(cfg.hidden),
                    dtype: DType::F32,
                    op: ReduceOp::Sum,
                    div: 1,
                });
                acc = out;
                copied = false;
            }
            if copied {
                ops.push(self.copy(first, out));
            }
        }
        ops
    }
}

/// A routing's lengths against the shape.
fn check_lengths(cfg: &MoeConfig, s: &Routing) -> Result<(), PlanError> {
    let (w, k) = (cfg.world as usize, cfg.topk as usize);
    let tokens = s.idx.len() / k;
    cfg.check_tokens(tokens as u32, Mode::Normal)
        .map_err(PlanError::Moe)?;
    for (what, len, want) in [
        ("topk_idx", s.idx.len(), tokens * k),
        ("slots", s.slots.len(), tokens * w),
        ("eslots", s.eslots.len(), tokens * k),
        ("counts", s.counts.len(), w),
        ("ecounts", s.ecounts.len(), cfg.experts as usize),
    ] {
        if len != want {
            return Err(PlanError::Moe(MoeError::BadLength { what, len, want }));
        }
    }
    Ok(())
}

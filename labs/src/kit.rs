//! The toolkit a lab's schedule is written with.
//!
//! A schedule is a function from one rank's point of view to that rank's list of ops
//! ([`symm_core::op::Op`]): the checker calls it once per rank, runs every rank's list at once
//! and checks what ends up in the outputs. A [`Kit`] is that point of view: which rank you are,
//! how big the world is, and shorthands that build ops in elements rather than bytes.
//!
//! The ops are the library's own instruction set, so everything you learn here is what the
//! library's schedules do:
//!
//! * [`Kit::copy`]: move elements from one location to another. Either end may be on another
//!   rank: a copy into a peer's buffer is a *put*, a copy from one is a *get*.
//! * [`Kit::reduce`]: `dst = a + b` element by element (the request's operator; the labs sum).
//!   `dst` may be `a` or `b` itself.
//! * [`Kit::signal`]: add 1 to a counter (a *slot*) in a peer's signal pad. Everything you wrote
//!   before the signal is visible to a peer that sees the new count.
//! * [`Kit::wait`]: block until one of your own slots has received `count` more signals.
//!
//! A slot is named by its *kind* ([`SlotKind`]: `Ready`, `Data`, `Credit`, ...) and by the rank
//! that signals it, so every slot has exactly one writer: `k.signal(peer, Data)` bumps the slot
//! "data from me" on `peer`, and the peer waits for it with `k.wait(me, Data, 1)`. Counters
//! never reset: the third `wait(p, Data, 1)` passes once `p` has signalled `Data` three times.
//!
//! Every buffer is *symmetric*: the same (buffer, element) names the same bytes on every rank, so
//! `k.at(peer, Buf::Output, e)` is element `e` of `peer`'s output.

use symm_core::op::{Buf, Loc, McLoc, Op, Ranks, SignalOp};
use symm_core::sched::{part, Collective, Part, Request};
use symm_core::signal::SlotKind;

/// One rank's view of a collective: its rank, the request, and op builders.
#[derive(Clone, Copy, Debug)]
pub struct Kit {
    req: Request,
    rank: u16,
    channel: u16,
    slots: u64,
    chunk: u64,
}

impl Kit {
    /// The view of `rank` on `channel` of `req`, with the request's pipelining (its chunk and
    /// scratch slots).
    pub fn new(req: Request, rank: u16, channel: u16) -> Kit {
        Kit {
            req,
            rank,
            channel,
            slots: req.slot_count(),
            chunk: req.chunk_elems(),
        }
    }

    /// The same view with `slots` scratch slots per stream (at most what the request's scratch
    /// holds: a checker uses this to run a schedule with fewer slots than it allocated).
    pub fn with_slots(mut self, slots: u64) -> Kit {
        self.slots = slots.clamp(1, self.req.slot_count());
        self
    }

    /// The request: collective, world, bytes, element type, pipelining.
    pub fn request(&self) -> &Request {
        &self.req
    }

    /// This rank.
    pub fn rank(&self) -> u16 {
        self.rank
    }

    /// This channel (the labs run one channel: 0).
    pub fn channel(&self) -> u16 {
        self.channel
    }

    /// Ranks in the world: they are numbered `0 .. world`.
    pub fn world(&self) -> u16 {
        self.req.world
    }

    /// The root of a rooted collective (broadcast, reduce, scatter, gather); 0 otherwise.
    pub fn root(&self) -> u16 {
        match self.req.collective {
            Collective::Broadcast { root }
            | Collective::Reduce { root }
            | Collective::Scatter { root }
            | Collective::Gather { root } => root,
            _ => 0,
        }
    }

    /// The next rank on the ring: `(rank + 1) % world`.
    pub fn next(&self) -> u16 {
        ((self.rank as u32 + 1) % self.world() as u32) as u16
    }

    /// The previous rank on the ring: `(rank + world - 1) % world`.
    pub fn prev(&self) -> u16 {
        let w = self.world() as u32;
        ((self.rank as u32 + w - 1) % w) as u16
    }

    /// Elements in the request's `bytes`: the whole buffer of an all-reduce or broadcast, one
    /// block of an all-gather, reduce-scatter or all-to-all.
    pub fn elems(&self) -> u64 {
        self.req.elems()
    }

    /// Part `i` of `of` near-equal parts of [`Kit::elems`] (the first `elems % of` parts are one
    /// element longer). Parts tile the elements exactly, so `of` parts cover every element once.
    pub fn segment(&self, i: u64, of: u64) -> Part {
        part(self.elems(), i, of)
    }

    /// Parts `a .. b` of `of` of [`Kit::elems`], as one range.
    pub fn segments(&self, a: u64, b: u64, of: u64) -> Part {
        Part {
            start: 0,
            len: self.elems(),
        }
        .span(a, b, of)
    }

    /// Element `elem` of `rank`'s buffer `buf`.
    pub fn at(&self, rank: u16, buf: Buf, elem: u64) -> Loc {
        Loc::new(rank, buf, elem.saturating_mul(self.req.dtype.size()))
    }

    /// Copy `elems` elements from `src` to `dst`.
    pub fn copy(&self, src: Loc, dst: Loc, elems: u64) -> Op {
        Op::Copy {
            src,
            dst,
            bytes: elems.saturating_mul(self.req.dtype.size()),
        }
    }

    /// `dst = a + b` over `elems` elements (the request's operator and element type).
    pub fn reduce(&self, a: Loc, b: Loc, dst: Loc, elems: u64) -> Op {
        Op::Reduce {
            a,
            b,
            dst,
            elems,
            dtype: self.req.dtype,
            op: self.req.op,
            div: 1,
        }
    }

    /// The index of slot "`kind` from `from`" in any rank's pad (this channel).
    pub fn slot(&self, kind: SlotKind, from: u16) -> u32 {
        self.req
            .layout()
            .index_unchecked(0, self.channel, kind, from)
    }

    /// Add 1 to `peer`'s slot "`kind` from this rank".
    pub fn signal(&self, peer: u16, kind: SlotKind) -> Op {
        Op::Signal {
            peer,
            slot: self.slot(kind, self.rank),
            op: SignalOp::Add,
            value: 1,
        }
    }

    /// Wait until this rank's slot "`kind` from `from`" has received `count` more signals.
    pub fn wait(&self, from: u16, kind: SlotKind, count: u64) -> Op {
        Op::Wait {
            slot: self.slot(kind, from),
            count,
        }
    }

    /// Elements per pipelining chunk (one scratch slot holds one chunk).
    pub fn chunk_elems(&self) -> u64 {
        self.chunk
    }

    /// How many chunks cover `len` elements (at least 1).
    pub fn chunks(&self, len: u64) -> u64 {
        len.div_ceil(self.chunk.max(1)).max(1)
    }

    /// Chunk `k` of `chunks` of the part `p` (near-equal, as [`Kit::segment`]).
    pub fn chunk(&self, p: Part, k: u64, chunks: u64) -> Part {
        p.sub(k, chunks)
    }

    /// Scratch slots per stream.
    pub fn slots(&self) -> u64 {
        self.slots
    }

    /// The first scratch element of slot `j % slots` (one chunk each).
    pub fn scratch_slot(&self, j: u64) -> u64 {
        (j % self.slots.max(1)) * self.chunk
    }

    /// The first scratch element of region `region` when the scratch holds several streams of
    /// [`Kit::slots`] chunk-sized slots each, and slot `j % slots` in it.
    pub fn scratch_region(&self, region: u64, j: u64) -> u64 {
        (region * self.req.slot_count() + j % self.slots.max(1)) * self.chunk
    }

    /// k-way reduce: `dst = (op) over r in ranks, in that order, of (r's buf at elem)`, `elems`
    /// elements, in one pass (`None` for an empty list or more than
    /// [`symm_core::op::MAX_FANIN`] ranks).
    pub fn reduce_n(&self, buf: Buf, elem: u64, ranks: &[u16], dst: Loc, elems: u64) -> Option<Op> {
        Some(Op::ReduceN {
            buf,
            offset: elem.saturating_mul(self.req.dtype.size()),
            ranks: Ranks::new(ranks)?,
            dst,
            elems,
            dtype: self.req.dtype,
            op: self.req.op,
            div: 1,
        })
    }

    /// Multicast reduce: `dst = sum over every rank r of (r's buf at elem)`, `elems` elements.
    pub fn mc_reduce(&self, buf: Buf, elem: u64, dst: Loc, elems: u64) -> Op {
        Op::McReduce {
            src: McLoc {
                buf,
                offset: elem.saturating_mul(self.req.dtype.size()),
            },
            dst,
            elems,
            dtype: self.req.dtype,
            op: self.req.op,
            div: 1,
        }
    }

    /// Multicast store: copy `elems` elements from `src` to (`buf`, `elem`) on every rank.
    pub fn mc_store(&self, src: Loc, buf: Buf, elem: u64, elems: u64) -> Op {
        Op::McStore {
            src,
            dst: McLoc {
                buf,
                offset: elem.saturating_mul(self.req.dtype.size()),
            },
            bytes: elems.saturating_mul(self.req.dtype.size()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::dtype::{DType, ReduceOp};
    use symm_core::sched::Algorithm;

    #[test]
    fn ring_neighbours_wrap_and_slots_name_the_signaller() {
        let req = Request::new(
            Collective::AllGather,
            Algorithm::Ring,
            4,
            64,
            DType::F32,
            ReduceOp::Sum,
        );
        let k = Kit::new(req, 0, 0);
        assert_eq!((k.prev(), k.next()), (3, 1));
        assert_eq!(k.at(2, Buf::Output, 3), Loc::new(2, Buf::Output, 12));
        let Op::Signal { slot, .. } = k.signal(1, SlotKind::Data) else {
            panic!("not a signal");
        };
        let key = req.layout().key(slot).unwrap();
        assert_eq!((key.kind, key.peer), (SlotKind::Data, 0));
        assert_eq!(k.segments(0, 4, 4).len, 16);
    }
}

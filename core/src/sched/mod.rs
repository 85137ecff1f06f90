//! Collective schedules as lazy state machines.
//!
//! A [`Request`] names a collective, an algorithm, the world size, the channel count, the byte
//! count, the element type and operator, and the pipelining parameters. [`Schedule::new`] checks it
//! and returns, for one (rank, channel), an iterator over that rank's ops. The iterator holds a few
//! integers and a batch of at most [`BATCH`] ops: it never allocates and its size does not depend
//! on the request, so a 1 GiB all-reduce on 64 ranks costs the same memory as a 4-byte one.
//!
//! Every algorithm is a list of *phases*; a phase is a count of *units* and a function that emits
//! the ops of unit `u` from index arithmetic alone. Units are random access, so an executor could
//! start anywhere, and counting ops needs no simulation.
//!
//! ## Conventions every algorithm follows
//! * Data of each channel is a balanced contiguous part of the collective's elements
//!   ([`part`]): part `c` of `C` over `n` elements starts at `c*(n/C) + min(c, n%C)`.
//! * A rank signals [`SlotKind::Ready`] to every rank that will write into or read from its
//!   buffers, and waits for `Ready` from every rank it will write into or read from, before the
//!   first access. So a collective never touches a rank that is still inside the previous one.
//! * Pipelined algorithms stage data in the receiver's scratch: `slots` slots per stream, credit
//!   flow control (a sender reuses slot `j % slots` for chunk `j >= slots` only after the credit
//!   for chunk `j - slots`), and a receiver returns a credit only when the sender will wait for it,
//!   so every schedule is balanced (see [`crate::signal`]).
//! * Reductions combine contributions in a fixed order per algorithm; the last combining step of
//!   `Avg` divides by the world size.
//! * Outputs are written exactly once per element per collective.

mod alltoallv;
mod auto;
mod determinism;
mod part;
mod request;
mod signature;
#[macro_use]
mod table;

pub use alltoallv::{alltoallv, capacity as alltoallv_capacity, AllToAllV};
pub use auto::Forced;
pub use determinism::Combines;
pub use part::{part, Part};
pub use request::{collectives, pairs, BufferSizes, Collective, Request, SchedError, MAX_BUFFER};
pub use signature::{Differs, Signature};
pub use table::Desc;

// The algorithm table: each file's algorithms with (name, program, description). See `table`.
algorithms! {
    ring {
        /// Ring (pipelined, credit flow control); for broadcast a pipelined chain.
        Ring = "ring", RingOrChain, DESC;
    }
    tree {
        /// Double binary tree (all-reduce) or binary tree (broadcast, reduce), pipelined.
        Tree = "tree", Tree, DESC;
    }
    rhd {
        /// Recursive halving (reduce-scatter) then doubling (all-gather), any world size.
        Rhd = "rhd", Rhd, DESC;
    }
    direct {
        /// Every rank reads every input and reduces the whole buffer.
        OneShot = "one_shot", Direct, ONE_SHOT;
        /// Direct reduce-scatter then direct all-gather.
        TwoShot = "two_shot", Direct, TWO_SHOT;
        /// NVLink multicast: load-reduce and multicast store.
        Multicast = "multicast", Direct, MULTICAST;
        /// Each rank reads or writes its peers directly.
        Direct = "direct", Direct, DIRECT;
        /// All-to-all in world - 1 pairwise steps.
        Pairwise = "pairwise", Direct, PAIRWISE;
    }
    ll {
        /// One-shot all-reduce over the low-latency protocol (data and flag in one line).
        OneShotLl = "one_shot_ll", OneShotLl, ONE_SHOT_LL;
        /// All-gather, reduce-scatter and all-to-all over the low-latency protocol.
        DirectLl = "direct_ll", DirectLl, DIRECT_LL;
        /// One-shot all-reduce over 128-byte lines (120 data bytes and a flag word each).
        OneShotLl128 = "one_shot_ll128", OneShotLl128, ONE_SHOT_LL128;
        /// All-gather, reduce-scatter and all-to-all over 128-byte lines.
        DirectLl128 = "direct_ll128", DirectLl128, DIRECT_LL128;
    }
}

use crate::dtype::ReduceOp;
use crate::op::{Buf, Loc, Op, SignalOp};
use crate::signal::{SlotKind, SlotLayout};

/// Most ops a single unit emits.
pub const BATCH: usize = 8;

/// Largest world a schedule accepts.
pub const MAX_WORLD: u16 = 1024;

/// Most channels a request may use.
pub const MAX_CHANNELS: u16 = 64;

/// Default pipelining chunk (bytes per channel per step).
pub const DEFAULT_CHUNK: u64 = 128 * 1024;

/// Default number of scratch slots per stream.
pub const DEFAULT_SLOTS: u8 = 2;

/// The ops a unit emits.
pub(crate) type Batch = heapless::Vec<Op, BATCH>;

/// What every algorithm knows about its rank and channel.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ctx {
    pub req: Request,
    pub rank: u16,
    pub channel: u16,
    pub esize: u64,
    pub layout: SlotLayout,
}

impl Ctx {
    /// The context of (`rank`, `channel`) after validating the request and both indices.
    pub fn new(req: Request, rank: u16, channel: u16) -> Result<Ctx, SchedError> {
        req.validate()?;
        if rank >= req.world {
            return Err(SchedError::BadRank { rank });
        }
        if channel >= req.channels {
            return Err(SchedError::BadChannel { channel });
        }
        Ok(Ctx {
            req,
            rank,
            channel,
            esize: req.dtype.size(),
            layout: req.layout(),
        })
    }

    pub fn world(&self) -> u16 {
        self.req.world
    }

    /// Signal `peer`'s slot of `kind` (keyed by this rank) with +1.
    pub fn signal(&self, peer: u16, kind: SlotKind) -> Op {
        Op::Signal {
            peer,
            slot: self
                .layout
                .index_unchecked(0, self.channel, kind, self.rank),
            op: SignalOp::Add,
            value: 1,
        }
    }

    /// Wait for `count` more signals of `kind` from `peer`.
    pub fn wait(&self, peer: u16, kind: SlotKind, count: u64) -> Op {
        Op::Wait {
            slot: self.layout.index_unchecked(0, self.channel, kind, peer),
            count,
        }
    }

    pub fn loc(&self, rank: u16, buf: Buf, elem: u64) -> Loc {
        Loc::new(rank, buf, elem * self.esize)
    }

    pub fn copy(&self, src: Loc, dst: Loc, elems: u64) -> Op {
        Op::Copy {
            src,
            dst,
            bytes: elems * self.esize,
        }
    }

    pub fn reduce(&self, a: Loc, b: Loc, dst: Loc, elems: u64, last: bool) -> Op {
        Op::Reduce {
            a,
            b,
            dst,
            elems,
            dtype: self.req.dtype,
            op: self.req.op,
            div: self.div(last),
        }
    }

    /// The divisor of the last combining step (world size for `Avg`).
    pub fn div(&self, last: bool) -> u32 {
        if last && self.req.op == ReduceOp::Avg {
            self.req.world as u32
        } else {
            1
        }
    }

    /// Element offset of scratch region `region`, slot `slot`, for this channel.
    pub fn scratch(&self, regions: u64, region: u64, slot: u64) -> u64 {
        let chunk = self.req.chunk_elems();
        let slots = self.req.slot_count();
        ((self.channel as u64 * regions + region) * slots + slot) * chunk
    }
}

/// An algorithm as phases of units.
pub(crate) trait Program: Sized {
    /// The program of (rank, channel) of the context's request.
    fn new(ctx: &Ctx) -> Self;
    /// Units in phase `p`; phases past the last return 0 and [`Program::PHASES`] bounds them.
    fn units(&self, ctx: &Ctx, p: u8) -> u64;
    /// Emits the ops of unit `u` of phase `p`.
    fn emit(&self, ctx: &Ctx, p: u8, u: u64, out: &mut Batch);
    /// Number of phases.
    const PHASES: u8;
}

/// One (rank, channel)'s ops for a request, produced lazily.
#[derive(Clone, Debug)]
pub struct Schedule {
    ctx: Ctx,
    algo: Algo,
    cursor: Cursor,
}

impl Schedule {
    /// The schedule of `rank` on `channel`.
    ///
    /// ```
    /// use symm_core::dtype::{DType, ReduceOp};
    /// use symm_core::op::{Buf, Op};
    /// use symm_core::sched::{Algorithm, Collective, Request, Schedule};
    ///
    /// let (c, a) = (Collective::AllGather, Algorithm::Direct);
    /// let req = Request::new(c, a, 4, 256, DType::F32, ReduceOp::Sum);
    /// let ops: Vec<Op> = Schedule::new(req, 1, 0).unwrap().collect();
    ///
    /// // Rank 1 writes its block into every rank's output (its own included): four copies,
    /// // each 256 bytes to block 1, with signals and waits around them.
    /// let puts: Vec<_> = ops
    ///     .iter()
    ///     .filter_map(|op| match *op {
    ///         Op::Copy { dst, bytes, .. } if dst.buf == Buf::Output => Some((dst.offset, bytes)),
    ///         _ => None,
    ///     })
    ///     .collect();
    /// assert_eq!(puts.len(), 4);
    /// assert!(puts.iter().all(|&(offset, bytes)| offset == 256 && bytes == 256));
    /// assert!(ops.iter().any(|op| matches!(op, Op::Wait { .. })));
    ///
    /// // `Schedule::count` walks a fresh copy without consuming the schedule. (Method syntax
    /// // on a value, `schedule.count()`, picks `Iterator::count`, which consumes it.)
    /// let schedule = Schedule::new(req, 1, 0).unwrap();
    /// assert_eq!(Schedule::count(&schedule), ops.len() as u64);
    /// assert_eq!(schedule.count(), ops.len());
    /// // A rank outside the world is refused.
    /// assert!(Schedule::new(req, 4, 0).is_err());
    /// ```
    pub fn new(req: Request, rank: u16, channel: u16) -> Result<Schedule, SchedError> {
        let ctx = Ctx::new(req, rank, channel)?;
        if req.collective == Collective::AllToAllV {
            return Err(SchedError::NeedsCounts);
        }
        let algo = if req.bytes == 0 {
            Algo::Empty
        } else {
            Algo::new(&ctx)
        };
        Ok(Schedule {
            ctx,
            algo,
            cursor: Cursor::default(),
        })
    }

    /// The request.
    pub fn request(&self) -> &Request {
        &self.ctx.req
    }

    /// The rank.
    pub fn rank(&self) -> u16 {
        self.ctx.rank
    }

    /// The channel.
    pub fn channel(&self) -> u16 {
        self.ctx.channel
    }

    /// Total number of ops (walks a fresh copy of the schedule; each unit is O(1)).
    pub fn count(&self) -> u64 {
        let mut s = self.clone();
        s.cursor = Cursor::default();
        s.fold(0, |n, _| n + 1)
    }
}

/// Where an iterator over phases of units stands: the unit to emit next and the ops of the
/// current unit not yet returned. Every schedule iterator walks its phases with one.
#[derive(Clone, Debug, Default)]
pub(crate) struct Cursor {
    phase: u8,
    unit: u64,
    batch: Batch,
    pos: usize,
}

impl Cursor {
    /// The next op of a program with `phases` phases, `units(p)` units in phase `p`, and
    /// `emit(p, u, out)` writing unit `u`'s ops.
    pub fn next(
        &mut self,
        phases: u8,
        units: impl Fn(u8) -> u64,
        emit: impl Fn(u8, u64, &mut Batch),
    ) -> Option<Op> {
        loop {
            if let Some(op) = self.batch.get(self.pos) {
                self.pos += 1;
                return Some(*op);
            }
            if self.phase >= phases {
                return None;
            }
            if self.unit >= units(self.phase) {
                self.phase += 1;
                self.unit = 0;
                continue;
            }
            self.batch.clear();
            self.pos = 0;
            emit(self.phase, self.unit, &mut self.batch);
            self.unit += 1;
        }
    }
}

impl Iterator for Schedule {
    type Item = Op;

    fn next(&mut self) -> Option<Op> {
        let (c, a) = (&self.ctx, &self.algo);
        self.cursor.next(
            a.phases(),
            |p| a.units(c, p),
            |p, u, out| a.emit(c, p, u, out),
        )
    }
}

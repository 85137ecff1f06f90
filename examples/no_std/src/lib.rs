//! A `no_std` use of a symm schedule: what firmware, a GPU-side loader or any runtime without a
//! heap can do with `symm-core` alone.
//!
//! A [`Schedule`] is a lazy iterator that holds a few integers and one small batch of ops, so
//! walking it needs neither `std` nor `alloc`. This crate depends on `symm-core` with
//! `default-features = false` and uses only `core`; `cargo xtask test` builds it for
//! `thumbv7em-none-eabihf` (a Cortex-M4F, no operating system) to keep it that way.
//!
//! * [`tally`] walks every (rank, channel) stream of a request and counts ops by kind, the bytes
//!   the data ops move, how many of those bytes cross to another rank, and the longest stream:
//!   the numbers a runtime sizes its queues and budgets by.
//! * [`plan_into`] encodes one stream into a caller-provided array of 64-byte [`PlanOp`]s, the
//!   fixed-size form the GPU interpreter reads, refusing (not truncating) a stream that does not
//!   fit.
//!
//! The host side (`examples/no_std_schedule.rs`, run by `cargo xtask test`) checks both against
//! the `alloc`-based paths of `symm-core`: ops collected into vectors, the symbolic checker's op
//! count, and the simulator's.
//!
//! ```
//! use symm_core::dtype::{DType, ReduceOp};
//! use symm_core::sched::{Algorithm, Collective, Request};
//!
//! let (c, a) = (Collective::AllGather, Algorithm::Ring);
//! let req = Request::new(c, a, 4, 1024, DType::F32, ReduceOp::Sum);
//! let t = symm_example_no_std::tally(&req).unwrap();
//! // Each rank copies its block into its own output, and each block travels to the 3 others.
//! assert_eq!(t.copies, 4 + 4 * 3);
//! assert_eq!(t.remote_bytes, 4 * 3 * 1024);
//! assert_eq!(t.bytes, (4 + 4 * 3) * 1024);
//! ```
#![no_std]
#![deny(missing_docs)]
#![forbid(unsafe_code)]

use symm_core::op::{At, Op};
use symm_core::plan::PlanOp;
use symm_core::sched::{Request, SchedError, Schedule};

/// What the streams of a request do, counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// `Copy` and `LlPut` ops.
    pub copies: u64,
    /// `Reduce`, `ReduceN` and `LlReduce` ops.
    pub reduces: u64,
    /// `Signal` ops.
    pub signals: u64,
    /// `Wait` ops.
    pub waits: u64,
    /// `McReduce` and `McStore` ops.
    pub multicast: u64,
    /// Bytes the data ops move ([`Op::bytes`]).
    pub bytes: u64,
    /// Of those, the bytes of ops that read or write another rank's memory (multicast included).
    pub remote_bytes: u64,
    /// Ops of the longest single (rank, channel) stream.
    pub longest: u64,
}

impl Tally {
    /// Every op counted.
    pub fn ops(&self) -> u64 {
        self.copies + self.reduces + self.signals + self.waits + self.multicast
    }

    /// Counts one op that rank `me` runs.
    fn add(&mut self, me: u16, op: &Op) {
        match op {
            Op::Copy { .. } | Op::LlPut { .. } => self.copies += 1,
            Op::Reduce { .. } | Op::ReduceN { .. } | Op::LlReduce { .. } => self.reduces += 1,
            Op::Signal { .. } => self.signals += 1,
            Op::Wait { .. } => self.waits += 1,
            Op::McReduce { .. } | Op::McStore { .. } => self.multicast += 1,
        }
        // Whether it touches another rank's bytes: its footprint names them (a multicast
        // range names every rank's).
        let remote = op.footprint().ranges().iter().any(|r| match r.at {
            At::Rank(l) => l.rank != me,
            At::Every(_) => true,
        });
        self.bytes += op.bytes();
        if remote {
            self.remote_bytes += op.bytes();
        }
    }
}

/// Counts the ops of one (rank, channel) stream of `req`.
pub fn tally_stream(req: &Request, rank: u16, channel: u16) -> Result<Tally, SchedError> {
    let mut t = Tally::default();
    for op in Schedule::new(*req, rank, channel)? {
        t.add(rank, &op);
    }
    t.longest = t.ops();
    Ok(t)
}

/// Counts the ops of every (rank, channel) stream of `req`.
pub fn tally(req: &Request) -> Result<Tally, SchedError> {
    req.validate()?;
    let mut all = Tally::default();
    for rank in 0..req.world {
        for channel in 0..req.channels {
            let t = tally_stream(req, rank, channel)?;
            all.copies += t.copies;
            all.reduces += t.reduces;
            all.signals += t.signals;
            all.waits += t.waits;
            all.multicast += t.multicast;
            all.bytes += t.bytes;
            all.remote_bytes += t.remote_bytes;
            all.longest = all.longest.max(t.longest);
        }
    }
    Ok(all)
}

/// Why [`plan_into`] could not encode a stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanIntoError {
    /// The request, rank or channel does not schedule.
    Sched(SchedError),
    /// The stream has `needed` ops and the array holds fewer.
    TooLong {
        /// Ops in the stream.
        needed: u64,
    },
}

impl core::fmt::Display for PlanIntoError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            PlanIntoError::Sched(e) => write!(f, "the stream does not schedule: {e}"),
            PlanIntoError::TooLong { needed } => {
                write!(f, "the stream has {needed} ops, more than the array holds")
            }
        }
    }
}

impl core::error::Error for PlanIntoError {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            PlanIntoError::Sched(e) => Some(e),
            PlanIntoError::TooLong { .. } => None,
        }
    }
}

/// Encodes the stream of (`rank`, `channel`) into the front of `out` and returns how many ops it
/// wrote. A stream longer than `out` is [`PlanIntoError::TooLong`] with its full length, so the
/// caller can size the array and try again; `out` is then partly written.
pub fn plan_into(
    req: &Request,
    rank: u16,
    channel: u16,
    out: &mut [PlanOp],
) -> Result<usize, PlanIntoError> {
    let mut ops = Schedule::new(*req, rank, channel).map_err(PlanIntoError::Sched)?;
    let mut n = 0;
    for op in ops.by_ref() {
        let Some(slot) = out.get_mut(n) else {
            // `Schedule::count` walks a fresh copy: the whole stream's length.
            return Err(PlanIntoError::TooLong {
                needed: Schedule::count(&ops),
            });
        };
        *slot = PlanOp::encode(&op);
        n += 1;
    }
    Ok(n)
}

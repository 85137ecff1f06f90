//! The host backend: a world of ranks over host memory.
//!
//! Two ways to run a request, over the same op semantics (`mem`, public as [`WorldMem`] and [`RankFabric`]):
//!
//! * [`simulate`]: one thread steps every (rank, channel) executor in turn. It is deterministic,
//!   stamps events with *virtual* time from a [`Link`] model (a wait ends when the signal that
//!   satisfies it arrived), and can record what each op's destination holds (contribution sets)
//!   for the viz.
//! * [`run_threads`]: one OS thread per (rank, channel), real atomics on the signal pads
//!   (release on signal, acquire on wait), real time, and a deadline on every wait that turns a
//!   hang into a [`HostError::Timeout`] naming the rank, peer, slot, expected and found values.
//!
//! Buffer bytes are atomics accessed with relaxed loads and stores; all ordering comes from the
//! signal protocol, exactly as on a GPU. There is no `unsafe` in this backend: a buggy schedule
//! produces wrong bytes (which the tests catch), never undefined behaviour.
//!
//! # The crate
//!
//! symm-host depends on symm-core only (and loom under `cfg(loom)`): no CUDA, no bootstrap, no
//! files. Beside the backend it holds [`sync`], the std/loom switch of its atomics (the runtime's
//! abort arm uses it too), and [`trace_diff`], which compares a GPU trace with the simulator's.
//! The `Backend` trait over every executor lives in symm-driver, which re-exports this crate as
//! `symm_driver::host`.
#![deny(missing_docs)]

#[cfg(test)]
mod bounds_tests;
mod calls;
mod deterministic;
mod flags;
mod mem;
pub mod moe;
pub mod norm;
pub mod pad;
mod reference;
mod sim;
pub mod sync;
mod teams;
mod threads;
pub mod trace_diff;

pub use calls::{run_calls, CallsError, CallsMode, CallsOptions, RankCalls};
pub use deterministic::{hard_inputs, reference_in_rank_order};
pub use flags::{FlagStep, FlagStream};
pub use mem::{check_footprint, footprint, Oob, RankFabric, Temps, WorldMem, MAX_HOST_BYTES};

/// The most ops one host run executes (simulator, threads with a trace, teams): its trace
/// events, signal histories and op lists grow with them, so a schedule longer than this (a
/// large message in small chunks) is refused with [`HostError::TooManyOps`] when the run
/// reaches it, never run into memory it cannot bound. Untraced threads run any length.
pub const MAX_HOST_OPS: u64 = 1 << 24;

/// The most threads [`run_threads`] starts: one per rank and channel.
pub const MAX_HOST_THREADS: u64 = 8192;
pub use reference::{alltoallv_reference, compare, random_inputs, reference, Mismatch, POISON};
pub use sim::{
    check_inputs, fit_link, simulate, simulate_streams, Block, FitError, FitRow, FitSample,
    LinkFit, SimOptions,
};
pub use teams::{run_teams, run_teams_traced, TeamJob, TeamMode, TeamOutputs};
pub use threads::{run_streams, run_threads, run_threads_in_place, ThreadOptions};

use symm_core::cost::Link;
use symm_core::op::Loc;
use symm_core::sched::SchedError;
use symm_core::trace::{Event, Header, Source, TraceError};

/// An executor's error on `rank`'s `channel` as the backend's: an op outside the world's memory
/// (or an unknown slot) at its index. Every host runner maps executor errors through this.
pub(crate) fn exec_error(rank: u16, channel: u16, e: symm_core::exec::ExecError<Oob>) -> HostError {
    use symm_core::exec::ExecError;
    let (index, loc) = match e {
        ExecError::Fabric {
            error: Oob(loc),
            index,
        } => (index, loc),
        ExecError::SlotOutOfRange { index, .. } => (index, None),
        _ => (0, None),
    };
    HostError::OutOfBounds {
        rank,
        channel,
        index,
        loc,
    }
}

/// The result of a run.
#[derive(Clone, Debug)]
pub struct Run {
    /// Each rank's output buffer.
    pub outputs: Vec<Vec<u8>>,
    /// The trace (`symm_core::trace` format, with its end record).
    pub trace: Vec<u8>,
    /// Ops executed over all ranks and channels.
    pub ops: u64,
    /// Time of the run in microseconds: virtual for [`simulate`], wall clock for
    /// [`run_threads`].
    pub time_us: f64,
}

/// Errors of the host backend.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum HostError {
    /// The request does not schedule.
    Sched(SchedError),
    /// An input buffer has the wrong length.
    BadInput {
        /// Rank.
        rank: u16,
        /// Bytes expected.
        expected: u64,
        /// Bytes given.
        found: u64,
    },
    /// The number of input buffers is not the world size.
    BadWorld {
        /// Buffers expected.
        expected: u16,
        /// Buffers given.
        found: usize,
    },
    /// An op reaches outside a buffer or names a rank or slot outside the world.
    OutOfBounds {
        /// Rank running the op.
        rank: u16,
        /// Channel.
        channel: u16,
        /// Op index.
        index: u32,
        /// The location, when the op named one.
        loc: Option<Loc>,
    },
    /// Every unfinished stream is blocked (simulator).
    Deadlock {
        /// Rank of the first blocked stream.
        rank: u16,
        /// Channel.
        channel: u16,
        /// Op index.
        index: u32,
        /// Slot it waits on.
        slot: u32,
        /// Value it needs.
        target: u64,
        /// Value found.
        found: u64,
    },
    /// A wait passed its deadline (threads).
    Timeout {
        /// Rank that waited.
        rank: u16,
        /// Channel.
        channel: u16,
        /// Op index.
        index: u32,
        /// The peer expected to signal.
        peer: u16,
        /// Slot.
        slot: u32,
        /// Value needed.
        expected: u64,
        /// Value found.
        found: u64,
    },
    /// A rank thread panicked (a bug in this backend).
    ThreadPanicked,
    /// The trace could not be written.
    Trace(TraceError),
    /// A team could not be formed or mapped onto the world.
    Team(symm_core::team::TeamError),
    /// The run's memory (every rank's buffers, low-latency words and pad) would be over the
    /// host backend's bound (`mem::MAX_HOST_BYTES`); nothing was allocated.
    TooLarge {
        /// Bytes the run would take.
        bytes: u64,
        /// The bound.
        limit: u64,
    },
    /// The run's schedule holds more ops than the host backend executes ([`MAX_HOST_OPS`]):
    /// larger chunks (`Request::with_pipeline`) or a smaller message run.
    TooManyOps {
        /// The bound.
        limit: u64,
    },
    /// The run needs a thread per rank and channel, more than [`MAX_HOST_THREADS`] or than
    /// the system would start; the threads started were stopped.
    TooManyThreads {
        /// Threads the run needs.
        threads: u64,
        /// The bound, or the threads the system started before it refused one.
        limit: u64,
    },
    /// The request's output cannot be its input: its sizes differ, or its algorithm does not
    /// run in place (`Request::runs_in_place`).
    NotInPlace {
        /// The request's collective.
        collective: &'static str,
        /// Its algorithm.
        algorithm: &'static str,
    },
}

impl std::fmt::Display for HostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostError::Sched(e) => write!(f, "cannot schedule: {e}"),
            HostError::BadInput { rank, expected, found } => {
                write!(f, "rank {rank}'s input has {found} bytes, the request needs {expected}")
            }
            HostError::BadWorld { expected, found } => {
                write!(f, "{found} input buffers for a world of {expected}")
            }
            HostError::OutOfBounds { rank, channel, index, loc } => {
                write!(f, "rank {rank} channel {channel} op {index} is out of bounds ({loc:?})")
            }
            HostError::Deadlock { rank, channel, index, slot, target, found } => write!(
                f,
                "deadlock: rank {rank} channel {channel} op {index} waits for slot {slot} to reach {target}, found {found}"
            ),
            HostError::Timeout { rank, channel, index, peer, slot, expected, found } => write!(
                f,
                "timeout: rank {rank} channel {channel} op {index} waited for peer {peer} on slot {slot}: expected {expected}, found {found}"
            ),
            HostError::ThreadPanicked => write!(f, "a rank thread panicked"),
            HostError::Trace(e) => write!(f, "trace: {e}"),
            HostError::Team(e) => write!(f, "team: {e}"),
            HostError::TooLarge { bytes, limit } => write!(
                f,
                "the run's memory would take {bytes} bytes (every rank's buffers, scratch and pad); the host backend takes at most {limit}"
            ),
            HostError::TooManyOps { limit } => write!(
                f,
                "the run's schedule holds more than {limit} ops, the most the host backend runs; larger chunks or a smaller message run"
            ),
            HostError::TooManyThreads { threads, limit } => write!(
                f,
                "the run needs {threads} threads (one per rank and channel); the host backend starts at most {limit}"
            ),
            HostError::NotInPlace { collective, algorithm } => write!(
                f,
                "{collective} by {algorithm} does not run in place (its output cannot be its input)"
            ),
        }
    }
}

impl std::error::Error for HostError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HostError::Sched(e) => Some(e),
            HostError::Trace(e) => Some(e),
            HostError::Team(e) => Some(e),
            _ => None,
        }
    }
}

/// Encodes a host trace (events sorted by `symm_core::trace::encode`).
fn write_trace(
    req: &symm_core::sched::Request,
    simulated: bool,
    events: &mut [Event],
) -> Result<Vec<u8>, HostError> {
    let header = Header {
        world: req.world,
        channels: req.channels,
        request: *req,
        source: Source::Host { simulated },
        time_unit_ns: 1,
        team: None,
    };
    symm_core::trace::encode(&header, events).map_err(HostError::Trace)
}

/// The default link model for simulated time.
pub const DEFAULT_LINK: Link = Link::NVLINK4;

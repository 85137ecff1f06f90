//! One OS thread per (rank, channel), real atomics, real time.
//!
//! Each thread runs its stream on the generic executor. A blocked wait spins (then yields) on
//! acquire loads of its slot until it is satisfied, another thread failed (a shared abort flag), or
//! the deadline passes; then the run returns [`HostError::Timeout`] naming the rank, the peer
//! expected to signal (from the slot layout), the slot, the value needed and the value found.

use super::mem::{RankFabric, Temps, WorldMem};
use super::sim::check_inputs;
use super::{HostError, Run};
use crate::sync::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use symm_core::exec::{Executor, Step};
use symm_core::op::Op;
use symm_core::sched::{Request, Schedule};
use symm_core::trace::{Event, EventKind};

/// Options of [`run_threads`].
#[derive(Clone, Copy, Debug)]
pub struct ThreadOptions {
    /// How long a wait may block before the run fails.
    pub deadline: Duration,
    /// Record a trace.
    pub trace: bool,
}

impl Default for ThreadOptions {
    fn default() -> Self {
        ThreadOptions {
            deadline: Duration::from_secs(10),
            trace: true,
        }
    }
}

/// What every stream of a run shares: the abort flag, and with a trace the ops the run's
/// streams may still run (a trace keeps two events per op).
struct Shared {
    abort: AtomicBool,
    /// Ops left to the run's trace.
    room: AtomicU64,
    /// The run's bound ([`crate::MAX_HOST_OPS`]), named by the error.
    max_ops: u64,
}

fn stream<I: Iterator<Item = Op>>(
    req: &Request,
    mem: &WorldMem,
    shared: &Shared,
    opts: &ThreadOptions,
    t0: Instant,
    (rank, channel): (u16, u16),
    ops: I,
) -> Result<(u64, Vec<Event>), HostError> {
    let abort = &shared.abort;
    // This channel's range of the rank's counters (its waits name only its own slots).
    let per_channel = (req.layout().slots() / req.channels.max(1) as u32).max(1);
    let mut expected = vec![0u64; per_channel as usize];
    let mut ex = Executor::at(ops, &mut expected, channel as u32 * per_channel);
    let mut temps = Temps::default();
    let mut view = RankFabric::new(mem, rank, &mut temps);
    let mut events = Vec::new();
    let mut n = 0;
    let now = || t0.elapsed().as_nanos() as u64;
    loop {
        let begin = now();
        let mut blocked_since = None;
        let mut spins = 0u32;
        let step = loop {
            let s = ex
                .step(&mut view)
                .map_err(|e| super::exec_error(rank, channel, e))?;
            let Step::Blocked {
                index,
                slot,
                target,
                found,
            } = s
            else {
                break s;
            };
            let since = *blocked_since.get_or_insert_with(Instant::now);
            if abort.load(Ordering::Relaxed) {
                return Ok((n, events));
            }
            if since.elapsed() > opts.deadline {
                let peer = req.layout().key(slot).map(|k| k.peer).unwrap_or(u16::MAX);
                return Err(HostError::Timeout {
                    rank,
                    channel,
                    index,
                    peer,
                    slot,
                    expected: target,
                    found,
                });
            }
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else if spins < 4096 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        };
        match step {
            Step::Ran { index, op } => {
                n += 1;
                if opts.trace {
                    let left = shared.room.fetch_sub(1, Ordering::Relaxed);
                    if left == 0 || left > shared.max_ops {
                        shared.room.store(0, Ordering::Relaxed);
                        return Err(HostError::TooManyOps {
                            limit: shared.max_ops,
                        });
                    }
                    let ev = |time, kind| Event {
                        time,
                        rank,
                        channel,
                        index,
                        kind,
                        op,
                        contents: None,
                    };
                    events.push(ev(begin, EventKind::Begin));
                    events.push(ev(now(), EventKind::End));
                }
            }
            _ => return Ok((n, events)),
        }
    }
}

/// Runs `req` over `inputs` with one thread per (rank, channel).
///
/// ```
/// use std::time::Duration;
/// use symm_core::dtype::{DType, ReduceOp};
/// use symm_core::sched::{Algorithm, Collective, Request};
/// use symm_host::{self as host, HostError, ThreadOptions};
///
/// let (c, a) = (Collective::ReduceScatter, Algorithm::Ring);
/// let req = Request::new(c, a, 4, 1024, DType::I32, ReduceOp::Max).with_channels(2);
/// let inputs = host::random_inputs(&req, 7);
/// let opts = ThreadOptions { deadline: Duration::from_secs(10), trace: false };
/// let run = host::run_threads(&req, &inputs, &opts).unwrap();
/// // Rank r holds block r of the element-wise maximum.
/// assert_eq!(run.outputs, host::reference(&req, &inputs));
///
/// // Bad input is an error before any thread starts.
/// let short = &inputs[..3];
/// assert!(matches!(
///     host::run_threads(&req, short, &opts),
///     Err(HostError::BadWorld { expected: 4, found: 3 })
/// ));
/// ```
pub fn run_threads(
    req: &Request,
    inputs: &[Vec<u8>],
    opts: &ThreadOptions,
) -> Result<Run, HostError> {
    run_streams(req, inputs, opts, |r, c| {
        Schedule::new(*req, r, c).map_err(HostError::Sched)
    })
}

/// Runs arbitrary per-(rank, channel) op streams (user-written plans, or deliberately broken ones
/// in tests) over the memory of `req`.
pub fn run_streams<I, F>(
    req: &Request,
    inputs: &[Vec<u8>],
    opts: &ThreadOptions,
    make: F,
) -> Result<Run, HostError>
where
    I: Iterator<Item = Op> + Send,
    F: Fn(u16, u16) -> Result<I, HostError>,
{
    // `WorldMem::new` checks the request and the inputs.
    let mem = WorldMem::new(req, inputs, super::POISON)?;
    run_on(req, &mem, opts, make)
}

/// Runs `req` in place with threads: each rank's output is its input buffer, as a framework's
/// in-place all-reduce hands it. Refused ([`HostError::NotInPlace`]) unless the request runs in
/// place ([`Request::runs_in_place`]); the outputs are the inputs' buffers after the run.
pub fn run_threads_in_place(
    req: &Request,
    inputs: &[Vec<u8>],
    opts: &ThreadOptions,
) -> Result<Run, HostError> {
    check_inputs(req, inputs)?;
    if !req.runs_in_place() {
        return Err(HostError::NotInPlace {
            collective: req.collective.name(),
            algorithm: req.algorithm.name(),
        });
    }
    let mem = WorldMem::in_place(req, inputs)?;
    run_on(req, &mem, opts, |r, c| {
        Schedule::new(*req, r, c).map_err(HostError::Sched)
    })
}

/// Runs `work` on each of `items`, a scoped thread each, and returns their results in order (a
/// thread that panicked is [`HostError::ThreadPanicked`]). A failed item raises `abort`, which
/// the others' waits watch. At most [`crate::MAX_HOST_THREADS`] items; when the system starts
/// no more threads, `abort` is raised, the started ones are joined, and the run is
/// [`HostError::TooManyThreads`]: never a panic.
pub(crate) fn on_threads<T: Send, R: Send>(
    items: Vec<T>,
    abort: &AtomicBool,
    work: impl Fn(T) -> Result<R, HostError> + Sync,
) -> Result<Vec<Result<R, HostError>>, HostError> {
    let threads = items.len() as u64;
    if threads > crate::MAX_HOST_THREADS {
        return Err(HostError::TooManyThreads {
            threads,
            limit: crate::MAX_HOST_THREADS,
        });
    }
    let mut refused = None;
    let work = &work;
    let results = std::thread::scope(|s| {
        let mut handles = Vec::with_capacity(items.len());
        for item in items {
            let started = std::thread::Builder::new().spawn_scoped(s, move || {
                let r = work(item);
                if r.is_err() {
                    abort.store(true, Ordering::Relaxed);
                }
                r
            });
            match started {
                Ok(h) => handles.push(h),
                Err(_) => {
                    // The system starts no more: the started ones stop at their next wait.
                    abort.store(true, Ordering::Relaxed);
                    refused = Some(HostError::TooManyThreads {
                        threads,
                        limit: handles.len() as u64,
                    });
                    break;
                }
            }
        }
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(HostError::ThreadPanicked)))
            .collect()
    });
    match refused {
        Some(e) => Err(e),
        None => Ok(results),
    }
}

/// Runs the op streams `make` gives over `mem`, a thread per (rank, channel).
fn run_on<I, F>(
    req: &Request,
    mem: &WorldMem,
    opts: &ThreadOptions,
    make: F,
) -> Result<Run, HostError>
where
    I: Iterator<Item = Op> + Send,
    F: Fn(u16, u16) -> Result<I, HostError>,
{
    run_within(req, mem, opts, make, crate::MAX_HOST_OPS)
}

/// [`run_on`] with at most `max_ops` ops in a traced run.
pub(crate) fn run_within<I, F>(
    req: &Request,
    mem: &WorldMem,
    opts: &ThreadOptions,
    make: F,
    max_ops: u64,
) -> Result<Run, HostError>
where
    I: Iterator<Item = Op> + Send,
    F: Fn(u16, u16) -> Result<I, HostError>,
{
    // The thread bound is `on_threads`'s, checked before any thread starts.
    let shared = Shared {
        abort: AtomicBool::new(false),
        room: AtomicU64::new(max_ops),
        max_ops,
    };
    let t0 = Instant::now();
    let mut jobs = Vec::new();
    for r in 0..req.world {
        for c in 0..req.channels {
            jobs.push(((r, c), make(r, c)?));
        }
    }
    let results = on_threads(jobs, &shared.abort, |(rc, ops)| {
        stream(req, mem, &shared, opts, t0, rc, ops)
    })?;
    let elapsed = t0.elapsed();
    let mut ops = 0;
    let mut events = Vec::new();
    for r in results {
        let (n, ev) = r?;
        ops += n;
        events.extend(ev);
    }
    let trace = if opts.trace {
        super::write_trace(req, false, &mut events)?
    } else {
        Vec::new()
    };
    Ok(Run {
        outputs: (0..req.world as usize).map(|r| mem.output(r)).collect(),
        trace,
        ops,
        time_us: elapsed.as_secs_f64() * 1e6,
    })
}

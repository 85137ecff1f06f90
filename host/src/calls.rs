//! A job of back-to-back calls on the host, each rank making its own calls, and the signature
//! check that names a call that differs across ranks at once.
//!
//! [`run_calls`] gives every rank one OS thread that makes its list of calls one after another
//! over one memory (buffers sized for the largest call, one signal pad whose counters only
//! grow, as a job's heap), with no barrier between calls: what a framework's process does. Each
//! call, a rank
//!
//! 1. writes its input (the caller's data is in place before the call);
//! 2. publishes its call's [`Signature`] in its signature word `seq mod 2`, with release, before
//!    its first signal of the call;
//! 3. runs its streams (its channels in turn on its thread, each resumed when it blocks); after
//!    each wait that a peer's signal satisfied, the first one of the call from that peer, it
//!    reads the peer's word with acquire and [`Signature::check`]s it against its own;
//! 4. reads its output.
//!
//! A check that names a difference raises the job's abort flag with [`CallsError::RanksDiffer`]
//! (which rank found it, the peer, the call, both words and what differs), and every other rank,
//! blocked in a wait or not, stops with the same error: every rank learns the cause, no rank
//! waits for its deadline. A wait that outlives the deadline is [`CallsError::Host`]'s timeout,
//! as in [`crate::run_threads`]. Agreeing calls never fire, however far apart the ranks run: the
//! word read for call `k` is either the peer's call `k`, equal, or a later call of the peer,
//! which the sequence number tells apart (`driver/tests/loom.rs` models it).
//!
//! Low-latency algorithms are refused ([`CallsError::Host`] with
//! [`HostError::Sched`]'s unsupported request): their flags need a call epoch this job does not
//! keep.

use super::mem::{RankFabric, Temps, WorldMem};
use super::{exec_error, HostError, POISON};
use crate::sync::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use symm_core::exec::{Executor, Step};
use symm_core::op::{Buf, Loc, Op};
use symm_core::sched::{Differs, Request, SchedError, Schedule, Signature};
use symm_core::signal::SlotLayout;

/// What stopped a job of calls.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum CallsError {
    /// A call differs across ranks: `rank` read `peer`'s signature of call `call` after
    /// waiting for its signal, and it is not `rank`'s.
    RanksDiffer {
        /// The rank that found it.
        rank: u16,
        /// The peer whose call differs.
        peer: u16,
        /// The call's sequence number (counted from 0 on every rank).
        call: u64,
        /// The finder's signature.
        mine: Signature,
        /// The peer's.
        theirs: Signature,
        /// What differs.
        differs: Differs,
    },
    /// The ranks' calls could not run: a request that does not schedule, a timeout, a buffer.
    Host(HostError),
}

impl std::fmt::Display for CallsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallsError::RanksDiffer {
                rank,
                peer,
                call,
                differs,
                ..
            } => write!(
                f,
                "call {call} differs across ranks: rank {rank} and rank {peer} differ in {}",
                differs.words()
            ),
            CallsError::Host(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for CallsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CallsError::Host(e) => Some(e),
            CallsError::RanksDiffer { .. } => None,
        }
    }
}

/// Options of [`run_calls`].
#[derive(Clone, Copy, Debug)]
pub struct CallsOptions {
    /// How long a wait may block before the job fails.
    pub deadline: Duration,
    /// Seed of every call's inputs ([`crate::random_inputs`] of the call's request, with the
    /// seed plus the call's number).
    pub seed: u64,
}

impl Default for CallsOptions {
    fn default() -> Self {
        CallsOptions {
            deadline: Duration::from_secs(10),
            seed: 1,
        }
    }
}

/// Every rank's outputs, call by call (`[call][...]` per rank), or what stopped it.
pub type RankCalls = Result<Vec<Vec<u8>>, CallsError>;

/// The job's shared state: memory, signature words, abort flag and first error.
struct Job {
    mem: WorldMem,
    /// Two signature words per rank (call `k` in word `k mod 2`).
    sigs: Vec<[AtomicU64; 2]>,
    abort: AtomicBool,
    first: Mutex<Option<CallsError>>,
    /// The job's pad: one layout for every call (the most channels any call has), so that a
    /// slot means the same (channel, kind, peer) in every call and a signal of a peer's next
    /// call can never satisfy a wait of this one under another name.
    layout: SlotLayout,
}

impl Job {
    /// Records `e` as the cause unless one is recorded, raises the abort flag, and returns the
    /// cause.
    fn fail(&self, e: CallsError) -> CallsError {
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        let cause = first.get_or_insert(e).clone();
        self.abort.store(true, Ordering::Release);
        cause
    }

    /// The recorded cause (after the abort flag was seen).
    fn cause(&self) -> CallsError {
        let first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        first
            .clone()
            .unwrap_or(CallsError::Host(HostError::ThreadPanicked))
    }
}

/// Runs each rank's `calls[rank]` back to back, one thread per rank; returns each rank's
/// outputs per call, or the error that stopped it (the same cause on every rank).
///
/// ```
/// use symm_core::dtype::{DType, ReduceOp};
/// use symm_core::sched::{Algorithm, Collective, Differs, Request};
/// use symm_host::{run_calls, CallsError, CallsOptions};
///
/// let ar = Request::new(Collective::AllReduce, Algorithm::OneShot, 2, 64, DType::F32,
///                       ReduceOp::Sum);
/// let ag = Request { collective: Collective::AllGather, algorithm: Algorithm::Ring,
///                    bytes: 32, ..ar };
/// let opts = CallsOptions::default();
/// // The same calls: every rank's outputs.
/// let same = run_calls(&[vec![ar, ag], vec![ar, ag]], &opts);
/// assert!(same.iter().all(|r| r.as_ref().is_ok_and(|o| o.len() == 2)));
/// // Rank 1's second call is another all-reduce: named on both ranks at once.
/// let differ = run_calls(&[vec![ar, ag], vec![ar, ar]], &opts);
/// for r in &differ {
///     match r {
///         Err(CallsError::RanksDiffer { call: 1, differs, .. }) => {
///             assert!(differs.contains(Differs::COLLECTIVE))
///         }
///         other => panic!("{other:?}"),
///     }
/// }
/// ```
pub fn run_calls(calls: &[Vec<Request>], opts: &CallsOptions) -> Vec<RankCalls> {
    let world = calls.len();
    match job(calls) {
        Ok(job) => std::thread::scope(|s| {
            let handles: Vec<_> = calls
                .iter()
                .enumerate()
                .map(|(r, mine)| {
                    let job = &job;
                    s.spawn(move || rank_calls(job, r as u16, mine, opts))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or(Err(CallsError::Host(HostError::ThreadPanicked)))
                })
                .collect()
        }),
        Err(e) => vec![Err(e); world],
    }
}

/// The job's memory: buffers for the largest call of any rank, a pad for the most slots.
fn job(calls: &[Vec<Request>]) -> Result<Job, CallsError> {
    let world = u16::try_from(calls.len()).map_err(|_| {
        CallsError::Host(HostError::Sched(SchedError::BadWorld { world: u16::MAX }))
    })?;
    let mut sizes = [0u64; 3];
    let mut channels = 1u16;
    for req in calls.iter().flatten() {
        req.validate()
            .map_err(|e| CallsError::Host(HostError::Sched(e)))?;
        if req.world != world {
            return Err(CallsError::Host(HostError::BadWorld {
                expected: req.world,
                found: calls.len(),
            }));
        }
        // The low-latency algorithms are the ones with a size limit (their lines).
        if !req.algorithm.takes_on(u64::MAX, u16::MAX) {
            return Err(CallsError::Host(HostError::Sched(
                SchedError::Unsupported {
                    collective: req.collective,
                    algorithm: req.algorithm,
                },
            )));
        }
        let sz = req.buffer_sizes();
        for (m, n) in sizes.iter_mut().zip([sz.input, sz.output, sz.scratch]) {
            *m = (*m).max(n);
        }
        channels = channels.max(req.channels);
    }
    let layout = SlotLayout::new(1, channels, world)
        .map_err(|_| CallsError::Host(HostError::Sched(SchedError::BadWorld { world })))?;
    Ok(Job {
        mem: WorldMem::blank(world, sizes, layout.slots(), POISON).map_err(CallsError::Host)?,
        sigs: (0..world)
            .map(|_| [AtomicU64::new(u64::MAX), AtomicU64::new(u64::MAX)])
            .collect(),
        abort: AtomicBool::new(false),
        first: Mutex::new(None),
        layout,
    })
}

/// One rank's calls.
fn rank_calls(job: &Job, rank: u16, calls: &[Request], opts: &CallsOptions) -> RankCalls {
    // This rank's expected counters, for the whole pad, across calls.
    let mut expected = vec![0u64; job.layout.slots() as usize];
    let mut outputs = Vec::with_capacity(calls.len());
    for (k, req) in calls.iter().enumerate() {
        let call = k as u64;
        let inputs = crate::random_inputs(req, opts.seed.wrapping_add(call));
        let mine = inputs.get(rank as usize).map_or(&[][..], Vec::as_slice);
        job.mem
            .write_at(Loc::new(rank, Buf::Input, 0), mine)
            .map_err(|_| CallsError::Host(HostError::ThreadPanicked))?;
        let sig = req.signature(call);
        job.sigs[rank as usize][(call % 2) as usize].store(sig.0, Ordering::Release);
        match run_call(job, rank, req, call, sig, &mut expected, opts) {
            Ok(()) => {}
            Err(e) => return Err(job.fail(e)),
        }
        if job.abort.load(Ordering::Acquire) {
            return Err(job.cause());
        }
        let n = req.buffer_sizes().output as usize;
        let mut out = job.mem.buffer(rank as usize, Buf::Output);
        out.truncate(n);
        outputs.push(out);
    }
    Ok(outputs)
}

/// One call of one rank: its channels' streams in turn on this thread.
fn run_call(
    job: &Job,
    rank: u16,
    req: &Request,
    call: u64,
    sig: Signature,
    expected: &mut [u64],
    opts: &CallsOptions,
) -> Result<(), CallsError> {
    let layout = job.layout;
    let per_channel = (layout.slots() / layout.channels.max(1) as u32).max(1) as usize;
    let mut checked = vec![false; req.world as usize];
    checked[rank as usize] = true;
    // The call's schedule, its slots moved to the job's layout.
    let own = req.layout();
    // A slot outside the job's layout (none, for a request that validated) is an op outside
    // the pad, reported as the executor reports one.
    let moved = |s: u32| own.key(s).and_then(|k| layout.index(k).ok()).ok_or(s);
    let sched = |c: u16| -> Result<Vec<Op>, CallsError> {
        let ops =
            Schedule::new(*req, rank, c).map_err(|e| CallsError::Host(HostError::Sched(e)))?;
        ops.enumerate()
            .map(|(i, op)| op.map_slots(Ok, moved).map_err(|slot| (i, slot)))
            .collect::<Result<Vec<Op>, (usize, u32)>>()
            .map_err(|(i, slot)| {
                let e = symm_core::exec::ExecError::SlotOutOfRange {
                    slot,
                    index: i as u32,
                };
                CallsError::Host(exec_error(rank, c, e))
            })
    };
    let mut streams = Vec::new();
    let mut rest = expected;
    for c in 0..req.channels {
        let (mine, tail) = rest.split_at_mut(per_channel.min(rest.len()));
        rest = tail;
        let ops = sched(c)?.into_iter();
        streams.push((c, Executor::at(ops, mine, c as u32 * per_channel as u32)));
    }
    let mut temps = Temps::default();
    let mut done = vec![false; streams.len()];
    let mut since: Option<Instant> = None;
    while done.iter().any(|d| !d) {
        let mut progressed = false;
        for (i, (c, ex)) in streams.iter_mut().enumerate() {
            if done[i] {
                continue;
            }
            let mut view = RankFabric::new(&job.mem, rank, &mut temps);
            loop {
                let before = ex.peek();
                match ex
                    .step(&mut view)
                    .map_err(|e| CallsError::Host(exec_error(rank, *c, e)))?
                {
                    Step::Ran { .. } => {
                        progressed = true;
                        if let Some((_, Op::Wait { slot, .. })) = before {
                            let peer = layout.key(slot).map(|k| k.peer);
                            if let Some(q) = peer.filter(|&q| !checked[q as usize]) {
                                checked[q as usize] = true;
                                let word = job.sigs[q as usize][(call % 2) as usize]
                                    .load(Ordering::Acquire);
                                if let Some(differs) = sig.check(Signature(word)) {
                                    return Err(CallsError::RanksDiffer {
                                        rank,
                                        peer: q,
                                        call,
                                        mine: sig,
                                        theirs: Signature(word),
                                        differs,
                                    });
                                }
                            }
                        }
                    }
                    Step::Blocked {
                        index,
                        slot,
                        target,
                        found,
                    } => {
                        if job.abort.load(Ordering::Acquire) {
                            return Ok(());
                        }
                        let t = *since.get_or_insert_with(Instant::now);
                        if t.elapsed() > opts.deadline {
                            return Err(CallsError::Host(HostError::Timeout {
                                rank,
                                channel: *c,
                                index,
                                peer: layout.key(slot).map_or(u16::MAX, |k| k.peer),
                                slot,
                                expected: target,
                                found,
                            }));
                        }
                        break;
                    }
                    Step::Done => {
                        done[i] = true;
                        break;
                    }
                }
            }
        }
        if progressed {
            since = None;
        } else {
            std::thread::yield_now();
        }
    }
    Ok(())
}

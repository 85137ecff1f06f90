//! A job of back-to-back calls on the host, each rank making its own calls, and the signature
//! check that names a call that differs across ranks at once.
//!
//! [`run_calls`] has every rank make its list of calls one after another
//! over one memory (buffers sized for the largest call, one signal pad whose counters only
//! grow, as a job's heap), with no barrier between calls: what a framework's process does. Each
//! call, a rank
//!
//! 1. writes its input (the caller's data is in place before the call);
//! 2. publishes its call's [`Signature`] in its signature word `seq mod 2`, with release, before
//!    its first signal of the call;
//! 3. runs its streams (one op of each of its channels in turn, a blocked one tried again on
//!    the next turn); after
//!    each wait that a peer's signal satisfied, the first one of the call from that peer, it
//!    reads the peer's word with acquire and [`Signature::check`]s it against its own;
//! 4. reads its output.
//!
//! A check that names a difference raises the job's abort flag with [`CallsError::RanksDiffer`]
//! (which rank found it, the peer, the call, both words and what differs), and every other rank,
//! blocked in a wait or not, stops with the same error: every rank learns the cause, no rank
//! waits for its deadline. With threads ([`CallsMode::Threads`]) a wait that outlives the
//! deadline is [`CallsError::Host`]'s timeout, as in [`crate::run_threads`]; the one-thread
//! simulation ([`CallsMode::Simulate`]) runs the same steps deterministically and reports a job
//! where nothing can move as a deadlock. Agreeing calls never fire, however far apart the ranks run: the
//! word read for call `k` is either the peer's call `k`, equal, or a later call of the peer,
//! which the sequence number tells apart (`driver/tests/loom.rs` models it).
//!
//! Low-latency algorithms are refused ([`CallsError::Host`] with
//! [`HostError::Sched`]'s unsupported request): their flags need a call epoch this job does not
//! keep.

use super::mem::{Oob, RankFabric, Temps, WorldMem};
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

/// How [`run_calls`] drives the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallsMode {
    /// One OS thread per rank, real atomics; a wait blocked longer than the deadline fails the
    /// job ([`HostError::Timeout`]).
    Threads(Duration),
    /// One thread, every rank in turn, one op of each of its streams per turn: deterministic,
    /// and a job where nothing can move is a [`HostError::Deadlock`], not a wait.
    Simulate,
}

/// Options of [`run_calls`].
#[derive(Clone, Copy, Debug)]
pub struct CallsOptions {
    /// Threads or the one-thread simulation.
    pub mode: CallsMode,
    /// Seed of every call's inputs ([`crate::random_inputs`] of the call's request, with the
    /// seed plus the call's number).
    pub seed: u64,
}

impl Default for CallsOptions {
    fn default() -> Self {
        CallsOptions {
            mode: CallsMode::Threads(Duration::from_secs(10)),
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
    let job = match job(calls) {
        Ok(job) => job,
        Err(e) => return vec![Err(e); world],
    };
    let runs = calls
        .iter()
        .enumerate()
        .map(|(r, mine)| RankRun::new(&job, r as u16, mine, opts.seed));
    match opts.mode {
        CallsMode::Threads(deadline) => {
            // Each rank's thread ends at its own deadline; no abort word to share.
            let abort = crate::sync::AtomicBool::new(false);
            match crate::threads::on_threads(runs.collect(), &abort, |run| {
                Ok(threaded(run, deadline))
            }) {
                Ok(results) => results
                    .into_iter()
                    .map(|r| r.unwrap_or_else(|e| Err(CallsError::Host(e))))
                    .collect(),
                Err(e) => vec![Err(CallsError::Host(e)); world],
            }
        }
        CallsMode::Simulate => simulated(runs.collect()),
    }
}

/// One rank's calls on its own thread.
fn threaded(mut run: RankRun<'_>, deadline: Duration) -> RankCalls {
    let mut since: Option<Instant> = None;
    loop {
        match run.step() {
            Err(e) => return Err(run.job.fail(e)),
            Ok(Progress::Finished) => return Ok(run.outputs),
            Ok(Progress::Ran) => since = None,
            Ok(Progress::Blocked(b)) => {
                if run.job.abort.load(Ordering::Acquire) {
                    return Err(run.job.cause());
                }
                if since.get_or_insert_with(Instant::now).elapsed() > deadline {
                    let peer = run.job.layout.key(b.slot).map_or(u16::MAX, |k| k.peer);
                    let e = HostError::Timeout {
                        rank: run.rank,
                        channel: b.channel,
                        index: b.index,
                        peer,
                        slot: b.slot,
                        expected: b.target,
                        found: b.found,
                    };
                    return Err(run.job.fail(CallsError::Host(e)));
                }
                std::thread::yield_now();
            }
        }
    }
}

/// Every rank's calls on this thread, in turn.
fn simulated(mut runs: Vec<RankRun<'_>>) -> Vec<RankCalls> {
    let mut results: Vec<Option<RankCalls>> = runs.iter().map(|_| None).collect();
    loop {
        let mut moved = false;
        let mut stuck = None;
        for (r, run) in runs.iter_mut().enumerate() {
            if results[r].is_some() {
                continue;
            }
            match run.step() {
                Err(e) => {
                    let cause = run.job.fail(e);
                    results[r] = Some(Err(cause));
                    moved = true;
                }
                Ok(Progress::Finished) => {
                    results[r] = Some(Ok(std::mem::take(&mut run.outputs)));
                    moved = true;
                }
                Ok(Progress::Ran) => moved = true,
                Ok(Progress::Blocked(b)) => {
                    stuck.get_or_insert((run.rank, b));
                }
            }
        }
        if let Some(job) = runs.first().map(|r| r.job) {
            if job.abort.load(Ordering::Acquire) {
                let cause = job.cause();
                return results
                    .into_iter()
                    .map(|r| r.unwrap_or_else(|| Err(cause.clone())))
                    .collect();
            }
            if !moved {
                if let Some((rank, b)) = stuck {
                    let e = HostError::Deadlock {
                        rank,
                        channel: b.channel,
                        index: b.index,
                        slot: b.slot,
                        target: b.target,
                        found: b.found,
                    };
                    let cause = job.fail(CallsError::Host(e));
                    return results
                        .into_iter()
                        .map(|r| r.unwrap_or_else(|| Err(cause.clone())))
                        .collect();
                }
            }
        }
        if results.iter().all(Option::is_some) {
            return results.into_iter().flatten().collect();
        }
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

/// A blocked stream: where and on what.
#[derive(Clone, Copy, Debug)]
struct Blocked {
    channel: u16,
    index: u32,
    slot: u32,
    target: u64,
    found: u64,
}

/// What one step of a rank did.
enum Progress {
    /// An op ran, or the rank entered or finished a call.
    Ran,
    /// Every unfinished stream of its call is blocked (the first one).
    Blocked(Blocked),
    /// Every call is done.
    Finished,
}

/// A (rank, channel) stream of the current call: its ops (slots in the job's layout) and how
/// far it ran.
struct Lane {
    channel: u16,
    ops: Vec<Op>,
    pos: usize,
}

/// One rank's progress through its calls.
struct RankRun<'j> {
    job: &'j Job,
    rank: u16,
    calls: &'j [Request],
    seed: u64,
    /// The rank's expected counters for the whole pad, across calls.
    counters: Vec<u64>,
    /// The current call (`calls.len()`: finished).
    k: usize,
    /// The current call's unfinished streams (empty: the call is not entered yet).
    lanes: Vec<Lane>,
    /// Peers whose word this call has checked.
    checked: Vec<bool>,
    sig: Signature,
    outputs: Vec<Vec<u8>>,
    temps: Temps,
}

impl<'j> RankRun<'j> {
    fn new(job: &'j Job, rank: u16, calls: &'j [Request], seed: u64) -> RankRun<'j> {
        RankRun {
            job,
            rank,
            calls,
            seed,
            counters: vec![0; job.layout.slots() as usize],
            k: 0,
            lanes: Vec::new(),
            checked: Vec::new(),
            sig: Signature(0),
            outputs: Vec::with_capacity(calls.len()),
            temps: Temps::default(),
        }
    }

    fn per_channel(&self) -> usize {
        let l = self.job.layout;
        (l.slots() / l.channels.max(1) as u32).max(1) as usize
    }

    /// Enters call `k`: writes its input, publishes its signature, builds its streams.
    fn enter(&mut self) -> Result<(), CallsError> {
        let (job, rank, req) = (self.job, self.rank, self.calls[self.k]);
        let call = self.k as u64;
        let inputs = crate::random_inputs(&req, self.seed.wrapping_add(call));
        let mine = inputs.get(rank as usize).map_or(&[][..], Vec::as_slice);
        job.mem
            .write_at(Loc::new(rank, Buf::Input, 0), mine)
            .map_err(|Oob(loc)| {
                CallsError::Host(HostError::OutOfBounds {
                    rank,
                    channel: 0,
                    index: 0,
                    loc,
                })
            })?;
        self.sig = req.signature(call);
        job.sigs[rank as usize][(call % 2) as usize].store(self.sig.0, Ordering::Release);
        self.checked = vec![false; req.world as usize];
        self.checked[rank as usize] = true;
        // The call's schedule, its slots moved to the job's layout. A slot outside the job's
        // layout (none, for a request that validated) is an op outside the pad, reported as
        // the executor reports one.
        let (own, layout) = (req.layout(), job.layout);
        let moved = |s: u32| own.key(s).and_then(|k| layout.index(k).ok()).ok_or(s);
        for c in 0..req.channels {
            let ops =
                Schedule::new(req, rank, c).map_err(|e| CallsError::Host(HostError::Sched(e)))?;
            let ops = ops
                .enumerate()
                .map(|(i, op)| op.map_slots(Ok, moved).map_err(|slot| (i, slot)))
                .collect::<Result<Vec<Op>, (usize, u32)>>()
                .map_err(|(i, slot)| {
                    let e = symm_core::exec::ExecError::SlotOutOfRange {
                        slot,
                        index: i as u32,
                    };
                    CallsError::Host(exec_error(rank, c, e))
                })?;
            self.lanes.push(Lane {
                channel: c,
                ops,
                pos: 0,
            });
        }
        Ok(())
    }

    /// One op of each unfinished stream of the current call (entering or leaving calls as
    /// they start and end).
    fn step(&mut self) -> Result<Progress, CallsError> {
        if self.k == self.calls.len() {
            return Ok(Progress::Finished);
        }
        if self.lanes.is_empty() {
            self.enter()?;
            return Ok(Progress::Ran);
        }
        let per = self.per_channel();
        let (job, rank) = (self.job, self.rank);
        let mut ran = false;
        let mut blocked = None;
        let mut i = 0;
        while i < self.lanes.len() {
            let lane = &mut self.lanes[i];
            let base = lane.channel as usize * per;
            let counters = &mut self.counters[base..base + per];
            let mut ex = Executor::at(lane.ops[lane.pos..].iter().copied(), counters, base as u32);
            let mut view = RankFabric::new(&job.mem, rank, &mut self.temps);
            let step = ex
                .step(&mut view)
                .map_err(|e| CallsError::Host(exec_error(rank, lane.channel, e)))?;
            match step {
                Step::Ran { op, .. } => {
                    lane.pos += 1;
                    ran = true;
                    if let Op::Wait { slot, .. } = op {
                        self.check(slot)?;
                    }
                    i += 1;
                }
                Step::Blocked {
                    index,
                    slot,
                    target,
                    found,
                } => {
                    blocked.get_or_insert(Blocked {
                        channel: lane.channel,
                        index: index + lane.pos as u32,
                        slot,
                        target,
                        found,
                    });
                    i += 1;
                }
                Step::Done => {
                    self.lanes.remove(i);
                    ran = true;
                }
            }
        }
        if self.lanes.is_empty() {
            // The call is done: its output is final (every write into it came before a signal
            // this rank waited for).
            let n = self.calls[self.k].buffer_sizes().output as usize;
            let mut out = job.mem.buffer(rank as usize, Buf::Output);
            out.truncate(n);
            self.outputs.push(out);
            self.k += 1;
            return Ok(Progress::Ran);
        }
        Ok(match (ran, blocked) {
            (false, Some(b)) => Progress::Blocked(b),
            _ => Progress::Ran,
        })
    }

    /// After a wait on `slot` ran: the first of the call satisfied by that peer checks the
    /// peer's signature word of this call.
    fn check(&mut self, slot: u32) -> Result<(), CallsError> {
        let Some(q) = self.job.layout.key(slot).map(|k| k.peer) else {
            return Ok(());
        };
        if self.checked.get(q as usize) != Some(&false) {
            return Ok(());
        }
        self.checked[q as usize] = true;
        let call = self.k as u64;
        let word = self.job.sigs[q as usize][(call % 2) as usize].load(Ordering::Acquire);
        match self.sig.check(Signature(word)) {
            None => Ok(()),
            Some(differs) => Err(CallsError::RanksDiffer {
                rank: self.rank,
                peer: q,
                call,
                mine: self.sig,
                theirs: Signature(word),
                differs,
            }),
        }
    }
}

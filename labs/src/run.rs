//! Running a hand-written schedule through every check the library has.
//!
//! A [`Case`] is a request (collective, world, size, pipelining) the schedule must handle. For
//! each case, [`check_case`]:
//!
//! 1. builds every rank's ops by calling the schedule ([`build`]; a panic in it becomes
//!    [`Problem::Panicked`] with its message, not a crash);
//! 2. checks each op on its own ([`lint`]): ranks inside the world, offsets inside the buffers,
//!    slots inside the pad and written only by the rank they name;
//! 3. runs the ops *symbolically* ([`symbolic`]) under several random interleavings: every
//!    element is the set of ranks whose contributions it holds, so a deadlock, a read of data not
//!    yet written, a reduction of mismatched elements, a wrong output or an unbalanced signal is
//!    named exactly;
//! 4. runs them on the host simulator (virtual time; the trace the viz replays) and on real
//!    threads with real atomics (a deadline turns a hang into an error), and compares each
//!    result with the reference (`symm_driver::host::reference`).

use crate::kit::Kit;
use crate::problem::{Blocked, Problem};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::Duration;
use symm_core::cost::Link;
use symm_core::exec::{ExecError, Executor, Fabric, Step};
use symm_core::op::{Buf, Loc, Op};
use symm_core::sched::Request;
use symm_core::symbolic::{Rng, SymError, SymWorld};
use symm_core::trace::{self, Event, EventKind, Header, Source};
use symm_driver::host::{self, HostError, SimOptions, ThreadOptions};

/// A schedule: one rank's ops from its [`Kit`].
pub type Plan<'a> = &'a dyn Fn(&Kit) -> Vec<Op>;

/// The reference outputs of a case, from its inputs.
pub type Reference = Box<dyn Fn(&Request, &[Vec<u8>]) -> Vec<Vec<u8>>>;

/// One request a schedule must handle.
pub struct Case {
    /// How the case is shown ("world 3, 10 elements").
    pub label: String,
    /// The request.
    pub req: Request,
    /// Scratch slots the schedule is told to use (default: the request's).
    pub slots: Option<u64>,
    /// Whether the symbolic check compares outputs with the collective's definition.
    pub verify: bool,
    /// The reference (default: `host::reference`).
    pub reference: Option<Reference>,
    /// Interleavings of the symbolic check.
    pub seeds: u64,
}

impl Case {
    /// A case with every check on.
    pub fn new(label: impl Into<String>, req: Request) -> Case {
        Case {
            label: label.into(),
            req,
            slots: None,
            verify: true,
            reference: None,
            seeds: 8,
        }
    }

    /// The schedule is told to use `slots` scratch slots.
    pub fn slots(mut self, slots: u64) -> Case {
        self.slots = Some(slots);
        self
    }

    /// Outputs are compared with `reference` only (the symbolic check still looks for
    /// deadlocks, unwritten reads and unbalanced signals).
    pub fn reference(mut self, reference: Reference) -> Case {
        self.reference = Some(reference);
        self.verify = false;
        self
    }

    fn kit(&self, rank: u16, channel: u16) -> Kit {
        let k = Kit::new(self.req, rank, channel);
        match self.slots {
            Some(s) => k.with_slots(s),
            None => k,
        }
    }
}

static PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Builds every (rank, channel)'s ops, stream `rank * channels + channel`.
pub fn build(case: &Case, plan: Plan) -> Result<Vec<Vec<Op>>, Problem> {
    let previous = panic::take_hook();
    panic::set_hook(Box::new(|info| {
        if let Ok(mut m) = PANIC.lock() {
            *m = Some(info.to_string().replace('\n', " "));
        }
    }));
    let mut out = Vec::new();
    let mut failed = None;
    'all: for r in 0..case.req.world {
        for c in 0..case.req.channels {
            let k = case.kit(r, c);
            match panic::catch_unwind(AssertUnwindSafe(|| plan(&k))) {
                Ok(ops) => out.push(ops),
                Err(_) => {
                    failed = Some(r);
                    break 'all;
                }
            }
        }
    }
    panic::set_hook(previous);
    match failed {
        None => Ok(out),
        Some(rank) => Err(Problem::Panicked {
            rank,
            message: PANIC
                .lock()
                .ok()
                .and_then(|mut m| m.take())
                .unwrap_or_else(|| "(no message)".into()),
        }),
    }
}

/// The locations an op touches and how many bytes at each (multicast: on every rank).
fn touched(req: &Request, op: &Op) -> Vec<(Loc, u64)> {
    let es = req.dtype.size();
    match *op {
        Op::Copy { src, dst, bytes } => vec![(src, bytes), (dst, bytes)],
        Op::Reduce {
            a, b, dst, elems, ..
        } => {
            let n = elems.saturating_mul(es);
            vec![(a, n), (b, n), (dst, n)]
        }
        Op::McReduce {
            src, dst, elems, ..
        } => {
            let n = elems.saturating_mul(es);
            let mut v: Vec<_> = (0..req.world)
                .map(|r| (Loc::new(r, src.buf, src.offset), n))
                .collect();
            v.push((dst, n));
            v
        }
        Op::McStore { src, dst, bytes } => {
            let mut v: Vec<_> = (0..req.world)
                .map(|r| (Loc::new(r, dst.buf, dst.offset), bytes))
                .collect();
            v.push((src, bytes));
            v
        }
        Op::Signal { .. } | Op::Wait { .. } => Vec::new(),
    }
}

/// Checks every op on its own: ranks, buffer bounds, slots, element types.
pub fn lint(req: &Request, streams: &[Vec<Op>]) -> Result<(), Problem> {
    let sz = req.buffer_sizes();
    let es = req.dtype.size();
    let layout = req.layout();
    let channels = req.channels.max(1) as usize;
    let per_channel = layout.slots() / channels as u32;
    for (s, ops) in streams.iter().enumerate() {
        let rank = (s / channels) as u16;
        let channel = (s % channels) as u32;
        for (index, op) in ops.iter().enumerate() {
            for (loc, bytes) in touched(req, op) {
                if loc.rank >= req.world {
                    return Err(Problem::RankOutside {
                        rank,
                        index,
                        op: *op,
                        named: loc.rank,
                    });
                }
                let size = match loc.buf {
                    Buf::Input => sz.input,
                    Buf::Output => sz.output,
                    Buf::Scratch => sz.scratch,
                };
                let inside = loc.offset.checked_add(bytes).is_some_and(|e| e <= size);
                if !inside || loc.offset % es != 0 || bytes % es != 0 {
                    return Err(Problem::OutsideBuffer {
                        rank,
                        index,
                        op: *op,
                        loc,
                        bytes,
                        size,
                    });
                }
            }
            match *op {
                Op::Signal { peer, slot, .. } => {
                    if peer >= req.world {
                        return Err(Problem::RankOutside {
                            rank,
                            index,
                            op: *op,
                            named: peer,
                        });
                    }
                    match layout.key(slot) {
                        None => return Err(Problem::NoSuchSlot { rank, index, slot }),
                        Some(k) if k.peer != rank => {
                            return Err(Problem::ForeignSlot {
                                rank,
                                index,
                                peer,
                                slot,
                            })
                        }
                        Some(_) => {}
                    }
                }
                Op::Wait { slot, .. }
                    if slot >= layout.slots() || slot / per_channel.max(1) != channel =>
                {
                    return Err(Problem::NoSuchSlot { rank, index, slot });
                }
                Op::Reduce { dtype, op: o, .. } | Op::McReduce { dtype, op: o, .. }
                    if dtype != req.dtype || o != req.op =>
                {
                    return Err(Problem::WrongType { rank, index });
                }
                _ => {}
            }
        }
    }
    Ok(())
}

/// One rank's view of the symbolic world, remembering the contents the last op wrote.
struct View<'w> {
    world: &'w mut SymWorld,
    rank: u16,
    last: Option<u64>,
}

impl Fabric for View<'_> {
    type Error = SymError;
    fn execute(&mut self, op: &Op) -> Result<(), SymError> {
        self.last = self.world.apply(self.rank, op)?;
        Ok(())
    }
    fn load_slot(&mut self, slot: u32) -> Result<u64, SymError> {
        self.world.slot(self.rank, slot)
    }
}

/// How one stream stands in the symbolic run.
struct Lane<'e> {
    rank: u16,
    channel: u16,
    ex: Executor<'e, std::iter::Copied<std::slice::Iter<'e, Op>>>,
    done: bool,
    blocked: Option<(u64, Blocked)>,
}

/// What a symbolic run ended with: the verdict, the ops it ran, and its events (time in
/// steps of 100 ns, a stall for every wait still blocked at a deadlock).
pub struct SymRun {
    /// The verdict.
    pub result: Result<u64, Problem>,
    /// Begin/end events, stalls at a deadlock.
    pub events: Vec<Event>,
}

fn signals_sent(streams: &[Vec<Op>], channels: usize, from: u16, to: u16, slot: u32) -> u64 {
    streams
        .iter()
        .enumerate()
        .filter(|(s, _)| (s / channels) as u16 == from)
        .flat_map(|(_, ops)| ops.iter())
        .map(|op| match *op {
            Op::Signal {
                peer,
                slot: s,
                value,
                ..
            } if peer == to && s == slot => value,
            _ => 0,
        })
        .sum()
}

/// Runs the streams on contribution sets under the interleaving chosen by `seed`.
pub fn symbolic(req: &Request, streams: &[Vec<Op>], seed: u64, verify: bool) -> SymRun {
    let mut events = Vec::new();
    let result = sym_inner(req, streams, seed, verify, &mut events);
    SymRun { result, events }
}

fn sym_inner(
    req: &Request,
    streams: &[Vec<Op>],
    seed: u64,
    verify: bool,
    events: &mut Vec<Event>,
) -> Result<u64, Problem> {
    let mut world = SymWorld::new(req).map_err(|e| Problem::Lab(format!("{e:?}")))?;
    let channels = req.channels.max(1) as usize;
    let slots = req.layout().slots() as usize;
    let per_channel = (slots / channels).max(1);
    let mut expected = vec![vec![0u64; slots]; req.world as usize];
    let mut lanes: Vec<Lane> = streams
        .iter()
        .zip(expected.iter_mut().flat_map(|v| v.chunks_mut(per_channel)))
        .enumerate()
        .map(|(s, (ops, e))| {
            let channel = (s % channels) as u16;
            Lane {
                rank: (s / channels) as u16,
                channel,
                ex: Executor::at(ops.iter().copied(), e, channel as u32 * per_channel as u32),
                done: false,
                blocked: None,
            }
        })
        .collect();
    let mut rng = Rng::new(seed);
    let mut t = 0u64;
    let mut ran = 0u64;
    let mut live = lanes.len();
    let mut confirm = false;
    while live > 0 {
        let mut progressed = false;
        let n = lanes.len();
        let start = rng.below(n as u64) as usize;
        for i in 0..n {
            let lane = &mut lanes[(start + i) % n];
            if lane.done || (!confirm && rng.below(3) == 0) {
                continue;
            }
            // Even seeds run bursts of 1 to 8 ops; odd seeds run each stream as far as it can
            // go, which overruns any missing flow control.
            let burst = if seed % 2 == 1 {
                u64::MAX
            } else {
                1 + rng.below(8)
            };
            for _ in 0..burst {
                let mut view = View {
                    world: &mut world,
                    rank: lane.rank,
                    last: None,
                };
                let step = lane.ex.step(&mut view);
                let last = view.last;
                match step {
                    Ok(Step::Ran { index, op }) => {
                        ran += 1;
                        progressed = true;
                        let begin = lane.blocked.take().map_or(t, |(b, _)| b);
                        t += 1;
                        let ev = |time, kind, contents| Event {
                            time: time * 100,
                            rank: lane.rank,
                            channel: lane.channel,
                            index,
                            kind,
                            op,
                            contents,
                        };
                        events.push(ev(begin, EventKind::Begin, None));
                        events.push(ev(t, EventKind::End, last));
                    }
                    Ok(Step::Blocked {
                        index,
                        slot,
                        target,
                        found,
                    }) => {
                        let b = Blocked {
                            rank: lane.rank,
                            index: index as usize,
                            slot,
                            target,
                            found,
                            sent_in_all: 0,
                        };
                        let since = lane.blocked.as_ref().map_or(t, |(s, _)| *s);
                        lane.blocked = Some((since, b));
                        break;
                    }
                    Ok(Step::Done) => {
                        lane.done = true;
                        live -= 1;
                        progressed = true;
                        break;
                    }
                    Err(e) => return Err(sym_problem(req, lane, e)),
                }
            }
        }
        if progressed {
            confirm = false;
        } else if !confirm {
            confirm = true;
        } else {
            return Err(deadlock(req, streams, &lanes, t, events));
        }
    }
    drop(lanes);
    if verify {
        if let Err(SymError::Wrong {
            rank,
            elem,
            found,
            want,
        }) = world.verify()
        {
            return Err(Problem::Wrong {
                rank,
                elem,
                found,
                want,
            });
        }
    }
    for (rank, e) in expected.iter().enumerate() {
        for (slot, &exp) in e.iter().enumerate() {
            let pad = world.slot(rank as u16, slot as u32).unwrap_or(exp);
            if pad != exp {
                return Err(Problem::Unbalanced {
                    rank: rank as u16,
                    slot: slot as u32,
                    pad,
                    expected: exp,
                });
            }
        }
    }
    Ok(ran)
}

fn sym_problem(req: &Request, lane: &mut Lane, e: ExecError<SymError>) -> Problem {
    let (index, op) = lane
        .ex
        .peek()
        .unwrap_or((0, Op::Wait { slot: 0, count: 0 }));
    let (rank, index) = (lane.rank, index as usize);
    match e {
        ExecError::Fabric {
            error: SymError::ReadUnwritten { loc, .. },
            ..
        } => Problem::ReadUnwritten {
            rank,
            index,
            op,
            loc,
        },
        ExecError::Fabric {
            error: SymError::Mixed { .. },
            ..
        } => Problem::Mixed { rank, index, op },
        ExecError::SlotOutOfRange { slot, .. }
        | ExecError::Fabric {
            error: SymError::BadSlot { slot, .. },
            ..
        } => Problem::NoSuchSlot { rank, index, slot },
        ExecError::Fabric { error, .. } => Problem::Lab(format!(
            "rank {rank}'s op {index} ({}) failed: {error:?}",
            crate::problem::op_words(req, &op)
        )),
        _ => Problem::Lab(format!("rank {rank}'s op {index} failed")),
    }
}

/// The deadlock in words: who waits for whom, starting from the first blocked stream.
fn deadlock(
    req: &Request,
    streams: &[Vec<Op>],
    lanes: &[Lane],
    t: u64,
    events: &mut Vec<Event>,
) -> Problem {
    let channels = req.channels.max(1) as usize;
    let layout = req.layout();
    let blocked: Vec<(u16, u16, u64, Blocked)> = lanes
        .iter()
        .filter(|l| !l.done)
        .filter_map(|l| {
            let (since, b) = l.blocked.clone()?;
            Some((l.rank, l.channel, since, b))
        })
        .collect();
    for (rank, channel, since, b) in &blocked {
        let op = streams[*rank as usize * channels + *channel as usize][b.index];
        let ev = |time, kind| Event {
            time: time * 100,
            rank: *rank,
            channel: *channel,
            index: b.index as u32,
            kind,
            op,
            contents: None,
        };
        events.push(ev(*since, EventKind::Begin));
        events.push(ev(
            t + 10,
            EventKind::Stall {
                target: b.target,
                found: b.found,
            },
        ));
    }
    let mut chain: Vec<Blocked> = Vec::new();
    let mut at = blocked.first().map(|(r, c, _, _)| (*r, *c));
    while let Some((rank, channel)) = at {
        if chain.iter().any(|b| b.rank == rank) {
            break;
        }
        let Some((_, _, _, b)) = blocked
            .iter()
            .find(|(r, c, _, _)| *r == rank && *c == channel)
        else {
            break;
        };
        let mut b = b.clone();
        let from = layout.key(b.slot).map(|k| k.peer);
        if let Some(p) = from {
            b.sent_in_all = signals_sent(streams, channels, p, rank, b.slot);
        }
        chain.push(b);
        at = from.map(|p| (p, channel));
    }
    Problem::Deadlock { chain }
}

/// The header of a trace of `req` written by the labs.
fn header(req: &Request, simulated: bool) -> Header {
    Header {
        world: req.world,
        channels: req.channels,
        request: *req,
        source: Source::Host { simulated },
        time_unit_ns: 1,
        team: None,
    }
}

/// Runs the streams on the simulator (contents recorded for the viz when `record`).
pub fn simulate(
    req: &Request,
    streams: &[Vec<Op>],
    inputs: &[Vec<u8>],
    record: bool,
) -> Result<host::Run, HostError> {
    let opts = SimOptions {
        contents: record,
        trace: record,
        ..SimOptions::default()
    };
    let channels = req.channels.max(1) as usize;
    host::simulate_streams(req, inputs, &opts, |r, c| {
        Ok(streams[r as usize * channels + c as usize]
            .clone()
            .into_iter())
    })
}

/// The simulator's time for the streams, timing only (no data moves), on `link`.
pub fn time_us(req: &Request, streams: &[Vec<Op>], link: Link) -> Result<f64, HostError> {
    let opts = SimOptions {
        link,
        contents: false,
        trace: false,
        data: false,
    };
    let channels = req.channels.max(1) as usize;
    host::simulate_streams(req, &[], &opts, |r, c| {
        Ok(streams[r as usize * channels + c as usize]
            .clone()
            .into_iter())
    })
    .map(|run| run.time_us)
}

/// What a passing case produced.
pub struct Passed {
    /// The simulator's trace (contents recorded).
    pub trace: Vec<u8>,
    /// The simulator's virtual time.
    pub time_us: f64,
    /// Every rank's ops.
    pub streams: Vec<Vec<Op>>,
}

/// Every check of one case, stopping at the first problem.
pub fn check_case(case: &Case, plan: Plan) -> Result<Passed, Problem> {
    let req = &case.req;
    let streams = build(case, plan)?;
    lint(req, &streams)?;
    for seed in 0..case.seeds {
        symbolic(req, &streams, seed, case.verify).result?;
    }
    let inputs = host::random_inputs(req, 11);
    let want = match &case.reference {
        Some(f) => f(req, &inputs),
        None => host::reference(req, &inputs),
    };
    let run = simulate(req, &streams, &inputs, true).map_err(|error| Problem::Host {
        backend: "simulator",
        error,
    })?;
    host::compare(req, &run.outputs, &want).map_err(|mismatch| Problem::Numbers {
        backend: "simulator",
        mismatch,
    })?;
    let opts = ThreadOptions {
        deadline: Duration::from_secs(3),
        trace: false,
    };
    let channels = req.channels.max(1) as usize;
    let threads = host::run_streams(req, &inputs, &opts, |r, c| {
        Ok(streams[r as usize * channels + c as usize]
            .clone()
            .into_iter())
    })
    .map_err(|error| Problem::Host {
        backend: "threads",
        error,
    })?;
    host::compare(req, &threads.outputs, &want).map_err(|mismatch| Problem::Numbers {
        backend: "threads",
        mismatch,
    })?;
    Ok(Passed {
        trace: run.trace,
        time_us: run.time_us,
        streams,
    })
}

/// A trace of the schedule on `case` for the viz, even when it fails: the simulator's when it
/// runs through, else the symbolic run's (which ends in stalls at a deadlock). `None` when the
/// ops cannot even be built or name things outside the world.
pub fn trace_of(case: &Case, plan: Plan) -> Option<Vec<u8>> {
    let req = &case.req;
    let streams = build(case, plan).ok()?;
    lint(req, &streams).ok()?;
    let inputs = host::random_inputs(req, 11);
    if let Ok(run) = simulate(req, &streams, &inputs, true) {
        return Some(run.trace);
    }
    let mut run = symbolic(req, &streams, 0, case.verify);
    trace::encode(&header(req, true), &mut run.events).ok()
}

//! The deterministic single-threaded simulator.
//!
//! Every (rank, channel) stream runs on the generic executor in turn, until it blocks or ends.
//! Time is virtual: each stream has a clock; a data op advances it by its size over the link
//! bandwidth (plus one hop latency when it touches another rank), a signal by one hop latency and
//! it records when the peer's counter reached each value, and a wait ends at the later of the
//! stream's clock and the moment the counter reached its target. The result is the time the
//! schedule would take on a machine described by the [`Link`], with every dependency honoured.

use std::collections::HashMap;

use super::mem::{RankFabric, Temps, WorldMem};
use super::{HostError, Run, DEFAULT_LINK};
use symm_core::cost::Link;
use symm_core::exec::{Executor, Step};
use symm_core::op::{Op, SignalOp};
use symm_core::sched::{Request, Schedule};
use symm_core::signal::Cmp;
use symm_core::symbolic::SymWorld;
use symm_core::trace::{Event, EventKind};

/// Options of [`simulate`].
#[derive(Clone, Copy, Debug)]
pub struct SimOptions {
    /// The machine model for virtual time.
    pub link: Link,
    /// Record each op's destination contents (contribution sets) in the trace; worlds up to 64.
    pub contents: bool,
    /// Record a trace at all.
    pub trace: bool,
    /// Move the data (`false`: timing only; no buffers are allocated, `inputs` may be empty and
    /// the outputs are empty, so requests of any size can be timed).
    pub data: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            link: DEFAULT_LINK,
            contents: false,
            trace: true,
            data: true,
        }
    }
}

/// The request validates and there is one input of its size per rank.
pub fn check_inputs(req: &Request, inputs: &[Vec<u8>]) -> Result<(), HostError> {
    req.validate().map_err(HostError::Sched)?;
    if inputs.len() != req.world as usize {
        return Err(HostError::BadWorld {
            expected: req.world,
            found: inputs.len(),
        });
    }
    let want = req.buffer_sizes().input;
    for (r, i) in inputs.iter().enumerate() {
        if i.len() as u64 != want {
            return Err(HostError::BadInput {
                rank: r as u16,
                expected: want,
                found: i.len() as u64,
            });
        }
    }
    Ok(())
}

fn cost_ns(op: &Op, me: u16, link: &Link) -> u64 {
    let us = match *op {
        Op::Copy { src, dst, bytes } => {
            let hop = if src.rank != me || dst.rank != me {
                link.alpha_us
            } else {
                0.0
            };
            hop + bytes as f64 / link.beta_bytes_per_us
        }
        Op::Reduce { a, b, dst, .. } => {
            let remote = a.rank != me || b.rank != me || dst.rank != me;
            (if remote { link.alpha_us } else { 0.0 }) + op.bytes() as f64 / link.beta_bytes_per_us
        }
        Op::ReduceN {
            ranks,
            dst,
            elems,
            dtype,
            ..
        } => {
            // The remote sources come in over this rank's link together: one hop, their bytes.
            let remote = ranks.as_slice().iter().filter(|&&r| r != me).count() as f64;
            let hop = if remote > 0.0 || dst.rank != me {
                link.alpha_us
            } else {
                0.0
            };
            let bytes = elems.saturating_mul(dtype.size()) as f64;
            hop + remote.max(1.0) * bytes / link.beta_bytes_per_us
        }
        Op::LlPut { dst, bytes, .. } => {
            let hop = if dst.rank != me { link.alpha_us } else { 0.0 };
            hop + symm_core::ll::line_bytes(bytes) as f64 / link.beta_bytes_per_us
        }
        // Reading its own memory once the lines are there (their arrival is the wait).
        Op::LlReduce { elems, dtype, .. } => {
            elems.saturating_mul(dtype.size()) as f64 / link.beta_bytes_per_us
        }
        Op::McReduce { .. } | Op::McStore { .. } => {
            link.alpha_us + op.bytes() as f64 / link.multicast_bytes_per_us.max(1.0)
        }
        Op::Signal { .. } => link.alpha_us,
        Op::Wait { .. } => 0.0,
    };
    (us * 1000.0).round() as u64
}

/// The (cumulative value, time) of every signal one slot received.
#[derive(Clone, Default)]
struct History {
    list: Vec<(u64, u64)>,
    /// No value went down (wrap-safe): true while only adds arrived, or sets that grew.
    monotone: bool,
}

impl History {
    fn push(&mut self, op: SignalOp, value: u64, time: u64) {
        let prev = self.list.last().map(|&(v, _)| v).unwrap_or(0);
        let v = match op {
            SignalOp::Add => prev.wrapping_add(value),
            SignalOp::Set => value,
        };
        if self.list.is_empty() {
            self.monotone = true;
        }
        self.monotone &= Cmp::Ge.holds(v, prev);
        self.list.push((v, time));
    }

    /// When the counter first reached `target`: by bisection while the history is monotone,
    /// by a scan otherwise.
    fn first_reaching(&self, target: u64) -> Option<u64> {
        if self.monotone {
            let i = self
                .list
                .partition_point(|(v, _)| !Cmp::Ge.holds(*v, target));
            self.list.get(i).map(|&(_, t)| t)
        } else {
            self.list
                .iter()
                .find(|(v, _)| Cmp::Ge.holds(*v, target))
                .map(|&(_, t)| t)
        }
    }
}

/// Runs `req` over `inputs` (one buffer per rank) in the simulator.
///
/// ```
/// use symm_core::dtype::{DType, ReduceOp};
/// use symm_core::sched::{Algorithm, Collective, Request};
/// use symm_core::trace;
/// use symm_driver::host::{self, SimOptions};
///
/// let (c, a) = (Collective::AllReduce, Algorithm::Rhd);
/// let req = Request::new(c, a, 6, 4096, DType::F32, ReduceOp::Sum);
/// let inputs = host::random_inputs(&req, 1);
/// let run = host::simulate(&req, &inputs, &SimOptions::default()).unwrap();
///
/// // Every rank holds the sum of every rank's input.
/// assert_eq!(run.outputs, host::reference(&req, &inputs));
/// // Virtual time on the default link model, launch included, and a trace of every op.
/// assert!(run.time_us > SimOptions::default().link.launch_us);
/// let decoded = trace::decode(&run.trace).unwrap();
/// assert_eq!(decoded.events.len() as u64, 2 * run.ops); // a begin and an end per op
///
/// // Timing only: no buffers, so any size can be timed.
/// let big = Request { bytes: 1 << 30, ..req };
/// let timing = SimOptions { data: false, trace: false, ..SimOptions::default() };
/// assert!(host::simulate(&big, &[], &timing).unwrap().time_us > run.time_us);
/// ```
pub fn simulate(req: &Request, inputs: &[Vec<u8>], opts: &SimOptions) -> Result<Run, HostError> {
    simulate_streams(req, inputs, opts, |r, c| {
        Schedule::new(*req, r, c).map_err(HostError::Sched)
    })
}

/// Runs arbitrary per-(rank, channel) op streams (an all-to-allv, a user-written plan) over the
/// memory `req` describes, in the simulator.
pub fn simulate_streams<I, F>(
    req: &Request,
    inputs: &[Vec<u8>],
    opts: &SimOptions,
    make: F,
) -> Result<Run, HostError>
where
    I: Iterator<Item = Op>,
    F: Fn(u16, u16) -> Result<I, HostError>,
{
    let mem = if opts.data {
        WorldMem::new(req, inputs, super::POISON)?
    } else {
        WorldMem::pads_only(req)?
    };
    let slots = req.layout().slots() as usize;
    let w = req.world as usize;
    let elems = req.buffer_sizes().input / req.dtype.size();
    let contents = opts.data && opts.trace && opts.contents;
    let mut shadow = if contents && req.world <= 64 && elems <= (1 << 20) {
        SymWorld::new(req).ok()
    } else {
        None
    };
    // Only slots that receive signals get a history.
    let mut arrivals: HashMap<(u16, u32), History> = HashMap::new();
    // When the last lines of each low-latency region landed: (rank, offset) -> time.
    let mut lines: HashMap<(u16, u64), u64> = HashMap::new();
    let mut streams = Vec::new();
    for r in 0..req.world {
        for c in 0..req.channels {
            streams.push((r, c, make(r, c)?));
        }
    }
    // One counter per slot of each rank (as on a GPU); each channel's executor owns its
    // channel's contiguous range of them.
    let per_channel = (slots / req.channels.max(1) as usize).max(1);
    let mut expected = vec![vec![0u64; slots]; w];
    let ranges = expected.iter_mut().flat_map(|v| v.chunks_mut(per_channel));
    let launch = (opts.link.launch_us * 1000.0) as u64;
    let mut st: Vec<_> = streams
        .into_iter()
        .zip(ranges)
        .map(|((r, c, s), e)| {
            let base = c as u32 * per_channel as u32;
            (r, c, Executor::at(s, e, base), launch, None::<u64>, false)
        })
        .collect();
    let mut events = Vec::new();
    let mut temps = Temps::default();
    let mut ops = 0u64;
    let mut live = st.len();
    while live > 0 {
        let mut progressed = false;
        for (rank, channel, ex, clock, wait_began, done) in st.iter_mut() {
            if *done {
                continue;
            }
            loop {
                let mut view = RankFabric::new(&mem, *rank, &mut temps);
                let step = ex
                    .step(&mut view)
                    .map_err(|e| super::exec_error(*rank, *channel, e))?;
                let (index, op) = match step {
                    Step::Done => {
                        *done = true;
                        live -= 1;
                        progressed = true;
                        break;
                    }
                    Step::Blocked { .. } => {
                        wait_began.get_or_insert(*clock);
                        break;
                    }
                    Step::Ran { index, op } => (index, op),
                };
                progressed = true;
                ops += 1;
                let begin = wait_began.take().unwrap_or(*clock);
                let end = match op {
                    Op::Wait { slot, .. } => {
                        let target = ex.expected_of(slot).unwrap_or(0);
                        let arrived = arrivals
                            .get(&(*rank, slot))
                            .and_then(|h| h.first_reaching(target))
                            .unwrap_or(begin);
                        begin.max(arrived)
                    }
                    Op::LlReduce {
                        src,
                        stride,
                        sources,
                        slot,
                        flip,
                        ..
                    } => {
                        let epoch = ex.expected_of(slot).unwrap_or(0);
                        let landed = (0..sources as u64)
                            .filter_map(|s| {
                                let at = symm_core::ll::region(src, stride, s, flip, epoch)?;
                                lines.get(&(at.rank, at.offset)).copied()
                            })
                            .max()
                            .unwrap_or(begin);
                        begin.max(landed) + cost_ns(&op, *rank, &opts.link)
                    }
                    _ => begin + cost_ns(&op, *rank, &opts.link),
                };
                if let Op::LlPut {
                    dst, slot, flip, ..
                } = op
                {
                    let epoch = ex.expected_of(slot).unwrap_or(0);
                    if let Some(at) = symm_core::ll::at(dst, flip, epoch) {
                        lines.insert((at.rank, at.offset), end);
                    }
                }
                if let Op::Signal {
                    peer,
                    slot,
                    op: sop,
                    value,
                } = op
                {
                    // The signal ran, so the slot exists (the fabric checked it).
                    arrivals
                        .entry((peer, slot))
                        .or_default()
                        .push(sop, value, end);
                }
                *clock = end;
                if opts.trace {
                    let contents = match (&mut shadow, op) {
                        (Some(s), o) if o.ll_slot().is_some() => {
                            let epoch = o.ll_slot().and_then(|k| ex.expected_of(k)).unwrap_or(0);
                            s.ll(*rank, &o, epoch).ok().and_then(|(_, m)| m)
                        }
                        (Some(s), o) if !matches!(o, Op::Wait { .. } | Op::Signal { .. }) => {
                            s.apply(*rank, &o).ok().flatten()
                        }
                        _ => None,
                    };
                    let ev = |time, kind, contents| Event {
                        time,
                        rank: *rank,
                        channel: *channel,
                        index,
                        kind,
                        op,
                        contents,
                    };
                    events.push(ev(begin, EventKind::Begin, None));
                    events.push(ev(end, EventKind::End, contents));
                }
            }
        }
        if !progressed {
            let (rank, channel, ex, ..) = st
                .iter_mut()
                .find(|s| !s.5)
                .ok_or(HostError::ThreadPanicked)?;
            let mut view = RankFabric::new(&mem, *rank, &mut temps);
            if let Ok(Step::Blocked {
                index,
                slot,
                target,
                found,
            }) = ex.step(&mut view)
            {
                return Err(HostError::Deadlock {
                    rank: *rank,
                    channel: *channel,
                    index,
                    slot,
                    target,
                    found,
                });
            }
            return Err(HostError::ThreadPanicked);
        }
    }
    let end = st.iter().map(|s| s.3).max().unwrap_or(0);
    drop(st);
    let trace = if opts.trace {
        super::write_trace(req, true, &mut events)?
    } else {
        Vec::new()
    };
    Ok(Run {
        outputs: (0..w).map(|r| mem.output(r)).collect(),
        trace,
        ops,
        time_us: end as f64 / 1000.0,
    })
}

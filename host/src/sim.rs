//! The deterministic single-threaded simulator.
//!
//! Every (rank, channel) stream runs on the generic executor with a virtual clock (nanoseconds,
//! from the link's launch). The simulator always runs one op of the stream whose clock is
//! earliest (ties by stream index), so the machine's resources are claimed in about the order of
//! virtual time; a stream that blocks is parked until a signal or a low-latency put reaches its
//! rank. The result is the time the schedule would take on a machine described by the
//! [`Link`], with every dependency honoured; it is a pure function of the request and the link.
//!
//! ## The model (`ports`)
//!
//! * **Resources.** Each rank has an egress and an ingress link port (`beta` each way), a memory
//!   port for passes that stay on the rank ([`Link::memory_bytes_per_us`], four times `beta`),
//!   and a switch port for multicast. An op moves its bytes through the rank that runs it: a
//!   remote source is read through its rank's egress into the runner's ingress, a remote
//!   destination written through the runner's egress into its rank's ingress. Each port serves
//!   its share of an op in the earliest gap of its timeline at or after the op is ready, and the
//!   op's transfer ends when its last port is done. So the channels of a rank, and its
//!   low-latency puts, share its link: C channels move bytes no faster than one port allows,
//!   they serialise on it.
//! * **Latency.** A read ends one hop (`alpha`) after its transfer (the loads come back); a
//!   write is posted: its stream goes on when the bytes left, and they land a hop later.
//! * **Signals.** A signal costs its sender only the issue ([`Link::issue_us`], an eighth of a
//!   hop); it lands on the peer one hop after it was issued. A wait ends at the later of the
//!   moment the stream reached it (`wait_began`, when it first blocked) and the moment the
//!   signal that satisfies it landed; a low-latency reduce likewise waits until its lines
//!   landed. Since a sender issues a signal after its put's bytes left, the signal lands after
//!   the data.
//! * **Blocks.** A channel is one GPU thread block, which alone moves bytes at a bounded rate
//!   and pays a fixed cost per op: [`SimOptions::block`] ([`Block`]) makes a data op last at
//!   least its bytes over the block's rate, after its op cost. The default adds nothing.
//! * **The end** of a run is the latest stream clock or landing.
//!
//! [`fit_link`] fits the link's launch, alpha and beta to measured times (the bench does it with
//! its GPU samples).

mod fit;
mod ports;

pub use fit::{fit_link, FitError, FitRow, FitSample, LinkFit};
pub use ports::Block;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::mem::{RankFabric, Temps, WorldMem};
use super::{HostError, Run, DEFAULT_LINK};
use ports::Ports;
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
    /// What one channel (a thread block) can do alone; [`Block::UNLIMITED`] by default, so
    /// only the link's ports bound a channel.
    pub block: Block,
    /// Record each op's destination contents (contribution sets) in the trace: worlds up to 64,
    /// inputs up to 2^20 elements and every rank's buffers up to
    /// [`symm_core::symbolic::MAX_CELLS`] elements (a larger run records none).
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
            block: Block::UNLIMITED,
            contents: false,
            trace: true,
            data: true,
        }
    }
}

/// The request validates, its memory fits [`crate::MAX_HOST_BYTES`] ([`HostError::TooLarge`]),
/// and there is one input of its size per rank.
pub fn check_inputs(req: &Request, inputs: &[Vec<u8>]) -> Result<(), HostError> {
    req.validate().map_err(HostError::Sched)?;
    // The bound before the inputs: a request too large to run is named as such, whatever its
    // inputs hold.
    super::mem::check_footprint(req, true)?;
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

/// A stream in the simulator: rank, channel, executor, clock, when its blocked op began, done.
type Stream<'e, I> = (u16, u16, Executor<'e, I>, u64, Option<u64>, bool);

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
/// use symm_host::{self as host, SimOptions};
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
    simulate_within(req, inputs, opts, make, super::MAX_HOST_OPS)
}

/// [`simulate_streams`], refused with [`HostError::TooManyOps`] past `max_ops` ops.
pub(crate) fn simulate_within<I, F>(
    req: &Request,
    inputs: &[Vec<u8>],
    opts: &SimOptions,
    make: F,
    max_ops: u64,
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
    let launch = ports::ns(opts.link.launch_us);
    let mut ports = Ports::new(req.world, opts.link, opts.block);
    // The latest moment any write or signal landed: a run ends when everything arrived.
    let mut last_landing = launch;
    let mut st: Vec<Stream<'_, I>> = streams
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
    // Streams run one op at a time, the one with the earliest clock first (ties by index), so
    // the ports are claimed roughly in virtual-time order. A blocked stream is parked on its
    // rank until a signal or a low-latency put reaches that rank.
    let mut runnable: BinaryHeap<Reverse<(u64, usize)>> =
        (0..st.len()).map(|i| Reverse((launch, i))).collect();
    let mut parked: Vec<Vec<usize>> = vec![Vec::new(); w];
    let mut progressed = true;
    while live > 0 {
        let Some(Reverse((_, i))) = runnable.pop() else {
            // Nothing runnable: every parked stream tries once more; without progress since
            // the last such round, the world is deadlocked.
            if !progressed {
                return Err(deadlock(&mut st, &mem, &mut temps));
            }
            progressed = false;
            for p in parked.iter_mut() {
                runnable.extend(p.drain(..).map(|i| Reverse((st[i].3, i))));
            }
            continue;
        };
        let (rank, channel, ex, clock, wait_began, done) = &mut st[i];
        let mut view = RankFabric::new(&mem, *rank, &mut temps);
        let step = ex
            .step(&mut view)
            .map_err(|e| super::exec_error(*rank, *channel, e))?;
        let (index, op) = match step {
            Step::Done => {
                *done = true;
                live -= 1;
                progressed = true;
                continue;
            }
            Step::Blocked { .. } => {
                wait_began.get_or_insert(*clock);
                if let Some(p) = parked.get_mut(*rank as usize) {
                    p.push(i);
                }
                continue;
            }
            Step::Ran { index, op } => (index, op),
        };
        progressed = true;
        ops += 1;
        if ops > max_ops {
            return Err(HostError::TooManyOps { limit: max_ops });
        }
        // A blocked op began when the stream first blocked on it; it runs once what it waited
        // for has landed.
        let begin = wait_began.take().unwrap_or(*clock);
        let ready = match op {
            Op::Wait { slot, .. } => {
                let target = ex.expected_of(slot).unwrap_or(0);
                arrivals
                    .get(&(*rank, slot))
                    .and_then(|h| h.first_reaching(target))
                    .map_or(begin, |t| begin.max(t))
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
                (0..sources as u64)
                    .filter_map(|s| {
                        let at = symm_core::ll::region(src, stride, s, flip, epoch)?;
                        lines.get(&(at.rank, at.offset)).copied()
                    })
                    .fold(begin, u64::max)
            }
            Op::Copy { .. }
            | Op::Reduce { .. }
            | Op::Signal { .. }
            | Op::ReduceN { .. }
            | Op::LlPut { .. }
            | Op::McReduce { .. }
            | Op::McStore { .. } => begin,
        };
        let timing = ports.run(&op, *rank, ready);
        let end = timing.end;
        last_landing = last_landing.max(timing.landed);
        let woken = match op {
            Op::LlPut {
                dst, slot, flip, ..
            } => {
                let epoch = ex.expected_of(slot).unwrap_or(0);
                if let Some(at) = symm_core::ll::at(dst, flip, epoch) {
                    lines.insert((at.rank, at.offset), timing.landed);
                }
                Some(dst.rank)
            }
            Op::Signal {
                peer,
                slot,
                op: sop,
                value,
            } => {
                // The signal ran, so the slot exists (the fabric checked it).
                arrivals
                    .entry((peer, slot))
                    .or_default()
                    .push(sop, value, timing.landed);
                Some(peer)
            }
            Op::Copy { .. }
            | Op::Reduce { .. }
            | Op::Wait { .. }
            | Op::ReduceN { .. }
            | Op::LlReduce { .. }
            | Op::McReduce { .. }
            | Op::McStore { .. } => None,
        };
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
        runnable.push(Reverse((end, i)));
        if let Some(p) = woken.and_then(|r| parked.get_mut(r as usize)) {
            runnable.extend(p.drain(..).map(|j| Reverse((st[j].3, j))));
        }
    }
    let end = st.iter().map(|s| s.3).fold(last_landing, u64::max);
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

/// The deadlock error of the first unfinished stream (which is blocked: nothing can run).
fn deadlock<I: Iterator<Item = Op>>(
    st: &mut [Stream<'_, I>],
    mem: &WorldMem,
    temps: &mut Temps,
) -> HostError {
    let Some((rank, channel, ex, ..)) = st.iter_mut().find(|s| !s.5) else {
        return HostError::ThreadPanicked;
    };
    let mut view = RankFabric::new(mem, *rank, temps);
    match ex.step(&mut view) {
        Ok(Step::Blocked {
            index,
            slot,
            target,
            found,
        }) => HostError::Deadlock {
            rank: *rank,
            channel: *channel,
            index,
            slot,
            target,
            found,
        },
        _ => HostError::ThreadPanicked,
    }
}

#[cfg(test)]
mod tests;

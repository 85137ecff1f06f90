//! Running a hand-written schedule through every check the library has.
//!
//! A [`Case`] is a request (collective, world, size, pipelining) the schedule must handle. For
//! each case, [`check_case`]:
//!
//! 1. builds every rank's ops by calling the schedule ([`build`]; a panic in it becomes
//!    [`Problem::Panicked`] with its message, not a crash);
//! 2. checks each op on its own ([`lint`]): ranks inside the world, offsets inside the buffers,
//!    slots inside the pad and written only by the rank they name; then the protocol rules the
//!    labs teach ([`crate::rules`]: no peer's buffer touched before its `Ready`);
//! 3. runs the ops *symbolically* ([`symbolic`], in [`crate::sym`]) under several random
//!    interleavings: every element is the set of ranks whose contributions it holds, so a
//!    deadlock, a read of data not yet written, a reduction of mismatched elements, a wrong
//!    output or an unbalanced signal is named exactly;
//! 4. runs them on the host simulator (virtual time; the trace the viz replays) and on real
//!    threads with real atomics (a deadline turns a hang into an error), and compares each
//!    result with the reference (`symm_driver::host::reference`).

use crate::kit::Kit;
use crate::problem::Problem;
pub use crate::sym::{symbolic, SymRun};
use std::panic::{self, AssertUnwindSafe};
use std::time::Duration;
use symm_core::cost::Link;
use symm_core::op::{At, Buf, Loc, Op};
use symm_core::sched::Request;
use symm_core::trace::{self, Header, Source};
use symm_driver::host::{self, Block, HostError, Mismatch, SimOptions, ThreadOptions};

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
    /// Whether the rule 'Ready before touch' is checked ([`crate::rules`]).
    pub ready_before_touch: bool,
    /// What one (rank, channel) stream costs on the simulator beyond the link: a GPU thread
    /// block's bandwidth and fixed cost per data op (default: none, only the link).
    pub block: Block,
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
            ready_before_touch: true,
            block: Block::UNLIMITED,
        }
    }

    /// The simulator charges each stream `block` beyond the link (lab 7: a fixed cost per data
    /// op, as a GPU thread block pays).
    pub fn with_block(mut self, block: Block) -> Case {
        self.block = block;
        self
    }

    /// The handshake rules are not checked, 'Ready before touch' and 'nothing touches a rank
    /// after it finished': the protocol has none (the MoE layer's epoch halves and tagged
    /// headers, [`crate::rules`]).
    pub fn without_handshake(mut self) -> Case {
        self.ready_before_touch = false;
        self
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

thread_local! {
    /// Set while this thread builds a student's ops: the hook records the panic here.
    static CAPTURE: std::cell::RefCell<Option<Option<String>>> = const { std::cell::RefCell::new(None) };
}

/// Installs, once per process, a panic hook that records a panic of a thread building
/// student ops (its message becomes the checker's report) and forwards every other panic to
/// the hook that was there before.
fn install_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let captured = CAPTURE
                .try_with(|c| {
                    let mut c = c.borrow_mut();
                    match c.as_mut() {
                        Some(slot) => {
                            *slot = Some(info.to_string().replace('\n', " "));
                            true
                        }
                        None => false,
                    }
                })
                .unwrap_or(false);
            if !captured {
                previous(info);
            }
        }));
    });
}

/// Builds every (rank, channel)'s ops, stream `rank * channels + channel`.
pub fn build(case: &Case, plan: Plan) -> Result<Vec<Vec<Op>>, Problem> {
    install_hook();
    CAPTURE.with(|c| *c.borrow_mut() = Some(None));
    let mut out = Vec::new();
    let mut failed = None;
    'all: for r in 0..case.req.world {
        for c in 0..case.req.channels {
            let k = case.kit(r, c);
            match panic::catch_unwind(AssertUnwindSafe(|| plan(&k))) {
                Ok(ops) => out.push(crate::catalogue::planted(&k, ops)),
                Err(_) => {
                    failed = Some(r);
                    break 'all;
                }
            }
        }
    }
    let message = CAPTURE.with(|c| c.borrow_mut().take()).flatten();
    match failed {
        None => Ok(out),
        Some(rank) => Err(Problem::Panicked {
            rank,
            message: message.unwrap_or_else(|| "(no message)".into()),
        }),
    }
}

/// The locations an op touches and how many bytes from each may be touched (its footprint;
/// multicast: on every rank).
fn touched(req: &Request, op: &Op) -> Vec<(Loc, u64)> {
    let mut v = Vec::new();
    for r in op.footprint().ranges() {
        match r.at {
            At::Rank(l) => v.push((l, r.span)),
            At::Every(m) => {
                v.extend((0..req.world).map(|q| (Loc::new(q, m.buf, m.offset), r.span)));
            }
        }
    }
    v
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
                Op::Reduce { dtype, op: o, .. }
                | Op::ReduceN { dtype, op: o, .. }
                | Op::LlReduce { dtype, op: o, .. }
                | Op::McReduce { dtype, op: o, .. }
                    if dtype != req.dtype || o != req.op =>
                {
                    return Err(Problem::WrongType { rank, index });
                }
                Op::Copy { .. }
                | Op::Reduce { .. }
                | Op::Wait { .. }
                | Op::ReduceN { .. }
                | Op::LlPut { .. }
                | Op::LlReduce { .. }
                | Op::McReduce { .. }
                | Op::McStore { .. } => {}
            }
        }
    }
    Ok(())
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
    simulate_on(req, streams, inputs, record, Block::UNLIMITED)
}

/// [`simulate`], charging each stream `block` beyond the link.
pub fn simulate_on(
    req: &Request,
    streams: &[Vec<Op>],
    inputs: &[Vec<u8>],
    record: bool,
    block: Block,
) -> Result<host::Run, HostError> {
    let opts = SimOptions {
        contents: record,
        trace: record,
        block,
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
    time_us_on(req, streams, link, Block::UNLIMITED)
}

/// [`time_us`], charging each stream `block` beyond the link.
pub fn time_us_on(
    req: &Request,
    streams: &[Vec<Op>],
    link: Link,
    block: Block,
) -> Result<f64, HostError> {
    let opts = SimOptions {
        link,
        block,
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

/// A numbers mismatch, noting whether the element found is still poison.
pub(crate) fn numbers(
    backend: &'static str,
    req: &Request,
    outputs: &[Vec<u8>],
    m: Mismatch,
) -> Problem {
    let es = req.dtype.size() as usize;
    let unwritten = outputs
        .get(m.rank)
        .and_then(|o| o.get(m.elem * es..(m.elem + 1) * es))
        .is_some_and(|b| b.iter().all(|&x| x == host::POISON));
    Problem::Numbers {
        backend,
        mismatch: m,
        unwritten,
    }
}

/// Every check of one case, stopping at the first problem.
pub fn check_case(case: &Case, plan: Plan) -> Result<Passed, Problem> {
    let req = &case.req;
    let streams = build(case, plan)?;
    lint(req, &streams)?;
    if case.ready_before_touch {
        crate::rules::ready_before_touch(req, &streams)?;
    }
    for seed in 0..case.seeds {
        crate::sym::symbolic_ruled(req, &streams, seed, case.verify, case.ready_before_touch)
            .result?;
    }
    let inputs = host::random_inputs(req, 11);
    let want = match &case.reference {
        Some(f) => f(req, &inputs),
        None => host::reference(req, &inputs),
    };
    let run =
        simulate_on(req, &streams, &inputs, true, case.block).map_err(|error| Problem::Host {
            backend: "simulator",
            error,
        })?;
    host::compare(req, &run.outputs, &want)
        .map_err(|m| numbers("simulator", req, &run.outputs, m))?;
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
    host::compare(req, &threads.outputs, &want)
        .map_err(|m| numbers("threads", req, &threads.outputs, m))?;
    Ok(Passed {
        trace: run.trace,
        time_us: run.time_us,
        streams,
    })
}

/// A trace of the schedule on `case` for the viz, even when it fails: the simulator's when it
/// runs through, else the symbolic run's (which ends in stalls at a deadlock). `None` when the
/// ops cannot even be built or name things outside the world.
///
/// A case that tells the schedule to use fewer slots than its request allocates runs on that
/// request (the library refuses too few slots), and its trace's header names the slots the
/// schedule was told to use, so the viz shows those.
pub fn trace_of(case: &Case, plan: Plan) -> Option<Vec<u8>> {
    let req = &case.req;
    let streams = build(case, plan).ok()?;
    lint(req, &streams).ok()?;
    let inputs = host::random_inputs(req, 11);
    let shown = match case.slots {
        Some(s) if s < req.slot_count() => {
            let slots = u8::try_from(s.max(1)).unwrap_or(u8::MAX);
            req.with_pipeline(req.chunk_bytes, slots)
        }
        _ => *req,
    };
    let (mut head, mut events) = match simulate_on(req, &streams, &inputs, true, case.block) {
        Ok(run) if shown == *req => return Some(run.trace),
        Ok(run) => {
            let t = trace::decode(&run.trace).ok()?;
            (t.header, t.events)
        }
        Err(_) => (
            header(req, true),
            symbolic(req, &streams, 0, case.verify).events,
        ),
    };
    head.request = shown;
    trace::encode(&head, &mut events).ok()
}

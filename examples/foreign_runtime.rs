//! A foreign runtime embedding symm: its own memory, its own [`Fabric`], its own scheduler.
//!
//! ```sh
//! cargo run -p symm-examples --bin foreign-runtime
//! ```
//!
//! symm's schedules say *what* each rank does ([`Schedule`]: a lazy stream of [`Op`]s per
//! (rank, channel)); its executor ([`Executor`]) says *in which order*, and never blocks: a wait
//! whose signal has not arrived returns [`Step::Blocked`]. Everything else belongs to the runtime
//! that embeds it: where bytes live, how a signal reaches a peer, and who runs next. This program
//! is such a runtime, written from scratch on top of `symm-core` alone (symm-driver is used only
//! for the reference result the outputs are checked against):
//!
//! * **Memory.** Each rank has three plain `Vec<u8>` buffers (input, output, scratch) and a signal
//!   pad of plain `u64`s ([`Memory`]). There are no atomics: one thread runs every rank, and an op
//!   finishes before the next starts, which is stronger than the protocol's release/acquire.
//! * **Fabric.** [`RankView`] is one rank's view of the memory, and implements the op semantics:
//!   `Copy` moves bytes, `Reduce` combines element by element with `symm_core::dtype::combine`
//!   (operands are read before the destination is written, so `dst` may alias them), `Signal`
//!   updates the peer's slot with `symm_core::signal::apply`, and `load_slot` reads the rank's own
//!   pad for the executor, which handles `Wait` itself. This runtime has no multicast hardware,
//!   so `McReduce` and `McStore` are refused with an error, and the program checks that they are.
//! * **Scheduler.** Every (rank, channel) is a task owning an [`Executor`]; the scheduler visits
//!   them in turn and steps each until it blocks or its turn ends ([`Policy`]), like a
//!   cooperative, single-threaded async runtime polling futures. A full round in which no task
//!   ran an op is a deadlock: nothing can change any more, and the runtime names every blocked
//!   wait instead of spinning.
//! * **Counters.** The runtime owns each rank's expected counters (one per pad slot) and lends
//!   each channel's executor its own range ([`Executor::at`]) for one collective. Counters and
//!   pads are kept from one collective to the next, so a second collective on the same memory
//!   starts where the first left off; the schedules are balanced, so that just works.
//!
//! Each case runs under three interleavings and then once more on the same memory, and every
//! output is compared with the sequential reference. Any mismatch exits non-zero.
#![forbid(unsafe_code)]

use std::error::Error;
use std::fmt;

use symm_core::dtype::{combine, fold, DType, ReduceOp};
use symm_core::exec::{ExecError, Executor, Fabric, LlPoll, Step};
use symm_core::ll::{self, Format};
use symm_core::op::{Buf, Loc, Op};
use symm_core::sched::{Algorithm, Collective, Request, SchedError, Schedule};
use symm_core::signal;
use symm_core::symbolic::Rng;
use symm_driver::host;

/// The byte outputs and scratch start with, as in every symm backend (the reference leaves the
/// outputs a collective does not define at this value too).
const POISON: u8 = host::POISON;

/// One rank's memory in this runtime.
struct RankMemory {
    /// Input, output and scratch, indexed by `Buf as usize`.
    bufs: [Vec<u8>; 3],
    /// The signal pad.
    pad: Vec<u64>,
}

/// Every rank's memory.
struct Memory {
    ranks: Vec<RankMemory>,
}

/// Why this runtime's fabric refused an op.
#[derive(Debug)]
enum FabricError {
    /// A location outside a buffer (or a rank outside the world).
    OutOfBounds { loc: Loc, len: u64 },
    /// A slot outside a pad (or a rank outside the world).
    NoSlot { rank: u16, slot: u32 },
    /// A multicast op: this runtime has no multicast.
    Multicast(&'static str),
}

impl fmt::Display for FabricError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FabricError::OutOfBounds { loc, len } => write!(
                f,
                "{len} bytes at rank {} {} offset {} are outside the buffer",
                loc.rank,
                loc.buf.name(),
                loc.offset
            ),
            FabricError::NoSlot { rank, slot } => write!(f, "rank {rank} has no slot {slot}"),
            FabricError::Multicast(kind) => write!(f, "{kind}: this runtime has no multicast"),
        }
    }
}

impl Memory {
    /// Inputs as given, outputs and scratch poisoned, pads at zero.
    fn new(req: &Request, inputs: &[Vec<u8>]) -> Memory {
        let sz = req.buffer_sizes();
        let slots = req.layout().slots() as usize;
        let ranks = inputs
            .iter()
            .map(|input| RankMemory {
                bufs: [
                    input.clone(),
                    vec![POISON; sz.output as usize],
                    vec![POISON; sz.scratch as usize],
                ],
                pad: vec![0; slots],
            })
            .collect();
        Memory { ranks }
    }

    fn range(&self, loc: Loc, len: u64) -> Result<std::ops::Range<usize>, FabricError> {
        let oob = FabricError::OutOfBounds { loc, len };
        let buf = &self.ranks.get(loc.rank as usize).ok_or(oob)?.bufs[loc.buf as usize];
        let end = loc
            .offset
            .checked_add(len)
            .filter(|&e| e <= buf.len() as u64);
        match end {
            Some(end) => Ok(loc.offset as usize..end as usize),
            None => Err(FabricError::OutOfBounds { loc, len }),
        }
    }

    /// The `len` bytes at `loc`.
    fn read(&self, loc: Loc, len: u64) -> Result<&[u8], FabricError> {
        let r = self.range(loc, len)?;
        Ok(&self.ranks[loc.rank as usize].bufs[loc.buf as usize][r])
    }

    /// Writes `data` at `loc`.
    fn write(&mut self, loc: Loc, data: &[u8]) -> Result<(), FabricError> {
        let r = self.range(loc, data.len() as u64)?;
        self.ranks[loc.rank as usize].bufs[loc.buf as usize][r].copy_from_slice(data);
        Ok(())
    }

    fn slot(&mut self, rank: u16, slot: u32) -> Result<&mut u64, FabricError> {
        self.ranks
            .get_mut(rank as usize)
            .and_then(|r| r.pad.get_mut(slot as usize))
            .ok_or(FabricError::NoSlot { rank, slot })
    }
}

/// One rank's view of the memory: the [`Fabric`] its executors step against.
struct RankView<'m> {
    mem: &'m mut Memory,
    rank: u16,
}

impl Fabric for RankView<'_> {
    type Error = FabricError;

    fn execute(&mut self, op: &Op) -> Result<(), FabricError> {
        match *op {
            Op::Copy { src, dst, bytes } => {
                let data = self.mem.read(src, bytes)?.to_vec();
                self.mem.write(dst, &data)
            }
            Op::Reduce {
                a,
                b,
                dst,
                elems,
                dtype,
                op,
                div,
            } => {
                let es = dtype.size() as usize;
                let len = elems.saturating_mul(dtype.size());
                // Both operands are read before the destination is written: `dst` may be `a`.
                let x = self.mem.read(a, len)?;
                let y = self.mem.read(b, len)?;
                let mut out = vec![0u8; x.len()];
                for ((o, x), y) in out
                    .chunks_exact_mut(es)
                    .zip(x.chunks_exact(es))
                    .zip(y.chunks_exact(es))
                {
                    combine(dtype, op, div, x, y, o);
                }
                self.mem.write(dst, &out)
            }
            Op::ReduceN {
                buf,
                offset,
                ranks,
                dst,
                elems,
                dtype,
                op,
                div,
            } => {
                let es = dtype.size() as usize;
                let len = elems.saturating_mul(dtype.size());
                // Every source is read before the destination is written.
                let srcs = ranks
                    .as_slice()
                    .iter()
                    .map(|&r| {
                        self.mem
                            .read(Loc::new(r, buf, offset), len)
                            .map(<[u8]>::to_vec)
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let mut out = vec![0u8; len as usize];
                for (i, o) in out.chunks_exact_mut(es).enumerate() {
                    let at: Vec<&[u8]> = srcs.iter().map(|s| &s[i * es..(i + 1) * es]).collect();
                    fold(dtype, op, div, &at, o);
                }
                self.mem.write(dst, &out)
            }
            Op::Signal {
                peer,
                slot,
                op,
                value,
            } => {
                let s = self.mem.slot(peer, slot)?;
                *s = signal::apply(op, *s, value);
                Ok(())
            }
            // The executor decides waits itself through `load_slot`; it never passes one here.
            Op::Wait { .. } => Ok(()),
            Op::McReduce { .. } | Op::McStore { .. } => Err(FabricError::Multicast(op.kind_name())),
            // They need the call's epoch: the executor passes them to `ll`.
            Op::LlPut { .. } | Op::LlReduce { .. } => Err(FabricError::NoSlot {
                rank: self.rank,
                slot: op.ll_slot().unwrap_or(0),
            }),
        }
    }

    /// Low-latency lines as plain bytes: one thread runs every rank, so no store can tear.
    fn ll(&mut self, op: &Op, epoch: u64) -> Result<LlPoll, FabricError> {
        let flag = ll::flag(epoch);
        let oob = |loc: Loc| FabricError::OutOfBounds { loc, len: 0 };
        match *op {
            Op::LlPut {
                format,
                src,
                dst,
                bytes,
                flip,
                ..
            } => {
                let data = self.mem.read(src, bytes)?.to_vec();
                let mut lines = Vec::with_capacity(format.line_bytes(bytes) as usize);
                for chunk in data.chunks(format.data() as usize) {
                    match format {
                        Format::Ll => {
                            for h in ll::pack(chunk, flag) {
                                lines.extend_from_slice(&h.to_le_bytes());
                            }
                        }
                        Format::Ll128 => {
                            for w in ll::pack128(chunk) {
                                lines.extend_from_slice(&w.to_le_bytes());
                            }
                            lines.extend_from_slice(&ll::flag128(flag).to_le_bytes());
                        }
                    }
                }
                self.mem
                    .write(ll::at(dst, flip, epoch).ok_or(oob(dst))?, &lines)?;
                Ok(LlPoll::Done)
            }
            Op::LlReduce {
                format,
                src,
                stride,
                sources,
                dst,
                elems,
                dtype,
                op,
                div,
                flip,
                ..
            } => {
                let es = dtype.size() as usize;
                let len = elems.saturating_mul(dtype.size());
                let mut regions = Vec::with_capacity(sources as usize);
                for s in 0..sources as u64 {
                    let at = ll::region(src, stride, s, flip, epoch).ok_or(oob(src))?;
                    let lines = self.mem.read(at, format.line_bytes(len))?;
                    let mut data = Vec::with_capacity(len as usize);
                    for line in lines.chunks_exact(format.line() as usize) {
                        let word = |i: usize| {
                            u64::from_le_bytes(line[i..i + 8].try_into().unwrap_or([0; 8]))
                        };
                        let got = match format {
                            Format::Ll => ll::unpack([word(0), word(8)], flag).map(|d| d.to_vec()),
                            Format::Ll128 => {
                                let words: [u64; ll::LINE128_DATA_WORDS] =
                                    core::array::from_fn(|w| word(8 * w));
                                ll::unpack128(word(120), &words, flag).map(|d| d.to_vec())
                            }
                        };
                        match got {
                            Some(d) => data.extend_from_slice(&d),
                            None => return Ok(LlPoll::Waiting((word(0) >> 32) as u32)),
                        }
                    }
                    data.truncate(len as usize);
                    regions.push(data);
                }
                let mut out = vec![0u8; len as usize];
                for (i, o) in out.chunks_exact_mut(es).enumerate() {
                    let at: Vec<&[u8]> = regions.iter().map(|r| &r[i * es..(i + 1) * es]).collect();
                    fold(dtype, op, div, &at, o);
                }
                self.mem.write(dst, &out)?;
                Ok(LlPoll::Done)
            }
            Op::Copy { .. }
            | Op::Reduce { .. }
            | Op::Signal { .. }
            | Op::Wait { .. }
            | Op::ReduceN { .. }
            | Op::McReduce { .. }
            | Op::McStore { .. } => Err(FabricError::NoSlot {
                rank: self.rank,
                slot: 0,
            }),
        }
    }

    fn load_slot(&mut self, slot: u32) -> Result<u64, FabricError> {
        self.mem.slot(self.rank, slot).map(|s| *s)
    }
}

/// How the scheduler interleaves its tasks.
#[derive(Clone, Copy, Debug)]
enum Policy {
    /// Step a task until it blocks or finishes, then move on (fewest switches).
    UntilBlocked,
    /// One op per turn (most switches).
    OneOp,
    /// A random number of ops per turn (1 to 8), each round starting at a random task.
    Random(u64),
}

/// Why a collective did not finish.
#[derive(Debug)]
enum RuntimeError {
    /// The request, a rank or a channel does not schedule.
    Sched(SchedError),
    /// A task's executor stopped on an error.
    Exec {
        rank: u16,
        channel: u16,
        error: ExecError<FabricError>,
    },
    /// Every unfinished task is blocked: (rank, channel, op index, slot, target, found) each.
    Deadlock(Vec<(u16, u16, u32, u32, u64, u64)>),
    /// Not one input of the request's input size per rank.
    BadInputs,
}

impl fmt::Display for RuntimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuntimeError::Sched(e) => write!(f, "cannot schedule: {e}"),
            RuntimeError::Exec {
                rank,
                channel,
                error,
            } => match error {
                ExecError::Fabric { error, index } => {
                    write!(f, "rank {rank} channel {channel} op {index}: {error}")
                }
                ExecError::SlotOutOfRange { slot, index } => write!(
                    f,
                    "rank {rank} channel {channel} op {index} waits on slot {slot}, not its own"
                ),
                other => write!(f, "rank {rank} channel {channel}: {other:?}"),
            },
            RuntimeError::Deadlock(w) => write!(f, "deadlock; blocked waits: {w:?}"),
            RuntimeError::BadInputs => write!(f, "not one input of the request's size per rank"),
        }
    }
}

impl Error for RuntimeError {}

/// A world of ranks in this runtime: memory, pads and every rank's expected counters.
struct Runtime {
    req: Request,
    mem: Memory,
    /// Rank r's expected counter of each slot of its pad, kept across collectives.
    expected: Vec<Vec<u64>>,
}

/// What one collective cost the scheduler.
#[derive(Debug, Default)]
struct Stats {
    /// Ops run over every task.
    ops: u64,
    /// Turns given to tasks (a turn ends when the task blocks, finishes or used its quantum).
    turns: u64,
}

impl Runtime {
    fn new(req: Request, inputs: &[Vec<u8>]) -> Result<Runtime, RuntimeError> {
        req.validate().map_err(RuntimeError::Sched)?;
        let size = req.buffer_sizes().input;
        if inputs.len() != req.world as usize || inputs.iter().any(|i| i.len() as u64 != size) {
            return Err(RuntimeError::BadInputs);
        }
        let slots = req.layout().slots() as usize;
        Ok(Runtime {
            req,
            mem: Memory::new(&req, inputs),
            expected: vec![vec![0; slots]; req.world as usize],
        })
    }

    /// Runs the request once, interleaving every (rank, channel) task by `policy`.
    fn run(&mut self, policy: Policy) -> Result<Stats, RuntimeError> {
        // Slots are laid out channel by channel, so each channel's waits name one contiguous
        // range of its rank's counters: the executor of that channel borrows just that range.
        let per_channel = self.req.layout().slots() as usize / self.req.channels as usize;
        let mut tasks = Vec::new();
        for (rank, counters) in (0u16..).zip(self.expected.iter_mut()) {
            for (channel, range) in (0u16..).zip(counters.chunks_mut(per_channel)) {
                let ops = Schedule::new(self.req, rank, channel).map_err(RuntimeError::Sched)?;
                let base = channel as u32 * per_channel as u32;
                tasks.push((rank, channel, Executor::at(ops, range, base), false));
            }
        }
        let mut rng = Rng::new(match policy {
            Policy::Random(seed) => seed,
            _ => 0,
        });
        let mut stats = Stats::default();
        let mut live = tasks.len();
        while live > 0 {
            let mut progressed = false;
            let start = match policy {
                Policy::Random(_) => rng.below(tasks.len() as u64) as usize,
                _ => 0,
            };
            let n = tasks.len();
            for i in (0..n).map(|i| (start + i) % n) {
                let (rank, channel, exec, done) = &mut tasks[i];
                if *done {
                    continue;
                }
                stats.turns += 1;
                let quantum = match policy {
                    Policy::UntilBlocked => u64::MAX,
                    Policy::OneOp => 1,
                    Policy::Random(_) => 1 + rng.below(8),
                };
                let mut view = RankView {
                    mem: &mut self.mem,
                    rank: *rank,
                };
                for _ in 0..quantum {
                    let step = exec.step(&mut view).map_err(|error| RuntimeError::Exec {
                        rank: *rank,
                        channel: *channel,
                        error,
                    })?;
                    match step {
                        Step::Ran { .. } => {
                            stats.ops += 1;
                            progressed = true;
                        }
                        Step::Blocked { .. } => break,
                        Step::Done => {
                            *done = true;
                            live -= 1;
                            break;
                        }
                    }
                }
            }
            if live > 0 && !progressed {
                // Nothing ran in a whole round, so nothing will: name every blocked wait.
                let mut waits = Vec::new();
                for (rank, channel, exec, _) in tasks.iter_mut().filter(|t| !t.3) {
                    let mut view = RankView {
                        mem: &mut self.mem,
                        rank: *rank,
                    };
                    if let Ok(Step::Blocked {
                        index,
                        slot,
                        target,
                        found,
                    }) = exec.step(&mut view)
                    {
                        waits.push((*rank, *channel, index, slot, target, found));
                    }
                }
                return Err(RuntimeError::Deadlock(waits));
            }
        }
        Ok(stats)
    }

    /// Every rank's output buffer.
    fn outputs(&self) -> Vec<Vec<u8>> {
        self.mem
            .ranks
            .iter()
            .map(|r| r.bufs[Buf::Output as usize].clone())
            .collect()
    }
}

/// Runs `req` under every policy, then twice on one runtime, checking each result.
fn check_case(req: Request, seed: u64) -> Result<(), Box<dyn Error>> {
    let name = format!(
        "{} {} w{} {} B {} ({} ch)",
        req.collective.name(),
        req.algorithm.name(),
        req.world,
        req.bytes,
        req.dtype.name(),
        req.channels
    );
    let inputs = host::random_inputs(&req, seed);
    let want = host::reference(&req, &inputs);
    let verify = |rt: &Runtime, how: &str| {
        host::compare(&req, &rt.outputs(), &want).map_err(|m| {
            format!(
                "{name} ({how}): rank {} element {} is {}, the reference says {}",
                m.rank, m.elem, m.found, m.want
            )
        })
    };
    let mut line = Vec::new();
    for policy in [Policy::UntilBlocked, Policy::OneOp, Policy::Random(seed)] {
        let mut rt = Runtime::new(req, &inputs)?;
        let stats = rt.run(policy)?;
        verify(&rt, &format!("{policy:?}"))?;
        line.push(format!("{:>5} turns", stats.turns));
        if let Policy::UntilBlocked = policy {
            line.insert(0, format!("{:>5} ops", stats.ops));
        }
    }
    // A second collective on the same memory, pads and counters: it starts where the first
    // left off. Outputs are overwritten with the same result.
    let mut rt = Runtime::new(req, &inputs)?;
    rt.run(Policy::UntilBlocked)?;
    rt.run(Policy::Random(seed + 1))?;
    verify(&rt, "second collective on the same pads")?;
    println!("{name:<40} {}   pass", line.join("  "));
    Ok(())
}

fn run() -> Result<(), Box<dyn Error>> {
    use Algorithm::*;
    use Collective::*;
    let small = |c, a, world, bytes, dtype| {
        Request::new(c, a, world, bytes, dtype, ReduceOp::Sum).with_pipeline(256, 2)
    };
    let cases = [
        small(AllReduce, Ring, 4, 4096 + 12, DType::F32).with_channels(2),
        small(AllReduce, Tree, 5, 2048, DType::Bf16),
        small(AllReduce, Rhd, 6, 1000, DType::I32),
        small(AllReduce, TwoShot, 3, 600, DType::F64).with_channels(2),
        small(ReduceScatter, Ring, 4, 512, DType::F32),
        small(AllGather, Direct, 3, 300, DType::U8),
        small(Broadcast { root: 2 }, Tree, 5, 1024, DType::F32),
        small(Reduce { root: 0 }, Tree, 4, 800, DType::I32),
        small(AllToAll, Pairwise, 4, 256, DType::F32),
        small(AllReduce, OneShotLl, 3, 1000, DType::Bf16),
    ];
    println!("one thread, plain memory, round-robin tasks; outputs checked against the reference");
    for (seed, req) in (1u64..).zip(cases) {
        check_case(req, seed)?;
    }

    // This runtime has no multicast: the fabric must refuse the first multicast op.
    let mc = small(AllReduce, Multicast, 4, 1024, DType::F32);
    let inputs = host::random_inputs(&mc, 99);
    match Runtime::new(mc, &inputs)?.run(Policy::UntilBlocked) {
        Err(RuntimeError::Exec {
            error:
                ExecError::Fabric {
                    error: FabricError::Multicast(kind),
                    index,
                },
            rank,
            channel,
        }) => println!(
            "all_reduce multicast: refused at rank {rank} channel {channel} op {index} ({kind})"
        ),
        other => {
            return Err(format!("a multicast all-reduce was not refused: {other:?}").into());
        }
    }
    println!("foreign-runtime: every case matches the reference");
    Ok(())
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("foreign-runtime: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

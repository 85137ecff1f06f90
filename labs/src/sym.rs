//! The symbolic run of hand-written op streams: the library's contribution-set memory
//! ([`SymWorld`]) driven by the generic executor, one stream per (rank, channel), under a seeded
//! interleaving.
//!
//! Unlike `symm_core::symbolic::check`, which runs the library's own schedules, this runs any
//! streams, keeps the op index of every failure for the words, follows a deadlock's chain of
//! waits, and records begin, end and stall events so that a failing run still has a trace.
//! Even seeds run bursts of one to eight ops per stream; odd seeds run each stream as far as it
//! can go, which overruns a missing credit or barrier.

use crate::problem::{op_words, Blocked, Problem};
use symm_core::exec::{ExecError, Executor, Fabric, LlPoll, Step};
use symm_core::op::{At, Op};
use symm_core::sched::Request;
use symm_core::symbolic::{Rng, SymError, SymWorld};
use symm_core::trace::{Event, EventKind};

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
    fn ll(&mut self, op: &Op, epoch: u64) -> Result<LlPoll, SymError> {
        let (poll, last) = self.world.ll(self.rank, op, epoch)?;
        self.last = last;
        Ok(poll)
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
            Op::Copy { .. }
            | Op::Reduce { .. }
            | Op::Signal { .. }
            | Op::Wait { .. }
            | Op::ReduceN { .. }
            | Op::LlPut { .. }
            | Op::LlReduce { .. }
            | Op::McReduce { .. }
            | Op::McStore { .. } => 0,
        })
        .fold(0u64, u64::saturating_add)
}

/// Runs the streams on contribution sets under the interleaving chosen by `seed`, with the
/// rule that nothing touches a rank after all its streams finished
/// ([`Problem::TouchAfterDone`]).
pub fn symbolic(req: &Request, streams: &[Vec<Op>], seed: u64, verify: bool) -> SymRun {
    symbolic_ruled(req, streams, seed, verify, true)
}

/// [`symbolic`], with the finished-rank rule only when `rules` is set: a case without the
/// labs' handshakes ([`crate::run::Case::without_handshake`]) checks its data alone.
pub fn symbolic_ruled(
    req: &Request,
    streams: &[Vec<Op>],
    seed: u64,
    verify: bool,
    rules: bool,
) -> SymRun {
    let mut events = Vec::new();
    let result = sym_inner(req, streams, seed, verify, rules, &mut events);
    SymRun { result, events }
}

fn sym_inner(
    req: &Request,
    streams: &[Vec<Op>],
    seed: u64,
    verify: bool,
    rules: bool,
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
    // Streams of each rank still running, and the ranks whose every stream finished.
    let mut left = vec![channels; req.world as usize];
    let mut done = vec![false; req.world as usize];
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
                        let late = finished_peer(req, &done, lane.rank, &op).filter(|_| rules);
                        if let Some(peer) = late {
                            return Err(Problem::TouchAfterDone {
                                rank: lane.rank,
                                index: index as usize,
                                op,
                                peer,
                            });
                        }
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
                        left[lane.rank as usize] -= 1;
                        if left[lane.rank as usize] == 0 {
                            done[lane.rank as usize] = true;
                        }
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

/// A finished peer whose buffers `op` of `rank` touches (checked after the op ran, so a touch
/// that races with the peer's end is seen under some interleaving).
fn finished_peer(req: &Request, done: &[bool], rank: u16, op: &Op) -> Option<u16> {
    op.footprint().ranges().iter().find_map(|r| match r.at {
        At::Rank(l) => {
            (l.rank != rank && done.get(l.rank as usize) == Some(&true)).then_some(l.rank)
        }
        At::Every(_) => (0..req.world).find(|&q| q != rank && done[q as usize]),
    })
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
            op_words(req, &op)
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

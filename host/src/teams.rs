//! Several team collectives at once on one host world.
//!
//! [`run_teams`] places every job's buffers one after another in each rank's input, output and
//! scratch buffers (the same offsets on every rank, as a symmetric allocator would), writes each
//! member's input at its job's offset, maps each job's schedule onto the world with
//! [`TeamMap`] (world ranks, slots re-keyed by team id, offsets moved to the job's buffers), and
//! runs every (job, rank, channel) stream over one [`WorldMem`]: deterministically on one thread
//! ([`TeamMode::Simulate`]) or with one OS thread per stream ([`TeamMode::Threads`]). Each job's
//! outputs come back in its team's local-rank order.

use crate::sync::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use symm_core::exec::{Executor, Step};
use symm_core::op::{Buf, Loc, Op};
use symm_core::sched::{Request, Schedule};
use symm_core::signal::{SlotLayout, KINDS};
use symm_core::team::{Team, TeamMap};
use symm_core::trace::{Event, EventKind, Header, Source, TeamTag};

use super::mem::{Oob, RankFabric, Temps, WorldMem};
use super::sim::check_inputs;
use super::{exec_error, HostError, POISON};

/// One team collective.
#[derive(Clone, Debug)]
pub struct TeamJob {
    /// The team.
    pub team: Team,
    /// The request (`world` is the team's size).
    pub request: Request,
    /// One input per member, in local-rank order.
    pub inputs: Vec<Vec<u8>>,
}

/// How [`run_teams`] drives the streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TeamMode {
    /// One thread, every stream in turn (a deadlock is reported, not waited out).
    Simulate,
    /// One thread per stream; a wait blocked longer than the deadline fails the run.
    Threads(Duration),
}

/// A stream: (job, world rank, channel, ops mapped onto the world, the team's own ops, local
/// rank).
type Stream = (usize, u16, u16, Vec<Op>, Vec<Op>, u16);

/// Each job's outputs (one per member, in local-rank order).
pub type TeamOutputs = Vec<Vec<Vec<u8>>>;

/// Runs every job at once on a world of `world` ranks; returns each job's outputs.
pub fn run_teams(world: u16, jobs: &[TeamJob], mode: TeamMode) -> Result<TeamOutputs, HostError> {
    run_teams_traced(world, jobs, mode, false).map(|(o, _)| o)
}

/// [`run_teams`], and with `trace` in [`TeamMode::Simulate`] one trace per job: the job's events
/// in its team's local ranks and ops, on the run's common virtual clock (one unit per step), its
/// header naming the team ([`TeamTag`]). No traces are written in [`TeamMode::Threads`].
pub fn run_teams_traced(
    world: u16,
    jobs: &[TeamJob],
    mode: TeamMode,
    trace: bool,
) -> Result<(TeamOutputs, Vec<Vec<u8>>), HostError> {
    run_teams_within(world, jobs, mode, trace, crate::MAX_HOST_OPS)
}

/// [`run_teams_traced`], refused with [`HostError::TooManyOps`] when the jobs' streams hold
/// more than `max_ops` ops in all.
pub(crate) fn run_teams_within(
    world: u16,
    jobs: &[TeamJob],
    mode: TeamMode,
    trace: bool,
    max_ops: u64,
) -> Result<(TeamOutputs, Vec<Vec<u8>>), HostError> {
    // Pads hold every id in use; ids are bounded as on a GPU communicator, so a hostile id cannot
    // size the pads.
    let teams = jobs
        .iter()
        .map(|j| j.team.id().saturating_add(1))
        .max()
        .unwrap_or(1);
    if teams > symm_core::team::MAX_TEAMS {
        return Err(HostError::Team(symm_core::team::TeamError::NoSlots {
            id: teams - 1,
        }));
    }
    let channels = jobs.iter().map(|j| j.request.channels).max().unwrap_or(1);
    let mut room = max_ops;
    let outer = SlotLayout::new(teams, channels, world).map_err(|_| HostError::BadWorld {
        expected: world,
        found: 0,
    })?;
    // Buffers of job j start at bases[j] in every rank's input, output and scratch.
    let mut bases = Vec::with_capacity(jobs.len());
    let mut total = [0u64; 3];
    for j in jobs {
        if j.team.world_size() != world {
            return Err(HostError::Team(
                symm_core::team::TeamError::RankOutOfWorld {
                    rank: j.team.world_size(),
                    world,
                },
            ));
        }
        check_inputs(&j.request, &j.inputs)?;
        let s = j.request.buffer_sizes();
        bases.push(total);
        for (t, n) in total.iter_mut().zip([s.input, s.output, s.scratch]) {
            *t = t.saturating_add(n.div_ceil(16) * 16);
        }
    }
    let mem = WorldMem::blank(world, total, outer.slots(), POISON)?;
    let mut streams: Vec<Stream> = Vec::new();
    for (ji, j) in jobs.iter().enumerate() {
        for (local, inp) in j.inputs.iter().enumerate() {
            let rank = j.team.global(local as u16).ok_or(HostError::BadWorld {
                expected: j.team.size(),
                found: j.inputs.len(),
            })?;
            mem.write_at(Loc::new(rank, Buf::Input, bases[ji][0]), inp)
                .map_err(|Oob(loc)| HostError::OutOfBounds {
                    rank,
                    channel: 0,
                    index: 0,
                    loc,
                })?;
        }
        let map = TeamMap::new(&j.team, &j.request, outer, bases[ji]).map_err(HostError::Team)?;
        for local in 0..j.request.world {
            let rank = j.team.global(local).unwrap_or(u16::MAX);
            for c in 0..j.request.channels {
                // Every stream's ops are held (twice) for the run: at most `max_ops` in all.
                let own: Vec<Op> = Schedule::new(j.request, local, c)
                    .map_err(HostError::Sched)?
                    .take(
                        usize::try_from(room)
                            .unwrap_or(usize::MAX)
                            .saturating_add(1),
                    )
                    .collect();
                room = room
                    .checked_sub(own.len() as u64)
                    .ok_or(HostError::TooManyOps { limit: max_ops })?;
                let ops = own
                    .iter()
                    .map(|&op| map.op(op))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(HostError::Team)?;
                streams.push((ji, rank, c, ops, own, local));
            }
        }
    }
    // A (team, channel)'s slots are one contiguous window of the world's layout: each stream's
    // executor counts only its window (memory per stream: KINDS * world counters).
    let len = KINDS * outer.world as u32;
    let windows: Vec<(u32, usize)> = streams
        .iter()
        .map(|(ji, _, c, ..)| {
            let id = jobs[*ji].team.id() as u32;
            (
                ((id * outer.channels as u32) + *c as u32) * len,
                len as usize,
            )
        })
        .collect();
    let mut traces = Vec::new();
    match mode {
        TeamMode::Simulate => {
            let mut events: Vec<Vec<Event>> = vec![Vec::new(); jobs.len()];
            simulate(&mem, &streams, &windows, trace.then_some(&mut events))?;
            if trace {
                for (j, mut ev) in jobs.iter().zip(events) {
                    traces.push(team_trace(j, &mut ev)?);
                }
            }
        }
        TeamMode::Threads(deadline) => {
            let teams: Vec<&Team> = streams.iter().map(|s| &jobs[s.0].team).collect();
            threads(&mem, &streams, &windows, &teams, deadline, &outer)?
        }
    }
    let outputs = jobs
        .iter()
        .enumerate()
        .map(|(ji, j)| {
            let n = j.request.buffer_sizes().output as usize;
            let at = bases[ji][1] as usize;
            j.team
                .members()
                .iter()
                .map(|&r| mem.output(r as usize)[at..at + n].to_vec())
                .collect()
        })
        .collect();
    Ok((outputs, traces))
}

/// Encodes one job's events (world ranks and mapped ops turned back into the team's local ranks
/// and its own ops) with a header that names the team.
fn team_trace(j: &TeamJob, events: &mut [Event]) -> Result<Vec<u8>, HostError> {
    let too_large = HostError::Trace(symm_core::trace::TraceError::TooLarge);
    let header = Header {
        world: j.request.world,
        channels: j.request.channels,
        request: j.request,
        source: Source::Host { simulated: true },
        time_unit_ns: 1,
        team: Some(TeamTag::of(&j.team).ok_or(too_large)?),
    };
    symm_core::trace::encode(&header, events).map_err(HostError::Trace)
}

fn simulate(
    mem: &WorldMem,
    streams: &[Stream],
    windows: &[(u32, usize)],
    mut events: Option<&mut Vec<Vec<Event>>>,
) -> Result<(), HostError> {
    let mut expected: Vec<Vec<u64>> = windows.iter().map(|&(_, n)| vec![0u64; n]).collect();
    let mut execs: Vec<_> = streams
        .iter()
        .zip(expected.iter_mut())
        .zip(windows)
        .map(|((s, e), &(base, _))| (s, Executor::at(s.3.iter().copied(), e, base), false))
        .collect();
    let mut temps = Temps::default();
    let mut live = execs.len();
    let mut tick = 0u64;
    while live > 0 {
        let mut progressed = false;
        let mut blocked = None;
        for ((job, rank, channel, _, own, local), ex, done) in execs.iter_mut() {
            if *done {
                continue;
            }
            let mut view = RankFabric::new(mem, *rank, &mut temps);
            for _ in 0..64 {
                match ex
                    .step(&mut view)
                    .map_err(|e| exec_error(*rank, *channel, e))?
                {
                    Step::Ran { index, .. } => {
                        progressed = true;
                        if let (Some(ev), Some(&op)) =
                            (events.as_deref_mut(), own.get(index as usize))
                        {
                            let e = |time, kind| Event {
                                time,
                                rank: *local,
                                channel: *channel,
                                index,
                                kind,
                                op,
                                contents: None,
                            };
                            ev[*job].push(e(tick, EventKind::Begin));
                            ev[*job].push(e(tick + 1, EventKind::End));
                        }
                        tick += 1;
                    }
                    Step::Blocked {
                        index,
                        slot,
                        target,
                        found,
                    } => {
                        blocked.get_or_insert(HostError::Deadlock {
                            rank: *rank,
                            channel: *channel,
                            index,
                            slot,
                            target,
                            found,
                        });
                        break;
                    }
                    Step::Done => {
                        *done = true;
                        live -= 1;
                        progressed = true;
                        break;
                    }
                }
            }
        }
        if !progressed {
            if let Some(e) = blocked {
                return Err(e);
            }
        }
    }
    Ok(())
}

fn threads(
    mem: &WorldMem,
    streams: &[Stream],
    windows: &[(u32, usize)],
    teams: &[&Team],
    deadline: Duration,
    outer: &SlotLayout,
) -> Result<(), HostError> {
    let abort = AtomicBool::new(false);
    let items: Vec<_> = streams.iter().zip(windows).zip(teams).collect();
    let results = crate::threads::on_threads(
        items,
        &abort,
        |(((_, rank, channel, ops, ..), &window), &team)| {
            one(
                mem,
                (*rank, *channel),
                ops,
                window,
                team,
                deadline,
                &abort,
                outer,
            )
        },
    )?;
    results.into_iter().collect()
}

#[allow(clippy::too_many_arguments)]
fn one(
    mem: &WorldMem,
    (rank, channel): (u16, u16),
    ops: &[Op],
    (base, len): (u32, usize),
    team: &Team,
    deadline: Duration,
    abort: &AtomicBool,
    outer: &SlotLayout,
) -> Result<(), HostError> {
    let mut expected = vec![0u64; len];
    let mut ex = Executor::at(ops.iter().copied(), &mut expected, base);
    let mut temps = Temps::default();
    let mut view = RankFabric::new(mem, rank, &mut temps);
    let mut since: Option<Instant> = None;
    let mut spins = 0u32;
    loop {
        match ex
            .step(&mut view)
            .map_err(|e| exec_error(rank, channel, e))?
        {
            Step::Done => return Ok(()),
            Step::Ran { .. } => {
                since = None;
                spins = 0;
            }
            Step::Blocked {
                index,
                slot,
                target,
                found,
            } => {
                if abort.load(Ordering::Relaxed) {
                    return Ok(());
                }
                if since.get_or_insert_with(Instant::now).elapsed() > deadline {
                    return Err(HostError::Timeout {
                        rank,
                        channel,
                        index,
                        // The slot names the signalling peer by its local rank in the team.
                        peer: outer
                            .key(slot)
                            .and_then(|k| team.global(k.peer))
                            .unwrap_or(u16::MAX),
                        slot,
                        expected: target,
                        found,
                    });
                }
                spins += 1;
                if spins < 64 {
                    std::hint::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
        }
    }
}

//! The symbolic checker for team collectives running at the same time on one world.
//!
//! [`check_teams`] builds every job's schedule in the team's local ranks, maps each op onto the
//! world with [`TeamMap`] (world ranks, slots re-keyed by team id), and runs all (job, rank,
//! channel) streams under one seeded random interleaving. Signals and waits go to one set of
//! world pads shared by every job, so a slot two teams share would let one team's wait pass on
//! the other's signal; data ops are mapped back to the job's local ranks and applied to that
//! job's symbolic memory, where an early read is `ReadUnwritten` and a wrong result `Wrong`.
//! At the end every job's outputs must match its collective, and every world slot must equal the
//! sum of the counters its owner's executors expected.

use alloc::vec;
use alloc::vec::Vec;

use super::{Team, TeamMap};
use crate::exec::{Executor, Fabric, LlPoll};
use crate::op::{Loc, Op};
use crate::sched::{Request, Schedule};
use crate::signal::{apply, SlotLayout};
use crate::symbolic::{deadlock, interleave, stepped, Report, SymError, SymWorld};

/// One team collective of a [`check_teams`] run.
pub struct Job {
    /// The team.
    pub team: Team,
    /// Its request (`world` is the team's size).
    pub request: Request,
}

/// The world's slot layout that holds every job's team id and channels.
pub fn layout(world: u16, jobs: &[Job]) -> Result<SlotLayout, SymError> {
    let teams = jobs
        .iter()
        .map(|j| j.team.id().saturating_add(1))
        .max()
        .unwrap_or(1);
    if teams > super::MAX_TEAMS {
        return Err(SymError::Team(super::TeamError::NoSlots { id: teams - 1 }));
    }
    let channels = jobs.iter().map(|j| j.request.channels).max().unwrap_or(1);
    SlotLayout::new(teams, channels, world).map_err(|_| SymError::WorldTooLarge)
}

struct View<'a> {
    job: &'a Team,
    mem: &'a mut SymWorld,
    pads: &'a mut [Vec<u64>],
    rank: u16,
    local: u16,
}

impl View<'_> {
    fn unmap(&self, l: Loc) -> Result<Loc, SymError> {
        let rank = self.job.local(l.rank).ok_or(SymError::OutOfBounds {
            rank: self.rank,
            loc: l,
        })?;
        Ok(Loc { rank, ..l })
    }
}

impl Fabric for View<'_> {
    type Error = SymError;
    fn execute(&mut self, op: &Op) -> Result<(), SymError> {
        match *op {
            Op::Signal {
                peer,
                slot,
                op,
                value,
            } => {
                let s = self
                    .pads
                    .get_mut(peer as usize)
                    .and_then(|p| p.get_mut(slot as usize))
                    .ok_or(SymError::BadSlot {
                        rank: self.rank,
                        slot,
                    })?;
                *s = apply(op, *s, value);
                Ok(())
            }
            Op::Wait { .. } => Ok(()),
            Op::McReduce { .. } | Op::McStore { .. } => {
                Err(SymError::Team(super::TeamError::Multicast))
            }
            Op::LlPut { .. } | Op::LlReduce { .. } => Err(SymError::OutOfBounds {
                rank: self.rank,
                loc: crate::op::Loc::new(self.rank, crate::op::Buf::Scratch, 0),
            }),
            Op::Copy { .. } | Op::Reduce { .. } | Op::ReduceN { .. } => {
                let local = op.map_locs(|l| self.unmap(l))?;
                self.mem.apply(self.local, &local).map(|_| ())
            }
        }
    }
    fn load_slot(&mut self, slot: u32) -> Result<u64, SymError> {
        self.pads[self.rank as usize]
            .get(slot as usize)
            .copied()
            .ok_or(SymError::BadSlot {
                rank: self.rank,
                slot,
            })
    }
    fn ll(&mut self, op: &Op, epoch: u64) -> Result<LlPoll, SymError> {
        let local = op.map_locs(|l| self.unmap(l))?;
        self.mem.ll(self.local, &local, epoch).map(|(p, _)| p)
    }
}

/// Runs every job at once on a world of `world` ranks under the interleaving chosen by `seed`.
pub fn check_teams(world: u16, jobs: &[Job], seed: u64) -> Result<Report, SymError> {
    let outer = layout(world, jobs)?;
    let slots = outer.slots() as usize;
    let mut mems = Vec::with_capacity(jobs.len());
    let mut maps = Vec::with_capacity(jobs.len());
    for j in jobs {
        if j.team.world_size() != world {
            return Err(SymError::Team(super::TeamError::RankOutOfWorld {
                rank: j.team.world_size(),
                world,
            }));
        }
        mems.push(SymWorld::new(&j.request)?);
        maps.push(TeamMap::new(&j.team, &j.request, outer, [0; 3]).map_err(SymError::Team)?);
    }
    // Ops are mapped ahead (a mapping error is reported before anything runs).
    let mut streams: Vec<(usize, u16, u16, u16, Vec<Op>)> = Vec::new();
    for (ji, j) in jobs.iter().enumerate() {
        for local in 0..j.request.world {
            for c in 0..j.request.channels {
                let s = Schedule::new(j.request, local, c).map_err(SymError::Sched)?;
                let ops = s
                    .map(|op| maps[ji].op(op))
                    .collect::<Result<Vec<Op>, _>>()
                    .map_err(SymError::Team)?;
                let rank = j
                    .team
                    .global(local)
                    .ok_or(SymError::Team(super::TeamError::OpOutOfTeam))?;
                streams.push((ji, rank, local, c, ops));
            }
        }
    }
    let mut pads = vec![vec![0u64; slots]; world as usize];
    // A (team, channel)'s slots are one window of the world's layout: each stream's executor
    // counts only its window.
    let len = crate::signal::KINDS * outer.world as u32;
    let window = |ji: usize, c: u16| {
        let id = jobs[ji].team.id() as u32;
        ((id * outer.channels as u32) + c as u32) * len
    };
    let mut expected: Vec<Vec<u64>> = vec![vec![0; len as usize]; streams.len()];
    let mut execs: Vec<_> = streams
        .iter()
        .zip(expected.iter_mut())
        .map(|((ji, rank, local, c, ops), e)| {
            (
                *ji,
                *rank,
                *local,
                *c,
                Executor::at(ops.iter().copied(), e, window(*ji, *c)),
            )
        })
        .collect();
    let ran = interleave(execs.len(), seed, |i| {
        let (ji, rank, local, _, ex) = &mut execs[i];
        let mut view = View {
            job: &jobs[*ji].team,
            mem: &mut mems[*ji],
            pads: &mut pads,
            rank: *rank,
            local: *local,
        };
        stepped(*rank, ex.step(&mut view))
    })?;
    let report = match ran {
        Ok(ops) => Report { ops },
        Err(i) => {
            let (_, rank, _, channel, ex) = &mut execs[i];
            return Err(deadlock(*rank, *channel, ex.peek()));
        }
    };
    drop(execs);
    for m in &mems {
        m.verify()?;
    }
    // What each rank's executors expected, slot by slot.
    let mut wants = vec![vec![0u64; slots]; world as usize];
    for ((ji, rank, _, c, _), e) in streams.iter().zip(&expected) {
        let base = window(*ji, *c) as usize;
        for (w, &x) in wants[*rank as usize][base..base + e.len()]
            .iter_mut()
            .zip(e)
        {
            *w = w.saturating_add(x);
        }
    }
    for (rank, (pad, want)) in pads.iter().zip(&wants).enumerate() {
        for (slot, (&value, &want)) in pad.iter().zip(want).enumerate() {
            if value != want {
                return Err(SymError::Unbalanced {
                    rank: rank as u16,
                    slot: slot as u32,
                    pad: value,
                    expected: want,
                });
            }
        }
    }
    Ok(report)
}

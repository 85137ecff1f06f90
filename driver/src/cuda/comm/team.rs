//! Teams of a [`Comm`]: [`CommTeam::split`] (as `ncclCommSplit`) and
//! [`CommTeam::split_strided`] (as
//! `nvshmem_team_split_strided`).
//!
//! A split is collective over the whole job: every rank calls it, with its colour and key (or
//! the same stride description), and the split's teams take the next team id (1, 2, ... up to
//! [`MAX_TEAMS`] - 1), so every member of a team agrees on its id. Each split also reserves a
//! region of the heap (`heap_bytes`, the same offset on every rank, checked like any symmetric
//! allocation): the team's buffers come from that region, on its members' heaps. The region
//! stays reserved for the life of the Comm.
//!
//! A team collective is a request whose `world` is the team's size. Its plan is the team's
//! schedule in local ranks mapped onto the job by [`TeamMap`]: peers become job ranks, slots
//! move to the team id's part of the pad (which the Comm sizes for [`MAX_TEAMS`] ids), so
//! teams' collectives and the job's own can be in flight at the same time. Plans live in the
//! Comm's cache and are admitted like the job's ([`CommTeam::admit`]); buffers are checked
//! against the team's region before every launch.
//!
//! Team allocation is collective over the team's members: after every team alloc and free the
//! members compare their team allocators through a mailbox at the start of the region
//! (`agree.rs`), and a divergence names the first differing call on both sides, as with the
//! job's own allocations.

use std::sync::Mutex;

use symm_core::heap::Heap;
use symm_core::sched::{BufferSizes, Request, Schedule, MAX_CHANNELS};
use symm_core::signal::SlotLayout;
use symm_core::team::{Team, TeamError, TeamMap, MAX_TEAMS};

use super::{agree, Admitted, Comm};
use crate::cuda::bounds::{self as guard, Buffers};
use crate::cuda::device::Stream;
use crate::cuda::error::{CudaError, Result};
use crate::cuda::plan::RankPlan;

/// One team of a [`Comm`], as this rank sees it.
pub struct CommTeam<'c> {
    comm: &'c Comm,
    team: Team,
    me: u16,
    /// Where buffers go, `[lo, hi)` heap offsets (after the mailbox).
    region: (u64, u64),
    /// The agreement mailbox at the start of the reserved span (`agree::MAILBOX` bytes).
    mailbox: u64,
    alloc: Mutex<TeamHeap>,
}

/// A team's allocator and how many agreements its members have made.
struct TeamHeap {
    heap: Heap,
    agreed: u64,
}

fn team_err(e: TeamError) -> CudaError {
    CudaError::Team(e)
}

/// Every rank's (colour, key) from its split message (colour, key, the team id it expects), all
/// little endian; refused when malformed or when a rank expects another id.
pub(crate) fn split_entries(all: &[Vec<u8>], next: u16) -> Result<Vec<(i32, i32)>> {
    all.iter()
        .enumerate()
        .map(|(r, v)| {
            let w = |i: usize| {
                v.get(i..i + 4)
                    .and_then(|b| b.try_into().ok())
                    .map(i32::from_le_bytes)
            };
            match (w(0), w(4), v.get(8..10), v.len()) {
                (Some(c), Some(k), Some(id), 10) if id == next.to_le_bytes() => Ok((c, k)),
                (Some(_), Some(_), Some(_), 10) => Err(CudaError::Disagree {
                    what: "split (team id; a rank missed a split)",
                    rank: Some(u16::try_from(r).unwrap_or(u16::MAX)),
                }),
                _ => Err(CudaError::Malformed {
                    rank: u16::try_from(r).unwrap_or(u16::MAX),
                    what: "split entry",
                }),
            }
        })
        .collect()
}

impl Comm {
    /// The pad layout of every team id (what team plans are mapped onto).
    fn team_layout(&self) -> Result<SlotLayout> {
        SlotLayout::new(MAX_TEAMS, MAX_CHANNELS, self.job.world).map_err(CudaError::Signal)
    }

    /// The id the next split will take.
    fn peek_team(&self) -> Result<u16> {
        Ok(self.alloc_lock()?.next_team)
    }

    /// Collective: takes the next team id and reserves `heap_bytes` of the heap for the split.
    fn begin_split(&self, heap_bytes: u64) -> Result<(u16, u64)> {
        let _g = self.enter()?;
        let id = {
            let mut a = self.alloc_lock()?;
            if a.next_team >= MAX_TEAMS {
                return Err(team_err(TeamError::NoSlots { id: a.next_team }));
            }
            a.next_team += 1;
            a.next_team - 1
        };
        let span = heap_bytes
            .max(4096)
            .checked_add(agree::MAILBOX)
            .ok_or(CudaError::Overflow {
                what: "team heap size",
            })?;
        let off = {
            let mut a = self.alloc_lock()?;
            let off = a.heap.alloc(span, 4096).map_err(CudaError::Heap)? + self.data_off;
            a.regions.push(off);
            off
        };
        // Low-latency lines another team left in this memory carry that team's epochs, which
        // this team's may repeat: the region starts zeroed (no flag is 0), before the agreement,
        // so no member writes into it first (symm_core::ll).
        self.heap_fill(off, span, 0)?;
        self.agree()?;
        Ok((id, off))
    }

    /// A device timeout on a team's slot names the signalling peer by its local rank (the
    /// record takes it from the slot): this names it by its job rank.
    pub(super) fn team_peer(&self, e: CudaError) -> CudaError {
        let CudaError::Timeout {
            rank,
            peer,
            slot,
            channel,
            expected,
            found,
            op_index,
        } = e
        else {
            return e;
        };
        let key = self.team_layout().ok().and_then(|l| l.key(slot));
        let global = key.filter(|k| k.team != 0).and_then(|k| {
            let a = self.alloc.lock().ok()?;
            a.teams.get(&k.team)?.global(k.peer)
        });
        CudaError::Timeout {
            rank,
            peer: global.unwrap_or(peer),
            slot,
            channel,
            expected,
            found,
            op_index,
        }
    }

    fn team_of(&self, team: Option<Team>, off: u64, heap_bytes: u64) -> Option<CommTeam<'_>> {
        let team = team?;
        let me = team.local(self.job.rank)?;
        if let Ok(mut a) = self.alloc.lock() {
            a.teams.insert(team.id(), team.clone());
        }
        let len = heap_bytes.max(4096);
        let lo = off + agree::MAILBOX;
        Some(CommTeam {
            comm: self,
            team,
            me,
            region: (lo, lo + len),
            mailbox: off,
            alloc: Mutex::new(TeamHeap {
                heap: Heap::new(len),
                agreed: 0,
            }),
        })
    }
}

impl<'c> CommTeam<'c> {
    /// Collective: splits the job by `color` (ranks of one colour form a team, ordered by `key`
    /// then job rank; a negative colour joins no team) and reserves `heap_bytes` per rank for
    /// the teams' buffers. Returns this rank's team, `None` for a negative colour.
    pub fn split(comm: &'c Comm, color: i32, key: i32, heap_bytes: u64) -> Result<Option<Self>> {
        comm.live()?;
        let next = comm.peek_team()?;
        let mine: Vec<u8> = color
            .to_le_bytes()
            .into_iter()
            .chain(key.to_le_bytes())
            .chain(next.to_le_bytes())
            .collect();
        let colors = split_entries(&comm.exchange(&mine)?, next)?;
        let (id, off) = comm.begin_split(heap_bytes)?;
        let team = Team::split(id, &colors, comm.job.rank).map_err(team_err)?;
        Ok(comm.team_of(team, off, heap_bytes))
    }

    /// Collective: the team of ranks `start, start + stride, ...` (`size` of them), as
    /// `nvshmem_team_split_strided`; every rank calls it with the same arguments and gets the
    /// team when it is a member. Reserves `heap_bytes` per rank for the team's buffers.
    pub fn split_strided(
        comm: &'c Comm,
        start: u16,
        stride: u16,
        size: u16,
        heap_bytes: u64,
    ) -> Result<Option<Self>> {
        comm.live()?;
        let desc: Vec<u8> = [start, stride, size, comm.peek_team()?]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        if comm.exchange(&desc)?.iter().any(|d| *d != desc) {
            return Err(CudaError::Disagree {
                what: "split_strided (start, stride, size, team counter)",
                rank: None,
            });
        }
        let (id, off) = comm.begin_split(heap_bytes)?;
        let team = Team::strided(id, comm.job.world, start, stride, size).map_err(team_err)?;
        Ok(comm.team_of(Some(team), off, heap_bytes))
    }

    /// The team (members in local-rank order, id).
    pub fn team(&self) -> &Team {
        &self.team
    }

    /// This rank's local rank in the team.
    pub fn rank(&self) -> u16 {
        self.me
    }

    /// Ranks in the team.
    pub fn size(&self) -> u16 {
        self.team.size()
    }

    /// The communicator.
    pub fn comm(&self) -> &'c Comm {
        self.comm
    }

    /// Team-collective: places buffers for `req` in the team's region, at the same offsets on
    /// every member.
    pub fn alloc(&self, req: &Request) -> Result<Buffers> {
        self.alloc_sizes(req.buffer_sizes())
    }

    /// Team-collective: places buffers of the given sizes in the team's region, at the same
    /// offsets on every member (compared across the members: a divergence is an error naming
    /// the first differing call).
    pub fn alloc_sizes(&self, sizes: BufferSizes) -> Result<Buffers> {
        let _g = self.comm.enter()?;
        let mut h = self.heap_lock()?;
        let b = guard::place(&mut h.heap, sizes, self.region.0)?;
        self.agree(&mut h)?;
        Ok(b)
    }

    fn heap_lock(&self) -> Result<std::sync::MutexGuard<'_, TeamHeap>> {
        self.alloc
            .lock()
            .map_err(|_| CudaError::LockPoisoned { what: "team heap" })
    }

    /// Compares the team allocators of every member (after an alloc or a free).
    fn agree(&self, h: &mut TeamHeap) -> Result<()> {
        h.agreed += 1;
        self.comm
            .agree_team(&self.team, self.mailbox, h.agreed, &h.heap)
    }

    /// Team-collective: returns buffers to the team's region once this rank's device is idle.
    pub fn free(&self, b: &Buffers) -> Result<()> {
        let _g = self.comm.enter_any()?;
        self.comm.check_unpinned(b)?;
        self.comm.sync_device()?;
        // Held until the buffers are back in the region: no capture pins them meanwhile.
        let alloc = self.comm.alloc_lock()?;
        super::capture::check_unpinned_in(&alloc.pins, b)?;
        let mut h = self.heap_lock()?;
        // Every offset is checked before any is freed: a bad set frees nothing.
        crate::cuda::bounds::unplace(&mut h.heap, b, self.region.0, &[])?;
        drop(alloc);
        self.agree(&mut h)
    }

    /// This rank's plan of the team request `req`, mapped onto the job (not yet validated).
    fn host_plan(&self, req: &Request) -> Result<RankPlan> {
        let outer = self.comm.team_layout()?;
        let map = TeamMap::new(&self.team, req, outer, [0; 3]).map_err(team_err)?;
        RankPlan::collect(req.channels, |c| {
            Schedule::new(*req, self.me, c)
                .map(|s| s.map(|op| map.op(op).map_err(team_err)))
                .map_err(CudaError::Sched)
        })
    }

    /// Fails unless `req` is a valid request of this team.
    fn check_shape(&self, req: &Request) -> Result<()> {
        if req.world != self.team.size() {
            return Err(team_err(TeamError::SizeMismatch {
                request: req.world,
                team: self.team.size(),
            }));
        }
        // Validation and the job's mode, as the job's own requests.
        self.comm.check_shape(req, req.world)
    }

    /// Admits the team request `req` ([`Comm::admit`] for the team: its plan mapped onto the
    /// job, its buffers in the team's region); launch it with [`Comm::launch`].
    pub fn admit(&self, req: &Request) -> Result<Admitted> {
        let _g = self.comm.enter()?;
        self.admit_at(req, false)
    }

    /// Admits `req` (checked here), its plan compiled now when `now`.
    fn admit_at(&self, req: &Request, now: bool) -> Result<Admitted> {
        let key = (self.team.id(), *req);
        if !now {
            if let Some(a) = self.comm.cached_admission(&key)? {
                return Ok(a);
            }
        }
        self.check_shape(req)?;
        self.comm
            .admit_checked(key, self.region, now, || self.host_plan(req))
    }

    /// The admission of `req` when its plan exists (what a capture may launch).
    pub(super) fn admit_prepared(&self, req: &Request) -> Result<Admitted> {
        let key = (self.team.id(), *req);
        if let Some(a) = self.comm.cached_admission(&key)? {
            return Ok(a);
        }
        self.comm.prepared(key)?;
        self.admit_at(req, false)
    }

    /// Admits `reqs` now, the kernels of those that run compiled compiled first on several
    /// threads ([`Comm::prepare`]). Not collective.
    pub fn prepare(&self, reqs: &[Request]) -> Result<()> {
        let _g = self.comm.enter_any()?;
        if reqs.len() > 1 {
            self.comm.compile_ahead(reqs, |r| self.host_plan(r).ok());
        }
        for r in reqs {
            self.admit_at(r, true)?;
        }
        Ok(())
    }

    /// Enqueues this rank's part of the team collective `req` over `b` (buffers of the team's
    /// region) on `stream`, without host synchronisation, like [`Comm::enqueue`]. Every member
    /// enqueues the same team requests in the same order.
    pub fn enqueue(&self, req: &Request, b: &Buffers, stream: &Stream) -> Result<()> {
        let _g = self.comm.enter_on(stream)?;
        self.comm
            .enqueue_entered((self.team.id(), *req), b, stream, |comm| {
                self.check_shape(req)?;
                guard::check_buffers(b, &req.buffer_sizes(), self.region.0, self.region.1)?;
                comm.admit_checked((self.team.id(), *req), self.region, false, || {
                    self.host_plan(req)
                })
            })
    }

    /// Enqueues `req`, waits for `stream` and checks for errors.
    pub fn run(&self, req: &Request, b: &Buffers, stream: &Stream) -> Result<()> {
        self.enqueue(req, b, stream)?;
        self.comm.synchronize(stream)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(c: i32, k: i32, id: u16) -> Vec<u8> {
        c.to_le_bytes()
            .into_iter()
            .chain(k.to_le_bytes())
            .chain(id.to_le_bytes())
            .collect()
    }

    #[test]
    fn hostile_split_entries_are_refused() {
        let good = split_entries(&[entry(0, 5, 1), entry(-1, 0, 1)], 1).unwrap();
        assert_eq!(good, vec![(0, 5), (-1, 0)]);
        let mut long = entry(0, 0, 1);
        long.push(0);
        for bad in [vec![], vec![0; 9], long] {
            let r = split_entries(&[entry(0, 0, 1), bad.clone()], 1);
            assert!(
                matches!(
                    r,
                    Err(CudaError::Malformed {
                        rank: 1,
                        what: "split entry"
                    })
                ),
                "{bad:?}"
            );
        }
        // Well formed, but expecting another team id: rank 1 missed a split.
        let r = split_entries(&[entry(0, 0, 1), entry(0, 0, 2)], 1);
        assert!(
            matches!(r, Err(CudaError::Disagree { rank: Some(1), .. })),
            "{r:?}"
        );
    }
}

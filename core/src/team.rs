//! Teams: collectives over a subset of a world's ranks, beside other teams' collectives.
//!
//! A [`Team`] is an ordered list of distinct world ranks (its members; member `i` is the team's
//! local rank `i`) and an id. A team collective is an ordinary [`Request`] whose `world` is the
//! team's size: its schedule is built, checked and costed exactly like a world's, in local ranks.
//! [`TeamMap`] turns each op of that schedule into an op on the world:
//!
//! * a location's or signal's rank `i` becomes `members[i]`;
//! * a slot keyed (team 0, channel, kind, peer) in the request's own layout is re-keyed to (team
//!   `id`, channel, kind, peer) in the world's layout, whose `teams` and `channels` leave room
//!   for every team: two teams with different ids never touch the same slot of any rank, so their
//!   collectives can run at the same time on shared ranks;
//! * buffer offsets move by per-buffer bases, for a backend that places several teams' buffers in
//!   one buffer of a rank (the host backends; on a GPU each launch names its buffers instead).
//!
//! Teams come from [`Team::split`] (as `ncclCommSplit`: every rank gives a colour and a key; the
//! ranks of one colour form a team ordered by key, then world rank; a negative colour is no team)
//! or [`Team::strided`] (as `nvshmem_team_split_strided`). Id 0 is the world itself: split teams
//! take ids from 1, and every rank must give the same id to the same team, which a split over
//! the whole world guarantees when ids count the splits.

use heapless::Vec as HVec;

use crate::op::{Loc, Op};
use crate::sched::{Request, MAX_WORLD};
use crate::signal::SlotLayout;

/// Team ids a GPU communicator's signal pad has room for (id 0, the world, included).
pub const MAX_TEAMS: u16 = 8;

/// Why a team could not be formed or mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TeamError {
    /// A member is not a rank of the world.
    RankOutOfWorld {
        /// The rank.
        rank: u16,
        /// The world's size.
        world: u16,
    },
    /// A rank appears twice.
    Duplicate {
        /// The rank.
        rank: u16,
    },
    /// No members.
    Empty,
    /// A strided team's stride is zero for more than one member.
    BadStride,
    /// The request's world is not the team's size.
    SizeMismatch {
        /// The request's world.
        request: u16,
        /// The team's size.
        team: u16,
    },
    /// The team's id, or the request's channels, do not fit the world's slot layout.
    NoSlots {
        /// The team's id.
        id: u16,
    },
    /// An op names a local rank outside the team, or a slot outside the request's layout.
    OpOutOfTeam,
    /// Multicast ops address every rank of the world: not on a team.
    Multicast,
    /// A split's colour list does not have one entry per rank.
    BadSplit,
}

impl core::fmt::Display for TeamError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            TeamError::RankOutOfWorld { rank, world } => {
                write!(f, "rank {rank} is not in a world of {world}")
            }
            TeamError::Duplicate { rank } => write!(f, "rank {rank} appears twice"),
            TeamError::Empty => write!(f, "a team needs at least one rank"),
            TeamError::BadStride => write!(f, "stride 0 with more than one member"),
            TeamError::SizeMismatch { request, team } => {
                write!(f, "a request for {request} ranks on a team of {team}")
            }
            TeamError::NoSlots { id } => {
                write!(f, "team {id} has no room in the world's slot layout")
            }
            TeamError::OpOutOfTeam => write!(f, "an op names a rank or slot outside the team"),
            TeamError::Multicast => write!(f, "multicast ops do not run on a team"),
            TeamError::BadSplit => write!(f, "a split needs one (colour, key) per rank"),
        }
    }
}

impl core::error::Error for TeamError {}

/// An ordered set of a world's ranks.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Team {
    id: u16,
    world: u16,
    members: HVec<u16, { MAX_WORLD as usize }>,
}

impl Team {
    /// The team of `members` (in local-rank order) of a world of `world` ranks, with slot id `id`.
    pub fn new(id: u16, world: u16, members: &[u16]) -> Result<Team, TeamError> {
        if members.is_empty() {
            return Err(TeamError::Empty);
        }
        let mut v = HVec::new();
        for &m in members {
            if m >= world {
                return Err(TeamError::RankOutOfWorld { rank: m, world });
            }
            if v.contains(&m) {
                return Err(TeamError::Duplicate { rank: m });
            }
            v.push(m)
                .map_err(|_| TeamError::RankOutOfWorld { rank: m, world })?;
        }
        Ok(Team {
            id,
            world,
            members: v,
        })
    }

    /// The whole world as team 0; a world past [`MAX_WORLD`] is refused (its rank
    /// `MAX_WORLD` has no place in a team).
    pub fn world(world: u16) -> Result<Team, TeamError> {
        if world > MAX_WORLD {
            return Err(TeamError::RankOutOfWorld {
                rank: MAX_WORLD,
                world: MAX_WORLD,
            });
        }
        let all: HVec<u16, { MAX_WORLD as usize }> = (0..world).collect();
        Team::new(0, world, &all)
    }

    /// Ranks `start, start + stride, ...` (`size` of them), as `nvshmem_team_split_strided`.
    pub fn strided(
        id: u16,
        world: u16,
        start: u16,
        stride: u16,
        size: u16,
    ) -> Result<Team, TeamError> {
        if size == 0 {
            return Err(TeamError::Empty);
        }
        if stride == 0 && size > 1 {
            return Err(TeamError::BadStride);
        }
        let mut v: HVec<u16, { MAX_WORLD as usize }> = HVec::new();
        for i in 0..size as u32 {
            let r = start as u32 + i * stride as u32;
            if r >= world as u32 {
                return Err(TeamError::RankOutOfWorld {
                    rank: r.min(u16::MAX as u32) as u16,
                    world,
                });
            }
            v.push(r as u16).map_err(|_| TeamError::RankOutOfWorld {
                rank: r as u16,
                world,
            })?;
        }
        Team::new(id, world, &v)
    }

    /// The team of rank `me` in a split where rank `r` gave `colors[r] = (colour, key)`: the
    /// ranks of `me`'s colour ordered by (key, rank). `None` when `me`'s colour is negative.
    ///
    /// ```
    /// use symm_core::team::Team;
    ///
    /// // Six ranks split into even and odd ranks, each ordered by descending rank (key -r);
    /// // rank 5 opts out with a negative colour.
    /// let colors: Vec<(i32, i32)> = (0..6)
    ///     .map(|r: i32| if r == 5 { (-1, 0) } else { (r % 2, -r) })
    ///     .collect();
    /// let even = Team::split(1, &colors, 2).unwrap().unwrap();
    /// assert_eq!(even.members(), &[4, 2, 0]);
    /// assert_eq!((even.id(), even.size(), even.world_size()), (1, 3, 6));
    /// assert_eq!(even.local(2), Some(1));
    /// assert_eq!(even.global(0), Some(4));
    ///
    /// let odd = Team::split(1, &colors, 3).unwrap().unwrap();
    /// assert_eq!(odd.members(), &[3, 1]);
    /// assert_eq!(Team::split(1, &colors, 5).unwrap(), None);
    /// ```
    pub fn split(id: u16, colors: &[(i32, i32)], me: u16) -> Result<Option<Team>, TeamError> {
        let world = u16::try_from(colors.len()).map_err(|_| TeamError::BadSplit)?;
        if world == 0 || world > MAX_WORLD {
            return Err(TeamError::BadSplit);
        }
        let Some(&(mine, _)) = colors.get(me as usize) else {
            return Err(TeamError::RankOutOfWorld { rank: me, world });
        };
        if mine < 0 {
            return Ok(None);
        }
        let mut v: HVec<(i32, u16), { MAX_WORLD as usize }> = colors
            .iter()
            .enumerate()
            .filter(|(_, &(c, _))| c == mine)
            .map(|(r, &(_, k))| (k, r as u16))
            .collect();
        v.sort_unstable();
        let members: HVec<u16, { MAX_WORLD as usize }> = v.iter().map(|&(_, r)| r).collect();
        Team::new(id, world, &members).map(Some)
    }

    /// The slot id (0: the world).
    pub fn id(&self) -> u16 {
        self.id
    }

    /// Ranks in the team.
    pub fn size(&self) -> u16 {
        self.members.len() as u16
    }

    /// The world the team is part of.
    pub fn world_size(&self) -> u16 {
        self.world
    }

    /// The members, in local-rank order.
    pub fn members(&self) -> &[u16] {
        &self.members
    }

    /// The world rank of local rank `local`.
    pub fn global(&self, local: u16) -> Option<u16> {
        self.members.get(local as usize).copied()
    }

    /// The local rank of world rank `rank`, if it is a member.
    pub fn local(&self, rank: u16) -> Option<u16> {
        self.members
            .iter()
            .position(|&m| m == rank)
            .map(|i| i as u16)
    }
}

/// Maps a team request's ops onto the world (see the module documentation).
#[derive(Clone, Debug)]
pub struct TeamMap<'t> {
    team: &'t Team,
    inner: SlotLayout,
    outer: SlotLayout,
    offsets: [u64; 3],
}

impl<'t> TeamMap<'t> {
    /// The map of `req` (whose world is the team's size) onto the world's slot layout `outer`,
    /// moving offsets of buffer `b` by `offsets[b]`.
    pub fn new(
        team: &'t Team,
        req: &Request,
        outer: SlotLayout,
        offsets: [u64; 3],
    ) -> Result<TeamMap<'t>, TeamError> {
        if req.world != team.size() {
            return Err(TeamError::SizeMismatch {
                request: req.world,
                team: team.size(),
            });
        }
        if team.id >= outer.teams || req.channels > outer.channels || outer.world < team.world {
            return Err(TeamError::NoSlots { id: team.id });
        }
        Ok(TeamMap {
            team,
            inner: req.layout(),
            outer,
            offsets,
        })
    }

    fn loc(&self, l: Loc) -> Result<Loc, TeamError> {
        Ok(Loc {
            rank: self.team.global(l.rank).ok_or(TeamError::OpOutOfTeam)?,
            buf: l.buf,
            offset: l
                .offset
                .checked_add(self.offsets[l.buf as usize])
                .ok_or(TeamError::OpOutOfTeam)?,
        })
    }

    fn slot(&self, slot: u32) -> Result<u32, TeamError> {
        let mut key = self.inner.key(slot).ok_or(TeamError::OpOutOfTeam)?;
        key.team = self.team.id;
        self.outer
            .index(key)
            .map_err(|_| TeamError::NoSlots { id: self.team.id })
    }

    /// One op of the team's schedule as an op on the world.
    pub fn op(&self, op: Op) -> Result<Op, TeamError> {
        if op.is_multicast() {
            return Err(TeamError::Multicast);
        }
        op.map_locs(|l| self.loc(l))?.map_slots(
            |peer| self.team.global(peer).ok_or(TeamError::OpOutOfTeam),
            |slot| self.slot(slot),
        )
    }
}

#[cfg(feature = "alloc")]
pub mod check;
#[cfg(test)]
mod tests;

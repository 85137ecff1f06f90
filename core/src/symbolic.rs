//! The symbolic checker: runs schedules on contribution sets instead of numbers.
//!
//! Every element is a [`Sym`]: the set of ranks whose contributions it holds (a bit mask), how
//! many contributions were combined into it, and which logical input element it stands for.
//! Rank r's input element i starts as `{r}`, count 1, index i; outputs and scratch start empty.
//! A reduction of two elements unions the masks, adds the counts and requires equal indices; a copy
//! moves elements. At the end every output element must equal what the collective defines, for
//! example `{all ranks}` with count `world` at index i for an all-reduce: mask full and count equal
//! to the world size means every rank's contribution is in it exactly once.
//!
//! [`check`] drives every (rank, channel) with the generic executor under a seeded random
//! interleaving (any rank may run any number of ops while others stall), and reports a deadlock
//! (every unfinished stream blocked), a read of data never written, a reduction of mismatched
//! elements, a wrong output, or an unbalanced signal (a slot whose final value differs from its
//! receiver's expected counter). Running several seeds explores different interleavings.

use crate::exec::{Executor, Fabric, LlPoll};
use crate::op::{Buf, Loc, McLoc, Op};
use crate::sched::{Collective, Request, SchedError, Schedule};
use crate::signal::apply;
use alloc::collections::BTreeMap;

mod display;
mod drive;
mod ll;
mod order;
use alloc::vec;
use alloc::vec::Vec;
pub use drive::Rng;
pub(crate) use drive::{deadlock, interleave, stepped};
pub use order::{check_rank_order, Fold};

/// A symbolic element.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sym {
    /// Ranks whose contributions are combined here (bit r: rank r).
    pub mask: u64,
    /// Number of contributions combined.
    pub count: u32,
    /// The logical input element this stands for.
    pub index: u64,
}

impl Sym {
    /// Nothing written.
    pub const EMPTY: Sym = Sym {
        mask: 0,
        count: 0,
        index: u64::MAX,
    };

    fn of(rank: u16, index: u64) -> Sym {
        Sym {
            mask: 1 << rank,
            count: 1,
            index,
        }
    }
}

/// What the checker found wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SymError {
    /// The request does not schedule.
    Sched(SchedError),
    /// The symbolic checker handles worlds up to 64.
    WorldTooLarge,
    /// The request's buffers hold more elements, over every rank, than the checker models
    /// ([`MAX_CELLS`]): a cell per element is held for the check.
    TooManyCells {
        /// Elements of every rank's input, output and scratch.
        cells: u64,
    },
    /// Every unfinished stream is blocked; one of them is named.
    Deadlock {
        /// Rank.
        rank: u16,
        /// Channel.
        channel: u16,
        /// Op index.
        index: u32,
        /// Slot waited on.
        slot: u32,
    },
    /// An op read an element nobody wrote.
    ReadUnwritten {
        /// Rank running the op.
        rank: u16,
        /// The location read.
        loc: Loc,
    },
    /// A reduction combined elements of different logical indices.
    Mixed {
        /// Rank running the op.
        rank: u16,
        /// Destination of the reduction.
        dst: Loc,
    },
    /// An op reaches outside a buffer or names a rank outside the world.
    OutOfBounds {
        /// Rank running the op.
        rank: u16,
        /// The location.
        loc: Loc,
    },
    /// A slot index outside the pad.
    BadSlot {
        /// Rank running the op.
        rank: u16,
        /// The slot.
        slot: u32,
    },
    /// An output element differs from the collective's definition.
    Wrong {
        /// Rank.
        rank: u16,
        /// Element index in the output.
        elem: u64,
        /// Found.
        found: Sym,
        /// Wanted.
        want: Sym,
    },
    /// A team could not be mapped onto the world (see [`crate::team::TeamError`]).
    Team(crate::team::TeamError),
    /// An element of a reduction's result is not the rank-order fold of every rank with the
    /// roundings deterministic mode allows ([`check_rank_order`]).
    NotRankOrder {
        /// Rank.
        rank: u16,
        /// Element index in the output.
        elem: u64,
        /// How it was combined.
        fold: Fold,
    },
    /// After the run, a slot's value differs from its owner's expected counter.
    Unbalanced {
        /// Rank owning the slot.
        rank: u16,
        /// Slot.
        slot: u32,
        /// Value in the pad.
        pad: u64,
        /// Expected counter.
        expected: u64,
    },
}

/// What a successful check ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Ops executed over all ranks and channels.
    pub ops: u64,
}

/// Symbolic memory and signal pads of a whole world.
pub struct SymWorld {
    req: Request,
    mem: Vec<[Vec<Sym>; 3]>,
    pads: Vec<Vec<u64>>,
    /// Low-latency cells: (rank, buffer, byte position of an element in its line) -> (flag,
    /// contribution). An element stands for its line: a reader needs each element's flag.
    ll: BTreeMap<(u16, u8, u64), (u32, Sym)>,
    /// Bytes of each rank's scratch, the low-latency regions included (those hold no
    /// contribution cells in `mem`, only entries of `ll`).
    scratch_bytes: u64,
    /// The order witness, when on ([`SymWorld::with_folds`]).
    folds: Option<order::Folds>,
}

/// The most elements (over every rank's input, output and scratch) the checker models: each is
/// a cell of its memory, so a request past this is refused before anything is allocated.
pub const MAX_CELLS: u64 = 1 << 24;

impl SymWorld {
    /// Memory for `req` with inputs initialised and outputs and scratch empty; refused past
    /// [`MAX_CELLS`] elements.
    pub fn new(req: &Request) -> Result<SymWorld, SymError> {
        req.validate().map_err(SymError::Sched)?;
        if req.world > 64 {
            return Err(SymError::WorldTooLarge);
        }
        let es = req.dtype.size();
        let sz = req.buffer_sizes();
        let slots = req.layout().slots() as usize;
        let lines = (req.algorithm.desc().scratch)(req);
        let plain = sz.scratch.saturating_sub(lines);
        let cells = (sz.input / es)
            .saturating_add(sz.output / es)
            .saturating_add(plain / es)
            .saturating_mul(u64::from(req.world));
        if cells > MAX_CELLS {
            return Err(SymError::TooManyCells { cells });
        }
        let mem = (0..req.world)
            .map(|r| {
                let input = (0..sz.input / es).map(|i| Sym::of(r, i)).collect();
                [
                    input,
                    vec![Sym::EMPTY; (sz.output / es) as usize],
                    vec![Sym::EMPTY; (plain / es) as usize],
                ]
            })
            .collect();
        Ok(SymWorld {
            req: *req,
            ll: BTreeMap::new(),
            scratch_bytes: sz.scratch,
            mem,
            pads: vec![vec![0; slots]; req.world as usize],
            folds: None,
        })
    }

    fn range(&self, rank: u16, l: Loc, elems: u64) -> Result<(usize, usize, usize), SymError> {
        let es = self.req.dtype.size();
        let oob = SymError::OutOfBounds { rank, loc: l };
        if l.rank >= self.req.world || !l.offset.is_multiple_of(es) {
            return Err(oob);
        }
        let start = l.offset / es;
        let buf = &self.mem[l.rank as usize][l.buf as usize];
        if start
            .checked_add(elems)
            .is_none_or(|e| e > buf.len() as u64)
        {
            return Err(oob);
        }
        Ok((l.rank as usize, l.buf as usize, start as usize))
    }

    fn get(&self, rank: u16, l: Loc, elems: u64) -> Result<Vec<Sym>, SymError> {
        let (r, b, s) = self.range(rank, l, elems)?;
        let v: Vec<Sym> = self.mem[r][b][s..s + elems as usize].to_vec();
        if v.iter().any(|x| x.count == 0) {
            return Err(SymError::ReadUnwritten { rank, loc: l });
        }
        Ok(v)
    }

    fn put(&mut self, rank: u16, l: Loc, v: &[Sym]) -> Result<u64, SymError> {
        let (r, b, s) = self.range(rank, l, v.len() as u64)?;
        self.mem[r][b][s..s + v.len()].copy_from_slice(v);
        Ok(v.iter().fold(0, |m, x| m | x.mask))
    }

    fn combine(rank: u16, dst: Loc, a: &mut [Sym], b: &[Sym]) -> Result<(), SymError> {
        for (x, y) in a.iter_mut().zip(b) {
            if x.index != y.index {
                return Err(SymError::Mixed { rank, dst });
            }
            x.mask |= y.mask;
            x.count += y.count;
        }
        Ok(())
    }

    /// Applies a data op or signal of `rank`; returns the union of the destination's masks.
    pub fn apply(&mut self, rank: u16, op: &Op) -> Result<Option<u64>, SymError> {
        let es = self.req.dtype.size();
        match *op {
            Op::Copy { src, dst, bytes } => {
                let v = self.get(rank, src, bytes / es)?;
                self.fold_op(&[src], dst, bytes / es);
                self.put(rank, dst, &v).map(Some)
            }
            Op::Reduce {
                a, b, dst, elems, ..
            } => {
                let mut x = self.get(rank, a, elems)?;
                let y = self.get(rank, b, elems)?;
                Self::combine(rank, dst, &mut x, &y)?;
                self.fold_op(&[a, b], dst, elems);
                self.put(rank, dst, &x).map(Some)
            }
            Op::ReduceN {
                buf,
                offset,
                ranks,
                dst,
                elems,
                ..
            } => {
                let at = |r: u16| Loc::new(r, buf, offset);
                let Some((&first, rest)) = ranks.as_slice().split_first() else {
                    return Err(SymError::OutOfBounds { rank, loc: dst });
                };
                let mut x = self.get(rank, at(first), elems)?;
                for &r in rest {
                    let y = self.get(rank, at(r), elems)?;
                    Self::combine(rank, dst, &mut x, &y)?;
                }
                let srcs: Vec<Loc> = ranks.as_slice().iter().map(|&r| at(r)).collect();
                self.fold_op(&srcs, dst, elems);
                self.put(rank, dst, &x).map(Some)
            }
            Op::LlPut { .. } | Op::LlReduce { .. } => Err(SymError::OutOfBounds {
                rank,
                loc: Loc::new(rank, Buf::Scratch, 0),
            }),
            Op::McReduce {
                src, dst, elems, ..
            } => {
                let at = |r: u16| Loc::new(r, src.buf, src.offset);
                let mut x = self.get(rank, at(0), elems)?;
                for r in 1..self.req.world {
                    let y = self.get(rank, at(r), elems)?;
                    Self::combine(rank, dst, &mut x, &y)?;
                }
                // The switch's reduction order is not fixed by the hardware.
                self.fold_unordered(dst, elems);
                self.put(rank, dst, &x).map(Some)
            }
            Op::McStore {
                src,
                dst: McLoc { buf, offset },
                bytes,
            } => {
                let v = self.get(rank, src, bytes / es)?;
                let mut m = 0;
                for r in 0..self.req.world {
                    self.fold_op(&[src], Loc::new(r, buf, offset), bytes / es);
                    m |= self.put(rank, Loc::new(r, buf, offset), &v)?;
                }
                Ok(Some(m))
            }
            Op::Signal {
                peer,
                slot,
                op,
                value,
            } => {
                let pad = self
                    .pads
                    .get_mut(peer as usize)
                    .ok_or(SymError::OutOfBounds {
                        rank,
                        loc: Loc::new(peer, Buf::Input, 0),
                    })?;
                let s = pad
                    .get_mut(slot as usize)
                    .ok_or(SymError::BadSlot { rank, slot })?;
                *s = apply(op, *s, value);
                Ok(None)
            }
            Op::Wait { .. } => Ok(None),
        }
    }

    /// The value of a rank's slot.
    pub fn slot(&self, rank: u16, slot: u32) -> Result<u64, SymError> {
        self.pads[rank as usize]
            .get(slot as usize)
            .copied()
            .ok_or(SymError::BadSlot { rank, slot })
    }

    /// The element the collective defines for output element `i` of `rank`.
    pub fn want(&self, rank: u16, i: u64) -> Sym {
        let n = self.req.elems();
        let w = self.req.world;
        let all = if w == 64 { u64::MAX } else { (1u64 << w) - 1 };
        let full = |index| Sym {
            mask: all,
            count: w as u32,
            index,
        };
        let blk = |i: u64| ((i / n.max(1)) as u16, i % n.max(1));
        match self.req.collective {
            Collective::AllReduce => full(i),
            Collective::ReduceScatter => full(rank as u64 * n + i),
            Collective::AllGather => {
                let (q, j) = blk(i);
                Sym::of(q, j)
            }
            Collective::Broadcast { root } => Sym::of(root, i),
            Collective::Reduce { root } if root == rank => full(i),
            Collective::Scatter { root } => Sym::of(root, rank as u64 * n + i),
            Collective::Gather { root } if root == rank => {
                let (q, j) = blk(i);
                Sym::of(q, j)
            }
            Collective::AllToAll => {
                let (q, j) = blk(i);
                Sym::of(q, rank as u64 * n + j)
            }
            Collective::SendRecv { src, dst } if dst == rank => Sym::of(src, i),
            _ => Sym::EMPTY,
        }
    }

    /// Compares every output with the collective's definition.
    pub fn verify(&self) -> Result<(), SymError> {
        for r in 0..self.req.world {
            for (i, &found) in self.mem[r as usize][Buf::Output as usize]
                .iter()
                .enumerate()
            {
                let want = self.want(r, i as u64);
                if found != want {
                    return Err(SymError::Wrong {
                        rank: r,
                        elem: i as u64,
                        found,
                        want,
                    });
                }
            }
        }
        Ok(())
    }
}

struct RankView<'w> {
    world: &'w mut SymWorld,
    rank: u16,
}

impl Fabric for RankView<'_> {
    type Error = SymError;
    fn execute(&mut self, op: &Op) -> Result<(), SymError> {
        self.world.apply(self.rank, op).map(|_| ())
    }
    fn load_slot(&mut self, slot: u32) -> Result<u64, SymError> {
        self.world.slot(self.rank, slot)
    }
    fn ll(&mut self, op: &Op, epoch: u64) -> Result<LlPoll, SymError> {
        self.world.ll(self.rank, op, epoch).map(|(p, _)| p)
    }
}

/// Runs `req` symbolically on every rank and channel under the interleaving chosen by `seed`.
///
/// ```
/// use symm_core::dtype::{DType, ReduceOp};
/// use symm_core::sched::{algorithms, Collective, Request, Schedule};
/// use symm_core::symbolic::check;
///
/// // Every all-reduce algorithm at 5 ranks (not a power of two), under three interleavings:
/// // every output element holds every rank's contribution exactly once.
/// for &alg in algorithms(Collective::AllReduce) {
///     let req = Request::new(Collective::AllReduce, alg, 5, 4096, DType::F32, ReduceOp::Sum)
///         .with_channels(2)
///         .with_pipeline(512, 2);
///     for seed in 0..3 {
///         let report = check(&req, seed).unwrap();
///         // It ran every op of every (rank, channel) stream.
///         let ops: u64 = (0..5)
///             .flat_map(|r| (0..2).map(move |c| (r, c)))
///             .map(|(r, c)| Schedule::count(&Schedule::new(req, r, c).unwrap()))
///             .sum();
///         assert_eq!(report.ops, ops);
///     }
/// }
/// ```
pub fn check(req: &Request, seed: u64) -> Result<Report, SymError> {
    let mut world = SymWorld::new(req)?;
    let (ops, expected) = run(req, &mut world, seed)?;
    let report = Report { ops };
    for (rank, e) in expected.iter().enumerate() {
        let rank = rank as u16;
        for (slot, &exp) in e.iter().enumerate() {
            let pad = world.slot(rank, slot as u32)?;
            if pad != exp {
                return Err(SymError::Unbalanced {
                    rank,
                    slot: slot as u32,
                    pad,
                    expected: exp,
                });
            }
        }
    }
    Ok(report)
}

/// Runs every (rank, channel) stream of `req` over `world` in the interleaving `seed` picks, a
/// blocked stream a deadlock, then verifies the world's outputs: the ops run, and each rank's
/// counters as its executors left them (one per pad slot; each channel owns its range).
pub(crate) fn run(
    req: &Request,
    world: &mut SymWorld,
    seed: u64,
) -> Result<(u64, Vec<Vec<u64>>), SymError> {
    let slots = req.layout().slots() as usize;
    let mut streams = Vec::new();
    for r in 0..req.world {
        for c in 0..req.channels {
            streams.push((r, c, Schedule::new(*req, r, c).map_err(SymError::Sched)?));
        }
    }
    let per_channel = (slots / req.channels.max(1) as usize).max(1);
    let mut expected: Vec<Vec<u64>> = vec![vec![0; slots]; req.world as usize];
    let mut execs: Vec<_> = streams
        .into_iter()
        .zip(expected.iter_mut().flat_map(|v| v.chunks_mut(per_channel)))
        .map(|((r, c, s), e)| (r, c, Executor::at(s, e, c as u32 * per_channel as u32)))
        .collect();
    let ran = interleave(execs.len(), seed, |i| {
        let (rank, _, ex) = &mut execs[i];
        let mut view = RankView {
            world: &mut *world,
            rank: *rank,
        };
        stepped(*rank, ex.step(&mut view))
    })?;
    let ops = match ran {
        Ok(ops) => ops,
        Err(i) => {
            let (rank, channel, ex) = &mut execs[i];
            return Err(deadlock(*rank, *channel, ex.peek()));
        }
    };
    drop(execs);
    world.verify()?;
    Ok((ops, expected))
}

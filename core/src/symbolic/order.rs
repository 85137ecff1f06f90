//! The order witness of deterministic mode: beside each element's contribution set, the order
//! and the number of roundings in which its contributions were combined.
//!
//! A [`Fold`] says that an element is the left fold, in rank order, of the ranks `first ..
//! next`, rounded `steps` times (a k-way reduce or a line reduce rounds once, however many
//! sources it reads; a binary reduce once per step). Rank r's input element starts as the fold
//! of `r .. r + 1` with no rounding; a copy moves folds; a reduction appends each next source
//! only when it is one rank's own contribution that continues the order (`first` equal to the
//! accumulator's `next`), and anything else (a source that is itself a partial sum, a gap, the
//! switch's reduction, whose order the hardware does not fix) makes the element unordered.
//!
//! [`check_rank_order`] runs a request with the witness on and requires every element of a
//! reduction's result to be the fold of `0 .. world`, with one rounding for 16-bit floats (they
//! are widened and rounded once by a k-way reduce, per step by a chain), any number for 32 and
//! 64-bit floats and integers (their chain in rank order rounds as the fold does). That is the
//! proof that a request [`Request::is_deterministic`] calls deterministic reduces every element
//! in rank order, whatever its channels, chunking and size.

use super::{SymError, SymWorld};
use crate::dtype::DType;
use crate::op::{Buf, Loc};
use crate::sched::{Collective, Request};
use alloc::collections::BTreeMap;
use alloc::vec;
use alloc::vec::Vec;

/// How an element's contributions were combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fold {
    /// The first rank of the fold.
    pub first: u16,
    /// One past the last rank.
    pub next: u16,
    /// Roundings.
    pub steps: u16,
    /// Whether the contributions were combined as a left fold in rank order at all.
    pub ordered: bool,
}

impl Fold {
    /// Nothing written, or combined out of order.
    pub const UNORDERED: Fold = Fold {
        first: 0,
        next: 0,
        steps: 0,
        ordered: false,
    };

    fn of(rank: u16) -> Fold {
        Fold {
            first: rank,
            next: rank + 1,
            steps: 0,
            ordered: true,
        }
    }

    fn single(&self) -> bool {
        self.ordered && self.steps == 0 && self.next == self.first + 1
    }

    /// The fold of `srcs` combined by one op in this order: one rounding for the op.
    pub(super) fn combine(srcs: &[Fold]) -> Fold {
        let Some((&first, rest)) = srcs.split_first() else {
            return Fold::UNORDERED;
        };
        if rest.is_empty() {
            return first;
        }
        let mut acc = first;
        for s in rest {
            acc = if acc.ordered && s.single() && s.first == acc.next {
                Fold {
                    next: s.next,
                    ..acc
                }
            } else {
                Fold::UNORDERED
            };
        }
        if acc.ordered {
            acc.steps = acc.steps.saturating_add(1);
        }
        acc
    }
}

/// The witness of a whole world: one fold per element of each buffer, and per low-latency cell.
pub(super) struct Folds {
    mem: Vec<[Vec<Fold>; 3]>,
    ll: BTreeMap<(u16, u8, u64), Fold>,
}

impl SymWorld {
    /// This world with the order witness on.
    pub fn with_folds(mut self) -> SymWorld {
        let mem = self
            .mem
            .iter()
            .enumerate()
            .map(|(r, bufs)| {
                [
                    vec![Fold::of(r as u16); bufs[0].len()],
                    vec![Fold::UNORDERED; bufs[1].len()],
                    vec![Fold::UNORDERED; bufs[2].len()],
                ]
            })
            .collect();
        self.folds = Some(Folds {
            mem,
            ll: BTreeMap::new(),
        });
        self
    }

    fn fold_at(&self, l: Loc, i: usize) -> Fold {
        let es = self.req.dtype.size().max(1) as usize;
        self.folds
            .as_ref()
            .and_then(|f| f.mem.get(l.rank as usize))
            .and_then(|b| b[l.buf as usize].get(l.offset as usize / es + i))
            .copied()
            .unwrap_or(Fold::UNORDERED)
    }

    /// After an op that combined (or, with one source, moved) `srcs` element by element into
    /// `dst`, `elems` elements: the destination's folds.
    pub(super) fn fold_op(&mut self, srcs: &[Loc], dst: Loc, elems: u64) {
        if self.folds.is_none() {
            return;
        }
        let mut each = [Fold::UNORDERED; crate::op::MAX_FANIN + 1];
        let n = srcs.len().min(each.len());
        let folds: Vec<Fold> = (0..elems as usize)
            .map(|i| {
                for (e, &s) in each.iter_mut().zip(&srcs[..n]) {
                    *e = self.fold_at(s, i);
                }
                Fold::combine(&each[..n])
            })
            .collect();
        self.fold_put(dst, &folds);
    }

    /// `dst`'s folds become `folds`.
    pub(super) fn fold_put(&mut self, dst: Loc, folds: &[Fold]) {
        let es = self.req.dtype.size().max(1) as usize;
        if let Some(buf) = self
            .folds
            .as_mut()
            .and_then(|f| f.mem.get_mut(dst.rank as usize))
            .map(|b| &mut b[dst.buf as usize])
        {
            let at = dst.offset as usize / es;
            for (i, f) in folds.iter().enumerate() {
                if let Some(x) = buf.get_mut(at + i) {
                    *x = *f;
                }
            }
        }
    }

    /// An op whose order the hardware does not fix wrote `elems` elements at `dst`.
    pub(super) fn fold_unordered(&mut self, dst: Loc, elems: u64) {
        self.fold_put(dst, &vec![Fold::UNORDERED; elems as usize]);
    }

    /// A low-latency put stored `src`'s element `i` in the cell `key`.
    pub(super) fn fold_ll_put(&mut self, src: Loc, i: usize, key: (u16, u8, u64)) {
        let f = self.fold_at(src, i);
        if let Some(folds) = self.folds.as_mut() {
            folds.ll.insert(key, f);
        }
    }

    /// The fold a low-latency cell holds.
    pub(super) fn fold_ll(&self, key: (u16, u8, u64)) -> Fold {
        self.folds
            .as_ref()
            .and_then(|f| f.ll.get(&key))
            .copied()
            .unwrap_or(Fold::UNORDERED)
    }

    /// Every element of a reduction's result is the rank-order fold of every rank, rounded
    /// once for 16-bit floats.
    pub fn verify_rank_order(&self) -> Result<(), SymError> {
        let w = self.req.world;
        let reduced = |r: u16| match self.req.collective {
            Collective::AllReduce | Collective::ReduceScatter => true,
            Collective::Reduce { root } => root == r,
            _ => false,
        };
        let half = matches!(self.req.dtype, DType::F16 | DType::Bf16);
        let Some(folds) = self.folds.as_ref() else {
            return Ok(());
        };
        for r in (0..w).filter(|&r| reduced(r)) {
            for (i, f) in folds.mem[r as usize][Buf::Output as usize]
                .iter()
                .enumerate()
            {
                let whole = f.ordered && f.first == 0 && f.next == w;
                if !whole || (half && f.steps > 1) {
                    return Err(SymError::NotRankOrder {
                        rank: r,
                        elem: i as u64,
                        fold: *f,
                    });
                }
            }
        }
        Ok(())
    }
}

/// Runs `req` symbolically with the order witness (under the interleaving `seed` chooses) and
/// requires every element of its reduction to be the rank-order fold of every rank
/// ([`SymWorld::verify_rank_order`]), besides everything [`super::check`] requires.
///
/// ```
/// use symm_core::dtype::{DType, ReduceOp};
/// use symm_core::sched::{Algorithm, Collective, Request};
/// use symm_core::symbolic::{check_rank_order, SymError};
///
/// let two = Request::new(Collective::AllReduce, Algorithm::TwoShot, 5, 4000, DType::Bf16,
///                        ReduceOp::Sum).with_channels(3);
/// assert!(check_rank_order(&two, 1).is_ok());
/// let ring = Request { algorithm: Algorithm::Ring, ..two };
/// assert!(matches!(check_rank_order(&ring, 1), Err(SymError::NotRankOrder { .. })));
/// ```
pub fn check_rank_order(req: &Request, seed: u64) -> Result<(), SymError> {
    let mut world = SymWorld::new(req)?.with_folds();
    super::run(req, &mut world, seed)?;
    world.verify_rank_order()
}

//! The fused all-reduce + RMSNorm's protocol over host memory, one thread per rank: what
//! `kernels/symm/norm.cu` does for one block, with symm-core's arithmetic (`symm_core::norm`).
//!
//! Each rank owns a symmetric area ([`NormWorld`]): two staging halves of `max_rows` rows and
//! one flag word per rank. Every element lives in an `AtomicU64` word (four bf16 a word)
//! accessed with relaxed loads and stores; the only ordering is the flag's. A [`NormRank`]
//! counts its calls (epochs from 1); call `e`:
//!
//! 1. copies this rank's input into its own half `e % 2`;
//! 2. stores `e << ROW_BITS | rows` into its word of every rank's flags (`FLAG_PUBLISH`, a
//!    release, after the copy), then loads every word of its own flags (`FLAG_OBSERVE`, an
//!    acquire) until each holds call `e`'s signal or a later one (a word of call `e` with other
//!    rows is [`NormThreadError::RanksDiffer`]);
//! 3. reads every rank's half `e % 2` and computes the new residual and the output with
//!    [`symm_core::norm::all_reduce_rmsnorm`].
//!
//! A half is written again two calls later, after the next call's flags: a peer stores those
//! only after it finished this call, so it reads nothing of the half any more.
//!
//! The call's epoch is not a count the rank keeps but its [`BlockEpoch`], as on the device,
//! where a call runs as several blocks: each block reads the epoch when it starts
//! ([`BlockEpoch::begin`]) and, when it is done, counts itself finished; the last block of
//! the call advances the epoch and clears the count ([`BlockEpoch::end`]). The next call
//! starts after every block of this one ended (one stream: kernels in order), so all its
//! blocks read the advanced epoch. Here a call is one block. Under
//! `cfg(loom)` the atomics are loom's (`crate::sync`) and a waiting rank yields to loom, so
//! `driver/tests/loom.rs` model-checks this very code.

use crate::sync::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use symm_core::norm::{all_reduce_rmsnorm, check_hidden, NormError};

/// The store of a flag word, after the staged rows it announces.
const FLAG_PUBLISH: Ordering = Ordering::Release;
/// The load of a flag word, before the rows it announces are read.
const FLAG_OBSERVE: Ordering = Ordering::Acquire;
/// Bits of a flag word below the epoch: the call's rows.
pub const ROW_BITS: u32 = 20;

/// Why a call of the host protocol failed.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum NormThreadError {
    /// The shapes are refused (as the GPU path refuses them).
    Shape(NormError),
    /// A peer's flag word of this call carries other rows than this rank's.
    RanksDiffer {
        /// This rank.
        rank: u16,
        /// The peer.
        peer: u16,
        /// This rank's rows.
        mine: u64,
        /// The peer's rows.
        theirs: u64,
    },
    /// A flag word did not arrive before the deadline, or another rank failed.
    Timeout {
        /// This rank.
        rank: u16,
        /// The peer waited for.
        peer: u16,
        /// The call.
        epoch: u64,
        /// The word's value.
        found: u64,
    },
}

impl std::fmt::Display for NormThreadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NormThreadError::Shape(e) => write!(f, "{e}"),
            NormThreadError::RanksDiffer {
                rank,
                peer,
                mine,
                theirs,
            } => write!(
                f,
                "ranks differ: rank {rank} called with {mine} rows, rank {peer} with {theirs}"
            ),
            NormThreadError::Timeout {
                rank,
                peer,
                epoch,
                found,
            } => write!(
                f,
                "rank {rank} waited for rank {peer}'s call {epoch}, found {found:#x}"
            ),
        }
    }
}

impl std::error::Error for NormThreadError {}

/// A rank's call epoch on the device (see the module doc): the last call's epoch (`state[0]`
/// of the kernel) and how many blocks of the running call finished (`state[1]`).
///
/// Its accesses are relaxed: what orders them is the stream (every block of a call starts
/// after every block of the one before ended: a kernel boundary on the device, a join in the
/// loom model) and, within a call, each block's own order (it reads the epoch before it
/// counts itself finished, and the kernel fences before the count). The loom model checks the
/// counting: every block of call `k` reads `k`, whichever block ends last.
#[derive(Default)]
pub struct BlockEpoch {
    last: AtomicU64,
    finished: AtomicU32,
}

impl BlockEpoch {
    /// A block starts: the epoch of the call it belongs to.
    pub fn begin(&self) -> u64 {
        self.last.load(Ordering::Relaxed) + 1
    }

    /// A block of call `epoch`, which runs as `blocks` blocks, is done with everything of the
    /// call (the kernel's `__threadfence` then `atomicAdd`); the last one advances the epoch.
    pub fn end(&self, epoch: u64, blocks: u32) {
        if self.finished.fetch_add(1, Ordering::Relaxed) + 1 == blocks {
            self.finished.store(0, Ordering::Relaxed);
            self.last.store(epoch, Ordering::Relaxed);
        }
    }
}

/// Every rank's symmetric area (see the module doc).
pub struct NormWorld {
    world: u16,
    hidden: usize,
    max_rows: usize,
    /// Per rank: two halves of `max_rows * hidden / 4` words.
    stage: Vec<[Vec<AtomicU64>; 2]>,
    /// Per rank: one flag word per sender.
    flags: Vec<Vec<AtomicU64>>,
    /// Per rank: its call epoch.
    epochs: Vec<BlockEpoch>,
    abort: AtomicBool,
    deadline: Duration,
}

impl NormWorld {
    /// Areas of `world` ranks for rows of `hidden` elements, at most `max_rows` a call; a wait
    /// that passes `deadline` fails the call.
    pub fn new(
        world: u16,
        hidden: usize,
        max_rows: usize,
        deadline: Duration,
    ) -> Result<NormWorld, NormError> {
        check_hidden(hidden)?;
        if world == 0 {
            return Err(NormError::NoRanks);
        }
        let words = max_rows * hidden / 4;
        let half = || (0..words).map(|_| AtomicU64::new(0)).collect::<Vec<_>>();
        Ok(NormWorld {
            world,
            hidden,
            max_rows,
            stage: (0..world).map(|_| [half(), half()]).collect(),
            flags: (0..world)
                .map(|_| (0..world).map(|_| AtomicU64::new(0)).collect())
                .collect(),
            epochs: (0..world).map(|_| BlockEpoch::default()).collect(),
            abort: AtomicBool::new(false),
            deadline,
        })
    }
}

/// One rank's side of the protocol: its rank and the epoch of its running call.
pub struct NormRank {
    rank: u16,
    epoch: u64,
}

impl NormRank {
    /// Rank `rank`, before its first call.
    pub fn new(rank: u16) -> NormRank {
        NormRank { rank, epoch: 0 }
    }

    /// One call (see the module doc): this rank's input `x` and `residual` (`rows * hidden`
    /// bf16 bits each) and the `weight`; returns the new residual and the output.
    pub fn call(
        &mut self,
        w: &NormWorld,
        x: &[u16],
        residual: &[u16],
        weight: &[u16],
        eps: f32,
    ) -> Result<(Vec<u16>, Vec<u16>), NormThreadError> {
        let n = x.len();
        let rows = n / w.hidden;
        if weight.len() != w.hidden || residual.len() != n || rows * w.hidden != n {
            return Err(NormThreadError::Shape(NormError::BadLength {
                what: "the input, residual or weight",
                have: n,
                want: rows * w.hidden,
            }));
        }
        if rows > w.max_rows || rows >> ROW_BITS != 0 {
            return Err(NormThreadError::Shape(NormError::BadLength {
                what: "rows",
                have: rows,
                want: w.max_rows,
            }));
        }
        let me = self.rank as usize;
        let e = w.epochs[me].begin();
        self.epoch = e;
        let half = (e % 2) as usize;
        // 1. This rank's rows into its half.
        for (word, chunk) in w.stage[me][half].iter().zip(x.chunks(4)) {
            let mut b = [0u16; 4];
            b[..chunk.len()].copy_from_slice(chunk);
            let v = b
                .iter()
                .enumerate()
                .fold(0u64, |a, (i, &h)| a | u64::from(h) << (16 * i));
            word.store(v, Ordering::Relaxed);
        }
        // 2. The flags.
        let sig = e << ROW_BITS | rows as u64;
        for q in 0..w.world as usize {
            w.flags[q][me].store(sig, FLAG_PUBLISH);
        }
        for q in 0..w.world {
            self.wait(w, q, rows as u64)?;
        }
        // 3. Every rank's rows, summed in rank order with the residual, normalised.
        let staged: Vec<Vec<u16>> = (0..w.world as usize)
            .map(|q| {
                let mut v = Vec::with_capacity(n);
                for word in &w.stage[q][half][..n.div_ceil(4)] {
                    let x = word.load(Ordering::Relaxed);
                    v.extend((0..4).map(|i| (x >> (16 * i)) as u16));
                }
                v.truncate(n);
                v
            })
            .collect();
        w.epochs[me].end(e, 1);
        let refs: Vec<&[u16]> = staged.iter().map(|v| v.as_slice()).collect();
        let (mut res_out, mut out) = (vec![0u16; n], vec![0u16; n]);
        all_reduce_rmsnorm(&refs, residual, weight, eps, &mut res_out, &mut out)
            .map_err(NormThreadError::Shape)?;
        Ok((res_out, out))
    }

    fn wait(&self, w: &NormWorld, peer: u16, rows: u64) -> Result<(), NormThreadError> {
        let word = &w.flags[self.rank as usize][peer as usize];
        let mut since: Option<Instant> = None;
        #[cfg(not(loom))]
        let mut spins = 0u32;
        loop {
            let v = word.load(FLAG_OBSERVE);
            if v >> ROW_BITS >= self.epoch {
                let theirs = v & ((1 << ROW_BITS) - 1);
                if v >> ROW_BITS == self.epoch && theirs != rows {
                    w.abort.store(true, Ordering::Relaxed);
                    return Err(NormThreadError::RanksDiffer {
                        rank: self.rank,
                        peer,
                        mine: rows,
                        theirs,
                    });
                }
                return Ok(());
            }
            let late = since.get_or_insert_with(Instant::now).elapsed() > w.deadline;
            if late || w.abort.load(Ordering::Relaxed) {
                w.abort.store(true, Ordering::Relaxed);
                return Err(NormThreadError::Timeout {
                    rank: self.rank,
                    peer,
                    epoch: self.epoch,
                    found: v,
                });
            }
            #[cfg(loom)]
            loom::thread::yield_now();
            #[cfg(not(loom))]
            if spins < 64 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;
    use symm_core::dtype::f32_to_bf16;

    fn input(r: u16, c: u64, rows: usize, hidden: usize) -> Vec<u16> {
        (0..rows * hidden)
            .map(|i| f32_to_bf16(((i as u64 * 7 + c * 13 + u64::from(r) * 29) % 23) as f32 - 11.0))
            .collect()
    }

    #[test]
    fn ranks_on_threads_get_the_reference_call_after_call() {
        let (world, hidden) = (3u16, 16usize);
        let w = Arc::new(NormWorld::new(world, hidden, 4, Duration::from_secs(20)).unwrap());
        let weight: Vec<u16> = (0..hidden)
            .map(|i| f32_to_bf16(1.0 + i as f32 / 8.0))
            .collect();
        let hs: Vec<_> = (0..world)
            .map(|r| {
                let (w, weight) = (w.clone(), weight.clone());
                std::thread::spawn(move || {
                    let mut rank = NormRank::new(r);
                    for c in 0..20u64 {
                        let rows = 1 + (c % 4) as usize;
                        let xs: Vec<Vec<u16>> =
                            (0..world).map(|q| input(q, c, rows, hidden)).collect();
                        let res = input(9, c, rows, hidden);
                        let got = rank.call(&w, &xs[r as usize], &res, &weight, 1e-6).unwrap();
                        let refs: Vec<&[u16]> = xs.iter().map(|v| v.as_slice()).collect();
                        let (mut ro, mut o) = (vec![0; res.len()], vec![0; res.len()]);
                        all_reduce_rmsnorm(&refs, &res, &weight, 1e-6, &mut ro, &mut o).unwrap();
                        assert_eq!(got, (ro, o), "rank {r} call {c}");
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    }

    #[test]
    fn rows_that_differ_are_named_not_waited_for() {
        let w = Arc::new(NormWorld::new(2, 8, 4, Duration::from_secs(20)).unwrap());
        let weight = vec![f32_to_bf16(1.0); 8];
        let hs: Vec<_> = (0..2u16)
            .map(|r| {
                let (w, weight) = (w.clone(), weight.clone());
                std::thread::spawn(move || {
                    let rows = 1 + r as usize;
                    let x = vec![0u16; rows * 8];
                    NormRank::new(r).call(&w, &x, &x, &weight, 1e-6)
                })
            })
            .collect();
        let errs: Vec<_> = hs
            .into_iter()
            .map(|h| h.join().unwrap().unwrap_err())
            .collect();
        // A rank that saw the other's abort before its word fails as stopped; one names it.
        assert!(
            errs.iter().any(|e| matches!(
                e,
                NormThreadError::RanksDiffer {
                    mine: 1,
                    theirs: 2,
                    ..
                } | NormThreadError::RanksDiffer {
                    mine: 2,
                    theirs: 1,
                    ..
                }
            )),
            "{errs:?}"
        );
    }
}

//! Rendezvous: how the ranks of a world exchange bytes (shareable handles) and meet.
//!
//! [`Bootstrap`] is the only thing the heap needs from the outside world: an all-gather of small
//! byte strings, an all-gather of file descriptors (the VMM handles) and a barrier, each with a
//! deadline. [`ThreadBootstrap`] implements it for one process with one thread per GPU;
//! [`SocketRendezvous`] for one process per GPU, over [`crate::bootstrap::SocketBootstrap`]
//! (descriptors travel with SCM_RIGHTS). Either way `all_gather_fds` hands each rank descriptors
//! of its own, so callers need not know which.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::error::{CudaError, Result};
use crate::bootstrap::SocketBootstrap;

/// What a heap needs to meet its peers.
pub trait Bootstrap: Sync {
    /// Ranks in the world.
    fn world(&self) -> u16;
    /// Every rank contributes `data`; every rank gets all contributions in rank order.
    fn all_gather(&self, rank: u16, data: &[u8]) -> Result<Arc<Vec<Vec<u8>>>>;
    /// Returns when every rank has called it (or fails at the deadline).
    fn barrier(&self, rank: u16) -> Result<()> {
        self.all_gather(rank, &[]).map(|_| ())
    }
    /// Every rank contributes one descriptor; every rank gets, in rank order, a descriptor of
    /// its own (closed on drop, close-on-exec) for each rank's, its own included.
    fn all_gather_fds(&self, rank: u16, fd: BorrowedFd<'_>) -> Result<Vec<OwnedFd>>;
    /// Wakes every waiting rank with an error (a rank failed and will not arrive).
    fn abort(&self, rank: u16, why: &str);
    /// Whether file descriptors from one rank are valid in another as they are (same process).
    fn shares_fds(&self) -> bool;
}

/// One rank's contribution to a [`ThreadBootstrap`] round.
#[derive(Clone)]
enum Slot {
    /// Not yet contributed.
    Empty,
    /// Bytes (`all_gather`).
    Bytes(Vec<u8>),
    /// A descriptor (`all_gather_fds`), a copy owned by the round: every rank makes its own
    /// copy from it, and it closes when the last rank drops the round's result.
    Fd(Arc<OwnedFd>),
}

struct State {
    generation: u64,
    arrived: u16,
    slots: Vec<Slot>,
    result: Arc<Vec<Slot>>,
    failed: Option<CudaError>,
}

/// One process, one thread per rank.
///
/// Descriptors never pass as integers: `all_gather_fds` contributes an owned copy of the
/// caller's descriptor, so no call, whatever bytes another rank passes to `all_gather`, can
/// make a rank use a descriptor number it was not lent.
pub struct ThreadBootstrap {
    world: u16,
    deadline: Duration,
    state: Mutex<State>,
    cv: Condvar,
}

impl ThreadBootstrap {
    /// A bootstrap for `world` threads; each exchange fails after `deadline` (at most
    /// [`super::MAX_WAIT`]).
    pub fn new(world: u16, deadline: Duration) -> ThreadBootstrap {
        ThreadBootstrap {
            world,
            deadline: deadline.min(super::MAX_WAIT),
            state: Mutex::new(State {
                generation: 0,
                arrived: 0,
                slots: vec![Slot::Empty; world as usize],
                result: Arc::new(Vec::new()),
                failed: None,
            }),
            cv: Condvar::new(),
        }
    }

    /// One round: every rank contributes `slot`; every rank gets all slots in rank order.
    fn round(&self, rank: u16, slot: Slot) -> Result<Arc<Vec<Slot>>> {
        if rank >= self.world {
            return Err(CudaError::BadRank {
                rank,
                world: self.world,
            });
        }
        let poisoned = || CudaError::RankPanicked;
        let mut st = self.state.lock().map_err(|_| poisoned())?;
        if let Some(why) = &st.failed {
            return Err(why.clone());
        }
        let gen = st.generation;
        st.slots[rank as usize] = slot;
        st.arrived += 1;
        if st.arrived == self.world {
            st.result = Arc::new(std::mem::replace(
                &mut st.slots,
                vec![Slot::Empty; self.world as usize],
            ));
            st.arrived = 0;
            st.generation += 1;
            self.cv.notify_all();
            return Ok(st.result.clone());
        }
        let end = Instant::now() + self.deadline;
        while st.generation == gen {
            if let Some(why) = &st.failed {
                return Err(why.clone());
            }
            let now = Instant::now();
            if now >= end {
                let why = CudaError::ExchangeTimeout {
                    rank,
                    waited_ms: u64::try_from(self.deadline.as_millis()).unwrap_or(u64::MAX),
                    arrived: st.arrived,
                    world: self.world,
                };
                st.failed = Some(why.clone());
                self.cv.notify_all();
                return Err(why);
            }
            st = self
                .cv
                .wait_timeout(st, end - now)
                .map_err(|_| poisoned())?
                .0;
        }
        Ok(st.result.clone())
    }
}

/// The error for ranks that called different collectives in the same round.
fn mixed(p: usize, want: &'static str) -> CudaError {
    CudaError::MixedExchange {
        rank: u16::try_from(p).unwrap_or(u16::MAX),
        want,
    }
}

impl Bootstrap for ThreadBootstrap {
    fn world(&self) -> u16 {
        self.world
    }

    fn all_gather(&self, rank: u16, data: &[u8]) -> Result<Arc<Vec<Vec<u8>>>> {
        let got = self.round(rank, Slot::Bytes(data.to_vec()))?;
        let bytes = got
            .iter()
            .enumerate()
            .map(|(p, s)| match s {
                Slot::Bytes(b) => Ok(b.clone()),
                _ => Err(mixed(p, "all_gather")),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Arc::new(bytes))
    }

    fn all_gather_fds(&self, rank: u16, fd: BorrowedFd<'_>) -> Result<Vec<OwnedFd>> {
        let own = fd.try_clone_to_owned().map_err(|e| CudaError::Dup {
            rank,
            message: e.to_string(),
        })?;
        let got = self.round(rank, Slot::Fd(Arc::new(own)))?;
        got.iter()
            .enumerate()
            .map(|(p, s)| match s {
                Slot::Fd(f) => f.try_clone().map_err(|e| CudaError::Dup {
                    rank: u16::try_from(p).unwrap_or(u16::MAX),
                    message: e.to_string(),
                }),
                _ => Err(mixed(p, "all_gather_fds")),
            })
            .collect()
    }

    fn abort(&self, rank: u16, why: &str) {
        if let Ok(mut st) = self.state.lock() {
            st.failed = Some(CudaError::RankFailed {
                rank,
                why: why.to_string(),
            });
        }
        self.cv.notify_all();
    }

    fn shares_fds(&self) -> bool {
        true
    }
}

/// One process per GPU: a [`SocketBootstrap`] with the deadline the trait's calls use.
pub struct SocketRendezvous {
    boot: SocketBootstrap,
    deadline: Duration,
}

impl SocketRendezvous {
    /// Serves `boot`'s job; each exchange fails after `deadline` (at most [`super::MAX_WAIT`]).
    pub fn new(boot: SocketBootstrap, deadline: Duration) -> SocketRendezvous {
        SocketRendezvous {
            boot,
            deadline: deadline.min(super::MAX_WAIT),
        }
    }

    /// The bootstrap (its lost word, callbacks, `finish`).
    pub fn bootstrap(&self) -> &SocketBootstrap {
        &self.boot
    }

    /// Makes the bootstrap usable again after a failed exchange while every process is alive
    /// ([`SocketBootstrap::recover`]). Collective.
    pub fn recover(&self) -> Result<()> {
        self.boot.recover(self.deadline).map_err(socket_error)
    }

    /// The bootstrap back.
    pub fn into_inner(self) -> SocketBootstrap {
        self.boot
    }

    fn own(&self, rank: u16) -> Result<()> {
        if rank == self.boot.rank() {
            Ok(())
        } else {
            Err(CudaError::NotOwnRank {
                rank,
                own: self.boot.rank(),
            })
        }
    }
}

fn socket_error(e: crate::bootstrap::BootstrapError) -> CudaError {
    CudaError::Bootstrap(e)
}

impl Bootstrap for SocketRendezvous {
    fn world(&self) -> u16 {
        self.boot.world()
    }

    fn all_gather(&self, rank: u16, data: &[u8]) -> Result<Arc<Vec<Vec<u8>>>> {
        self.own(rank)?;
        self.boot
            .all_gather(data, self.deadline)
            .map(Arc::new)
            .map_err(socket_error)
    }

    fn barrier(&self, rank: u16) -> Result<()> {
        self.own(rank)?;
        self.boot.barrier(self.deadline).map_err(socket_error)
    }

    fn all_gather_fds(&self, rank: u16, fd: BorrowedFd<'_>) -> Result<Vec<OwnedFd>> {
        self.own(rank)?;
        let per_rank = self
            .boot
            .all_gather_fds(&[fd], self.deadline)
            .map_err(socket_error)?;
        per_rank
            .into_iter()
            .enumerate()
            .map(|(p, mut fds)| {
                fds.pop()
                    .filter(|_| fds.is_empty())
                    .ok_or(CudaError::Malformed {
                        rank: u16::try_from(p).unwrap_or(u16::MAX),
                        what: "descriptor list",
                    })
            })
            .collect()
    }

    fn abort(&self, _rank: u16, _why: &str) {
        self.boot.leave();
    }

    fn shares_fds(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_gather_in_rank_order_and_repeated() {
        let b = ThreadBootstrap::new(3, Duration::from_secs(5));
        std::thread::scope(|s| {
            for r in 0..3u16 {
                let b = &b;
                s.spawn(move || {
                    for round in 0..50u8 {
                        let got = b.all_gather(r, &[r as u8, round]).unwrap();
                        for (q, v) in got.iter().enumerate() {
                            assert_eq!(v, &vec![q as u8, round]);
                        }
                    }
                });
            }
        });
    }

    #[test]
    fn descriptors_are_copied_for_every_rank() {
        use std::io::Write;
        use std::os::unix::fs::FileExt;
        let b = ThreadBootstrap::new(3, Duration::from_secs(5));
        std::thread::scope(|s| {
            for r in 0..3u16 {
                let b = &b;
                s.spawn(move || {
                    let mut f = crate::bootstrap::memfd("rank").unwrap();
                    f.write_all(&[r as u8; 5]).unwrap();
                    let got = b.all_gather_fds(r, std::os::fd::AsFd::as_fd(&f)).unwrap();
                    drop(f);
                    for (p, fd) in got.into_iter().enumerate() {
                        // Copies share the file offset: read at an explicit one.
                        let mut v = [0u8; 6];
                        let n = std::fs::File::from(fd).read_at(&mut v, 0).unwrap();
                        assert_eq!(v[..n], [p as u8; 5]);
                    }
                });
            }
        });
    }

    /// Bytes that look like a descriptor number are bytes: a rank gathering descriptors while
    /// another gathers bytes gets an error, never a descriptor made from those bytes.
    #[test]
    fn bytes_never_become_descriptors() {
        let b = ThreadBootstrap::new(2, Duration::from_secs(5));
        let f = crate::bootstrap::memfd("heap").unwrap();
        let raw = std::os::fd::AsRawFd::as_raw_fd(&f);
        std::thread::scope(|s| {
            let b = &b;
            let forged = s.spawn(move || b.all_gather(1, &raw.to_le_bytes()));
            let got = b.all_gather_fds(0, std::os::fd::AsFd::as_fd(&f));
            assert!(
                matches!(
                    &got,
                    Err(CudaError::MixedExchange {
                        rank: 1,
                        want: "all_gather_fds"
                    })
                ),
                "{:?}",
                got.as_ref().map(Vec::len)
            );
            assert!(matches!(
                forged.join().unwrap(),
                Err(CudaError::MixedExchange { rank: 0, .. })
            ));
        });
    }

    #[test]
    fn a_missing_rank_is_a_deadline_error() {
        let b = ThreadBootstrap::new(2, Duration::from_millis(50));
        assert!(matches!(
            b.all_gather(0, b"x"),
            Err(CudaError::ExchangeTimeout {
                rank: 0,
                arrived: 1,
                world: 2,
                ..
            })
        ));
    }

    /// A caller's deadline past any bound waits (at most `MAX_WAIT`) instead of overflowing the
    /// clock; an abort from another rank still ends the wait.
    #[test]
    fn an_endless_deadline_is_bounded() {
        let b = ThreadBootstrap::new(2, Duration::MAX);
        std::thread::scope(|s| {
            let b = &b;
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                b.abort(1, "rank 1 gives up");
            });
            let r = b.all_gather(0, b"x");
            assert!(
                matches!(&r, Err(CudaError::RankFailed { rank: 1, why }) if why == "rank 1 gives up"),
                "{r:?}"
            );
        });
    }
}

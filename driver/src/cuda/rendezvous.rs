//! Rendezvous: how the ranks of a world exchange bytes (shareable handles) and meet.
//!
//! [`Bootstrap`] is the only thing the heap needs from the outside world: an all-gather of small
//! byte strings and a barrier, each with a deadline. [`ThreadBootstrap`] implements it for one
//! process with one thread per GPU (file descriptors are then valid in every rank as they are);
//! a process-per-GPU bootstrap (a Unix socket passing descriptors with SCM_RIGHTS) plugs in
//! behind the same trait without changing callers.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::error::{CudaError, Result};

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
    /// Wakes every waiting rank with an error (a rank failed and will not arrive).
    fn abort(&self, rank: u16, why: &str);
    /// Whether file descriptors from one rank are valid in another as they are (same process).
    fn shares_fds(&self) -> bool;
}

struct State {
    generation: u64,
    arrived: u16,
    slots: Vec<Vec<u8>>,
    result: Arc<Vec<Vec<u8>>>,
    failed: Option<String>,
}

/// One process, one thread per rank.
pub struct ThreadBootstrap {
    world: u16,
    deadline: Duration,
    state: Mutex<State>,
    cv: Condvar,
}

impl ThreadBootstrap {
    /// A bootstrap for `world` threads; each exchange fails after `deadline`.
    pub fn new(world: u16, deadline: Duration) -> ThreadBootstrap {
        ThreadBootstrap {
            world,
            deadline,
            state: Mutex::new(State {
                generation: 0,
                arrived: 0,
                slots: vec![Vec::new(); world as usize],
                result: Arc::new(Vec::new()),
                failed: None,
            }),
            cv: Condvar::new(),
        }
    }
}

impl Bootstrap for ThreadBootstrap {
    fn world(&self) -> u16 {
        self.world
    }

    fn all_gather(&self, rank: u16, data: &[u8]) -> Result<Arc<Vec<Vec<u8>>>> {
        if rank >= self.world {
            return Err(CudaError::Invalid(format!(
                "rank {rank} in a world of {}",
                self.world
            )));
        }
        let poisoned = || CudaError::Rendezvous("a rank panicked during the exchange".into());
        let mut st = self.state.lock().map_err(|_| poisoned())?;
        if let Some(why) = &st.failed {
            return Err(CudaError::Rendezvous(why.clone()));
        }
        let gen = st.generation;
        st.slots[rank as usize] = data.to_vec();
        st.arrived += 1;
        if st.arrived == self.world {
            st.result = Arc::new(std::mem::replace(
                &mut st.slots,
                vec![Vec::new(); self.world as usize],
            ));
            st.arrived = 0;
            st.generation += 1;
            self.cv.notify_all();
            return Ok(st.result.clone());
        }
        let end = Instant::now() + self.deadline;
        while st.generation == gen {
            if let Some(why) = &st.failed {
                return Err(CudaError::Rendezvous(why.clone()));
            }
            let now = Instant::now();
            if now >= end {
                let why = format!(
                    "rank {rank} waited {:?} for the other ranks ({} of {} arrived)",
                    self.deadline, st.arrived, self.world
                );
                st.failed = Some(why.clone());
                self.cv.notify_all();
                return Err(CudaError::Rendezvous(why));
            }
            st = self
                .cv
                .wait_timeout(st, end - now)
                .map_err(|_| poisoned())?
                .0;
        }
        Ok(st.result.clone())
    }

    fn abort(&self, rank: u16, why: &str) {
        if let Ok(mut st) = self.state.lock() {
            st.failed = Some(format!("rank {rank} failed: {why}"));
        }
        self.cv.notify_all();
    }

    fn shares_fds(&self) -> bool {
        true
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
    fn a_missing_rank_is_a_deadline_error() {
        let b = ThreadBootstrap::new(2, Duration::from_millis(50));
        assert!(matches!(
            b.all_gather(0, b"x"),
            Err(CudaError::Rendezvous(_))
        ));
    }
}

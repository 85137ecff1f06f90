//! How the symbolic checks drive their streams: a seeded interleaving ([`interleave`], with
//! its generator [`Rng`]), an executor's step in the checker's terms ([`stepped`]), and the
//! deadlock a blocked stream names ([`deadlock`]).

use super::SymError;
use crate::exec::{ExecError, Step};
use crate::op::Op;
use alloc::vec;

/// A small xorshift generator (deterministic, no dependencies).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// A value below `n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// What one step of a stream did, for [`interleave`].
pub(crate) enum Stepped {
    /// An op ran.
    Ran,
    /// The stream waits.
    Blocked,
    /// The stream has no ops left.
    Done,
}

/// An executor's step as [`Stepped`], its errors as the checker's.
pub(crate) fn stepped<E>(rank: u16, r: Result<Step, ExecError<E>>) -> Result<Stepped, E>
where
    E: From<SymError>,
{
    match r {
        Ok(Step::Ran { .. }) => Ok(Stepped::Ran),
        Ok(Step::Blocked { .. }) => Ok(Stepped::Blocked),
        Ok(Step::Done) => Ok(Stepped::Done),
        Err(ExecError::Fabric { error, .. }) => Err(error),
        Err(ExecError::SlotOutOfRange { slot, .. }) => Err(SymError::BadSlot { rank, slot }.into()),
    }
}

/// The deadlock error for a stream found blocked at `next` (its next op).
pub(crate) fn deadlock(rank: u16, channel: u16, next: Option<(u32, Op)>) -> SymError {
    let (index, op) = next.unwrap_or((
        0,
        Op::Wait {
            slot: u32::MAX,
            count: 0,
        },
    ));
    let slot = if let Op::Wait { slot, .. } = op {
        slot
    } else {
        u32::MAX
    };
    SymError::Deadlock {
        rank,
        channel,
        index,
        slot,
    }
}

/// Drives `n` streams through `step(i)` under the seeded random interleaving every symbolic
/// check uses: each round starts at a random stream and gives streams bursts of 1 to 8 steps,
/// stopping after a stream with probability 1/2 (so any rank may run far ahead of others); a
/// round where nothing ran is confirmed by one step of every live stream. Returns the ops run,
/// or `Err(i)` with a stream still blocked when every live stream is blocked (a deadlock).
pub(crate) fn interleave(
    n: usize,
    seed: u64,
    mut step: impl FnMut(usize) -> Result<Stepped, SymError>,
) -> Result<Result<u64, usize>, SymError> {
    let mut rng = Rng::new(seed);
    let mut done = vec![false; n];
    let mut live = n;
    let mut ops = 0u64;
    while live > 0 {
        let mut progressed = false;
        let start = rng.below(n as u64) as usize;
        for k in 0..n {
            let i = (start + k) % n;
            if done[i] {
                continue;
            }
            for _ in 0..1 + rng.below(8) {
                match step(i)? {
                    Stepped::Ran => {
                        ops += 1;
                        progressed = true;
                    }
                    Stepped::Blocked => break,
                    Stepped::Done => {
                        done[i] = true;
                        live -= 1;
                        break;
                    }
                }
            }
            if rng.below(2) == 0 {
                break;
            }
        }
        if !progressed && live > 0 {
            // Confirm: a full pass where nobody can run is a deadlock.
            let mut any = false;
            for (i, d) in done.iter_mut().enumerate() {
                if *d {
                    continue;
                }
                match step(i)? {
                    Stepped::Ran => {
                        ops += 1;
                        any = true;
                    }
                    Stepped::Blocked => {}
                    Stepped::Done => {
                        *d = true;
                        live -= 1;
                        any = true;
                    }
                }
            }
            if !any {
                return Ok(Err(done.iter().position(|d| !d).unwrap_or(0)));
            }
        }
    }
    Ok(Ok(ops))
}

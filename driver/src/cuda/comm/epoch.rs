//! The low-latency epochs across [`Comm::reset`] (`symm_core::ll`).
//!
//! A reset zeroes the signal pad and the expected counters. The flag of a low-latency call comes
//! from the counter of the rank's own `Epoch` slot, so epochs that started again at zero would
//! repeat flags that lines left in scratch buffers before the reset still carry, and a later
//! call could take such a line for new data. So before the pad is zeroed the ranks agree on the
//! highest epoch any of them reached per (team, channel) (`highest`), and after it both the
//! pad slot and the counter resume one past it (`resume`): every later flag is new.

use symm_core::sched::MAX_CHANNELS;
use symm_core::signal::{SlotKey, SlotKind, SlotLayout};
use symm_core::team::MAX_TEAMS;

use super::Comm;
use crate::cuda::error::{CudaError, Result};

/// Pad indices of `rank`'s own `Epoch` slots, one per (team, channel), in a pad of `teams`
/// team ids (the one-process `World` has one, a `Comm` `MAX_TEAMS`).
pub fn slots(teams: u16, world: u16, rank: u16) -> Result<Vec<u32>> {
    let layout = SlotLayout::new(teams, MAX_CHANNELS, world).map_err(CudaError::Signal)?;
    let mut v = Vec::with_capacity(teams as usize * MAX_CHANNELS as usize);
    for team in 0..teams {
        for channel in 0..MAX_CHANNELS {
            let key = SlotKey {
                team,
                channel,
                kind: SlotKind::Epoch,
                peer: rank,
            };
            v.push(layout.index(key).map_err(CudaError::Signal)?);
        }
    }
    Ok(v)
}

/// Counter `i` of an array of little-endian `u64`s (0 past its end).
pub fn counter(bytes: &[u8], i: u32) -> u64 {
    let i = i as usize * 8;
    bytes
        .get(i..i + 8)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
}

/// Collective, while no kernel runs: the highest epoch any rank reached, per (team, channel).
pub(super) fn highest(comm: &Comm) -> Result<Vec<u64>> {
    let counters = comm.expected.download()?;
    let at = counter;
    let mine: Vec<u8> = slots(MAX_TEAMS, comm.job.world, comm.job.rank)?
        .iter()
        .flat_map(|&i| at(&counters, i).to_le_bytes())
        .collect();
    let all = comm.exchange(&mine)?;
    let mut top = vec![0u64; mine.len() / 8];
    for part in &all {
        if part.len() != mine.len() {
            return Err(CudaError::LengthMismatch {
                rank: None,
                what: "bytes of epochs",
                sent: part.len() as u64,
                expected: mine.len() as u64,
            });
        }
        for (t, i) in top.iter_mut().zip(0u32..) {
            *t = (*t).max(at(part, i));
        }
    }
    Ok(top)
}

/// After the pad and counters were zeroed: this rank's `Epoch` slots and counters set one past
/// `top` (from [`highest`]), pad and counter equal, so the protocol stays balanced.
pub(super) fn resume(comm: &Comm, top: &[u64]) -> Result<()> {
    for (&slot, &t) in slots(MAX_TEAMS, comm.job.world, comm.job.rank)?
        .iter()
        .zip(top)
    {
        if t == 0 {
            continue;
        }
        let v = t.wrapping_add(1).to_le_bytes();
        let off = slot as u64 * 8;
        if off + 8 > comm.data_off {
            return Err(CudaError::OutOfBounds {
                what: "epoch slot",
                offset: off,
                len: 8,
                lo: 0,
                hi: comm.data_off,
            });
        }
        comm.heap_write(off, &v)?;
        comm.expected.write_at(off as usize, &v)?;
    }
    Ok(())
}

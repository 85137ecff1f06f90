//! A rank's signal pad on the host: `u64` slots updated by peers.
//!
//! [`Pad::signal`] is the one place a signal touches memory and [`Pad::load`] the one place a
//! wait reads it. Both take their orderings from [`symm_core::signal::order`], the protocol's one
//! definition, so the loom models (which run this code) check the orderings that run.

use crate::sync::AtomicU64;
use symm_core::flag::RAISED;
use symm_core::op::SignalOp;
use symm_core::signal::order;

/// A signal pad.
pub struct Pad {
    slots: Vec<AtomicU64>,
}

impl Pad {
    /// A pad of `n` zeroed slots.
    pub fn new(n: usize) -> Pad {
        Pad {
            slots: (0..n).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Applies a signal to slot `slot` (an add, or a set, with release); `None` when the slot
    /// does not exist.
    pub fn signal(&self, slot: u32, op: SignalOp, value: u64) -> Option<()> {
        let s = self.slots.get(slot as usize)?;
        match op {
            SignalOp::Add => s.fetch_add(value, order::SIGNAL_ADD),
            SignalOp::Set => s.swap(value, order::SIGNAL_SET),
        };
        Some(())
    }

    /// Raises flag `slot` ([`symm_core::flag`]): stores [`RAISED`] with release; `None` when the
    /// slot does not exist.
    pub fn raise(&self, slot: u32) -> Option<()> {
        self.slots
            .get(slot as usize)?
            .store(RAISED, order::FLAG_RAISE);
        Some(())
    }

    /// Lowers flag `slot` if it is raised (a load with acquire, then a store of 0): whether it
    /// was; `None` when the slot does not exist.
    pub fn lower(&self, slot: u32) -> Option<bool> {
        let s = self.slots.get(slot as usize)?;
        if s.load(order::FLAG_WAIT) < RAISED {
            return Some(false);
        }
        // Only this rank stores into its lowered flag, and its next raise by the writer comes
        // after a release of this rank that follows this store (the flag form's condition 3).
        s.store(0, crate::sync::Ordering::Relaxed);
        Some(true)
    }

    /// Loads slot `slot` with acquire; `None` when the slot does not exist.
    pub fn load(&self, slot: u32) -> Option<u64> {
        self.slots.get(slot as usize).map(|s| s.load(order::WAIT))
    }
}

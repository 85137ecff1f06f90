//! A rank's signal pad on the host: `u64` slots updated by peers.
//!
//! [`Pad::signal`] is the one place a signal touches memory and [`Pad::load`] the one place a
//! wait reads it; the orderings are parameters ([`Orderings`]) so the loom models can show that the
//! protocol needs exactly release on the signal and acquire on the wait: weakened to relaxed,
//! every model fails.

use crate::sync::{AtomicU64, Ordering};
use symm_core::op::SignalOp;

/// The memory orderings of the signal protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Orderings {
    /// Ordering of the read-modify-write a signal performs.
    pub signal: Ordering,
    /// Ordering of the load a wait performs.
    pub wait: Ordering,
}

impl Orderings {
    /// Release signals, acquire waits: what symm uses.
    pub const PROTOCOL: Orderings = Orderings {
        signal: Ordering::Release,
        wait: Ordering::Acquire,
    };
    /// Relaxed both ways: broken on purpose, for the models that must fail.
    pub const RELAXED: Orderings = Orderings {
        signal: Ordering::Relaxed,
        wait: Ordering::Relaxed,
    };
}

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

    /// Applies a signal to slot `slot`; `None` when the slot does not exist.
    pub fn signal(&self, slot: u32, op: SignalOp, value: u64, o: Orderings) -> Option<()> {
        let s = self.slots.get(slot as usize)?;
        match op {
            SignalOp::Add => s.fetch_add(value, o.signal),
            SignalOp::Set => s.swap(value, o.signal),
        };
        Some(())
    }

    /// Loads slot `slot`; `None` when the slot does not exist.
    pub fn load(&self, slot: u32, o: Orderings) -> Option<u64> {
        self.slots.get(slot as usize).map(|s| s.load(o.wait))
    }
}

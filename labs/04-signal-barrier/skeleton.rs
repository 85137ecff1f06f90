//! Lab 4: the signal protocol. This is the file you edit.
//!
//! Check it with `cargo xtask lab check 4`: the barrier on the simulator, threads and the
//! symbolic check, then the orderings under loom. The README of this folder explains the idea.

use std::sync::atomic::Ordering;
use symm_core::op::Op;
use symm_core::signal::SlotKind::Barrier;
use symm_labs::kit::Kit;

/// The ordering of the atomic add a signal performs on the peer's slot.
// TODO: loom will show what goes wrong with Relaxed. Which ordering publishes this rank's
// earlier writes along with the signal?
pub const SIGNAL: Ordering = Ordering::Relaxed;

/// The ordering of the load a wait spins on.
// TODO: and which ordering lets the waiting rank see what the signaller published?
pub const WAIT: Ordering = Ordering::Relaxed;

/// A whole barrier over every rank: arrive (one signal to every peer), then wait for one
/// arrival from every peer. No rank passes before every rank has arrived.
pub fn barrier(k: &Kit) -> Vec<Op> {
    let peers = || (0..k.world()).filter(|&p| p != k.rank());
    // Given: arrive.
    let ops: Vec<Op> = peers().map(|p| k.signal(p, Barrier)).collect();
    // TODO: wait for one arrival from every peer (k.wait(peer, Barrier, 1)). Counters never
    // reset: the second barrier's waits pass on each peer's second signal.
    ops
}

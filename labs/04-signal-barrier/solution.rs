//! Lab 4, reference solution: a barrier from signals and waits, and the orderings that make it
//! publish what each rank wrote before it.

use std::sync::atomic::Ordering;
use symm_core::op::Op;
use symm_core::signal::SlotKind::Barrier;
use symm_labs::kit::Kit;

/// The ordering of the atomic add a signal performs on the peer's slot: release, so that
/// everything this rank wrote before the signal is visible to whoever sees the new count.
pub const SIGNAL: Ordering = Ordering::Release;

/// The ordering of the load a wait spins on: acquire, so that once it sees the count, it also
/// sees everything the signaller wrote before signalling.
pub const WAIT: Ordering = Ordering::Acquire;

/// A whole barrier over every rank: arrive (one signal to every peer), then wait for one
/// arrival from every peer. No rank passes before every rank has arrived.
pub fn barrier(k: &Kit) -> Vec<Op> {
    let peers = || (0..k.world()).filter(|&p| p != k.rank());
    let mut ops: Vec<Op> = peers().map(|p| k.signal(p, Barrier)).collect();
    ops.extend(peers().map(|p| k.wait(p, Barrier, 1)));
    ops
}

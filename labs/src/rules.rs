//! The protocol rules the labs teach, checked on the ops themselves: a schedule that breaks one
//! fails with the rule's name even when its data happens to come out right (a race the
//! simulator and the threads did not lose this time).
//!
//! **Ready before touch** (lab 1's first rule, and every lab's handshake since): a rank touches
//! a peer's buffers (reads its input, writes its output or scratch, directly or through a
//! multicast op) only after it has waited, on the same channel, for that peer's `Ready`. The
//! peer's `Ready` says it has entered the collective, so its buffers hold this call's data and
//! may take this call's writes. A barrier's wait on a peer (lab 4) says the same, so it counts
//! as that peer's `Ready`. Signals are not touches: they are how the handshake is made. The MoE
//! dispatch and combine of lab 9 have no handshake at all (the epoch halves and tagged headers
//! stand in for it), so their cases do not check this rule.

use crate::problem::Problem;
use symm_core::op::{At, Op};
use symm_core::sched::Request;
use symm_core::signal::{SlotKey, SlotKind};

/// The first op of any rank that touches a peer's buffers before waiting for that peer's
/// `Ready` on its channel.
pub fn ready_before_touch(req: &Request, streams: &[Vec<Op>]) -> Result<(), Problem> {
    let layout = req.layout();
    let channels = req.channels.max(1) as usize;
    for (s, ops) in streams.iter().enumerate() {
        let rank = (s / channels) as u16;
        let mut ready = vec![false; req.world as usize];
        for (index, op) in ops.iter().enumerate() {
            if let Op::Wait { slot, .. } = *op {
                let entered = |k: &SlotKey| matches!(k.kind, SlotKind::Ready | SlotKind::Barrier);
                if let Some(k) = layout.key(slot).filter(entered) {
                    if let Some(r) = ready.get_mut(k.peer as usize) {
                        *r = true;
                    }
                }
                continue;
            }
            for range in op.footprint().ranges() {
                let peers: Vec<u16> = match range.at {
                    At::Rank(l) => vec![l.rank],
                    At::Every(_) => (0..req.world).collect(),
                };
                let early = peers
                    .into_iter()
                    .find(|&q| q != rank && !ready.get(q as usize).copied().unwrap_or(true));
                if let Some(peer) = early {
                    return Err(Problem::TouchBeforeReady {
                        rank,
                        index,
                        op: *op,
                        peer,
                    });
                }
            }
        }
    }
    Ok(())
}

//! Lab 8: multicast all-reduce on the host model. This is the file you edit.
//!
//! Check it with `cargo xtask lab check 8`; the README of this folder explains the idea.

use symm_core::op::{Buf, Op};
use symm_core::signal::SlotKind::Ready;
use symm_labs::kit::Kit;

/// Multicast all-reduce: rank r load-reduces segment r of every rank's input through the switch
/// and stores the sum into every rank's output with one multicast store.
pub fn all_reduce(k: &Kit) -> Vec<Op> {
    let (me, w) = (k.rank(), k.world());
    let peers = || (0..w).filter(move |&q| q != me);
    let seg = k.segment(me as u64, w as u64);
    // Given: the multicast ops read every input and write every output, so everyone must be
    // here first.
    let mut ops: Vec<Op> = peers().map(|q| k.signal(q, Ready)).collect();
    ops.extend(peers().map(|q| k.wait(q, Ready, 1)));
    let mine = k.at(me, Buf::Output, seg.start);
    ops.push(k.mc_reduce(Buf::Input, seg.start, mine, seg.len));
    // TODO: the sum of segment r is now in my output only. One multicast store
    // (k.mc_store(src, Buf::Output, elem, len)) puts it into every rank's output.
    // TODO: then tell every peer its output holds my segment (and that I am done reading its
    // input), and wait until every peer has told me the same.
    ops
}

//! Lab 8, reference solution: multicast all-reduce on the host model of NVLink SHARP.

use symm_core::op::{Buf, Op};
use symm_core::signal::SlotKind::{Data, Ready};
use symm_labs::kit::Kit;

/// Multicast all-reduce: rank r load-reduces segment r of every rank's input through the switch
/// and stores the sum into every rank's output with one multicast store.
pub fn all_reduce(k: &Kit) -> Vec<Op> {
    let (me, w) = (k.rank(), k.world());
    let peers = || (0..w).filter(move |&q| q != me);
    let seg = k.segment(me as u64, w as u64);
    // The multicast ops read every input and write every output: everyone must be here.
    let mut ops: Vec<Op> = peers().map(|q| k.signal(q, Ready)).collect();
    ops.extend(peers().map(|q| k.wait(q, Ready, 1)));
    let mine = k.at(me, Buf::Output, seg.start);
    ops.push(k.mc_reduce(Buf::Input, seg.start, mine, seg.len));
    ops.push(k.mc_store(mine, Buf::Output, seg.start, seg.len));
    // Data: your output holds my segment, and I have read your input.
    ops.extend(peers().map(|q| k.signal(q, Data)));
    ops.extend(peers().map(|q| k.wait(q, Data, 1)));
    ops
}

//! Lab 1, reference solution: ring all-gather.

use symm_core::op::{Buf, Op};
use symm_core::signal::SlotKind::{Data, Ready};
use symm_labs::kit::Kit;

/// Rank `k.rank()`'s ops of a ring all-gather: every rank ends with every rank's block, block q
/// from rank q at output elements `q * n .. (q + 1) * n`.
pub fn all_gather(k: &Kit) -> Vec<Op> {
    let (me, w, n) = (k.rank() as u64, k.world() as u64, k.elems());
    let mut ops = Vec::new();
    // My own block goes into my own output first.
    let mine = k.at(k.rank(), Buf::Output, me * n);
    ops.push(k.copy(k.at(k.rank(), Buf::Input, 0), mine, n));
    if w == 1 {
        return ops;
    }
    // prev writes into my output, I write into next's: tell prev I am here, wait for next.
    ops.push(k.signal(k.prev(), Ready));
    ops.push(k.wait(k.next(), Ready, 1));
    for step in 0..w - 1 {
        // At step s I forward the block I received at step s - 1 (at step 0: my own).
        let block = (me + w - step) % w;
        if step > 0 {
            ops.push(k.wait(k.prev(), Data, 1));
        }
        let at = block * n;
        ops.push(k.copy(
            k.at(k.rank(), Buf::Output, at),
            k.at(k.next(), Buf::Output, at),
            n,
        ));
        ops.push(k.signal(k.next(), Data));
    }
    // The last block arrives after my last send.
    ops.push(k.wait(k.prev(), Data, 1));
    ops
}

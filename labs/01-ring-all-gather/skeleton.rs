//! Lab 1: ring all-gather. This is the file you edit.
//!
//! Check it with `cargo xtask lab check 1`; the README of this folder explains the idea.

use symm_core::op::{Buf, Op};
use symm_core::signal::SlotKind::{Data, Ready};
use symm_labs::kit::Kit;

/// Rank `k.rank()`'s ops of a ring all-gather: every rank ends with every rank's block, block q
/// from rank q at output elements `q * n .. (q + 1) * n`.
pub fn all_gather(k: &Kit) -> Vec<Op> {
    let (me, w, n) = (k.rank() as u64, k.world() as u64, k.elems());
    let mut ops = Vec::new();
    // Given: my own block goes into my own output first.
    let mine = k.at(k.rank(), Buf::Output, me * n);
    ops.push(k.copy(k.at(k.rank(), Buf::Input, 0), mine, n));
    if w == 1 {
        return ops;
    }
    // Given: prev writes into my output and I write into next's, so I tell prev I am here and
    // wait until next is.
    ops.push(k.signal(k.prev(), Ready));
    ops.push(k.wait(k.next(), Ready, 1));
    for step in 0..w - 1 {
        // TODO: which block do I forward at this step? At step 0 my own; at step s the block I
        // received at step s - 1. Is it the one below?
        let block = (me + step) % w;
        // TODO: a block I received may be forwarded only once it has arrived: wait for
        // prev's Data signal first (every step but the first).
        let at = block * n;
        ops.push(k.copy(
            k.at(k.rank(), Buf::Output, at),
            k.at(k.next(), Buf::Output, at),
            n,
        ));
        ops.push(k.signal(k.next(), Data));
    }
    // TODO: the last block arrives after my last send. Every signal sent to me must be waited
    // for before the collective ends.
    ops
}

//! Lab 2: ring reduce-scatter, then ring all-reduce. This is the file you edit.
//!
//! Check it with `cargo xtask lab check 2`; the README of this folder explains the idea.

use symm_core::op::{Buf, Op};
use symm_core::signal::SlotKind::{Data, Ready};
use symm_labs::kit::Kit;

/// Ring reduce-scatter: rank r ends with block r of the sum of every rank's input (the input
/// has `world` blocks of `n = k.elems()` elements, the output one).
pub fn reduce_scatter(k: &Kit) -> Vec<Op> {
    let (me, w, n) = (k.rank() as u64, k.world() as u64, k.elems());
    let mut ops = Vec::new();
    if w == 1 {
        ops.push(k.copy(k.at(0, Buf::Input, 0), k.at(0, Buf::Output, 0), n));
        return ops;
    }
    // Given: I write into next's scratch, prev writes into mine.
    ops.push(k.signal(k.prev(), Ready));
    ops.push(k.wait(k.next(), Ready, 1));
    // Step s writes into next's scratch slot s (one block each): k.scratch_slot(s).
    let scratch = |rank: u16, step: u64| k.at(rank, Buf::Scratch, k.scratch_slot(step));
    for step in 0..w - 1 {
        // At step s I send my partial of block (r - s - 1) mod w.
        let block = (me + 2 * w - 1 - step) % w;
        let mine = k.at(k.rank(), Buf::Input, block * n);
        // TODO: at step 0 the partial is my input alone; at step s > 0 it is my input plus
        // what prev sent me at step s - 1 (in my scratch slot s - 1, once prev's Data arrived):
        // wait, then k.reduce(mine, what I got, next's slot s, n) instead of this copy.
        ops.push(k.copy(mine, scratch(k.next(), step), n));
        ops.push(k.signal(k.next(), Data));
    }
    // TODO: prev's last send (in my slot w - 2) is its partial of my block r, missing only my
    // input: wait for it, add my input block r, and write the sum to my output.
    ops
}

/// Ring all-reduce: every rank ends with the sum of every rank's input (`n = k.elems()`
/// elements each), as a reduce-scatter of `world` segments then an all-gather of them.
pub fn all_reduce(k: &Kit) -> Vec<Op> {
    // TODO: the same two passes over segments instead of blocks. Segment i is
    // `k.segment(i, world)` (a `Part` with `start` and `len`; segments differ by at most one
    // element). First a reduce-scatter pass (rank r ends with segment r reduced, at its place
    // in the output), then lab 1's all-gather pass forwarding segments from output to output.
    // One Ready handshake at the start covers both passes.
    vec![k.copy(
        k.at(k.rank(), Buf::Input, 0),
        k.at(k.rank(), Buf::Output, 0),
        k.elems(),
    )]
}

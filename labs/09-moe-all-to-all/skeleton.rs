//! Lab 9: all-to-all for a mixture-of-experts layer. This is the file you edit.
//!
//! Check it with `cargo xtask lab check 9`; the README of this folder explains the idea.

use symm_core::op::{Buf, Op};
use symm_core::signal::SlotKind::{Data, Ready};
use symm_labs::kit::Kit;

/// Pairwise all-to-all: rank r's input block q lands in rank q's output block r.
pub fn all_to_all(k: &Kit) -> Vec<Op> {
    let (me, w, n) = (k.rank() as u64, k.world() as u64, k.elems());
    let peers = || (0..k.world()).filter(move |&q| q as u64 != me);
    let mut ops: Vec<Op> = peers().map(|q| k.signal(q, Ready)).collect();
    ops.extend(peers().map(|q| k.wait(q, Ready, 1)));
    let own = k.at(k.rank(), Buf::Input, me * n);
    ops.push(k.copy(own, k.at(k.rank(), Buf::Output, me * n), n));
    for s in 1..w {
        let to = ((me + s) % w) as u16;
        let from = ((me + w - s) % w) as u16;
        // TODO: which of my input blocks belongs to rank `to`, and where in its output does it
        // go? (Not my own block, and not at my own block's place in my input.)
        let src = k.at(k.rank(), Buf::Input, me * n);
        ops.push(k.copy(src, k.at(to, Buf::Output, me * n), n));
        ops.push(k.signal(to, Data));
        ops.push(k.wait(from, Data, 1));
    }
    ops
}

/// MoE dispatch, an all-to-allv: rank r sends `counts[r * world + q]` elements (its tokens
/// routed to the expert on rank q, stored grouped by q in its input) to rank q, which stores
/// them grouped by sender.
pub fn dispatch(k: &Kit, counts: &[u64]) -> Vec<Op> {
    // TODO: as all_to_all, but block q of my input starts after my elements for 0 .. q, and my
    // elements land in q's output after those of ranks 0 .. r (prefix sums of `counts`).
    // Signal every peer once even when you send it nothing: it waits for each of you.
    let _ = (k, counts);
    Vec::new()
}

/// MoE combine: every token goes back to the rank it came from, to the place it came from.
pub fn combine(k: &Kit, counts: &[u64]) -> Vec<Op> {
    // TODO: which all-to-allv undoes the dispatch?
    let _ = (k, counts);
    Vec::new()
}

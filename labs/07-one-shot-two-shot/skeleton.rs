//! Lab 7: one-shot against two-shot. This is the file you edit.
//!
//! Check it with `cargo xtask lab check 7`; the README of this folder explains the idea.

use symm_core::cost::Link;
use symm_core::op::{Buf, Op};
use symm_core::signal::SlotKind::{Done, Ready};
use symm_labs::kit::Kit;

/// One-shot all-reduce (given): every rank reads every rank's whole input and sums it, in rank
/// order.
pub fn one_shot(k: &Kit) -> Vec<Op> {
    let (me, w, n) = (k.rank(), k.world(), k.elems());
    let peers = || (0..w).filter(move |&q| q != me);
    let input = |q: u16| k.at(q, Buf::Input, 0);
    let out = k.at(me, Buf::Output, 0);
    let mut ops: Vec<Op> = peers().map(|q| k.signal(q, Ready)).collect();
    ops.extend(peers().map(|q| k.wait(q, Ready, 1)));
    if w == 1 {
        ops.push(k.copy(input(me), out, n));
        return ops;
    }
    // One k-way reduce reads every rank's input at once: one op, one round.
    let all: Vec<u16> = (0..w).collect();
    ops.extend(k.reduce_n(Buf::Input, 0, &all, out, n));
    // I read your input: you may reuse it once everyone has said so.
    ops.extend(peers().map(|q| k.signal(q, Done)));
    ops.extend(peers().map(|q| k.wait(q, Done, 1)));
    ops
}

/// Two-shot all-reduce: rank r sums segment r of every input (a direct reduce-scatter), then
/// writes it into every peer's output (a direct all-gather).
pub fn two_shot(k: &Kit) -> Vec<Op> {
    // TODO: like one_shot, over segment r = k.segment(rank, world) only; then copy the summed
    // segment into every peer's output and signal it Data. Which signal tells a rank both that
    // its output is complete and that nobody reads its input any more?
    one_shot(k)
}

/// The smallest size of `SIZES` at which the cost model predicts two-shot faster than
/// one-shot, at `world` ranks on `link`.
pub fn predict_crossover(world: u16, link: &Link) -> Option<u64> {
    // TODO: for each size of symm_labs::lab07::SIZES, compare
    // symm_core::cost::predict(&symm_labs::lab07::request(Algorithm::OneShot, world, bytes), link)
    // with the same for Algorithm::TwoShot.
    let _ = (world, link);
    None
}

/// The smallest size of `SIZES` at which the simulator times `two_shot` faster than
/// `one_shot`, at `world` ranks on `link`.
pub fn measure_crossover(world: u16, link: &Link) -> Option<u64> {
    // TODO: the same search, timing your own schedules with
    // symm_labs::lab07::time_us(&one_shot, Algorithm::OneShot, world, bytes, link).
    let _ = (world, link);
    None
}

//! Lab 7, reference solution: one-shot and two-shot all-reduce, and their crossover predicted
//! by the cost model and measured on the simulator.

use symm_core::cost::Link;
use symm_core::op::{Buf, Op};
use symm_core::sched::Algorithm;
use symm_core::signal::SlotKind::{Data, Done, Ready};
use symm_labs::kit::Kit;
use symm_labs::lab07::{predict, time_us, SIZES};

/// One-shot all-reduce: every rank reads every rank's whole input and sums it, in rank order.
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
    let (me, w) = (k.rank(), k.world());
    let peers = || (0..w).filter(move |&q| q != me);
    let seg = k.segment(me as u64, w as u64);
    let input = |q: u16| k.at(q, Buf::Input, seg.start);
    let out = |q: u16| k.at(q, Buf::Output, seg.start);
    let mut ops: Vec<Op> = peers().map(|q| k.signal(q, Ready)).collect();
    ops.extend(peers().map(|q| k.wait(q, Ready, 1)));
    if w == 1 {
        ops.push(k.copy(input(me), out(me), seg.len));
        return ops;
    }
    let all: Vec<u16> = (0..w).collect();
    ops.extend(k.reduce_n(Buf::Input, seg.start, &all, out(me), seg.len));
    for q in peers() {
        ops.push(k.copy(out(me), out(q), seg.len));
        ops.push(k.signal(q, Data));
    }
    // Each peer's Data says: your output holds my segment, and I finished reading your input.
    ops.extend(peers().map(|q| k.wait(q, Data, 1)));
    ops
}

/// The smallest size of `SIZES` at which the cost model predicts two-shot faster than
/// one-shot, at `world` ranks on `link`.
pub fn predict_crossover(world: u16, link: &Link) -> Option<u64> {
    SIZES.into_iter().find(|&bytes| {
        let one = predict(Algorithm::OneShot, world, bytes, link);
        let two = predict(Algorithm::TwoShot, world, bytes, link);
        two < one
    })
}

/// The smallest size of `SIZES` at which the simulator times `two_shot` faster than
/// `one_shot`, at `world` ranks on `link`.
pub fn measure_crossover(world: u16, link: &Link) -> Option<u64> {
    SIZES.into_iter().find(|&bytes| {
        let one = time_us(&one_shot, Algorithm::OneShot, world, bytes, link);
        let two = time_us(&two_shot, Algorithm::TwoShot, world, bytes, link);
        matches!((one, two), (Ok(one), Ok(two)) if two < one)
    })
}

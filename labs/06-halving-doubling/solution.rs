//! Lab 6, reference solution: recursive halving-doubling all-reduce for any world size.

use symm_core::op::{Buf, Op};
use symm_core::signal::SlotKind::{Data, Ready};
use symm_labs::kit::Kit;

/// Halving-doubling all-reduce. With `p` the largest power of two not above the world and
/// `e = world - p`, the first `2e` ranks pair up: each even one (an extra) folds its input into
/// the odd one after it and waits for the result. The other `p` ranks take virtual ranks
/// `0 .. p` and run halving (reduce-scatter) then doubling (all-gather) among themselves.
pub fn all_reduce(k: &Kit) -> Vec<Op> {
    let (me, w, n) = (k.rank() as u64, k.world() as u64, k.elems());
    let mut ops = Vec::new();
    let out = |rank: u16, e: u64| k.at(rank, Buf::Output, e);
    // Scratch region r holds a whole buffer: region 0 the fold, region i + 1 halving step i.
    let scratch =
        |rank: u16, region: u64, e: u64| k.at(rank, Buf::Scratch, k.scratch_region(region, 0) + e);
    let input = k.at(k.rank(), Buf::Input, 0);
    if w == 1 {
        ops.push(k.copy(input, out(0, 0), n));
        return ops;
    }
    let levels = 63 - w.leading_zeros() as u64;
    let p = 1u64 << levels;
    let e = w - p;
    if me < 2 * e && me % 2 == 0 {
        // An extra: fold into my partner, then wait for it to hand back the result.
        let partner = k.rank() + 1;
        ops.push(k.signal(partner, Ready));
        ops.push(k.wait(partner, Ready, 1));
        ops.push(k.copy(input, scratch(partner, 0, 0), n));
        ops.push(k.signal(partner, Data));
        ops.push(k.wait(partner, Data, 1));
        return ops;
    }
    let v = if me < 2 * e { me / 2 } else { me - e };
    let real = |v: u64| (if v < e { 2 * v + 1 } else { v + e }) as u16;
    let extra = (me < 2 * e).then(|| k.rank() - 1);
    // Ready with everyone who will touch my buffers, or whose buffers I touch.
    let partners: Vec<u16> = extra
        .into_iter()
        .chain((0..levels).map(|i| real(v ^ (p >> (i + 1)))))
        .collect();
    for &q in &partners {
        ops.push(k.signal(q, Ready));
    }
    for &q in &partners {
        ops.push(k.wait(q, Ready, 1));
    }
    // Fold: my output starts as my input (plus my extra's).
    match extra {
        Some(x) => {
            ops.push(k.wait(x, Data, 1));
            ops.push(k.reduce(input, scratch(k.rank(), 0, 0), out(k.rank(), 0), n));
        }
        None => ops.push(k.copy(input, out(k.rank(), 0), n)),
    }
    // Halving: I hold segments [lo, lo + 2b) of p; keep half, send the partner the other.
    let mut lo = 0;
    for i in 0..levels {
        let b = p >> (i + 1);
        let q = real(v ^ b);
        let (keep, give) = if v & b == 0 {
            (lo, lo + b)
        } else {
            (lo + b, lo)
        };
        let g = k.segments(give, give + b, p);
        let kp = k.segments(keep, keep + b, p);
        ops.push(k.copy(out(k.rank(), g.start), scratch(q, i + 1, g.start), g.len));
        ops.push(k.signal(q, Data));
        ops.push(k.wait(q, Data, 1));
        let got = scratch(k.rank(), i + 1, kp.start);
        ops.push(k.reduce(
            out(k.rank(), kp.start),
            got,
            out(k.rank(), kp.start),
            kp.len,
        ));
        lo = keep;
    }
    // Doubling: swap complete ranges with the partner, doubling the range every step.
    for j in 0..levels {
        let b = 1u64 << j;
        let q = real(v ^ b);
        let mine = k.segments(lo, lo + b, p);
        ops.push(k.copy(out(k.rank(), mine.start), out(q, mine.start), mine.len));
        ops.push(k.signal(q, Data));
        ops.push(k.wait(q, Data, 1));
        lo &= !b;
    }
    // Unfold: hand the result to my extra.
    if let Some(x) = extra {
        ops.push(k.copy(out(k.rank(), 0), out(x, 0), n));
        ops.push(k.signal(x, Data));
    }
    ops
}

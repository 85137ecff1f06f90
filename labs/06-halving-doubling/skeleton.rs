//! Lab 6: recursive halving-doubling for any world size. This is the file you edit.
//!
//! Check it with `cargo xtask lab check 6`; the README of this folder explains the idea.

use symm_core::op::{Buf, Op};
use symm_core::signal::SlotKind::{Data, Ready};
use symm_labs::kit::Kit;

/// Halving-doubling all-reduce: every rank ends with the sum of every rank's input.
pub fn all_reduce(k: &Kit) -> Vec<Op> {
    let (me, w, n) = (k.rank() as u64, k.world() as u64, k.elems());
    let mut ops = Vec::new();
    let out = |rank: u16, e: u64| k.at(rank, Buf::Output, e);
    // Scratch region r holds a whole buffer: region 0 for the fold, region i + 1 for halving
    // step i.
    let scratch =
        |rank: u16, region: u64, e: u64| k.at(rank, Buf::Scratch, k.scratch_region(region, 0) + e);
    let input = k.at(k.rank(), Buf::Input, 0);
    if w == 1 {
        ops.push(k.copy(input, out(0, 0), n));
        return ops;
    }
    // TODO (non-powers of two): this pretends the world is a power of two. Take p, the largest
    // power of two not above w, and e = w - p: the first 2e ranks pair up, each even one (an
    // extra) folds its input into the odd one after it (into its scratch region 0) and waits
    // for the result; the others take virtual ranks v (odd r < 2e: r / 2; r >= 2e: r - e), and
    // real(v) must map a virtual rank back. At the end, hand the result back to your extra.
    let levels = 64 - (w - 1).leading_zeros() as u64;
    let p = 1u64 << levels;
    let v = me;
    let real = |v: u64| v as u16;
    let partners: Vec<u16> = (0..levels).map(|i| real(v ^ (p >> (i + 1)))).collect();
    for &q in &partners {
        ops.push(k.signal(q, Ready));
    }
    for &q in &partners {
        ops.push(k.wait(q, Ready, 1));
    }
    ops.push(k.copy(input, out(k.rank(), 0), n));
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
    // TODO: doubling. Now I hold segment v fully reduced ([lo, lo + 1)). For j = 0, 1, ...:
    // with bit b = 1 << j and partner v ^ b, copy my range [lo, lo + b) of segments into the
    // partner's output at the same place, signal Data, wait for the partner's range, and
    // grow: lo &= !b.
    let _ = lo;
    ops
}

//! Lab 2, reference solution: ring reduce-scatter, and ring all-reduce as a reduce-scatter
//! followed by an all-gather.

use symm_core::op::{Buf, Op};
use symm_core::sched::Part;
use symm_core::signal::SlotKind::{Data, Ready};
use symm_labs::kit::Kit;

/// The reduce-scatter pass over `w` pieces: piece `i` of the data is input elements
/// `input(i)`; rank r ends with the sum of piece r over every rank at output elements
/// `output.start ..`. Step s of the ring uses scratch slot s.
fn reduce_scatter_pass(k: &Kit, input: &dyn Fn(u64) -> Part, output: u64, ops: &mut Vec<Op>) {
    let (me, w) = (k.rank() as u64, k.world() as u64);
    let scratch = |rank: u16, step: u64| k.at(rank, Buf::Scratch, k.scratch_slot(step));
    for step in 0..w - 1 {
        // At step s I send my partial of piece (r - s - 1): at step 0 my own input of it, later
        // my input plus the partial prev sent me at step s - 1.
        let p = input((me + 2 * w - 1 - step) % w);
        let mine = k.at(k.rank(), Buf::Input, p.start);
        if step == 0 {
            ops.push(k.copy(mine, scratch(k.next(), 0), p.len));
        } else {
            ops.push(k.wait(k.prev(), Data, 1));
            let got = scratch(k.rank(), step - 1);
            ops.push(k.reduce(mine, got, scratch(k.next(), step), p.len));
        }
        ops.push(k.signal(k.next(), Data));
    }
    // Prev's last send is its partial of my piece, missing only my input.
    let p = input(me);
    ops.push(k.wait(k.prev(), Data, 1));
    let got = scratch(k.rank(), w - 2);
    let mine = k.at(k.rank(), Buf::Input, p.start);
    ops.push(k.reduce(mine, got, k.at(k.rank(), Buf::Output, output), p.len));
}

/// Ring reduce-scatter: rank r ends with block r of the sum of every rank's input (the input
/// has `world` blocks of `n = k.elems()` elements, the output one).
pub fn reduce_scatter(k: &Kit) -> Vec<Op> {
    let n = k.elems();
    let mut ops = Vec::new();
    if k.world() == 1 {
        ops.push(k.copy(k.at(0, Buf::Input, 0), k.at(0, Buf::Output, 0), n));
        return ops;
    }
    ops.push(k.signal(k.prev(), Ready));
    ops.push(k.wait(k.next(), Ready, 1));
    reduce_scatter_pass(
        k,
        &|b| Part {
            start: b * n,
            len: n,
        },
        0,
        &mut ops,
    );
    ops
}

/// Ring all-reduce: every rank ends with the sum of every rank's input (`n = k.elems()`
/// elements each), as a reduce-scatter of the `world` segments then an all-gather of them.
pub fn all_reduce(k: &Kit) -> Vec<Op> {
    let (me, w) = (k.rank() as u64, k.world() as u64);
    let mut ops = Vec::new();
    if w == 1 {
        ops.push(k.copy(k.at(0, Buf::Input, 0), k.at(0, Buf::Output, 0), k.elems()));
        return ops;
    }
    ops.push(k.signal(k.prev(), Ready));
    ops.push(k.wait(k.next(), Ready, 1));
    let seg = |i: u64| k.segment(i, w);
    reduce_scatter_pass(k, &seg, seg(me).start, &mut ops);
    // All-gather of the reduced segments, as in lab 1, in place in the outputs.
    for step in 0..w - 1 {
        let p = seg((me + w - step) % w);
        if step > 0 {
            ops.push(k.wait(k.prev(), Data, 1));
        }
        let at = |rank| k.at(rank, Buf::Output, p.start);
        ops.push(k.copy(at(k.rank()), at(k.next()), p.len));
        ops.push(k.signal(k.next(), Data));
    }
    ops.push(k.wait(k.prev(), Data, 1));
    ops
}

//! Lab 3, reference solution: pipelined ring reduce-scatter with credits.

use symm_core::op::{Buf, Op};
use symm_core::sched::Part;
use symm_core::signal::SlotKind::{Credit, Data, Ready};
use symm_labs::kit::Kit;

/// Pipelined ring reduce-scatter: every block is cut into chunks (one scratch slot each) and
/// the ring runs chunk by chunk, through `k.slots()` slots reused under credit flow control.
pub fn reduce_scatter(k: &Kit) -> Vec<Op> {
    let (me, w, n) = (k.rank() as u64, k.world() as u64, k.elems());
    let mut ops = Vec::new();
    if w == 1 {
        ops.push(k.copy(k.at(0, Buf::Input, 0), k.at(0, Buf::Output, 0), n));
        return ops;
    }
    ops.push(k.signal(k.prev(), Ready));
    ops.push(k.wait(k.next(), Ready, 1));
    let chunks = k.chunks(n);
    let slots = k.slots();
    // The stream me -> next carries chunks * (w - 1) transfers; transfer j uses slot j % slots.
    let total = chunks * (w - 1);
    let scratch = |rank: u16, j: u64| k.at(rank, Buf::Scratch, k.scratch_slot(j));
    for c in 0..chunks {
        for step in 0..w {
            let block = (me + 2 * w - 1 - step) % w;
            let p = k.chunk(
                Part {
                    start: block * n,
                    len: n,
                },
                c,
                chunks,
            );
            let out = k.chunk(Part { start: 0, len: n }, c, chunks);
            let mine = k.at(k.rank(), Buf::Input, p.start);
            // My transfer number on my stream (steps 0 .. w-2 send), and prev's that I receive.
            let j = c * (w - 1) + step;
            if step > 0 {
                ops.push(k.wait(k.prev(), Data, 1));
            }
            // Reusing a slot: wait until next has consumed what transfer j - slots left there.
            if step < w - 1 && j >= slots {
                ops.push(k.wait(k.next(), Credit, 1));
            }
            ops.push(if step == 0 {
                k.copy(mine, scratch(k.next(), j), p.len)
            } else if step < w - 1 {
                k.reduce(mine, scratch(k.rank(), j - 1), scratch(k.next(), j), p.len)
            } else {
                let dst = k.at(k.rank(), Buf::Output, out.start);
                k.reduce(mine, scratch(k.rank(), j - 1), dst, p.len)
            });
            // My slot (j - 1) % slots is free again: tell prev, if it will ever wait for it.
            if step > 0 && j - 1 + slots < total {
                ops.push(k.signal(k.prev(), Credit));
            }
            if step < w - 1 {
                ops.push(k.signal(k.next(), Data));
            }
        }
    }
    ops
}

/// The fewest scratch slots with which `reduce_scatter` runs at `world` ranks.
///
/// A rank frees the slot it received into only after writing the combined chunk into next's
/// slot. With one slot and three or more ranks, every rank fills its successor's only slot at
/// step 0, and then each waits for a credit that its successor can only return after writing
/// into a slot that is full: a cycle of waits around the ring. With two ranks the last step
/// writes into the rank's own output, so the cycle never closes.
pub fn min_slots(world: u16) -> u64 {
    if world >= 3 {
        2
    } else {
        1
    }
}

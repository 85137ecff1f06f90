//! Lab 5, reference solution: double binary tree broadcast.

use symm_core::op::{Buf, Op};
use symm_core::signal::SlotKind::{Data, DataB, Ready};
use symm_labs::kit::Kit;

/// Where `rank` sits in tree `t`: the root is above both trees (`None`); the other `w - 1`
/// ranks take indices `0 .. w - 1` of a binary heap, in rank order after the root for tree 0
/// and in the mirrored order for tree 1.
fn index(k: &Kit, t: u64, rank: u16) -> Option<u64> {
    let w = k.world() as u64;
    let p = (rank as u64 + w - k.root() as u64) % w;
    let i = p.checked_sub(1)?;
    Some(if t == 0 { i } else { w - 2 - i })
}

/// The rank at index `i` of tree `t`.
fn rank_at(k: &Kit, t: u64, i: u64) -> u16 {
    let w = k.world() as u64;
    let i = if t == 0 { i } else { w - 2 - i };
    ((i + 1 + k.root() as u64) % w) as u16
}

/// This rank's parent in tree `t`: the root for index 0, else the heap parent (i - 1) / 2.
fn parent(k: &Kit, t: u64) -> Option<u16> {
    match index(k, t, k.rank())? {
        0 => Some(k.root()),
        i => Some(rank_at(k, t, (i - 1) / 2)),
    }
}

/// This rank's children in tree `t`: the root's is index 0; index i's are 2i + 1 and 2i + 2.
fn children(k: &Kit, t: u64) -> Vec<u16> {
    let n = k.world() as u64 - 1;
    let kids = match index(k, t, k.rank()) {
        None => vec![0],
        Some(i) => vec![2 * i + 1, 2 * i + 2],
    };
    kids.into_iter()
        .filter(|&c| c < n)
        .map(|c| rank_at(k, t, c))
        .collect()
}

/// Double binary tree broadcast: the root's input reaches every rank's output, the first half
/// down tree 0 and the second half down tree 1, chunk by chunk.
pub fn broadcast(k: &Kit) -> Vec<Op> {
    let me = k.rank();
    let mut ops = Vec::new();
    // My parents write into my output: tell them I am here; wait until my children are.
    for t in 0..2 {
        if let Some(p) = parent(k, t) {
            ops.push(k.signal(p, Ready));
        }
    }
    for t in 0..2 {
        for c in children(k, t) {
            ops.push(k.wait(c, Ready, 1));
        }
    }
    if me == k.root() {
        ops.push(k.copy(k.at(me, Buf::Input, 0), k.at(me, Buf::Output, 0), k.elems()));
    }
    for t in 0..2 {
        let kind = if t == 0 { Data } else { DataB };
        let half = k.segment(t, 2);
        let chunks = k.chunks(half.len);
        for c in 0..chunks {
            let part = k.chunk(half, c, chunks);
            if let Some(p) = parent(k, t) {
                ops.push(k.wait(p, kind, 1));
            }
            for child in children(k, t) {
                let at = |rank| k.at(rank, Buf::Output, part.start);
                ops.push(k.copy(at(me), at(child), part.len));
                ops.push(k.signal(child, kind));
            }
        }
    }
    ops
}

//! Lab 5: double binary tree broadcast. This is the file you edit.
//!
//! Check it with `cargo xtask lab check 5`; the README of this folder explains the idea.

use symm_core::op::{Buf, Op};
use symm_core::signal::SlotKind::{Data, Ready};
use symm_labs::kit::Kit;

/// Where `rank` sits in tree `t`: the root is above the tree (`None`); the other `w - 1`
/// ranks take indices `0 .. w - 1` of a binary heap, in rank order after the root.
fn index(k: &Kit, t: u64, rank: u16) -> Option<u64> {
    let w = k.world() as u64;
    let p = (rank as u64 + w - k.root() as u64) % w;
    let i = p.checked_sub(1)?;
    // TODO: tree 1 numbers the same ranks in mirrored order, w - 2 - i, so that the ranks
    // deep inside tree 0 (low indices) are leaves of tree 1.
    let _ = t;
    Some(i)
}

/// The rank at index `i` of tree `t`.
fn rank_at(k: &Kit, t: u64, i: u64) -> u16 {
    let w = k.world() as u64;
    // TODO: undo the mirror for tree 1.
    let _ = t;
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

/// Broadcast: the root's input reaches every rank's output. As given, the whole buffer goes
/// down one binary tree, chunk by chunk: correct, but every rank with two children sends the
/// whole buffer twice.
pub fn broadcast(k: &Kit) -> Vec<Op> {
    let me = k.rank();
    let mut ops = Vec::new();
    // TODO: with two trees, signal Ready to the parent in each and wait for the children of
    // each (a rank that is your child in both trees waits twice: it signals twice).
    if let Some(p) = parent(k, 0) {
        ops.push(k.signal(p, Ready));
    }
    for c in children(k, 0) {
        ops.push(k.wait(c, Ready, 1));
    }
    if me == k.root() {
        ops.push(k.copy(k.at(me, Buf::Input, 0), k.at(me, Buf::Output, 0), k.elems()));
    }
    // TODO: send half t = k.segment(t, 2) down tree t, for t = 0 and 1, with slot kind Data
    // for tree 0 and DataB for tree 1 (each tree's signals need their own counter).
    let all = k.segment(0, 1);
    let chunks = k.chunks(all.len);
    for c in 0..chunks {
        let part = k.chunk(all, c, chunks);
        if let Some(p) = parent(k, 0) {
            ops.push(k.wait(p, Data, 1));
        }
        for child in children(k, 0) {
            let at = |rank| k.at(rank, Buf::Output, part.start);
            ops.push(k.copy(at(me), at(child), part.len));
            ops.push(k.signal(child, Data));
        }
    }
    ops
}

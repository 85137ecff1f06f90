//! Source-level mistakes for the bug catalogue ([`crate::catalogue`]): schedules written with
//! one slip that no mutation of a solution's ops can express, where two ranks compute each
//! other's place by formulas that disagree.

use crate::catalogue::{Bug, How};
use crate::evidence::Cause;
use crate::grade::{Graded, Grader};
use crate::kit::Kit;
use crate::{lab05, lab06, lab09};
use symm_core::op::{Buf, Op};
use symm_core::signal::SlotKind::{Data, DataB, Ready};

/// The catalogue's source-level bugs.
pub fn bugs() -> Vec<Bug> {
    let bug = |lab, name, check: fn(&mut Grader) -> Graded| Bug {
        lab,
        name,
        how: How::Variant(check),
        cause: Cause::Mapping,
    };
    vec![
        bug(5, "rank_at does not undo the mirror of index", |g| {
            lab05::check_plan(g, &|k| tree_broadcast(k, Tree::RankAtUnmirrored))
        }),
        bug(
            5,
            "the mirror is w - 1 - i in index, w - 2 - i in rank_at",
            |g| lab05::check_plan(g, &|k| tree_broadcast(k, Tree::MirrorOffByOne)),
        ),
        bug(
            6,
            "a folded pair's survivor is taken as 2v, not 2v + 1",
            |g| lab06::check_plan(g, &folded_wrong),
        ),
        bug(
            9,
            "combine sends with dispatch's counts, not transposed",
            |g| {
                use lab09::solution as s;
                let combine = |k: &Kit, counts: &[u64]| s::dispatch(k, counts);
                lab09::check_parts(
                    g,
                    &s::all_to_all,
                    &s::dispatch,
                    &combine,
                    &s::route,
                    &s::expert_row,
                )
            },
        ),
    ]
}

/// Which slip a double binary tree makes.
#[derive(Clone, Copy, PartialEq)]
enum Tree {
    /// `rank_at` numbers tree 1 like tree 0.
    RankAtUnmirrored,
    /// `index` mirrors with `w - 1 - i`, `rank_at` with `w - 2 - i`.
    MirrorOffByOne,
}

/// Lab 5's double binary tree with a `rank_at` that does not undo `index`.
fn tree_broadcast(k: &Kit, slip: Tree) -> Vec<Op> {
    let w = k.world() as u64;
    let root = k.root() as u64;
    let index = |t: u64, rank: u16| -> Option<u64> {
        let i = ((rank as u64 + w - root) % w).checked_sub(1)?;
        Some(match (t, slip) {
            (0, _) => i,
            (_, Tree::MirrorOffByOne) => (w - 1 - i) % (w - 1).max(1),
            _ => w - 2 - i,
        })
    };
    let rank_at = |t: u64, i: u64| -> u16 {
        let i = match (t, slip) {
            (0, _) | (_, Tree::RankAtUnmirrored) => i,
            _ => w - 2 - i,
        };
        ((i + 1 + root) % w) as u16
    };
    let me = k.rank();
    let parent = |t| match index(t, me)? {
        0 => Some(k.root()),
        i => Some(rank_at(t, (i - 1) / 2)),
    };
    let children = |t| -> Vec<u16> {
        let kids = match index(t, me) {
            None => vec![0],
            Some(i) => vec![2 * i + 1, 2 * i + 2],
        };
        kids.into_iter()
            .filter(|&c| c < w - 1)
            .map(|c| rank_at(t, c))
            .collect()
    };
    let mut ops = Vec::new();
    for t in 0..2 {
        if let Some(p) = parent(t) {
            ops.push(k.signal(p, Ready));
        }
    }
    for t in 0..2 {
        for c in children(t) {
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
            if let Some(p) = parent(t) {
                ops.push(k.wait(p, kind, 1));
            }
            for child in children(t) {
                let at = |rank| k.at(rank, Buf::Output, part.start);
                ops.push(k.copy(at(me), at(child), part.len));
                ops.push(k.signal(child, kind));
            }
        }
    }
    ops
}

/// Lab 6's all-reduce whose `real` maps a folded pair's virtual rank to the pair's even rank
/// (`2v`), where each rank's own `v` says the survivor is the odd one (`2v + 1`).
fn folded_wrong(k: &Kit) -> Vec<Op> {
    let (me, w, n) = (k.rank() as u64, k.world() as u64, k.elems());
    let mut ops = Vec::new();
    let out = |rank: u16, e: u64| k.at(rank, Buf::Output, e);
    let scratch =
        |rank: u16, region: u64, e: u64| k.at(rank, Buf::Scratch, k.scratch_region(region, 0) + e);
    let input = k.at(k.rank(), Buf::Input, 0);
    if w == 1 {
        return vec![k.copy(input, out(0, 0), n)];
    }
    let levels = 63 - w.leading_zeros() as u64;
    let p = 1u64 << levels;
    let e = w - p;
    if me < 2 * e && me % 2 == 0 {
        let partner = k.rank() + 1;
        ops.push(k.signal(partner, Ready));
        ops.push(k.wait(partner, Ready, 1));
        ops.push(k.copy(input, scratch(partner, 0, 0), n));
        ops.push(k.signal(partner, Data));
        ops.push(k.wait(partner, Data, 1));
        return ops;
    }
    let v = if me < 2 * e { me / 2 } else { me - e };
    // The slip: 2v is the rank that folded out, not the survivor.
    let real = |v: u64| (if v < e { 2 * v } else { v + e }) as u16;
    let extra = (me < 2 * e).then(|| k.rank() - 1);
    let partners: Vec<u16> = extra
        .into_iter()
        .chain((0..levels).map(|i| real(v ^ (p >> (i + 1)))))
        .collect();
    ops.extend(partners.iter().map(|&q| k.signal(q, Ready)));
    ops.extend(partners.iter().map(|&q| k.wait(q, Ready, 1)));
    match extra {
        Some(x) => {
            ops.push(k.wait(x, Data, 1));
            ops.push(k.reduce(input, scratch(k.rank(), 0, 0), out(k.rank(), 0), n));
        }
        None => ops.push(k.copy(input, out(k.rank(), 0), n)),
    }
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
    for j in 0..levels {
        let b = 1u64 << j;
        let q = real(v ^ b);
        let mine = k.segments(lo, lo + b, p);
        ops.push(k.copy(out(k.rank(), mine.start), out(q, mine.start), mine.len));
        ops.push(k.signal(q, Data));
        ops.push(k.wait(q, Data, 1));
        lo &= !b;
    }
    if let Some(x) = extra {
        ops.push(k.copy(out(k.rank(), 0), out(x, 0), n));
        ops.push(k.signal(x, Data));
    }
    ops
}

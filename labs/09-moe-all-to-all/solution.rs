//! Lab 9, reference solution: pairwise all-to-all, and the all-to-allv of a mixture-of-experts
//! layer's dispatch and combine.

use symm_core::moe::{MoeConfig, NONE};
use symm_core::op::{Buf, Op};
use symm_core::signal::SlotKind::{Data, Ready};
use symm_labs::kit::Kit;

/// Pairwise all-to-all: rank r's input block q lands in rank q's output block r. At step s,
/// rank r sends to r + s and hears from r - s, so no rank is written by two ranks at once.
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
        let src = k.at(k.rank(), Buf::Input, to as u64 * n);
        ops.push(k.copy(src, k.at(to, Buf::Output, me * n), n));
        ops.push(k.signal(to, Data));
        ops.push(k.wait(from, Data, 1));
    }
    ops
}

/// Where rank `r`'s elements for rank `q` start in r's input: after its elements for 0 .. q.
fn send_offset(counts: &[u64], w: u64, r: u64, q: u64) -> u64 {
    (0..q).map(|p| counts[(r * w + p) as usize]).sum()
}

/// Where rank `r`'s elements start in rank `q`'s output: after those of ranks 0 .. r.
fn recv_offset(counts: &[u64], w: u64, r: u64, q: u64) -> u64 {
    (0..r).map(|p| counts[(p * w + q) as usize]).sum()
}

/// MoE dispatch, an all-to-allv: rank r sends `counts[r * world + q]` elements (its tokens
/// routed to the expert on rank q, stored grouped by q in its input) to rank q, which stores
/// them grouped by sender.
pub fn dispatch(k: &Kit, counts: &[u64]) -> Vec<Op> {
    let (me, w) = (k.rank() as u64, k.world() as u64);
    let peers = || (0..k.world()).filter(move |&q| q as u64 != me);
    let mut ops: Vec<Op> = peers().map(|q| k.signal(q, Ready)).collect();
    ops.extend(peers().map(|q| k.wait(q, Ready, 1)));
    for s in 0..w {
        let to = (me + s) % w;
        let len = counts[(me * w + to) as usize];
        let src = k.at(k.rank(), Buf::Input, send_offset(counts, w, me, to));
        let dst = k.at(to as u16, Buf::Output, recv_offset(counts, w, me, to));
        ops.push(k.copy(src, dst, len));
        if s > 0 {
            ops.push(k.signal(to as u16, Data));
        }
    }
    ops.extend(peers().map(|q| k.wait(q, Data, 1)));
    ops
}

/// MoE combine: every token goes back to the rank it came from, to the place it came from. It
/// is the dispatch with the counts transposed: rank q returns to r what r sent to q.
pub fn combine(k: &Kit, counts: &[u64]) -> Vec<Op> {
    let w = k.world() as usize;
    let transposed: Vec<u64> = (0..w * w).map(|i| counts[(i % w) * w + i / w]).collect();
    dispatch(k, &transposed)
}

/// MoE dispatch placement, the sender's side: `slots[t * world + q]` is the number of earlier
/// tokens that also go to q (one slot per token and rank, however many of its experts live
/// there), `eslots[t * topk + k]` the number of earlier entries with the same expert.
pub fn route(
    cfg: &MoeConfig,
    idx: &[i64],
    slots: &mut [u32],
    eslots: &mut [u32],
    counts: &mut [u32],
    ecounts: &mut [u32],
) {
    let (w, k) = (cfg.world as usize, cfg.topk as usize);
    counts.fill(0);
    ecounts.fill(0);
    for (t, row) in idx.chunks_exact(k).enumerate() {
        let mut goes = vec![false; w];
        for (j, &e) in row.iter().enumerate() {
            eslots[t * k + j] = match cfg.owner(e) {
                Some((q, _)) => {
                    goes[q as usize] = true;
                    ecounts[e as usize] += 1;
                    ecounts[e as usize] - 1
                }
                None => NONE,
            };
        }
        for (q, &go) in goes.iter().enumerate() {
            slots[t * w + q] = if go {
                counts[q] += 1;
                counts[q] - 1
            } else {
                NONE
            };
        }
    }
}

/// MoE dispatch placement, the receiver's side: expert-major, then by sender, then in the
/// sender's order. Expert j's rows start after every row of local experts 0 .. j (a prefix sum
/// over the whole `world x L` column), its rows from `sender` after those from ranks 0 ..
/// sender (a prefix sum down column j).
pub fn expert_row(cfg: &MoeConfig, ecol: &[u32], sender: u16, j: u32, eslot: u32) -> Option<u32> {
    let (w, l) = (cfg.world as usize, cfg.local_experts() as usize);
    let n = |p: usize, jj: usize| u64::from(ecol[p * l + jj]);
    let base: u64 = (0..j as usize)
        .flat_map(|jj| (0..w).map(move |p| n(p, jj)))
        .sum();
    let before: u64 = (0..sender as usize).map(|p| n(p, j as usize)).sum();
    let row = base + before + u64::from(eslot);
    (row < u64::from(cfg.rows_max)).then_some(row as u32)
}

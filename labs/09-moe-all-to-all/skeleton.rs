//! Lab 9: all-to-all for a mixture-of-experts layer. This is the file you edit.
//!
//! Check it with `cargo xtask lab check 9`; the README of this folder explains the idea.

use symm_core::moe::{MoeConfig, NONE};
use symm_core::op::{Buf, Op};
use symm_core::signal::SlotKind::{Data, Ready};
use symm_labs::kit::Kit;

/// Pairwise all-to-all: rank r's input block q lands in rank q's output block r.
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
        // TODO: which of my input blocks belongs to rank `to`, and where in its output does it
        // go? (Not my own block, and not at my own block's place in my input.)
        let src = k.at(k.rank(), Buf::Input, me * n);
        ops.push(k.copy(src, k.at(to, Buf::Output, me * n), n));
        ops.push(k.signal(to, Data));
        ops.push(k.wait(from, Data, 1));
    }
    ops
}

/// MoE dispatch, an all-to-allv: rank r sends `counts[r * world + q]` elements (its tokens
/// routed to the expert on rank q, stored grouped by q in its input) to rank q, which stores
/// them grouped by sender.
pub fn dispatch(k: &Kit, counts: &[u64]) -> Vec<Op> {
    // TODO: as all_to_all, but block q of my input starts after my elements for 0 .. q, and my
    // elements land in q's output after those of ranks 0 .. r (prefix sums of `counts`).
    // Signal every peer once even when you send it nothing: it waits for each of you.
    let _ = (k, counts);
    Vec::new()
}

/// MoE combine: every token goes back to the rank it came from, to the place it came from.
pub fn combine(k: &Kit, counts: &[u64]) -> Vec<Op> {
    // TODO: which all-to-allv undoes the dispatch?
    let _ = (k, counts);
    Vec::new()
}

/// MoE dispatch placement, the sender's side. `idx` holds `topk` expert indices per token
/// (negative: no expert; at or past `experts`: invalid, skipped). Fill
/// * `slots[t * world + q]`: slot(t, q), the number of earlier tokens that also go to rank q, or
///   `NONE` when none of t's experts lives on q;
/// * `counts[q]`: how many tokens go to rank q;
/// * `eslots[t * topk + k]`: the number of earlier entries (row-major) with the same expert, or
///   `NONE` for a skipped entry;
/// * `ecounts[e]`: how many entries name expert e.
///
/// Expert e lives on rank `e / L` (`cfg.owner(e)` gives the rank and the local index).
pub fn route(
    cfg: &MoeConfig,
    idx: &[i64],
    slots: &mut [u32],
    eslots: &mut [u32],
    counts: &mut [u32],
    ecounts: &mut [u32],
) {
    let (w, k) = (cfg.world as usize, cfg.topk as usize);
    slots.fill(NONE);
    eslots.fill(NONE);
    counts.fill(0);
    ecounts.fill(0);
    for (t, row) in idx.chunks_exact(k).enumerate() {
        for (j, &e) in row.iter().enumerate() {
            if let Some((q, _)) = cfg.owner(e) {
                // TODO: a token goes to a rank once, however many of its experts live there.
                // This gives the token a new slot, and counts it again, for every one of them.
                let q = q as usize;
                slots[t * w + q] = counts[q];
                counts[q] += 1;
                eslots[t * k + j] = ecounts[e as usize];
                ecounts[e as usize] += 1;
            }
        }
    }
}

/// MoE dispatch placement, the receiver's side: the expert row of an entry for local expert `j`
/// from `sender` with `eslot`, given the receiver's column of expert counts (`ecol[p * L + j]`
/// entries of local expert j come from rank p). `None` when the row is at or past `rows_max`.
pub fn expert_row(cfg: &MoeConfig, ecol: &[u32], sender: u16, j: u32, eslot: u32) -> Option<u32> {
    let l = cfg.local_experts() as usize;
    // TODO: expert j's rows come after every row of local experts 0 .. j, from every sender.
    // This only skips expert j's rows from the senders before `sender`.
    let before: u32 = (0..sender as usize).map(|p| ecol[p * l + j as usize]).sum();
    let row = before + eslot;
    (row < cfg.rows_max).then_some(row)
}

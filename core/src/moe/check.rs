//! The symbolic check of the MoE layout: a whole dispatch and combine on sets, not bytes.
//!
//! [`check`] takes a shape and every rank's `topk_idx` and plays the protocol of the module doc
//! with nothing but the layout functions: each sender [`route`]s its tokens and places token `t`
//! in staging row `stage_row(r, slot(t, q))` of every destination `q`; each receiver learns only
//! the headers (the counts), reads staging rows `stage_row(r, s)` for `s < c[r][q]`, and places
//! every entry at its [`expert_row`]. Then it checks:
//!
//! * **staging**: every (sender, token, destination) has exactly one staging row, inside the
//!   half, no two share one, and the rows the receiver reads from the counts are exactly the
//!   rows written;
//! * **expert rows**: every valid entry lands in one row of its local expert's span or is
//!   dropped, no two entries share a row, and the spans are disjoint and cover
//!   `[0, min(entries, rows_max))` in expert order, so every kept row holds an entry;
//! * **combine**: the partials a sender sums for a token contain each (rank, entry) with a row
//!   exactly once, and nothing else.
//!
//! The layout is a [`Layout`] so tests can hand the checker a broken one and watch it fail;
//! [`Spec`] is the module's.

use super::{dest_mask, expert_row, expert_span, route, MoeConfig, MoeError, NONE};
use alloc::collections::BTreeMap;
use alloc::vec;
use alloc::vec::Vec;

mod error;
pub use error::{Entry, MoeCheckError};

/// The placement functions the protocol is built from.
pub trait Layout {
    /// The staging row of the token in `slot` from `sender` (dispatch and combine staging).
    fn stage_row(&self, cfg: &MoeConfig, sender: u16, slot: u32) -> u64;
    /// The expert row of an entry, `None` when dropped.
    fn expert_row(
        &self,
        cfg: &MoeConfig,
        ecol: &[u32],
        sender: u16,
        j: u32,
        eslot: u32,
    ) -> Option<u32>;
    /// Local expert `j`'s rows: (first row, count).
    fn expert_span(&self, cfg: &MoeConfig, ecol: &[u32], j: u32) -> (u32, u32);
}

/// The layout of the module doc: [`MoeConfig::stage_row`], [`expert_row`], [`expert_span`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Spec;

impl Layout for Spec {
    fn stage_row(&self, cfg: &MoeConfig, sender: u16, slot: u32) -> u64 {
        cfg.stage_row(sender, slot)
    }
    fn expert_row(
        &self,
        cfg: &MoeConfig,
        ecol: &[u32],
        sender: u16,
        j: u32,
        eslot: u32,
    ) -> Option<u32> {
        expert_row(cfg, ecol, sender, j, eslot)
    }
    fn expert_span(&self, cfg: &MoeConfig, ecol: &[u32], j: u32) -> (u32, u32) {
        expert_span(cfg, ecol, j)
    }
}

/// What the check counted on success.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoeCheckReport {
    /// Staging rows written over all ranks (a token once per destination).
    pub staged: u64,
    /// Valid entries over all senders.
    pub entries: u64,
    /// Entries without a row (past `rows_max`).
    pub dropped: u64,
    /// Entries at or past `experts`, skipped.
    pub invalid: u64,
}

/// A sender's routing, as [`route`] gives it.
struct Sender {
    tokens: usize,
    slots: Vec<u32>,
    eslots: Vec<u32>,
    counts: Vec<u32>,
    ecounts: Vec<u32>,
}

fn route_all(cfg: &MoeConfig, idx: &[Vec<i64>]) -> Result<(Vec<Sender>, u64), MoeCheckError> {
    let (w, k) = (cfg.world as usize, cfg.topk as usize);
    if idx.len() != w {
        return Err(MoeError::BadLength {
            what: "ranks",
            len: idx.len(),
            want: w,
        }
        .into());
    }
    let mut invalid = 0;
    let mut out = Vec::with_capacity(w);
    for ids in idx {
        let tokens = ids.len() / k;
        cfg.check_tokens(
            u32::try_from(tokens).unwrap_or(u32::MAX),
            super::Mode::Normal,
        )?;
        let mut s = Sender {
            tokens,
            slots: vec![0; tokens * w],
            eslots: vec![0; tokens * k],
            counts: vec![0; w],
            ecounts: vec![0; cfg.experts as usize],
        };
        let r = route(
            cfg,
            ids,
            &mut s.slots,
            &mut s.eslots,
            &mut s.counts,
            &mut s.ecounts,
        )?;
        invalid += u64::from(r.invalid);
        out.push(s);
    }
    Ok((out, invalid))
}

/// Checks the dispatch and combine of the module doc's layout for these routings
/// (`idx[r]` is rank `r`'s `topk_idx`).
pub fn check(cfg: &MoeConfig, idx: &[Vec<i64>]) -> Result<MoeCheckReport, MoeCheckError> {
    check_with(&Spec, cfg, idx)
}

/// [`check`] over any layout.
pub fn check_with<L: Layout>(
    layout: &L,
    cfg: &MoeConfig,
    idx: &[Vec<i64>],
) -> Result<MoeCheckReport, MoeCheckError> {
    let (senders, invalid) = route_all(cfg, idx)?;
    let (w, k, l) = (
        cfg.world as usize,
        cfg.topk as usize,
        cfg.local_experts() as usize,
    );
    let mut report = MoeCheckReport {
        invalid,
        ..MoeCheckReport::default()
    };
    // Per sender, token and entry: the expert row it got (NONE when dropped or not valid).
    let mut rows: Vec<Vec<u32>> = senders.iter().map(|s| vec![NONE; s.eslots.len()]).collect();
    // Per receiver: staging row -> (sender, token).
    let mut staged: Vec<BTreeMap<u64, (u16, u32)>> = vec![BTreeMap::new(); w];

    for (r, s) in senders.iter().enumerate() {
        let rank = r as u16;
        let mut want = vec![0u32; w];
        for t in 0..s.tokens {
            let mask = dest_mask(cfg, &idx[r][t * k..(t + 1) * k]);
            for (q, stage) in staged.iter_mut().enumerate() {
                let slot = s.slots[t * w + q];
                let goes = mask >> q & 1 == 1;
                if goes != (slot != NONE) {
                    return Err(MoeCheckError::Slot {
                        rank,
                        token: t as u32,
                        dest: q as u16,
                    });
                }
                if !goes {
                    continue;
                }
                want[q] += 1;
                let row = layout.stage_row(cfg, rank, slot);
                if row >= cfg.stage_rows() {
                    return Err(MoeCheckError::StageOutOfRange {
                        dest: q as u16,
                        rank,
                        token: t as u32,
                        row,
                        rows: cfg.stage_rows(),
                    });
                }
                if let Some(&first) = stage.get(&row) {
                    return Err(MoeCheckError::StageCollision {
                        dest: q as u16,
                        row,
                        first,
                        second: (rank, t as u32),
                    });
                }
                stage.insert(row, (rank, t as u32));
                report.staged += 1;
            }
        }
        for (q, (&count, &want)) in s.counts.iter().zip(&want).enumerate() {
            if count != want {
                return Err(MoeCheckError::Count {
                    rank,
                    dest: q as u16,
                    count,
                    want,
                });
            }
        }
    }

    for (q, stage) in staged.iter().enumerate() {
        let dest = q as u16;
        // The receiver reads, from each sender's count alone, rows stage_row(p, 0..c[p][q]).
        let mut read = BTreeMap::new();
        for (p, s) in senders.iter().enumerate() {
            for slot in 0..s.counts[q] {
                let row = layout.stage_row(cfg, p as u16, slot);
                match stage.get(&row) {
                    Some(&(from, _)) if usize::from(from) == p => read.insert(row, ()),
                    _ => {
                        return Err(MoeCheckError::StageUnread {
                            dest,
                            rank: p as u16,
                            row,
                        })
                    }
                };
            }
        }
        if let Some((&row, &(rank, _))) = stage.iter().find(|(row, _)| !read.contains_key(row)) {
            return Err(MoeCheckError::StageUnread { dest, rank, row });
        }

        // The receiver's column of expert counts, then each staged token's entries.
        let ecol: Vec<u32> = (0..w * l)
            .map(|i| senders[i / l].ecounts[q * l + i % l])
            .collect();
        let total: u64 = ecol.iter().map(|&n| u64::from(n)).sum();
        let mut taken: BTreeMap<u32, Entry> = BTreeMap::new();
        for &(p, t) in stage.values() {
            let s = &senders[usize::from(p)];
            for kk in 0..k {
                let i = t as usize * k + kk;
                let Some((owner, j)) = cfg.owner(idx[usize::from(p)][i]) else {
                    continue;
                };
                if usize::from(owner) != q {
                    continue;
                }
                let entry = Entry {
                    rank: p,
                    token: t,
                    k: kk as u16,
                };
                report.entries += 1;
                let Some(row) = layout.expert_row(cfg, &ecol, p, j, s.eslots[i]) else {
                    report.dropped += 1;
                    continue;
                };
                let span = layout.expert_span(cfg, &ecol, j);
                if row < span.0 || u64::from(row) >= u64::from(span.0) + u64::from(span.1) {
                    return Err(MoeCheckError::OutsideSpan {
                        entry,
                        dest,
                        row,
                        span,
                    });
                }
                if let Some(&first) = taken.get(&row) {
                    return Err(MoeCheckError::ExpertCollision {
                        dest,
                        row,
                        first,
                        second: entry,
                    });
                }
                taken.insert(row, entry);
                rows[usize::from(p)][i] = row;
            }
        }
        let covered = total.min(u64::from(cfg.rows_max)) as u32;
        let mut end = 0u32;
        for j in 0..l as u32 {
            let (start, n) = layout.expert_span(cfg, &ecol, j);
            if start != end {
                return Err(MoeCheckError::Spans {
                    dest,
                    expert: j,
                    start,
                    want: end,
                });
            }
            end = start.saturating_add(n);
        }
        if end != covered {
            return Err(MoeCheckError::Spans {
                dest,
                expert: l as u32,
                start: end,
                want: covered,
            });
        }
        if taken.len() as u32 != covered {
            return Err(MoeCheckError::RowCount {
                dest,
                placed: taken.len() as u32,
                covered,
            });
        }
    }

    combine(layout, cfg, idx, &senders, &rows)?;
    Ok(report)
}

/// A sender's combine staging: row -> (receiver, token, the entries the partial holds).
type Partials = BTreeMap<u64, (u16, u32, Vec<u16>)>;

/// The combine on sets: each receiver builds a partial per staging row from its local entries
/// with a row and places it in the sender's combine staging; each sender sums the partials of
/// its destinations and the result must hold every entry with a row once.
fn combine<L: Layout>(
    layout: &L,
    cfg: &MoeConfig,
    idx: &[Vec<i64>],
    senders: &[Sender],
    rows: &[Vec<u32>],
) -> Result<(), MoeCheckError> {
    let (w, k) = (cfg.world as usize, cfg.topk as usize);
    let mut back: Vec<Partials> = vec![BTreeMap::new(); w];
    for (r, s) in senders.iter().enumerate() {
        for t in 0..s.tokens {
            for q in 0..w {
                let slot = s.slots[t * w + q];
                if slot == NONE {
                    continue;
                }
                let partial: Vec<u16> = (0..k)
                    .filter(|&kk| {
                        let i = t * k + kk;
                        cfg.owner(idx[r][i]).map(|o| usize::from(o.0)) == Some(q)
                            && rows[r][i] != NONE
                    })
                    .map(|kk| kk as u16)
                    .collect();
                let row = layout.stage_row(cfg, q as u16, slot);
                if row >= cfg.stage_rows() {
                    return Err(MoeCheckError::StageOutOfRange {
                        dest: r as u16,
                        rank: q as u16,
                        token: t as u32,
                        row,
                        rows: cfg.stage_rows(),
                    });
                }
                if let Some(&(first, ft, _)) = back[r].get(&row) {
                    return Err(MoeCheckError::StageCollision {
                        dest: r as u16,
                        row,
                        first: (first, ft),
                        second: (q as u16, t as u32),
                    });
                }
                back[r].insert(row, (q as u16, t as u32, partial));
            }
        }
    }
    for (r, s) in senders.iter().enumerate() {
        for t in 0..s.tokens {
            let mask = dest_mask(cfg, &idx[r][t * k..(t + 1) * k]);
            let mut found = vec![0u32; k];
            for q in (0..w).filter(|&q| mask >> q & 1 == 1) {
                let row = layout.stage_row(cfg, q as u16, s.slots[t * w + q]);
                if let Some((from, tok, partial)) = back[r].get(&row) {
                    if usize::from(*from) != q || *tok as usize != t {
                        return Err(MoeCheckError::CombineRow {
                            rank: r as u16,
                            token: t as u32,
                            dest: q as u16,
                        });
                    }
                    for &kk in partial {
                        found[usize::from(kk)] += 1;
                    }
                }
            }
            for (kk, &n) in found.iter().enumerate() {
                let want = u32::from(rows[r][t * k + kk] != NONE);
                if n != want {
                    return Err(MoeCheckError::Combine {
                        entry: Entry {
                            rank: r as u16,
                            token: t as u32,
                            k: kk as u16,
                        },
                        found: n,
                        want,
                    });
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;

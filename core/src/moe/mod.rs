//! Mixture-of-experts dispatch and combine: the layout every executor follows.
//!
//! A layer has `experts` experts spread evenly over the world: expert `e` lives on rank
//! `e / L` as local expert `e % L`, `L = experts / world`. Rank `r` holds `T_r <= tokens_max`
//! tokens of `hidden` elements and, for each, `topk` expert indices (`topk_idx[t * K + k]`,
//! signed: a negative index means "no expert", an index at or past `experts` is *invalid*; both
//! are skipped, and invalid ones are counted and reported) with their weights.
//!
//! ## Dispatch
//! * **Once per rank.** Token `t` goes to every rank that holds at least one of its experts
//!   ([`dest_mask`]), once, however many of its experts live there.
//! * **Sender order.** `slot(t, q)` is the number of earlier tokens that also go to `q`
//!   ([`route`]); the sender's count for `q`, `c[r][q]`, is the number of its tokens that go
//!   there. `eslot(t, k)` is the number of entries `(t', k') < (t, k)` (row-major) with the same
//!   expert; `ec[r][e]` counts the sender's entries of expert `e`.
//! * **Staging.** Rank `q` receives rank `r`'s token `t` in its staging row
//!   `r * tokens_max + slot(t, q)` ([`MoeConfig::stage_row`]): fixed slots, so a sender needs
//!   nobody's counts to place its data, and the whole dispatch is one round. The row carries the
//!   token's `hidden` elements and, per entry `k`, the local expert (or -1 when the expert is
//!   elsewhere or invalid), `eslot(t, k)` and the weight ([`ROW_ENTRY_BYTES`]).
//! * **Header.** After its rows, every rank writes to every rank (itself included, counts of 0
//!   included) a header: `c[r][q]` and `ec[r][q * L + j]` for each local expert `j`, each word
//!   tagged with the call's epoch ([`tag`]). The header is the only signal.
//! * **Expert rows.** Once every header is in, rank `q` knows `n_j = sum_p ec[p][q * L + j]`
//!   and places entry `(r, t, k)` of local expert `j` at row
//!   `sum_{j' < j} n_j' + sum_{p < r} ec[p][q * L + j] + eslot(t, k)` ([`expert_row`]): expert
//!   major, then by sender, then in the sender's order. These are prefix sums over a `world x L`
//!   matrix, computed where the data lands. A row at or past `rows_max` is dropped and counted;
//!   [`expert_span`] reports each expert's rows clipped to the bound.
//!
//! ## Combine
//! * Rank `q` turns each staging row into one f32 *partial*: starting from 0, for `k`
//!   ascending, every entry local to `q` with a row adds `weight * expert_out[row]` with a fused
//!   multiply-add. It sends the partial to the token's sender, row `q * tokens_max + slot(t, q)`
//!   of the sender's combine staging, then a header tagged with the combine's epoch.
//! * The sender sums, for each of its tokens, the partials of its destination ranks in
//!   ascending rank order, starting from 0 in f32, and rounds once to the output type. A token
//!   with no destination comes back as zeros. NaN and negative weights are data.
//!
//! ## Modes
//! [`Mode::LowLatency`] runs each of dispatch and combine as one kernel of a few blocks (every
//! block routes the tokens itself, at most [`LL_MAX_TOKENS`]); [`Mode::Normal`] splits each into
//! a send kernel and a receive kernel with many blocks, tuned for bandwidth. The layout, the
//! order of every sum and so the results are the same, bit for bit.
//!
//! ## Why no barrier is needed
//! Staging rows and header words live in two halves, and a call of epoch `e` writes half
//! `e % 2`. A rank writes half `e % 2` again only in call `e + 2`, after finishing call `e + 1`,
//! which needed every peer's header of `e + 1`; a peer writes that header only inside its call
//! `e + 1`, so it had finished call `e` and read what it was sent there. Header words carry the
//! epoch, so a word of an older call is never taken for the current one. This needs every rank
//! to send a header to every rank in every call, which the protocol does.

use core::fmt;

pub mod sched;

#[cfg(feature = "alloc")]
pub mod check;
#[cfg(test)]
mod tests;

/// Most ranks a dispatch spans (a destination set is a 64-bit mask).
pub const MAX_WORLD: u16 = 64;
/// Most tokens per rank in [`Mode::LowLatency`].
pub const LL_MAX_TOKENS: u32 = 128;
/// Most tokens a rank may be sized for (`tokens_max`).
pub const MAX_TOKENS: u32 = 1 << 31;
/// Most experts a token picks.
pub const MAX_TOPK: u16 = 32;
/// Bytes of one entry of a staging row's metadata: local expert (i32), eslot (u32), weight (f32).
pub const ROW_ENTRY_BYTES: u64 = 12;
/// "No row": a token that does not go to a rank, or an entry without a row.
pub const NONE: u32 = u32::MAX;

/// How dispatch and combine run on the GPU (the results are the same).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Mode {
    /// A send and a receive kernel, many blocks: large batches.
    Normal,
    /// One kernel each, a few blocks: at most [`LL_MAX_TOKENS`] tokens per rank.
    LowLatency,
}

/// What is wrong with a dispatch's shape or routing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MoeError {
    /// The world is 0 or above [`MAX_WORLD`].
    BadWorld {
        /// The world size.
        world: u16,
    },
    /// The experts do not split evenly over the ranks (or there are none).
    ExpertsNotDivisible {
        /// Experts.
        experts: u32,
        /// World size.
        world: u16,
    },
    /// `topk` is 0, above [`MAX_TOPK`], or larger than the number of experts.
    BadTopK {
        /// Experts per token asked for.
        topk: u16,
        /// Experts.
        experts: u32,
    },
    /// The hidden size is 0.
    ZeroHidden,
    /// A rank holds more tokens than the bound the buffers were sized from.
    TooManyTokens {
        /// Tokens given.
        tokens: u32,
        /// The bound (`tokens_max`, or [`LL_MAX_TOKENS`] in low-latency mode).
        bound: u32,
    },
    /// An expert index at or past the number of experts (found by the host-side check).
    ExpertOutOfRange {
        /// Token.
        token: u32,
        /// Entry of the token.
        k: u16,
        /// The index.
        expert: i64,
        /// Experts.
        experts: u32,
    },
    /// A slice does not have the length the shape asks for.
    BadLength {
        /// Which slice.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The length wanted.
        want: usize,
    },
    /// A buffer this shape needs exceeds 2^48 bytes.
    TooLarge {
        /// Bytes.
        bytes: u64,
    },
}

impl fmt::Display for MoeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            MoeError::BadWorld { world } => {
                write!(f, "world {world} is outside 1..={MAX_WORLD} for MoE")
            }
            MoeError::ExpertsNotDivisible { experts, world } => {
                write!(
                    f,
                    "{experts} experts do not split evenly over {world} ranks"
                )
            }
            MoeError::BadTopK { topk, experts } => write!(
                f,
                "topk {topk} must be in 1..={MAX_TOPK} and at most the {experts} experts"
            ),
            MoeError::ZeroHidden => write!(f, "the hidden size is 0"),
            MoeError::TooManyTokens { tokens, bound } => {
                write!(f, "{tokens} tokens exceed the bound of {bound} per rank")
            }
            MoeError::ExpertOutOfRange {
                token,
                k,
                expert,
                experts,
            } => write!(
                f,
                "token {token} entry {k} names expert {expert}, outside 0..{experts}"
            ),
            MoeError::BadLength { what, len, want } => {
                write!(f, "{what} has {len} entries, the shape needs {want}")
            }
            MoeError::TooLarge { bytes } => {
                write!(f, "a buffer of {bytes} bytes exceeds the 2^48 limit")
            }
        }
    }
}

impl core::error::Error for MoeError {}

/// The shape a dispatch's buffers are sized from; every rank uses the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MoeConfig {
    /// Ranks.
    pub world: u16,
    /// Experts over all ranks.
    pub experts: u32,
    /// Experts per token.
    pub topk: u16,
    /// Most tokens a rank dispatches in one call.
    pub tokens_max: u32,
    /// Elements per token.
    pub hidden: u32,
    /// Expert rows a rank holds; entries past it are dropped and counted.
    pub rows_max: u32,
}

const LIMIT: u64 = 1 << 48;

impl MoeConfig {
    /// Checks a shape; `rows_max` is `world * tokens_max * topk`, room for every entry.
    pub fn new(
        world: u16,
        experts: u32,
        topk: u16,
        tokens_max: u32,
        hidden: u32,
    ) -> Result<MoeConfig, MoeError> {
        let rows = u64::from(world) * u64::from(tokens_max) * u64::from(topk);
        let rows_max = u32::try_from(rows).map_err(|_| MoeError::TooLarge {
            bytes: rows.saturating_mul(u64::from(hidden)),
        })?;
        MoeConfig {
            world,
            experts,
            topk,
            tokens_max,
            hidden,
            rows_max,
        }
        .checked()
    }

    /// The same shape with room for `rows` expert rows per rank.
    pub fn with_rows_max(self, rows: u32) -> Result<MoeConfig, MoeError> {
        MoeConfig {
            rows_max: rows,
            ..self
        }
        .checked()
    }

    /// Validates every field and the sizes of the buffers (elements of 4 bytes at most).
    pub fn checked(self) -> Result<MoeConfig, MoeError> {
        if self.world == 0 || self.world > MAX_WORLD {
            return Err(MoeError::BadWorld { world: self.world });
        }
        if self.experts == 0 || !self.experts.is_multiple_of(u32::from(self.world)) {
            return Err(MoeError::ExpertsNotDivisible {
                experts: self.experts,
                world: self.world,
            });
        }
        if self.topk == 0 || self.topk > MAX_TOPK || u32::from(self.topk) > self.experts {
            return Err(MoeError::BadTopK {
                topk: self.topk,
                experts: self.experts,
            });
        }
        if self.hidden == 0 {
            return Err(MoeError::ZeroHidden);
        }
        if self.tokens_max > MAX_TOKENS {
            return Err(MoeError::TooManyTokens {
                tokens: self.tokens_max,
                bound: MAX_TOKENS,
            });
        }
        for bytes in [
            2 * self.stage_rows() * self.row_bytes(4),
            2 * self.stage_rows() * self.partial_bytes(),
            u64::from(self.rows_max) * u64::from(self.hidden) * 4,
        ] {
            if bytes > LIMIT {
                return Err(MoeError::TooLarge { bytes });
            }
        }
        Ok(self)
    }

    /// Experts per rank, `L`.
    pub fn local_experts(&self) -> u32 {
        self.experts / u32::from(self.world)
    }

    /// The rank and local index of expert `e`, `None` for a negative or invalid index.
    pub fn owner(&self, e: i64) -> Option<(u16, u32)> {
        let e = u32::try_from(e).ok().filter(|&e| e < self.experts)?;
        let l = self.local_experts();
        Some(((e / l) as u16, e % l))
    }

    /// Checks a rank's token count against the bound of `mode`.
    pub fn check_tokens(&self, tokens: u32, mode: Mode) -> Result<(), MoeError> {
        let bound = match mode {
            Mode::Normal => self.tokens_max,
            Mode::LowLatency => self.tokens_max.min(LL_MAX_TOKENS),
        };
        if tokens > bound {
            return Err(MoeError::TooManyTokens { tokens, bound });
        }
        Ok(())
    }

    /// Rows of one half of a staging area: `world * tokens_max`.
    pub fn stage_rows(&self) -> u64 {
        u64::from(self.world) * u64::from(self.tokens_max)
    }

    /// The staging row of the token in `slot` from `sender`.
    pub fn stage_row(&self, sender: u16, slot: u32) -> u64 {
        u64::from(sender) * u64::from(self.tokens_max) + u64::from(slot)
    }

    /// Bytes of a token's elements in a row, rounded up to 16.
    pub fn data_bytes(&self, elem: u64) -> u64 {
        (u64::from(self.hidden) * elem).div_ceil(16) * 16
    }

    /// Bytes of a dispatch staging row: the data, then the entries, each part rounded up to 16.
    pub fn row_bytes(&self, elem: u64) -> u64 {
        self.data_bytes(elem) + (u64::from(self.topk) * ROW_ENTRY_BYTES).div_ceil(16) * 16
    }

    /// Bytes of a combine staging row (f32 partials).
    pub fn partial_bytes(&self) -> u64 {
        self.data_bytes(4)
    }

    /// Words of one header a sender writes to a rank: its count, then one per local expert.
    pub fn header_words(&self) -> u32 {
        1 + self.local_experts()
    }
}

/// A header word: the epoch in the high half, the value in the low half.
pub fn tag(epoch: u32, value: u32) -> u64 {
    (u64::from(epoch) << 32) | u64::from(value)
}

/// The value of `word` if it carries `epoch`.
pub fn untag(word: u64, epoch: u32) -> Option<u32> {
    ((word >> 32) as u32 == epoch).then_some(word as u32)
}

/// The ranks token `row` (its `topk` indices) goes to, as a bit mask.
pub fn dest_mask(cfg: &MoeConfig, row: &[i64]) -> u64 {
    row.iter()
        .filter_map(|&e| cfg.owner(e))
        .fold(0, |m, (q, _)| m | 1u64 << q)
}

/// What [`route`] found about a rank's tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Routed {
    /// Entries whose index is at or past `experts` (skipped).
    pub invalid: u32,
}

/// The sender's side of a dispatch, in one pass over a rank's `tokens` tokens (`idx` holds
/// `tokens * topk` indices): `slots[t * world + q]` is `slot(t, q)` or [`NONE`],
/// `eslots[t * topk + k]` is `eslot(t, k)` or [`NONE`], `counts[q]` is `c[q]` and
/// `ecounts[e]` is `ec[e]`. Out-of-range indices are skipped and counted.
pub fn route(
    cfg: &MoeConfig,
    idx: &[i64],
    slots: &mut [u32],
    eslots: &mut [u32],
    counts: &mut [u32],
    ecounts: &mut [u32],
) -> Result<Routed, MoeError> {
    let (w, k) = (cfg.world as usize, cfg.topk as usize);
    let tokens = idx.len() / k;
    for (what, len, want) in [
        ("topk_idx", idx.len(), tokens * k),
        ("slots", slots.len(), tokens * w),
        ("eslots", eslots.len(), tokens * k),
        ("counts", counts.len(), w),
        ("ecounts", ecounts.len(), cfg.experts as usize),
    ] {
        if len != want {
            return Err(MoeError::BadLength { what, len, want });
        }
    }
    counts.fill(0);
    ecounts.fill(0);
    let mut out = Routed::default();
    for (t, row) in idx.chunks_exact(k).enumerate() {
        let mask = dest_mask(cfg, row);
        for (q, c) in counts.iter_mut().enumerate() {
            slots[t * w + q] = if mask >> q & 1 == 1 {
                *c += 1;
                *c - 1
            } else {
                NONE
            };
        }
        for (j, &e) in row.iter().enumerate() {
            eslots[t * k + j] = match cfg.owner(e) {
                Some(_) => {
                    let n = &mut ecounts[e as usize];
                    *n += 1;
                    *n - 1
                }
                None => {
                    if e >= 0 {
                        out.invalid += 1;
                    }
                    NONE
                }
            };
        }
    }
    Ok(out)
}

/// The host-side check of a routing: the first index at or past `experts`.
pub fn check_routing(cfg: &MoeConfig, idx: &[i64]) -> Result<(), MoeError> {
    let k = cfg.topk as usize;
    if !idx.len().is_multiple_of(k) {
        return Err(MoeError::BadLength {
            what: "topk_idx",
            len: idx.len(),
            want: idx.len() / k * k,
        });
    }
    match idx.iter().position(|&e| e >= i64::from(cfg.experts)) {
        None => Ok(()),
        Some(i) => Err(MoeError::ExpertOutOfRange {
            token: (i / k) as u32,
            k: (i % k) as u16,
            expert: idx[i],
            experts: cfg.experts,
        }),
    }
}

/// The receiver's expert row of an entry: local expert `j`, from `sender`, with `eslot`, given
/// the receiver's column of expert counts (`ecol[p * L + j]` is `ec[p][q * L + j]`); `None`
/// when it falls at or past `rows_max` (dropped).
pub fn expert_row(cfg: &MoeConfig, ecol: &[u32], sender: u16, j: u32, eslot: u32) -> Option<u32> {
    let l = cfg.local_experts() as usize;
    let (w, j) = (cfg.world as usize, j as usize);
    let col = |p: usize, jj: usize| u64::from(ecol.get(p * l + jj).copied().unwrap_or(0));
    let base: u64 = (0..j)
        .flat_map(|jj| (0..w).map(move |p| (p, jj)))
        .map(|(p, jj)| col(p, jj))
        .sum();
    let before: u64 = (0..sender as usize).map(|p| col(p, j)).sum();
    let row = base + before + u64::from(eslot);
    (row < u64::from(cfg.rows_max)).then_some(row as u32)
}

/// Local expert `j`'s rows on the receiver, clipped to `rows_max`: (first row, count).
pub fn expert_span(cfg: &MoeConfig, ecol: &[u32], j: u32) -> (u32, u32) {
    let l = cfg.local_experts() as usize;
    let w = cfg.world as usize;
    let n = |jj: usize| -> u64 {
        (0..w)
            .map(|p| u64::from(ecol.get(p * l + jj).copied().unwrap_or(0)))
            .sum()
    };
    let base: u64 = (0..j as usize).map(n).sum();
    let max = u64::from(cfg.rows_max);
    let start = base.min(max);
    let end = (base + n(j as usize)).min(max);
    (start as u32, (end - start) as u32)
}

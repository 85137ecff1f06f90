//! Mixture-of-experts dispatch and combine on the host (layout: `symm_core::moe`).
//!
//! * [`moe_reference`] and [`moe_combine_reference`]: what every executor must produce, bit
//!   for bit, computed directly from the routings with core's layout functions. Combine sums in
//!   the module doc's order: on each receiving rank, per staging row, the token's local entries
//!   with a row in ascending `k`, each a fused multiply-add into an f32 partial from 0; on the
//!   sender, the partials of the token's destinations in ascending rank order, added in f32 from
//!   0, rounded once to the output type.
//! * [`MoeWorld`] and [`MoeRank`]: the protocol itself over host memory, one thread per rank
//!   (or one loom thread), with two halves of staging rows and of tagged header words per rank
//!   and no barrier between calls; [`run_moe_threads`] runs a sequence of calls on OS threads.
//!
//! Elements are raw little-endian bytes of a [`MoeDtype`]; bf16 widens and rounds with
//! `symm_core::dtype`'s conversions, the ones the GPU matches.

mod reference;
mod threads;

#[cfg(test)]
mod tests;

pub use reference::{moe_combine_reference, moe_reference};
pub use threads::{run_moe_threads, MoeCall, MoePhase, MoeRank, MoeThreadError, MoeWorld};

use symm_core::dtype::{bf16_to_f32, f32_to_bf16};
use symm_core::moe::{route, Mode, MoeConfig, MoeError};

/// The element type of tokens, expert rows and combined outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MoeDtype {
    /// bfloat16, widened to f32 exactly and rounded to nearest even.
    Bf16,
    /// IEEE single precision.
    F32,
}

impl MoeDtype {
    /// Bytes of one element.
    pub fn bytes(self) -> usize {
        match self {
            MoeDtype::Bf16 => 2,
            MoeDtype::F32 => 4,
        }
    }

    /// Element `i` of `b`, widened to f32.
    pub fn get(self, b: &[u8], i: usize) -> f32 {
        match self {
            MoeDtype::Bf16 => bf16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])),
            MoeDtype::F32 => {
                f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
            }
        }
    }

    /// Stores `v`, rounded to the type, as element `i` of `b`.
    pub fn put(self, b: &mut [u8], i: usize, v: f32) {
        match self {
            MoeDtype::Bf16 => b[2 * i..2 * i + 2].copy_from_slice(&f32_to_bf16(v).to_le_bytes()),
            MoeDtype::F32 => b[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
        }
    }
}

/// One rank's side of a dispatch: its tokens and their routing.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MoeRankInput {
    /// `tokens * hidden` elements, little-endian.
    pub x: Vec<u8>,
    /// `tokens * topk` expert indices (negative: none; at or past `experts`: invalid).
    pub topk_idx: Vec<i64>,
    /// `tokens * topk` weights.
    pub topk_weights: Vec<f32>,
}

/// What a dispatch leaves on a receiving rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoeRankDispatch {
    /// `rows_max * hidden` elements: entry rows placed by `expert_row`, other rows 0.
    pub expert_x: Vec<u8>,
    /// Per local expert, its rows (first, count), clipped to `rows_max`.
    pub spans: Vec<(u32, u32)>,
    /// Entries for this rank without a row (past `rows_max`).
    pub dropped: u32,
    /// This rank's own entries at or past `experts` (skipped when it sent).
    pub invalid: u32,
}

/// A sender's routing of its tokens (core's [`route`]), after its input was checked.
#[derive(Clone, Debug)]
pub(crate) struct Routing {
    pub tokens: usize,
    pub slots: Vec<u32>,
    pub eslots: Vec<u32>,
    pub counts: Vec<u32>,
    pub ecounts: Vec<u32>,
    pub invalid: u32,
}

/// Checks one rank's input against the shape and routes it.
pub(crate) fn routing(
    cfg: &MoeConfig,
    dtype: MoeDtype,
    input: &MoeRankInput,
) -> Result<Routing, MoeError> {
    let (w, k) = (cfg.world as usize, cfg.topk as usize);
    let n = input.topk_idx.len();
    if !n.is_multiple_of(k) {
        return Err(MoeError::BadLength {
            what: "topk_idx",
            len: n,
            want: n / k * k,
        });
    }
    let tokens = n / k;
    cfg.check_tokens(u32::try_from(tokens).unwrap_or(u32::MAX), Mode::Normal)?;
    for (what, len, want) in [
        (
            "x",
            input.x.len(),
            tokens * cfg.hidden as usize * dtype.bytes(),
        ),
        ("topk_weights", input.topk_weights.len(), n),
    ] {
        if len != want {
            return Err(MoeError::BadLength { what, len, want });
        }
    }
    let mut r = Routing {
        tokens,
        slots: vec![0; tokens * w],
        eslots: vec![0; n],
        counts: vec![0; w],
        ecounts: vec![0; cfg.experts as usize],
        invalid: 0,
    };
    r.invalid = route(
        cfg,
        &input.topk_idx,
        &mut r.slots,
        &mut r.eslots,
        &mut r.counts,
        &mut r.ecounts,
    )?
    .invalid;
    Ok(r)
}

/// Rank `q`'s column of expert counts: `ecol[p * L + j] = ec[p][q * L + j]`.
pub(crate) fn ecol(cfg: &MoeConfig, routings: &[Routing], q: u16) -> Vec<u32> {
    let l = cfg.local_experts() as usize;
    routings
        .iter()
        .flat_map(|r| r.ecounts[usize::from(q) * l..][..l].iter().copied())
        .collect()
}

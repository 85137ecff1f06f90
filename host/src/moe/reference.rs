//! The reference dispatch and combine: the results, bit for bit, without the protocol.
//!
//! Dispatch copies every valid entry's token into the receiver's [`expert_row`]; combine forms,
//! per (sender, token, destination), the destination's f32 partial with fused multiply-adds in
//! ascending `k`, then sums the partials in ascending destination order from 0 and rounds once.

use super::{ecol, routing, MoeDtype, MoeRankDispatch, MoeRankInput, Routing};
use symm_core::moe::{dest_mask, expert_row, expert_span, MoeConfig, MoeError, NONE};

/// Every rank's routing, after checking that there is one input per rank.
fn routings(
    cfg: &MoeConfig,
    dtype: MoeDtype,
    inputs: &[MoeRankInput],
) -> Result<Vec<Routing>, MoeError> {
    if inputs.len() != usize::from(cfg.world) {
        return Err(MoeError::BadLength {
            what: "inputs",
            len: inputs.len(),
            want: usize::from(cfg.world),
        });
    }
    inputs.iter().map(|i| routing(cfg, dtype, i)).collect()
}

/// Per sender and entry, the expert row on the entry's owner (`NONE`: not valid or dropped).
fn rows(cfg: &MoeConfig, inputs: &[MoeRankInput], routings: &[Routing]) -> Vec<Vec<u32>> {
    let cols: Vec<Vec<u32>> = (0..cfg.world).map(|q| ecol(cfg, routings, q)).collect();
    inputs
        .iter()
        .zip(routings)
        .enumerate()
        .map(|(r, (input, routed))| {
            input
                .topk_idx
                .iter()
                .zip(&routed.eslots)
                .map(|(&e, &eslot)| match cfg.owner(e) {
                    Some((q, j)) => {
                        expert_row(cfg, &cols[usize::from(q)], r as u16, j, eslot).unwrap_or(NONE)
                    }
                    None => NONE,
                })
                .collect()
        })
        .collect()
}

/// The dispatch of `inputs` (one per rank): per receiving rank, its expert rows, spans, dropped
/// entries and its own invalid entries.
pub fn moe_reference(
    cfg: &MoeConfig,
    dtype: MoeDtype,
    inputs: &[MoeRankInput],
) -> Result<Vec<MoeRankDispatch>, MoeError> {
    let routings = routings(cfg, dtype, inputs)?;
    let rows = rows(cfg, inputs, &routings);
    let (k, token_bytes) = (cfg.topk as usize, cfg.hidden as usize * dtype.bytes());
    let mut out: Vec<MoeRankDispatch> = (0..cfg.world)
        .map(|q| {
            let col = ecol(cfg, &routings, q);
            MoeRankDispatch {
                expert_x: vec![0; cfg.rows_max as usize * token_bytes],
                spans: (0..cfg.local_experts())
                    .map(|j| expert_span(cfg, &col, j))
                    .collect(),
                dropped: 0,
                invalid: routings[usize::from(q)].invalid,
            }
        })
        .collect();
    for (input, rows) in inputs.iter().zip(&rows) {
        for (i, (&e, &row)) in input.topk_idx.iter().zip(rows).enumerate() {
            let Some((q, _)) = cfg.owner(e) else {
                continue;
            };
            let dst = &mut out[usize::from(q)];
            if row == NONE {
                dst.dropped += 1;
                continue;
            }
            let t = i / k;
            dst.expert_x[row as usize * token_bytes..][..token_bytes]
                .copy_from_slice(&input.x[t * token_bytes..][..token_bytes]);
        }
    }
    Ok(out)
}

/// The combine after [`moe_reference`]'s dispatch of the same `inputs`: `expert_out[q]` holds
/// rank `q`'s `rows_max * hidden` expert outputs. Returns each sender's `[tokens, hidden]`.
pub fn moe_combine_reference(
    cfg: &MoeConfig,
    dtype: MoeDtype,
    inputs: &[MoeRankInput],
    expert_out: &[Vec<u8>],
) -> Result<Vec<Vec<u8>>, MoeError> {
    let routings = routings(cfg, dtype, inputs)?;
    let (k, h) = (cfg.topk as usize, cfg.hidden as usize);
    let want = cfg.rows_max as usize * h * dtype.bytes();
    if expert_out.len() != usize::from(cfg.world) {
        return Err(MoeError::BadLength {
            what: "expert_out",
            len: expert_out.len(),
            want: usize::from(cfg.world),
        });
    }
    if let Some(b) = expert_out.iter().find(|b| b.len() != want) {
        return Err(MoeError::BadLength {
            what: "expert_out",
            len: b.len(),
            want,
        });
    }
    let rows = rows(cfg, inputs, &routings);
    let mut partial = vec![0f32; h];
    Ok(inputs
        .iter()
        .zip(&rows)
        .map(|(input, rows)| {
            let mut out = vec![0u8; input.topk_idx.len() / k * h * dtype.bytes()];
            for (t, idx) in input.topk_idx.chunks_exact(k).enumerate() {
                let mut acc = vec![0f32; h];
                let mask = dest_mask(cfg, idx);
                for q in (0..cfg.world).filter(|&q| mask >> q & 1 == 1) {
                    partial.fill(0.0);
                    for (kk, &e) in idx.iter().enumerate() {
                        let row = rows[t * k + kk];
                        if row == NONE || cfg.owner(e).map(|o| o.0) != Some(q) {
                            continue;
                        }
                        let w = input.topk_weights[t * k + kk];
                        let y = &expert_out[usize::from(q)];
                        for (c, p) in partial.iter_mut().enumerate() {
                            *p = w.mul_add(dtype.get(y, row as usize * h + c), *p);
                        }
                    }
                    for (a, &p) in acc.iter_mut().zip(&partial) {
                        *a += p;
                    }
                }
                for (c, &a) in acc.iter().enumerate() {
                    dtype.put(&mut out, t * h + c, a);
                }
            }
            out
        })
        .collect())
}

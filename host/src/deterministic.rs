//! The reference of deterministic mode, and inputs that tell orders apart.
//!
//! [`reference_in_rank_order`] is [`crate::reference`] with every reduction the left fold in
//! absolute rank order of [`symm_core::dtype::fold`]: 16-bit floats widened to `f32`,
//! accumulated there and rounded once, an average divided at the end. It is the bits every
//! request that [`Request::is_deterministic`](symm_core::sched::Request::is_deterministic) must
//! give, whatever its algorithm, channels, chunking or size.
//!
//! [`hard_inputs`] draws floats whose sums depend on the order they are added in: values that
//! cancel (`x` on one rank, about `-x` on another), magnitudes from `2^-10` to `2^12` side by
//! side, and values near the type's largest so that some partial sums overflow in one order and
//! not in another. Integers get [`crate::random_inputs`]'s small values (their sums are exact
//! in any order).

use symm_core::dtype::{encode_int, f32_to_bf16, f32_to_f16, fold, DType, ReduceOp};
use symm_core::sched::{Collective, Request};
use symm_core::symbolic::Rng;

/// The outputs `req` defines for `inputs`, reductions folded in rank order with one rounding
/// (outputs not defined stay [`crate::POISON`]).
pub fn reference_in_rank_order(req: &Request, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut outs = crate::reference(req, inputs);
    let b = req.bytes as usize;
    let reduce = |off: usize| fold_all(req, inputs, off, b);
    match req.collective {
        Collective::AllReduce => {
            let r = reduce(0);
            outs.iter_mut().for_each(|o| o.copy_from_slice(&r));
        }
        Collective::ReduceScatter => {
            for (q, o) in outs.iter_mut().enumerate() {
                o.copy_from_slice(&reduce(q * b));
            }
        }
        Collective::Reduce { root } => outs[root as usize] = reduce(0),
        // The others move bits: the reference is the reference.
        _ => {}
    }
    outs
}

/// Every rank's `inputs[r][off .. off + len]` folded element by element in rank order.
fn fold_all(req: &Request, inputs: &[Vec<u8>], off: usize, len: usize) -> Vec<u8> {
    let es = req.dtype.size() as usize;
    let div = if req.op == ReduceOp::Avg {
        req.world as u32
    } else {
        1
    };
    let mut out = vec![0u8; len];
    for (j, o) in out.chunks_exact_mut(es).enumerate() {
        let at = off + j * es;
        let srcs: Vec<&[u8]> = inputs.iter().map(|inp| &inp[at..at + es]).collect();
        fold(req.dtype, req.op, div, &srcs, o);
    }
    out
}

/// Inputs for `req` whose float sums depend on the order of addition (see the module doc).
pub fn hard_inputs(req: &Request, seed: u64) -> Vec<Vec<u8>> {
    if !req.dtype.is_float() {
        return crate::random_inputs(req, seed);
    }
    let es = req.dtype.size() as usize;
    let n = req.buffer_sizes().input as usize / es;
    let w = req.world as usize;
    let mut rng = Rng::new(seed ^ 0xd37e);
    // The largest finite value of the type, as f32 (f64 stays within f32's range here).
    let big = match req.dtype {
        DType::F16 => 65504.0f32,
        DType::Bf16 => f32::from_bits(0x7f7f_0000),
        _ => f32::MAX,
    };
    let mut vals = vec![vec![0f32; n]; w];
    for i in 0..n {
        let kind = rng.below(4);
        for (r, v) in vals.iter_mut().enumerate() {
            let mag = (1u64 << rng.below(22)) as f32 / 1024.0;
            let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
            let frac = 1.0 + rng.below(1 << 10) as f32 / 1024.0;
            v[i] = match kind {
                // Cancellation: rank 0's value comes back negated (and nudged) on the last rank.
                0 if r + 1 == w && w > 1 => 0.0,
                // Near the largest value: partial sums overflow in some orders.
                1 => sign * big * (0.25 + rng.below(4) as f32 / 8.0),
                _ => sign * mag * frac,
            };
        }
        if kind == 0 && w > 1 {
            vals[w - 1][i] = -vals[0][i] * (1.0 + 1.0 / 512.0);
        }
    }
    vals.into_iter()
        .map(|v| {
            let mut out = vec![0u8; n * es];
            for (x, e) in v.into_iter().zip(out.chunks_exact_mut(es)) {
                match req.dtype {
                    DType::F16 => e.copy_from_slice(&f32_to_f16(x).to_le_bytes()),
                    DType::Bf16 => e.copy_from_slice(&f32_to_bf16(x).to_le_bytes()),
                    DType::F32 => e.copy_from_slice(&x.to_le_bytes()),
                    DType::F64 => e.copy_from_slice(&(x as f64).to_le_bytes()),
                    // Not reached: integers take random_inputs above.
                    _ => encode_int(req.dtype, x as i64, e),
                }
            }
            out
        })
        .collect()
}

//! The reference results (the one definition every backend is checked against), test inputs and
//! comparison.
//!
//! The reference computes each collective's definition directly: reductions combine ranks in
//! order 0, 1, ..., world-1 with `symm_core::dtype::combine`, dividing at the last step for `Avg`.
//! Outputs a collective does not define (a non-root's output of a reduce, say) keep the poison
//! byte [`POISON`] they start with.
//!
//! [`random_inputs`] draws small integers (|x| <= 4, or {-1, 1, 2} for products), so every partial
//! sum of up to 64 ranks is exact in every dtype: float results then agree with the reference
//! whatever order an algorithm combines in, and the stated tolerance in [`compare`] is a margin,
//! not a crutch.

use symm_core::dtype::{combine, decode_f64, encode_int, DType, ReduceOp};
use symm_core::sched::{Collective, Request};
use symm_core::symbolic::Rng;

/// The byte outputs and scratch start with.
pub const POISON: u8 = 0xA5;

/// Random inputs for `req`, one buffer per rank.
pub fn random_inputs(req: &Request, seed: u64) -> Vec<Vec<u8>> {
    let es = req.dtype.size() as usize;
    let n = req.buffer_sizes().input as usize / es;
    let mut rng = Rng::new(seed ^ 0x5eed);
    (0..req.world)
        .map(|_| {
            let mut v = vec![0u8; n * es];
            for e in v.chunks_exact_mut(es) {
                let x = match req.op {
                    ReduceOp::Prod => [-1i64, 1, 2][rng.below(3) as usize],
                    _ => rng.below(9) as i64 - 4,
                };
                let unsigned = matches!(req.dtype, DType::U8 | DType::U32 | DType::U64);
                let x = if unsigned { x.abs() } else { x };
                encode_int(req.dtype, x, e);
            }
            v
        })
        .collect()
}

/// Combines `inputs[*][off .. off + len]` in rank order. Large ranges are cut into pieces
/// combined on several threads (each piece still in rank order, so the bits do not change): a
/// 256 MiB GPU check must not wait minutes for its reference.
fn reduce_all(req: &Request, inputs: &[Vec<u8>], off: usize, len: usize) -> Vec<u8> {
    let es = req.dtype.size() as usize;
    let w = req.world as usize;
    let mut acc = inputs[0][off..off + len].to_vec();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(32));
    let per = ((len / es).div_ceil(threads).max(1 << 16) * es).max(es);
    let combine_piece = |i: usize, part: &mut [u8]| {
        let base = off + i * per;
        let mut out = [0u8; 8];
        for (r, inp) in inputs.iter().enumerate().skip(1) {
            let div = if r + 1 == w && req.op == ReduceOp::Avg {
                w as u32
            } else {
                1
            };
            for (j, x) in part.chunks_exact_mut(es).enumerate() {
                let b = &inp[base + j * es..base + (j + 1) * es];
                combine(req.dtype, req.op, div, x, b, &mut out[..es]);
                x.copy_from_slice(&out[..es]);
            }
        }
    };
    if acc.len() <= per {
        combine_piece(0, &mut acc);
    } else {
        let f = &combine_piece;
        std::thread::scope(|s| {
            for (i, part) in acc.chunks_mut(per).enumerate() {
                s.spawn(move || f(i, part));
            }
        });
    }
    acc
}

/// The outputs `req` defines for `inputs` (outputs not defined stay [`POISON`]).
pub fn reference(req: &Request, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let w = req.world as usize;
    let b = req.bytes as usize;
    let sz = req.buffer_sizes();
    let mut outs = vec![vec![POISON; sz.output as usize]; w];
    match req.collective {
        Collective::AllReduce => {
            let r = reduce_all(req, inputs, 0, b);
            outs.iter_mut().for_each(|o| o.copy_from_slice(&r));
        }
        Collective::ReduceScatter => {
            for (q, o) in outs.iter_mut().enumerate() {
                o.copy_from_slice(&reduce_all(req, inputs, q * b, b));
            }
        }
        Collective::AllGather => {
            for o in outs.iter_mut() {
                for (q, inp) in inputs.iter().enumerate() {
                    o[q * b..(q + 1) * b].copy_from_slice(inp);
                }
            }
        }
        Collective::Broadcast { root } => {
            outs.iter_mut()
                .for_each(|o| o.copy_from_slice(&inputs[root as usize]));
        }
        Collective::Reduce { root } => outs[root as usize] = reduce_all(req, inputs, 0, b),
        Collective::Scatter { root } => {
            for (q, o) in outs.iter_mut().enumerate() {
                o.copy_from_slice(&inputs[root as usize][q * b..(q + 1) * b]);
            }
        }
        Collective::Gather { root } => {
            for (q, inp) in inputs.iter().enumerate() {
                outs[root as usize][q * b..(q + 1) * b].copy_from_slice(inp);
            }
        }
        Collective::AllToAll => {
            for (r, o) in outs.iter_mut().enumerate() {
                for (q, inp) in inputs.iter().enumerate() {
                    o[q * b..(q + 1) * b].copy_from_slice(&inp[r * b..(r + 1) * b]);
                }
            }
        }
        Collective::SendRecv { src, dst } => outs[dst as usize] = inputs[src as usize].clone(),
        _ => {}
    }
    outs
}

/// The outputs of an all-to-allv with `counts[r * world + q]` elements from r to q.
pub fn alltoallv_reference(req: &Request, inputs: &[Vec<u8>], counts: &[u64]) -> Vec<Vec<u8>> {
    let w = req.world as usize;
    let es = req.dtype.size() as usize;
    let mut outs = vec![vec![POISON; req.bytes as usize]; w];
    for (q, out) in outs.iter_mut().enumerate() {
        let mut at = 0;
        for (r, inp) in inputs.iter().enumerate() {
            let n = counts[r * w + q] as usize * es;
            let from: usize = (0..q).map(|k| counts[r * w + k] as usize * es).sum();
            out[at..at + n].copy_from_slice(&inp[from..from + n]);
            at += n;
        }
    }
    outs
}

/// The first element where two results differ beyond tolerance.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// Rank.
    pub rank: usize,
    /// Element index in the output.
    pub elem: usize,
    /// Value found.
    pub found: f64,
    /// Value wanted.
    pub want: f64,
}

/// Compares outputs: integers exactly, floats within a relative 1e-2 (f16, bf16) or 1e-5
/// (f32, f64) of the wanted value, at least that much absolute. Poison must match exactly.
pub fn compare<F: AsRef<[u8]>, W: AsRef<[u8]>>(
    req: &Request,
    found: &[F],
    want: &[W],
) -> Result<(), Mismatch> {
    let es = req.dtype.size() as usize;
    let tol = match req.dtype {
        DType::F16 | DType::Bf16 => 1e-2,
        _ => 1e-5,
    };
    for (rank, (f, w)) in found.iter().zip(want).enumerate() {
        let (f, w) = (f.as_ref(), w.as_ref());
        for (elem, (x, y)) in f.chunks_exact(es).zip(w.chunks_exact(es)).enumerate() {
            if x == y {
                continue;
            }
            let (a, b) = (decode_f64(req.dtype, x), decode_f64(req.dtype, y));
            let poisoned = y.iter().all(|&c| c == POISON);
            let close =
                req.dtype.is_float() && !poisoned && (a - b).abs() <= tol * b.abs().max(1.0);
            if !close {
                return Err(Mismatch {
                    rank,
                    elem,
                    found: a,
                    want: b,
                });
            }
        }
        if f.len() != w.len() {
            return Err(Mismatch {
                rank,
                elem: f.len().min(w.len()) / es,
                found: f.len() as f64,
                want: w.len() as f64,
            });
        }
    }
    Ok(())
}

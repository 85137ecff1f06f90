//! Test data for the GPU checks: fresh random inputs and reference results, computed in
//! parallel (a 256 MiB check must not wait minutes for its reference).
//!
//! Inputs are small integers (|x| <= 4, unsigned types non-negative), the same distribution as the
//! host backend's `random_inputs`, so every partial sum is exact in every dtype and any algorithm's
//! combining order gives the reference's bits. The reference combines ranks in order 0, 1, ...
//! with `symm_core::dtype::combine` (the host backend's definition).

use symm_core::dtype::{combine, decode_f64, encode_int, DType, ReduceOp};
use symm_core::sched::{Collective, Request};
use symm_core::symbolic::Rng;
use symm_driver::host;

fn threads() -> usize {
    std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .min(32)
}

/// Fresh inputs for `req` from `seed`, one buffer per rank.
pub fn inputs(req: &Request, seed: u64) -> Vec<Vec<u8>> {
    let es = req.dtype.size() as usize;
    let len = req.buffer_sizes().input as usize;
    let unsigned = matches!(req.dtype, DType::U8 | DType::U32 | DType::U64);
    let prod = req.op == ReduceOp::Prod;
    (0..req.world as u64)
        .map(|r| {
            let mut v = vec![0u8; len];
            let per = (len / es).div_ceil(threads()).max(1024) * es;
            std::thread::scope(|s| {
                for (i, part) in v.chunks_mut(per).enumerate() {
                    s.spawn(move || {
                        let mut rng = Rng::new(seed ^ (r << 40) ^ (i as u64) << 20 ^ 0x9e37);
                        for e in part.chunks_exact_mut(es) {
                            let x = if prod {
                                [-1i64, 1, 2][rng.below(3) as usize]
                            } else {
                                rng.below(9) as i64 - 4
                            };
                            encode_int(req.dtype, if unsigned { x.abs() } else { x }, e);
                        }
                    });
                }
            });
            v
        })
        .collect()
}

/// Reduction of `inputs[*][off .. off + len]` in rank order.
fn reduce_range(req: &Request, inputs: &[Vec<u8>], off: usize, len: usize) -> Vec<u8> {
    let es = req.dtype.size() as usize;
    let w = inputs.len();
    let mut acc = inputs[0][off..off + len].to_vec();
    let per = (len / es).div_ceil(threads()).max(1024) * es;
    std::thread::scope(|s| {
        for (i, part) in acc.chunks_mut(per).enumerate() {
            s.spawn(move || {
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
            });
        }
    });
    acc
}

/// The outputs `req` defines (others stay [`host::POISON`]).
pub fn reference(req: &Request, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let b = req.bytes as usize;
    let out = req.buffer_sizes().output as usize;
    match req.collective {
        Collective::AllReduce => {
            let r = reduce_range(req, inputs, 0, b);
            vec![r; req.world as usize]
        }
        Collective::ReduceScatter => (0..req.world as usize)
            .map(|q| reduce_range(req, inputs, q * b, b))
            .collect(),
        Collective::Reduce { root } => {
            let mut v = vec![vec![host::POISON; out]; req.world as usize];
            v[root as usize] = reduce_range(req, inputs, 0, b);
            v
        }
        _ => host::reference(req, inputs),
    }
}

/// The first element where GPU outputs differ from the reference (bit for bit), as text.
pub fn compare(req: &Request, found: &[Vec<u8>], want: &[Vec<u8>]) -> Result<(), String> {
    let es = req.dtype.size() as usize;
    for (rank, (f, w)) in found.iter().zip(want).enumerate() {
        if f.len() != w.len() {
            return Err(format!("rank {rank}: {} bytes, want {}", f.len(), w.len()));
        }
        if f == w {
            continue;
        }
        for (i, (x, y)) in f.chunks(es).zip(w.chunks(es)).enumerate() {
            if x != y {
                let poison = if y.iter().all(|&c| c == host::POISON) {
                    " (undefined output)"
                } else {
                    ""
                };
                return Err(format!(
                    "rank {rank} element {i}: found {} want {}{poison}",
                    decode_f64(req.dtype, x),
                    decode_f64(req.dtype, y)
                ));
            }
        }
    }
    Ok(())
}

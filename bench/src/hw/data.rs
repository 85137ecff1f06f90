//! Test data for the GPU checks: fresh random inputs, generated in parallel (a 256 MiB check
//! must not wait minutes for them). The reference is `host::reference`, the one every backend is
//! checked against.
//!
//! Inputs are small integers (|x| <= 4, unsigned types non-negative), the same distribution as the
//! host backend's `random_inputs`, so every partial sum is exact in every dtype and any algorithm's
//! combining order gives the reference's bits. The reference combines ranks in order 0, 1, ...
//! with `symm_core::dtype::combine` (the host backend's definition).

use symm_core::dtype::{encode_int, DType, ReduceOp};
use symm_core::sched::Request;
use symm_core::symbolic::Rng;

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

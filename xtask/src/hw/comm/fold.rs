//! The fused reductions' arithmetic on the GPU, bit for bit against core's definition.
//!
//! The conformance matrix draws small integers, whose sums are exact in every type, so it cannot
//! tell one rounding from another. This check draws arbitrary finite floats (fractions, mixed
//! magnitudes, signs), runs every fused reduction on the `Comm`, and requires every rank's output
//! to equal, bit for bit, what the host executor computes with `symm_core::dtype::fold` for the
//! same ops: f32 accumulation for 16-bit floats, one rounding, the divisor of an average last.

use symm_core::dtype::{encode_int, f32_to_bf16, f32_to_f16, DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_core::symbolic::Rng;
use symm_driver::backend::Backend;
use symm_driver::cuda::Comm;
use symm_driver::host::{self, SimOptions};
use symm_tests::matrix::exact;

/// The algorithms whose reductions are fused ops.
pub(super) const FUSED: [Algorithm; 2] = [Algorithm::OneShot, Algorithm::TwoShot];

/// Cases the check runs.
pub(super) fn cases() -> usize {
    FUSED.len() * 3 * 2
}

/// Arbitrary finite values of `req.dtype` (floats: a random sign, mantissa and exponent within
/// +-2^8, so partial sums round; integers: full range).
fn inputs(req: &Request, seed: u64) -> Vec<Vec<u8>> {
    let es = req.dtype.size() as usize;
    let n = req.buffer_sizes().input as usize / es;
    let mut rng = Rng::new(seed);
    (0..req.world)
        .map(|_| {
            let mut v = vec![0u8; n * es];
            for x in v.chunks_exact_mut(es) {
                let bits = rng.next_u64();
                let mant = 1.0 + (bits & 0xFFFFFF) as f32 / (1u32 << 24) as f32;
                let exp = ((bits >> 24) % 17) as i32 - 8;
                let sign = if bits >> 63 == 1 { -1.0 } else { 1.0 };
                let f = sign * mant * 2f32.powi(exp);
                match req.dtype {
                    DType::F32 => x.copy_from_slice(&f.to_le_bytes()),
                    DType::F16 => x.copy_from_slice(&f32_to_f16(f).to_le_bytes()),
                    DType::Bf16 => x.copy_from_slice(&f32_to_bf16(f).to_le_bytes()),
                    _ => encode_int(req.dtype, bits as i64, x),
                }
            }
            v
        })
        .collect()
}

/// Every fused algorithm x {bf16, f16, f32} x {sum, avg} at 64 KiB + 6 B (vector and tail
/// paths); returns a line or the first mismatch.
pub(super) fn run(comm: &mut Comm) -> Result<String, String> {
    let w = comm.world();
    let opts = SimOptions {
        trace: false,
        ..SimOptions::default()
    };
    let mut n = 0;
    for a in FUSED {
        for dt in [DType::Bf16, DType::F16, DType::F32] {
            for op in [ReduceOp::Sum, ReduceOp::Avg] {
                let bytes = ((64 << 10) + 6) / dt.size() * dt.size();
                let req = Request::new(Collective::AllReduce, a, w, bytes, dt, op);
                let ins = inputs(&req, 900 + n);
                let want = host::simulate(&req, &ins, &opts)
                    .map_err(|x| format!("host executor: {x:?}"))?
                    .outputs;
                let got = Backend::run(comm, &req, &ins, false)
                    .map_err(|x| x.to_string())?
                    .outputs;
                exact(&req, &got, &want)
                    .map_err(|m| format!("{} {} {}: {m}", a.name(), dt.name(), op.name()))?;
                n += 1;
            }
        }
    }
    Ok(format!(
        "{n} cases of fractional floats bit exact against the host executor"
    ))
}

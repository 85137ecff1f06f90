//! The fused reductions' arithmetic on the GPU, bit for bit against core's definition, and the
//! low-latency protocol run back to back.
//!
//! The conformance matrix draws small integers, whose sums are exact in every type, so it cannot
//! tell one rounding from another. This check draws arbitrary finite floats (fractions, mixed
//! magnitudes, signs), runs every fused reduction on the `Comm`, and requires every rank's output
//! to equal, bit for bit, what the host executor computes with `symm_core::dtype::fold` for the
//! same ops: f32 accumulation for 16-bit floats, one rounding, the divisor of an average last.

use symm_core::dtype::{encode_int, f32_to_bf16, f32_to_f16, DType, ReduceOp};
use symm_core::sched::{Algorithm, BufferSizes, Collective, Request};
use symm_core::symbolic::Rng;
use symm_driver::backend::Backend;
use symm_driver::cuda::device::Stream;
use symm_driver::cuda::{Buffers, Comm};
use symm_driver::host::{self, SimOptions};

use super::super::data;
use symm_tests::matrix::exact;

/// The algorithms whose reductions are fused ops.
pub(super) const FUSED: [Algorithm; 3] =
    [Algorithm::OneShot, Algorithm::TwoShot, Algorithm::OneShotLl];

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
                // Vector and tail paths (the low-latency one takes at most 64 KiB).
                let want_bytes = if a.takes(64 << 10) {
                    (64 << 10) - 10
                } else {
                    64 << 10
                };
                let bytes = (want_bytes + 6) / dt.size() * dt.size();
                let bytes = if a.takes(bytes) {
                    bytes
                } else {
                    want_bytes / dt.size() * dt.size()
                };
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

/// Calls of the back-to-back check.
pub(super) const CALLS: u64 = 64;

/// `CALLS` low-latency all-reduces enqueued back to back on one scratch buffer (each with its own
/// input and output, no host synchronisation or barrier between them, so a rank may run calls
/// ahead of its peer), then every output checked bit exact.
pub(super) fn ll_back_to_back(comm: &Comm, stream: &Stream) -> Result<String, String> {
    let me = comm.rank() as usize;
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::OneShotLl,
        comm.world(),
        (8 << 10) + 6,
        DType::Bf16,
        ReduceOp::Sum,
    );
    // One input and one output area, a 256-byte-aligned slot per call in each.
    let step = req.bytes.div_ceil(256) * 256;
    let base = comm.alloc(&req).map_err(|x| x.to_string())?;
    let area = comm
        .alloc(&BufferSizes {
            input: step * CALLS,
            output: step * CALLS,
            scratch: 16,
        })
        .map_err(|x| x.to_string());
    let area = match area {
        Ok(a) => a,
        Err(m) => {
            let _ = comm.free(&base);
            return Err(m);
        }
    };
    let on = |i: u64| Buffers {
        input: area.input + i * step,
        output: area.output + i * step,
        scratch: base.scratch,
        sizes: base.sizes,
    };
    let r = (|| -> Result<String, String> {
        for i in 0..CALLS {
            let ins = data::inputs(&req, 7000 + i);
            comm.memory()
                .write(on(i).input, &ins[me])
                .map_err(|x| x.to_string())?;
            comm.memory()
                .fill(on(i).output, req.bytes, host::POISON)
                .map_err(|x| x.to_string())?;
        }
        comm.prepare(&[req]).map_err(|x| x.to_string())?;
        comm.exchange(&[]).map_err(|x| x.to_string())?;
        for i in 0..CALLS {
            comm.enqueue(&req, &on(i), stream)
                .map_err(|x| x.to_string())?;
        }
        comm.synchronize(stream).map_err(|x| x.to_string())?;
        for i in 0..CALLS {
            let ins = data::inputs(&req, 7000 + i);
            let found = comm
                .memory()
                .read(on(i).output, req.bytes)
                .map_err(|x| x.to_string())?;
            exact(&req, &[found], &host::reference(&req, &ins)[me..me + 1])
                .map_err(|m| format!("call {i}: {m}"))?;
        }
        Ok(format!(
            "{CALLS} calls of 8 KiB on one scratch buffer, no barrier between them: bit exact"
        ))
    })();
    comm.free(&area).map_err(|x| x.to_string())?;
    comm.free(&base).map_err(|x| x.to_string())?;
    r
}

//! Phase `bench`: all-reduce bf16 sum with one process per GPU, symm's `Comm` on the rank's
//! stream beside NCCL (`ncclCommInitRank`) on the same buffers and stream; the slowest rank's
//! CUDA-event time per op over back-to-back launches.

use std::time::Duration;

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::cuda::device::Stream;
use symm_driver::cuda::Comm;
use symm_driver::host;
use symm_tests::matrix::exact;

use super::super::data;
use super::{e, opts};

/// Opens the job's communicator and times the cases.
pub(super) fn run() -> Result<String, String> {
    let comm = Comm::from_env(opts(Duration::from_secs(10), 1 << 30)).map_err(e)?;
    let stream = Stream::new(comm.device()).map_err(e)?;
    let r = bench(&comm, &stream)?;
    drop(stream);
    comm.finish().map_err(e)?;
    Ok(r)
}

/// Bytes, timed iterations, and the (algorithm, channels) tried.
type BenchCase = (u64, u32, &'static [(Algorithm, u16)]);

/// All-reduce bf16 sum, one process per GPU: symm's `Comm` on its own stream against NCCL
/// (ncclCommInitRank) on the same buffers and stream, the slowest rank's CUDA-event time.
fn bench(comm: &Comm, stream: &Stream) -> Result<String, String> {
    use symm_driver::cuda::ffi::nccl as nffi;
    use symm_driver::cuda::nccl::NcclRank;

    let nccl = NcclRank::new(comm).map_err(e);
    let w = comm.world();
    let mut lines = Vec::new();
    let cases: [BenchCase; 3] = [
        (
            1 << 10,
            500,
            &[(Algorithm::OneShot, 1), (Algorithm::TwoShot, 1)],
        ),
        (
            1 << 20,
            200,
            &[(Algorithm::OneShot, 16), (Algorithm::TwoShot, 16)],
        ),
        (
            256 << 20,
            10,
            &[(Algorithm::TwoShot, 64), (Algorithm::Ring, 64)],
        ),
    ];
    for (bytes, iters, algos) in cases {
        let mut best = (f64::MAX, String::new());
        for &(a, ch) in algos {
            let req = Request::new(
                Collective::AllReduce,
                a,
                w,
                bytes,
                DType::Bf16,
                ReduceOp::Sum,
            )
            .with_channels(ch);
            let b = comm.alloc(&req).map_err(e)?;
            let inputs = data::inputs(&req, bytes ^ ch as u64);
            let me = comm.rank() as usize;
            comm.write(b.input, &inputs[me]).map_err(e)?;
            let us = comm.time(&req, &b, stream, 10, iters).map_err(e)?;
            let found = comm.read(b.output, b.sizes.output).map_err(e)?;
            exact(&req, &[found], &host::reference(&req, &inputs)[me..me + 1])
                .map_err(|m| format!("{} {bytes} B after timing: {m}", a.name()))?;
            let slowest = comm
                .exchange(&us.to_le_bytes())
                .map_err(e)?
                .iter()
                .filter_map(|v| v.as_slice().try_into().ok().map(f64::from_le_bytes))
                .fold(0.0, f64::max);
            if slowest < best.0 {
                best = (slowest, format!("{}/{ch}ch", a.name()));
            }
            let nccl_us = match &nccl {
                Ok(n) => {
                    let t = n
                        .time_all_reduce(
                            comm,
                            (b.input, b.output),
                            (bytes / 2) as usize,
                            nffi::BFLOAT16,
                            nffi::SUM,
                            stream,
                            (10, iters),
                        )
                        .map_err(e)?;
                    comm.exchange(&t.to_le_bytes())
                        .map_err(e)?
                        .iter()
                        .filter_map(|v| v.as_slice().try_into().ok().map(f64::from_le_bytes))
                        .fold(0.0, f64::max)
                }
                Err(_) => f64::NAN,
            };
            comm.free(&b).map_err(e)?;
            if a == algos[algos.len() - 1].0 {
                let busbw = |t: f64| bytes as f64 / t / 1e3 * 2.0 * (w as f64 - 1.0) / w as f64;
                lines.push(format!(
                    "{bytes} B: symm {:.2} us ({:.0} GB/s, {}) vs NCCL {:.2} us ({:.0} GB/s)",
                    best.0,
                    busbw(best.0),
                    best.1,
                    nccl_us,
                    busbw(nccl_us)
                ));
            }
        }
    }
    if let Err(m) = &nccl {
        lines.push(format!("NCCL unavailable: {m}"));
    }
    Ok(lines.join("; "))
}

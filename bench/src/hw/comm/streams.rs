//! A Comm across streams: collectives of one team enqueued on two streams share the team's
//! slots and counters, so the Comm orders them (one order on every rank) instead of letting
//! them run at once.

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::cuda::device::Stream;
use symm_driver::cuda::Comm;
use symm_driver::host;
use symm_tests::matrix::exact;

use super::super::data;
use super::e;

/// 50 rounds of two job all-reduces, one on each of two streams, enqueued back to back with no
/// host synchronisation: both outputs bit exact.
pub(super) fn two_streams(comm: &Comm) -> Result<String, String> {
    let me = comm.rank() as usize;
    let (s1, s2) = (
        Stream::new(comm.device()).map_err(e)?,
        Stream::new(comm.device()).map_err(e)?,
    );
    let reqs = [
        Request::new(
            Collective::AllReduce,
            Algorithm::OneShot,
            comm.world(),
            64 << 10,
            DType::F32,
            ReduceOp::Sum,
        )
        .with_channels(2),
        Request::new(
            Collective::AllReduce,
            Algorithm::Ring,
            comm.world(),
            256 << 10,
            DType::I32,
            ReduceOp::Sum,
        )
        .with_channels(4),
    ];
    let bufs = [
        comm.alloc(&reqs[0]).map_err(e)?,
        comm.alloc(&reqs[1]).map_err(e)?,
    ];
    let r = (|| {
        let inputs = [data::inputs(&reqs[0], 71), data::inputs(&reqs[1], 72)];
        for ((req, b), inp) in reqs.iter().zip(&bufs).zip(&inputs) {
            comm.memory().write(b.input, &inp[me]).map_err(e)?;
            comm.prepare(std::slice::from_ref(req)).map_err(e)?;
        }
        comm.exchange(&[]).map_err(e)?;
        for _ in 0..50 {
            comm.enqueue(&reqs[0], &bufs[0], &s1).map_err(e)?;
            comm.enqueue(&reqs[1], &bufs[1], &s2).map_err(e)?;
        }
        comm.synchronize(&s1).map_err(e)?;
        comm.synchronize(&s2).map_err(e)?;
        // Out of place: every launch computes the same output from the same inputs.
        for ((req, b), inp) in reqs.iter().zip(&bufs).zip(&inputs) {
            let found = comm.memory().read(b.output, b.sizes.output).map_err(e)?;
            exact(req, &[found], &host::reference(req, inp)[me..me + 1])
                .map_err(|m| format!("{}: {m}", req.algorithm.name()))?;
        }
        Ok("50 x (one-shot on stream 1, ring on stream 2) back to back: bit exact".to_string())
    })();
    for b in &bufs {
        comm.free(b).map_err(e)?;
    }
    r
}

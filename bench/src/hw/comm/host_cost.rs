//! What a cached call costs the host: a repeated [`Comm::enqueue`] is a lookup of its admission
//! and a launch, and a launch of an admission the caller holds ([`Comm::launch`]) is only the
//! launch. Both are timed on the host (no synchronisation inside the loop) and their outputs
//! checked; the times are reported, not judged (they depend on the machine).

use std::time::Instant;

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::cuda::device::Stream;
use symm_driver::cuda::Comm;
use symm_driver::host;
use symm_tests::matrix::exact;

use super::super::data;
use super::e;

/// Calls per timed loop (well under the launch queue's depth).
const CALLS: u32 = 200;

/// A 4 KiB one-shot all-reduce, `CALLS` times through [`Comm::enqueue`] and `CALLS` times
/// through [`Comm::launch`] of its admission: host microseconds per call, outputs bit exact.
pub(super) fn cached_calls(comm: &Comm, stream: &Stream) -> Result<String, String> {
    let me = comm.rank() as usize;
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::OneShot,
        comm.world(),
        4 << 10,
        DType::F32,
        ReduceOp::Sum,
    );
    let b = comm.alloc(&req).map_err(e)?;
    let r = (|| {
        let inputs = data::inputs(&req, 81);
        comm.memory().write(b.input, &inputs[me]).map_err(e)?;
        let want = host::reference(&req, &inputs);
        let check = |what: &str| -> Result<(), String> {
            comm.synchronize(stream).map_err(e)?;
            let found = comm.memory().read(b.output, b.sizes.output).map_err(e)?;
            exact(&req, &[found], &want[me..me + 1]).map_err(|m| format!("{what}: {m}"))
        };
        // The first call admits (and builds the plan); the rest find it.
        comm.enqueue(&req, &b, stream).map_err(e)?;
        check("first call")?;
        comm.exchange(&[]).map_err(e)?;
        let t = Instant::now();
        for _ in 0..CALLS {
            comm.enqueue(&req, &b, stream).map_err(e)?;
        }
        let enqueue = t.elapsed().as_secs_f64() * 1e6 / f64::from(CALLS);
        check("enqueue")?;
        let a = comm.admit(&req).map_err(e)?;
        comm.exchange(&[]).map_err(e)?;
        let t = Instant::now();
        for _ in 0..CALLS {
            comm.launch(&a, &b, stream).map_err(e)?;
        }
        let launch = t.elapsed().as_secs_f64() * 1e6 / f64::from(CALLS);
        check("launch")?;
        Ok(format!(
            "4 KiB one-shot all-reduce, host time per call: enqueue {enqueue:.2} us, launch of a \
             held admission {launch:.2} us ({:?}); bit exact",
            a.executor()
        ))
    })();
    comm.free(&b).map_err(e)?;
    r
}

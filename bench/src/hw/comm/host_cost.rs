//! What a cached call costs the host, against the floor under it.
//!
//! A repeated [`Comm::enqueue`] is a lookup of its admission and a launch, and a launch of an
//! admission the caller holds ([`Comm::launch`]) is only the launch. Under both lies one
//! `cuLaunchKernel`, timed bare by [`LaunchFloor`]: an empty kernel with the same grid, block
//! and parameter-block size. Each is timed the same way: [`CALLS`] back-to-back calls on the
//! same stream, the host clock around the loop, no synchronisation inside it, the Comm's
//! context current on the thread (as a framework keeps it; a thread with another context
//! current pays a rebind and a restore per call, reported beside). Outputs are checked bit
//! exact; the times are reported, not judged (they depend on the machine).
//!
//! The order across streams (`comm/order.rs`) costs nothing while a team's collectives stay on
//! one stream; once a second stream was used, every launch asks whether its stream captures and
//! records an event. [`cached_calls`] runs before any check of the process uses a second
//! stream, and [`after_second_stream`] measures the same call once one was used.

use std::time::Instant;

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::cuda::device::{self, Stream};
use symm_driver::cuda::{Buffers, Comm, CudaError, LaunchFloor};
use symm_driver::host;
use symm_tests::matrix::exact;

use super::super::data;
use super::e;

/// Calls per timed loop (well under the launch queue's depth).
const CALLS: u32 = 200;

/// The timed request: a 4 KiB one-shot all-reduce.
fn request(comm: &Comm) -> Request {
    Request::new(
        Collective::AllReduce,
        Algorithm::OneShot,
        comm.world(),
        4 << 10,
        DType::F32,
        ReduceOp::Sum,
    )
}

/// Host microseconds per call of `CALLS` calls of `f`, the ranks lined up first.
fn per_call(comm: &Comm, mut f: impl FnMut() -> Result<(), CudaError>) -> Result<f64, String> {
    comm.exchange(&[]).map_err(e)?;
    let t = Instant::now();
    for _ in 0..CALLS {
        f().map_err(e)?;
    }
    Ok(t.elapsed().as_secs_f64() * 1e6 / f64::from(CALLS))
}

/// Runs `body` over fresh buffers of the timed request holding this rank's inputs, with a check
/// that `stream`'s last output is bit exact; frees the buffers.
fn with_buffers(
    comm: &Comm,
    stream: &Stream,
    body: impl FnOnce(&Request, &Buffers, &dyn Fn(&str) -> Result<(), String>) -> Result<String, String>,
) -> Result<String, String> {
    let me = comm.rank() as usize;
    let req = request(comm);
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
        body(&req, &b, &check)
    })();
    comm.free(&b).map_err(e)?;
    r
}

/// The timed request `CALLS` times through [`Comm::enqueue`] (with and without the context
/// current) and through [`Comm::launch`] of its admission, and `CALLS` bare launches: host
/// microseconds per call and symm's cost above the floor. Runs before any check of the process
/// uses a second stream (no order event).
pub(super) fn cached_calls(comm: &Comm, stream: &Stream) -> Result<String, String> {
    with_buffers(comm, stream, |req, b, check| {
        // The first call admits (and builds the plan); the rest find it.
        comm.enqueue(req, b, stream).map_err(e)?;
        check("first call")?;
        let a = comm.admit(req).map_err(e)?;
        let floor = LaunchFloor::load(comm).map_err(e)?;
        // The caller's binding (restored when this returns), as it was.
        let _keep = device::keep_current().map_err(e)?;
        let unbound = if device::current_context().map_err(e)? == comm.device().context() {
            None
        } else {
            let us = per_call(comm, || comm.enqueue(req, b, stream))?;
            check("enqueue, another context current")?;
            Some(us)
        };
        comm.device().bind().map_err(e)?;
        let enqueue = per_call(comm, || comm.enqueue(req, b, stream))?;
        check("enqueue")?;
        let launch = per_call(comm, || comm.launch(&a, b, stream))?;
        check("launch")?;
        let bare = floor.time(comm, &a, stream, CALLS).map_err(e)?;
        comm.synchronize(stream).map_err(e)?;
        let unbound = unbound.map_or(String::new(), |us| {
            format!("; enqueue from a thread with another context current {us:.2} us")
        });
        Ok(format!(
            "4 KiB one-shot all-reduce ({:?}, {} blocks), host time per call on one stream: \
             enqueue {enqueue:.2} us, launch of a held admission {launch:.2} us, bare launch \
             {bare:.2} us; symm above the floor: enqueue {:+.2} us, launch {:+.2} us{unbound}; \
             bit exact",
            a.executor(),
            a.sms(),
            enqueue - bare,
            launch - bare,
        ))
    })
}

/// The timed request `CALLS` times through [`Comm::enqueue`] once the job's collectives were
/// enqueued on a second stream: every launch then asks whether its stream captures and records
/// the order event. Host microseconds per call, beside the bare launch.
pub(super) fn after_second_stream(comm: &Comm, stream: &Stream) -> Result<String, String> {
    let other = Stream::new(comm.device()).map_err(e)?;
    with_buffers(comm, stream, |req, b, check| {
        // A call on another stream: from here on the job's order records an event per launch.
        comm.enqueue(req, b, &other).map_err(e)?;
        comm.enqueue(req, b, stream).map_err(e)?;
        check("after a switch of streams")?;
        let a = comm.admit(req).map_err(e)?;
        let floor = LaunchFloor::load(comm).map_err(e)?;
        let _keep = device::keep_current().map_err(e)?;
        comm.device().bind().map_err(e)?;
        let enqueue = per_call(comm, || comm.enqueue(req, b, stream))?;
        check("enqueue")?;
        let bare = floor.time(comm, &a, stream, CALLS).map_err(e)?;
        comm.synchronize(stream).map_err(e)?;
        Ok(format!(
            "4 KiB one-shot all-reduce, host time per call once a second stream was used \
             (a capture query and an event record per launch): enqueue {enqueue:.2} us, bare \
             launch {bare:.2} us, above the floor {:+.2} us; bit exact",
            enqueue - bare,
        ))
    })
}

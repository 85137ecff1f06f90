//! The checks of a caller who gets things wrong, run last in phase `correct`: a forced timeout
//! (rank 1 skips a collective: `Timeout` from `synchronize`, `Poisoned` after it, bit-exact
//! collectives after `reset()`), a block freed while a capture holds it, a stream of another
//! device or context, and hostile calls (short buffers, buffers over the pad, divergent
//! allocation), each refused with its typed error.

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::cuda::device::{self, Device, Stream};
use symm_driver::cuda::{Comm, CommTeam, CudaError};

use super::correct::case;
use super::e;

pub(super) fn poison_reset(comm: &Comm, stream: &Stream) -> Result<String, String> {
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::OneShot,
        comm.world(),
        4096,
        DType::F32,
        ReduceOp::Sum,
    );
    let b = comm.alloc(&req).map_err(e)?;
    comm.prepare(&[req]).map_err(e)?;
    let g = comm
        .capture(stream, |cap| cap.enqueue(&req, &b))
        .map_err(e)?;
    // Rank 1 skips this collective: every other rank times out waiting for it.
    if comm.rank() != 1 {
        comm.enqueue(&req, &b, stream).map_err(e)?;
        match comm.synchronize(stream) {
            Err(CudaError::Timeout { .. }) => {}
            other => return Err(format!("a collective rank 1 skipped gave {other:?}")),
        }
        match comm.enqueue(&req, &b, stream) {
            Err(CudaError::Poisoned(_)) => {}
            other => return Err(format!("after the timeout, enqueue gave {other:?}")),
        }
        // A replay would wait on the same counters: refused as well.
        match g.launch(stream) {
            Err(CudaError::Poisoned(_)) => {}
            other => return Err(format!("after the timeout, a graph replay gave {other:?}")),
        }
    }
    drop(g);
    comm.reset().map_err(e)?;
    let mut n = 0;
    for i in 0..100u64 {
        let a = [
            Algorithm::Ring,
            Algorithm::OneShot,
            Algorithm::TwoShot,
            Algorithm::Rhd,
        ][i as usize % 4];
        let req = Request {
            algorithm: a,
            ..req
        };
        case(comm, stream, &req, 5000 + i)?.map_err(|m| format!("after reset, run {i}: {m}"))?;
        n += 1;
    }
    comm.free(&b).map_err(e)?;
    Ok(format!(
        "timeout -> Timeout, Poisoned (enqueue and graph replay), reset() -> {n} bit exact"
    ))
}

/// Hostile calls: buffers short of the plan or over the signal pad are refused before anything is
/// enqueued (the next collective is bit exact), and ranks that allocate differently get an
/// error naming the call on both sides. Runs last: the allocators differ afterwards.
pub(super) fn hostile(comm: &Comm, stream: &Stream) -> Result<String, String> {
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        comm.world(),
        64 << 10,
        DType::F32,
        ReduceOp::Sum,
    );
    let b = comm.alloc(&req).map_err(e)?;
    let mut short = b;
    short.sizes.output -= 4;
    let mut pad = b;
    pad.output = 0;
    for (what, bad) in [("4 bytes short", short), ("over the signal pad", pad)] {
        match comm.enqueue(&req, &bad, stream) {
            Err(CudaError::TooSmall { what: "output", .. }) if what == "4 bytes short" => {}
            Err(CudaError::OutOfBounds { what: "output", .. }) if what == "over the signal pad" => {
            }
            other => return Err(format!("an output {what} gave {other:?}")),
        }
    }
    comm.free(&b).map_err(e)?;
    case(comm, stream, &req, 9000)?.map_err(|m| format!("after the refusals: {m}"))?;
    // Members of a team that allocate differently in its region are told so, by name.
    let team = CommTeam::split_strided(comm, 0, 1, comm.world(), 64 << 10)
        .map_err(e)?
        .ok_or("every rank is a member of the strided team")?;
    let n = if comm.rank() == 0 { 4096 } else { 8192 };
    let team_msg = match team.alloc_sizes(symm_core::sched::BufferSizes {
        input: n,
        output: n,
        scratch: 0,
    }) {
        Err(
            e @ CudaError::Diverged {
                what: "team allocation",
                ..
            },
        ) => e.to_string(),
        other => return Err(format!("divergent team allocation gave {other:?}")),
    };
    drop(team);
    let sizes = symm_core::sched::BufferSizes {
        input: n,
        output: n,
        scratch: 0,
    };
    match comm.alloc(&sizes) {
        Err(
            e @ CudaError::Diverged {
                what: "symmetric allocation",
                ..
            },
        ) => Ok(format!(
            "2 bad buffer sets refused; divergent allocation named: {e}; in a team: {team_msg}"
        )),
        other => Err(format!("divergent allocation gave {other:?}")),
    }
}

/// A stream of another GPU's context is refused by `enqueue`, `put_on_stream` and a graph's
/// replay before anything is enqueued (the heap is not mapped there), and the Comm stays usable.
pub(super) fn foreign_stream(comm: &Comm, stream: &Stream) -> Result<String, String> {
    let n = device::device_count().map_err(e)?;
    let mine = comm.device().ordinal();
    let Some(other) = (0..n).find(|&d| d != mine) else {
        return Ok("one visible GPU: nothing to check".into());
    };
    let other = Device::open(other).map_err(e)?;
    let theirs = Stream::new(&other).map_err(e)?;
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        comm.world(),
        64 << 10,
        DType::F32,
        ReduceOp::Sum,
    );
    let b = comm.alloc(&req).map_err(e)?;
    let r = (|| {
        comm.prepare(&[req]).map_err(e)?;
        let refused = |what: &str, r: Result<(), CudaError>| match r {
            Err(CudaError::WrongOwner { what: "the stream" }) => Ok(()),
            other => Err(format!("{what} on another device's stream gave {other:?}")),
        };
        refused("enqueue", comm.enqueue(&req, &b, &theirs))?;
        refused(
            "put_on_stream",
            comm.memory()
                .put_on_stream(comm.rank(), b.output, b.input, 4096, &theirs),
        )?;
        let g = comm.capture(stream, |c| c.enqueue(&req, &b)).map_err(e)?;
        refused("a graph replay", g.launch(&theirs))?;
        drop(g);
        comm.check().map_err(e)
    })();
    comm.free(&b).map_err(e)?;
    r?;
    case(comm, stream, &req, 9100)?.map_err(|m| format!("after the refusals: {m}"))?;
    Ok("enqueue, put_on_stream and replay on another device's stream refused".into())
}

/// Buffers a capture names are pinned from the moment the capture enqueues them: a `free` on
/// another thread while the capture is still open is refused (it would return memory the graph
/// replays into), and the buffers free normally once the graph is dropped.
pub(super) fn pinned_during_capture(comm: &Comm, stream: &Stream) -> Result<String, String> {
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        comm.world(),
        64 << 10,
        DType::F32,
        ReduceOp::Sum,
    );
    let b = comm.alloc(&req).map_err(e)?;
    comm.prepare(&[req]).map_err(e)?;
    let mut during = None;
    let g = comm
        .capture(stream, |c| {
            c.enqueue(&req, &b)?;
            during = Some(std::thread::scope(|s| {
                s.spawn(|| comm.free(&b))
                    .join()
                    .unwrap_or(Err(CudaError::RankPanicked))
            }));
            Ok(())
        })
        .map_err(e)?;
    drop(g);
    match during {
        Some(Err(CudaError::Pinned)) => {}
        other => {
            return Err(format!(
                "free on another thread during the capture gave {other:?}"
            ))
        }
    }
    comm.free(&b).map_err(e)?;
    Ok("free refused while the capture was open, accepted after the graph was dropped".into())
}

//! The copy-engine path on a `Comm` (`symm_driver::cuda::copy_engine`): every rank switches to
//! it together, runs the checks, and switches back.
//!
//! * the shared conformance matrix restricted to the requests the path serves (all-gather,
//!   broadcast, scatter, gather, send-recv on `direct`, all-to-all on `pairwise`), bit exact,
//!   each case checked to occupy no SM;
//! * the same requests traced (timing events around each stream operation), merged across
//!   processes and compared op by op with the host simulator's trace;
//! * 100 replays of an all-gather captured in a CUDA graph, fresh inputs each time (the flags
//!   wait for a fixed value, so a replay needs nothing re-recorded);
//! * back to back, the path and the kernel path alternate on the same buffers (flags and
//!   counters are different words).

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::backend::Backend;
use symm_driver::cuda::device::Stream;
use symm_driver::cuda::{Buffers, Comm, CopyEngine, CudaError};
use symm_driver::host;
use symm_tests::matrix::{exact, Matrix};

use super::super::checks::{hw_matrix, semantic_diff};
use super::super::data;
use super::{e, Params};

/// Runs the checks with the copy engines on, and always switches back.
pub(super) fn run(
    comm: &mut Comm,
    stream: &Stream,
    p: &Params,
    sizes: &[u64],
) -> Result<String, String> {
    comm.set_copy_engine(CopyEngine::Always).map_err(e)?;
    let r = checks(comm, stream, p, sizes);
    comm.set_copy_engine(CopyEngine::Off).map_err(e)?;
    r
}

fn checks(comm: &mut Comm, stream: &Stream, p: &Params, sizes: &[u64]) -> Result<String, String> {
    let m = Matrix {
        keep: symm_core::flag::eligible,
        ..hw_matrix(comm.world(), sizes)
    };
    let rep = symm_tests::matrix::run(comm, &m, &mut 11);
    if let Some(f) = rep.failures.first() {
        return Err(format!(
            "{} of {} cases failed; first: {f}",
            rep.failures.len(),
            rep.cases
        ));
    }
    if rep.cases == 0 {
        return Err("no case of the matrix runs on copy engines".into());
    }
    let ops = traces(comm, p)?;
    graph(comm, stream)?;
    alternate(comm, stream)?;
    Ok(format!(
        "{} cases bit exact on 0 SMs; {ops} traced ops in the simulator's order; 100 graph \
         replays; 20 calls alternating with the kernel path",
        rep.cases
    ))
}

/// The path's requests at `bytes` (one-hop schedules of the collectives that only move bytes).
fn requests(world: u16, bytes: u64) -> Vec<Request> {
    [
        (Collective::AllGather, Algorithm::Direct),
        (Collective::Broadcast { root: world - 1 }, Algorithm::Direct),
        (Collective::AllToAll, Algorithm::Pairwise),
    ]
    .into_iter()
    .map(|(c, a)| Request::new(c, a, world, bytes, DType::F32, ReduceOp::Sum).with_channels(2))
    .filter(symm_core::flag::eligible)
    .collect()
}

fn traces(comm: &mut Comm, p: &Params) -> Result<usize, String> {
    let w = comm.world();
    let mut ops = 0;
    for (i, req) in requests(w, 256 << 10).into_iter().enumerate() {
        let name = req.collective.name();
        if comm.admit(&req).map_err(e)?.sms() != 0 {
            return Err(format!("{name} would occupy SMs"));
        }
        let inputs = data::inputs(&req, 500 + i as u64);
        let out = Backend::run(comm, &req, &inputs, true).map_err(|m| format!("{name}: {m}"))?;
        exact(&req, &out.outputs, &host::reference(&req, &inputs))
            .map_err(|m| format!("{name}: {m}"))?;
        let gpu = out.trace.ok_or_else(|| format!("{name}: no trace"))?;
        if comm.rank() == 0 {
            let _ = std::fs::write(
                p.out.join(format!("gpu-w{w}-{name}-copy-engines.trace")),
                &gpu,
            );
        }
        let sim = host::simulate(&req, &inputs, &host::SimOptions::default())
            .map_err(|m| m.to_string())?;
        ops += semantic_diff(&gpu, &sim.trace).map_err(|m| format!("{name}: {m}"))?;
    }
    Ok(ops)
}

/// One case on `b`: fresh inputs, poisoned output, `go`, then this rank's output checked.
fn case(
    comm: &Comm,
    stream: &Stream,
    req: &Request,
    b: &Buffers,
    seed: u64,
    go: &dyn Fn() -> Result<(), CudaError>,
) -> Result<(), String> {
    let me = comm.rank() as usize;
    let inputs = data::inputs(req, seed);
    comm.memory().write(b.input, &inputs[me]).map_err(e)?;
    comm.memory()
        .fill(b.output, b.sizes.output, host::POISON)
        .map_err(e)?;
    // Every rank's buffers are ready before any rank's collective writes into them.
    comm.exchange(&[]).map_err(e)?;
    go().map_err(e)?;
    comm.synchronize(stream).map_err(e)?;
    let found = comm.memory().read(b.output, b.sizes.output).map_err(e)?;
    exact(req, &[found], &host::reference(req, &inputs)[me..me + 1])
}

fn graph(comm: &Comm, stream: &Stream) -> Result<(), String> {
    let req = requests(comm.world(), 1 << 20)[0];
    let b = comm.alloc(&req).map_err(e)?;
    comm.prepare(&[req]).map_err(e)?;
    let r = (|| {
        let g = comm
            .capture(stream, |cap| cap.enqueue(&req, &b))
            .map_err(e)?;
        for i in 0..100u64 {
            case(comm, stream, &req, &b, 2000 + i, &|| g.launch(stream))
                .map_err(|m| format!("graph replay {i}: {m}"))?;
        }
        Ok(())
    })();
    comm.free(&b).map_err(e)?;
    r
}

/// The same all-gather on copy engines and in a kernel, alternating on the same buffers.
fn alternate(comm: &Comm, stream: &Stream) -> Result<(), String> {
    let req = requests(comm.world(), 64 << 10)[0];
    let b = comm.alloc(&req).map_err(e)?;
    let r = (|| {
        for i in 0..20u64 {
            let ce = if i % 2 == 0 {
                CopyEngine::Always
            } else {
                CopyEngine::Off
            };
            comm.set_copy_engine(ce).map_err(e)?;
            case(comm, stream, &req, &b, 3000 + i, &|| {
                comm.enqueue(&req, &b, stream)
            })
            .map_err(|m| format!("call {i} ({ce:?}): {m}"))?;
        }
        Ok(())
    })();
    comm.set_copy_engine(CopyEngine::Always).map_err(e)?;
    comm.free(&b).map_err(e)?;
    r
}

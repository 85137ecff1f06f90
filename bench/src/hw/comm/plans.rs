//! Which kernel a prepared request runs: `Comm::prepare` compiles what the Comm's plan path
//! (`SYMM_PLANS`; `auto` by default: requests up to `AUTO_COMPILED_BYTES` whose plan holds at
//! most `AUTO_COMPILED_OPS` ops) runs compiled, so
//! the launches after it, and a CUDA graph captured after it, run the compiled kernel from the
//! first call instead of the interpreter while a background compile runs.

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::cuda::compiled::AUTO_COMPILED_BYTES;
use symm_driver::cuda::{Comm, CommOptions};

use super::e;

/// A small and a large all-reduce, prepared: each runs compiled exactly when the plan path
/// compiles its size (copy engines aside), on every rank.
pub(super) fn prepared(comm: &Comm) -> Result<String, String> {
    // The plan path the Comm was opened with: the environment's, read as the Comm read it.
    let path = CommOptions::from_env().map_err(|e| e.to_string())?.plans;
    let w = comm.world();
    let reqs = [
        Request::new(
            Collective::AllReduce,
            Algorithm::OneShotLl,
            w,
            1 << 10,
            DType::Bf16,
            ReduceOp::Sum,
        ),
        Request::new(
            Collective::AllReduce,
            Algorithm::TwoShot,
            w,
            4 * AUTO_COMPILED_BYTES,
            DType::Bf16,
            ReduceOp::Sum,
        )
        .with_channels(8),
    ];
    let mut notes = Vec::new();
    for req in reqs {
        comm.prepare(&[req]).map_err(e)?;
        let got = comm.admit(&req).map_err(e)?.runs_compiled();
        // The small plan is far below both op limits (`AUTO_COMPILED_OPS`, `MAX_COMPILED_OPS`);
        // the large one is past `AUTO_COMPILED_BYTES`, whatever its ops.
        let want = !comm.copy_engine().takes(&req) && path.compiles(req.bytes, 0);
        if got != want {
            return Err(format!(
                "{} {} B after prepare ({path:?}): runs compiled {got}, expected {want}",
                req.algorithm.name(),
                req.bytes
            ));
        }
        notes.push(format!(
            "{} {} B: {}",
            req.algorithm.name(),
            req.bytes,
            if got { "compiled" } else { "interpreted" }
        ));
    }
    Ok(format!(
        "{path:?} plans, after prepare: {}",
        notes.join("; ")
    ))
}

//! Which kernel a prepared request runs: `Comm::prepare` compiles what the Comm's plan path
//! (`SYMM_PLANS`; `auto` by default: plans whose kernel holds at most `AUTO_COMPILED_OPS` ops,
//! one channel of each shape, at any size) runs compiled, so
//! the launches after it, and a CUDA graph captured after it, run the compiled kernel from the
//! first call instead of the interpreter while a background compile runs.

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::cuda::compiled::compiled_ops;
use symm_driver::cuda::plan::RankPlan;
use symm_driver::cuda::{Comm, CommOptions};

use super::e;

/// A small and a large all-reduce, prepared: each runs compiled exactly when the plan path
/// compiles its kernel (copy engines aside), on every rank.
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
            64 << 20,
            DType::Bf16,
            ReduceOp::Sum,
        )
        .with_channels(64),
    ];
    let mut notes = Vec::new();
    for req in reqs {
        comm.prepare(&[req]).map_err(e)?;
        let got = comm.admit(&req).map_err(e)?.runs_compiled();
        // Both kernels are far below both op limits (`AUTO_COMPILED_OPS`, `MAX_COMPILED_OPS`):
        // the large plan's 64 channels share one shape.
        let plan = RankPlan::schedule(&req, comm.rank()).map_err(e)?;
        let want = !comm.copy_engine().takes(&req) && path.compiles(compiled_ops(&plan));
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

//! Joining the job from Python: the one way every entry point joins
//! ([`CommOptions::join`]), with the job's name and secret as the Python layer found them
//! (torch's store or `SYMM_JOB`/`SYMM_TOKEN`) and the options `symm.init` takes over the
//! environment's (`CommOptions::from_env`: `SYMM_PLANS`, `SYMM_COPY_ENGINE`, `SYMM_NVRTC`,
//! `SYMM_DETERMINISTIC`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use symm_driver::bootstrap::JobEnv;
use symm_driver::cuda::compiled::PlanPath;
use symm_driver::cuda::{AutoRequests, CommOptions};

use super::{py_err, GpuComm, Runtime};

/// Joins job `job` (secret `token`, hex) as `rank` of `world` on the GPU of `local_rank`, with
/// a heap of `heap_bytes`, the device-wait and bootstrap deadlines in milliseconds, `plans`
/// (when given) over `SYMM_PLANS` and `deterministic` (when given) over `SYMM_DETERMINISTIC`.
/// Collective.
pub(super) fn open(
    py: Python<'_>,
    (rank, world, local_rank): (i64, i64, i64),
    (job, token): (String, String),
    heap_bytes: u64,
    (timeout_ms, bootstrap_timeout_ms): (u64, u64),
    (plans, deterministic): (Option<&str>, Option<bool>),
    device: Option<i32>,
) -> PyResult<GpuComm> {
    let plans = plans
        .map(|p| {
            PlanPath::parse(p).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "plans must be auto, interpreted or compiled, got {:?}",
                    p.chars().take(32).collect::<String>()
                ))
            })
        })
        .transpose()?;
    let vars: HashMap<&str, String> = [
        ("RANK", rank.to_string()),
        ("WORLD_SIZE", world.to_string()),
        ("LOCAL_RANK", local_rank.to_string()),
        ("SYMM_JOB", job),
        ("SYMM_TOKEN", token),
    ]
    .into_iter()
    .collect();
    let env = JobEnv::from_vars(|k| vars.get(k).map(Into::into))
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    let mut opts = CommOptions::from_env().map_err(|e| py_err(py, e))?;
    opts.heap_bytes = heap_bytes;
    opts.timeout = Duration::from_millis(timeout_ms);
    opts.bootstrap_timeout = Duration::from_millis(bootstrap_timeout_ms);
    if let Some(p) = plans {
        opts.plans = p;
    }
    if let Some(d) = deterministic {
        opts.deterministic = d;
    }
    let plans = opts.plans;
    let comm = py
        .allow_threads(|| opts.join_on(&env, device))
        .map_err(|e| py_err(py, e))?;
    Ok(GpuComm {
        auto: AutoRequests::of(&comm),
        rt: Arc::new(Runtime::new(comm)),
        plans,
    })
}

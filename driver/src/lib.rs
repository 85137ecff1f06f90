//! # symm-driver
//!
//! symm's runtime: binds symm-core to real memory.
//!
//! * [`backend`]: one interface (`run(request, inputs) -> outputs`) over the simulator, the
//!   threads and the CUDA runtime, so one conformance matrix checks them all.
//! * [`abort`]: how the bootstrap's watcher raises an abort word its owner may be freeing.
//! * `cuda` (feature `cuda`): the CUDA VMM symmetric heap, rendezvous and plan-interpreter launch.
//! * [`kernel_cache`]: the private, hash-checked disk cache of compiled kernels the CUDA backend
//!   uses (plain files and bytes, so it builds and is tested without CUDA).
//!
//! # The crates beneath
//!
//! The runtime stands on two crates that know nothing of CUDA, re-exported here so that
//! `symm_driver::host::...` and `symm_driver::bootstrap::...` keep naming them:
//!
//! * [`host`] (symm-host): ranks are threads (or simulated streams) over host memory. The
//!   embedded default: tests, labs and `cargo xtask demo` run on it, no GPU needed. With it
//!   [`sync`] (std or loom atomics) and [`trace_diff`].
//! * [`bootstrap`] (symm-bootstrap, Linux): the process-per-GPU bootstrap: the job environment,
//!   a Unix-socket rendezvous checked by uid and token, collectives that carry file descriptors,
//!   lost peers. With it [`launcher`] (`symm-run`) and [`safety_env`], the multicast-off
//!   variables.
//!
//! [`Backend`](backend::Backend) lives here rather than in symm-host because its error carries
//! the runtime's `CudaError`: the host crate stays below the runtime, and every executor
//! (simulator, threads, `Comm`, and the test harness's one-process `World` in symm-harness)
//! implements the one trait from here. The harness depends on this crate, never the reverse.
#![deny(missing_docs)]

pub mod abort;
pub mod backend;
// A loom build models the host-side protocols only: the GPU runtime (whose host objects use
// std's Arc) is left out of it even when a dependent asks for the feature.
#[cfg(all(feature = "cuda", not(loom)))]
pub mod cuda;
#[cfg(unix)]
pub mod kernel_cache;

#[cfg(target_os = "linux")]
pub use symm_bootstrap as bootstrap;
#[cfg(target_os = "linux")]
pub use symm_bootstrap::launcher;
pub use symm_bootstrap::safety_env;
pub use symm_host as host;
pub use symm_host::{sync, trace_diff};

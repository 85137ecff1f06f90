//! # symm-driver
//!
//! Binds symm-core to real memory.
//!
//! * [`backend`]: one interface (`run(request, inputs) -> outputs`) over the simulator, the
//!   threads and the CUDA world, so one conformance matrix checks them all.
//! * [`abort`]: how the bootstrap's watcher raises an abort word its owner may be freeing.
//! * [`host`]: ranks are threads (or simulated streams) over host memory. The embedded default:
//!   tests, labs and `cargo xtask demo` run on it, no GPU needed.
//! * `cuda` (feature `cuda`): the CUDA VMM symmetric heap, rendezvous and plan-interpreter launch.
//! * [`kernel_cache`]: the private, hash-checked disk cache of compiled kernels the CUDA backend
//!   uses (plain files and bytes, so it builds and is tested without CUDA).
//! * [`bootstrap`] (Linux): the process-per-GPU bootstrap: the job environment, a Unix-socket
//!   rendezvous checked by uid and token, collectives that carry file descriptors, lost peers.
//! * [`safety_env`]: the multicast-off variables: checked before NCCL loads, set for every
//!   program symm starts.
//! * [`launcher`] (Linux): `symm-run`, which starts a job's ranks and ends the job when one fails.
#![deny(missing_docs)]

pub mod abort;
pub mod backend;
#[cfg(target_os = "linux")]
pub mod bootstrap;
// A loom build models the host-side protocols only: the GPU runtime (whose host objects use
// std's Arc) is left out of it even when a dependent asks for the feature.
#[cfg(all(feature = "cuda", not(loom)))]
pub mod cuda;
pub mod host;
#[cfg(unix)]
pub mod kernel_cache;
#[cfg(target_os = "linux")]
pub mod launcher;
pub mod safety_env;
pub mod sync;
pub mod trace_diff;

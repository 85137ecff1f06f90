//! # symm-harness
//!
//! What tests and benchmarks run beside the runtime, kept out of it:
//!
//! * [`world`]: a world of GPUs driven from one process and one thread (heap, plan cache, runs,
//!   graph replay, timing, timeout records), the backend the one-process GPU checks use; `&World`
//!   implements the runtime's `Backend`, so the conformance matrix runs on it.
//! * [`nccl`]: NCCL on the same streams and buffers, for side-by-side timing and checks.
//! * [`examples`]: runs the device-API examples (a check of `symm/device.cuh` on GPUs).
//! * [`trace`]: a world's GPU trace, every rank on one time axis.
//!
//! The harness depends on symm-driver (with `cuda`) and uses only its public items; the runtime
//! never names this crate, which Cargo enforces (the dependency goes one way). A loom build
//! leaves the GPU runtime out, and this crate is empty then.
#![deny(missing_docs)]

#[cfg(not(loom))]
mod backend;
#[cfg(not(loom))]
pub mod examples;
#[cfg(not(loom))]
pub mod nccl;
#[cfg(not(loom))]
pub mod trace;
#[cfg(not(loom))]
pub mod world;

#[cfg(not(loom))]
pub use world::{Options, World};

// The runtime's modules under the names the harness's files use (`super::device`,
// `crate::cuda::bounds`, ...): these files were written inside the runtime's `cuda` module.
#[cfg(not(loom))]
use symm_driver::cuda::{
    self as cuda, bounds, comm, compile, device, device_plan, error, ffi, launch, plan, rendezvous,
    vmm, Comm, CudaError,
};
#[cfg(not(loom))]
use symm_driver::{host, kernel_cache};

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A world's options are bounded as a `Comm`'s are: deadlines and the heap.
    #[test]
    fn options_out_of_range_are_refused() {
        let w = Options {
            rendezvous: Duration::MAX,
            ..Default::default()
        };
        assert!(w.validate().is_err());
        assert!(Options::default().validate().is_ok());
        for bad in [bounds::MAX_HEAP_BYTES + 1, u64::MAX] {
            let w = Options {
                heap_bytes: bad,
                ..Default::default()
            };
            let r = w.validate();
            assert!(
                matches!(&r, Err(CudaError::BadOption(m)) if m.contains("heap_bytes")),
                "{r:?}"
            );
        }
        let w = Options {
            heap_bytes: bounds::MAX_HEAP_BYTES,
            ..Default::default()
        };
        assert!(w.validate().is_ok());
    }
}

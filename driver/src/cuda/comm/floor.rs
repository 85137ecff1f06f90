//! The launch floor: what a launch costs the host when nothing but the launch is done.
//!
//! A cached collective ([`Comm::enqueue`], [`Comm::launch`], a binding's call) ends in one
//! `cuLaunchKernel`; everything before it is symm's. [`LaunchFloor`] times that launch alone:
//! an empty kernel whose parameter block has the interpreter's size ([`InterpParams`]), launched
//! with an admitted request's grid and block on the caller's stream, back to back, the context
//! bound once and no synchronisation inside the loop. What a cached call costs above it is
//! symm's host cost; the floor itself is the driver's (and, on a GPU shared under MPS, the
//! server's).

use std::time::Instant;

use super::{Admitted, Comm};
use crate::cuda::compile;
use crate::cuda::device::{self, Stream};
use crate::cuda::error::Result;
use crate::cuda::launch::{InterpParams, Kernel};

/// The empty kernel's entry point.
const ENTRY: &str = "symm_launch_floor";

/// The empty kernel: one by-value parameter of `bytes` bytes aligned as the interpreter's block.
fn source(bytes: usize) -> String {
    format!(
        "struct __align__(8) symm_floor_params {{ unsigned char b[{bytes}]; }};\n\
         extern \"C\" __global__ void {ENTRY}(symm_floor_params p) {{ (void)p; }}\n"
    )
}

/// An empty kernel loaded in one Comm's context, to time the bare launch (see the module doc).
pub struct LaunchFloor {
    kernel: Kernel,
    /// The Comm it was loaded for (`device_plan::next_owner`).
    owner: u64,
}

impl LaunchFloor {
    /// Compiles (or finds in the kernel cache) and loads the empty kernel in `comm`'s context.
    pub fn load(comm: &Comm) -> Result<LaunchFloor> {
        let dev = comm.device();
        let src = source(core::mem::size_of::<InterpParams>());
        let drv = device::driver_version()?;
        let (cubin, _) =
            compile::cubin_of_source(comm.plans.compiler(), ENTRY, &src, &[], dev.arch, drv)?;
        Ok(LaunchFloor {
            kernel: Kernel::load(dev, &cubin, ENTRY)?,
            owner: comm.job.id,
        })
    }

    /// Host microseconds per launch of `calls` back-to-back launches of the empty kernel on
    /// `stream` with `a`'s grid (its channels, at least one) and the interpreter's block, and
    /// `a`'s parameter block (which the kernel does not read). Nothing is waited for: the
    /// caller synchronises `stream` when it wants the launches done.
    pub fn time(&self, comm: &Comm, a: &Admitted, stream: &Stream, calls: u32) -> Result<f64> {
        if self.owner != comm.job.id {
            return Err(crate::cuda::CudaError::WrongOwner {
                what: "the launch floor",
            });
        }
        let _g = comm.enter_on(stream)?;
        let (grid, params) = (a.channels().max(1), a.params());
        let calls = calls.max(1);
        let t = Instant::now();
        for _ in 0..calls {
            // SAFETY: the kernel takes one by-value parameter of `size_of::<InterpParams>()`
            // bytes aligned to 8, which `params` is (`InterpParams` is `repr(C)` of 8-byte
            // words first), and reads none of it: its body is empty, so no address in it is
            // used. `stream` was checked to belong to this Comm's context (where the kernel
            // was loaded), bound by the guard.
            unsafe {
                self.kernel
                    .launch(stream, grid, symm_kernels::INTERP_THREADS, params)
            }?;
        }
        Ok(t.elapsed().as_secs_f64() * 1e6 / f64::from(calls))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_empty_kernel_takes_a_block_of_the_interpreters_size() {
        let n = core::mem::size_of::<InterpParams>();
        let s = source(n);
        assert!(s.contains(&format!("b[{n}]")), "{s}");
        assert!(
            s.contains(&format!("void {ENTRY}(symm_floor_params p)")),
            "{s}"
        );
        assert_eq!(core::mem::align_of::<InterpParams>(), 8);
    }
}

//! Runs the device-API examples (`symm/examples.cu`) on a world: a check that the user-facing
//! device header (`symm/device.cuh`) works on real GPUs, not only inside the interpreter.
//!
//! `symm_example_ring_pass`: every rank puts a buffer into the next rank with `put_signal_block`,
//! waits for its predecessor's signal with `wait_until_block`, then all ranks meet at a whole
//! `barrier_block`. The example owns a private signal pad (a heap buffer the caller zeroes), so
//! its counters never mix with the collectives' pad.

use core::ffi::c_void;

use super::compile::{self, Compiler};
use super::device::{self, DevBuf};
use super::error::{CudaError, Result};
use super::launch::Kernel;
use super::world::World;

/// `symm_world` of device.cuh.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct SymmWorld {
    base: u64,
    stride: u64,
    rank: u32,
    world: u32,
}

/// The ring-pass example, loaded on every rank of a world.
pub struct RingPass {
    kernels: Vec<Kernel>,
    status: Vec<DevBuf>,
    generation: u64,
}

impl RingPass {
    /// Compiles (or loads from cache) the examples and loads them on every rank.
    pub fn new(world: &World) -> Result<RingPass> {
        let compiler = Compiler::load(world.options().nvrtc.as_deref())?;
        let dev0 = world.device(0)?;
        let (cubin, _) = compile::cubin(
            &compiler,
            &symm_kernels::EXAMPLES,
            dev0.arch,
            device::driver_version()?,
        )?;
        let mut kernels = Vec::new();
        let mut status = Vec::new();
        for r in 0..world.world() {
            let d = world.device(r)?;
            kernels.push(Kernel::load(d, &cubin, "symm_example_ring_pass")?);
            status.push(DevBuf::zeroed(d, 4)?);
        }
        Ok(RingPass {
            kernels,
            status,
            generation: 0,
        })
    }

    /// One pass: rank r's `bytes` at heap offset `src` land at offset `dst` of rank r + 1. `pad`
    /// is the example's private pad (at least `8 * world` u64 slots, zero before the first pass).
    pub fn run(
        &mut self,
        world: &World,
        pad: u64,
        src: u64,
        dst: u64,
        bytes: u64,
        deadline_ns: u64,
    ) -> Result<()> {
        let w = world.world();
        for r in 0..w {
            let base = world.ptr(r, 0)? - r as u64 * world.stride();
            let mut sw = SymmWorld {
                base,
                stride: world.stride(),
                rank: r as u32,
                world: w as u32,
            };
            let (mut pad, mut src, mut dst, mut bytes) = (pad, src, dst, bytes);
            let (mut generation, mut deadline) = (self.generation, deadline_ns);
            let mut status = self.status[r as usize].ptr;
            let mut args: [*mut c_void; 8] = [
                (&mut sw as *mut SymmWorld).cast(),
                (&mut pad as *mut u64).cast(),
                (&mut src as *mut u64).cast(),
                (&mut dst as *mut u64).cast(),
                (&mut bytes as *mut u64).cast(),
                (&mut generation as *mut u64).cast(),
                (&mut deadline as *mut u64).cast(),
                (&mut status as *mut u64).cast(),
            ];
            world.device(r)?.bind()?;
            // SAFETY: the eight arguments match the kernel's parameter list in order and type
            // (symm_world by value, six u64, one int*); the heap offsets are inside the heap (the
            // caller allocated them) and `status` is 4 bytes of device memory of this rank.
            unsafe { self.kernels[r as usize].launch_args(world.stream(r)?, 1, 256, &mut args)? };
        }
        for r in 0..w {
            world.stream(r)?.synchronize()?;
        }
        self.generation += 1;
        for r in 0..w {
            world.device(r)?.bind()?;
            let mut s = [0u8; 4];
            device::dtoh(&mut s, self.status[r as usize].ptr)?;
            if i32::from_le_bytes(s) != 0 {
                return Err(CudaError::Invalid(format!(
                    "rank {r}: the example's wait passed its deadline (pass {})",
                    self.generation
                )));
            }
        }
        Ok(())
    }
}

//! Runs the device-API examples (`symm/examples.cu`) on a world or on one process's [`Comm`]: a
//! check that the user-facing device header (`symm/device.cuh`) works on real GPUs, not only
//! inside the interpreter, and the pattern a user's own kernel follows.
//!
//! `symm_example_ring_pass`: every rank puts a buffer into the next rank with `put_signal_block`,
//! waits for its predecessor's signal with `wait_until_block`, then all ranks meet at a whole
//! `barrier_block`. The example owns a private signal pad (a heap buffer the caller zeroes), so
//! its counters never mix with the collectives' pad.
//!
//! A user kernel receives a [`SymmWorld`] by value ([`Comm::symm_world`]): this rank's view of
//! the heap range, the stride between peers, the rank and the world size. Offsets it is given
//! must come from the symmetric allocator; [`RankRingPass::run_comm`] checks them against the
//! heap's buffer area before the kernel sees them.

use core::ffi::c_void;

use symm_core::signal::KINDS;

use super::bounds::check_range;
use super::comm::Comm;
use super::compile::{self, Compiler};
use super::device::{self, DevBuf, Device, Stream};
use super::error::{CudaError, Result};
use super::launch::Kernel;
use super::world::World;
pub use symm_kernels::abi::SymmWorld;

/// Where one ring pass reads and writes (heap offsets, the same on every rank).
#[derive(Clone, Copy, Debug)]
pub struct PassArgs {
    /// The example's private signal pad: `KINDS * world` u64 slots, zero before the first pass.
    pub pad: u64,
    /// What this rank sends.
    pub src: u64,
    /// Where the predecessor's bytes land.
    pub dst: u64,
    /// Bytes per rank.
    pub bytes: u64,
    /// Deadline of every wait, nanoseconds.
    pub deadline_ns: u64,
}

/// The ring-pass example on one rank.
pub struct RankRingPass {
    kernel: Kernel,
    status: DevBuf,
    generation: u64,
}

impl RankRingPass {
    /// Compiles (or loads from the cache) the examples and loads them on `dev`.
    pub fn new(dev: &Device, nvrtc: Option<&std::path::Path>) -> Result<RankRingPass> {
        let compiler = Compiler::load(nvrtc)?;
        let drv = device::driver_version()?;
        let (cubin, _) = compile::cubin(&compiler, &symm_kernels::EXAMPLES, dev.arch(), drv)?;
        Ok(RankRingPass {
            kernel: Kernel::load(dev, &cubin, "symm_example_ring_pass")?,
            status: DevBuf::zeroed(dev, 4)?,
            generation: 0,
        })
    }

    /// Enqueues one pass on `stream`. `area` is the heap's buffer area (`[lo, hi)` offsets):
    /// every range the kernel touches must lie inside it. Crate-private: the world and area come
    /// from a `Comm` or `World` ([`RankRingPass::run_comm`], [`RingPass::run`]), never from the
    /// caller.
    pub(crate) fn launch(
        &mut self,
        w: SymmWorld,
        area: (u64, u64),
        a: &PassArgs,
        stream: &Stream,
    ) -> Result<()> {
        let (lo, hi) = area;
        if !a.pad.is_multiple_of(8) {
            return Err(CudaError::Misaligned {
                what: "pad",
                offset: a.pad,
                align: 8,
            });
        }
        check_range(a.pad, KINDS as u64 * w.world as u64 * 8, lo, hi)?;
        check_range(a.src, a.bytes, lo, hi)?;
        check_range(a.dst, a.bytes, lo, hi)?;
        let mut sw = w;
        let (mut pad, mut src, mut dst, mut bytes) = (a.pad, a.src, a.dst, a.bytes);
        let (mut generation, mut deadline) = (self.generation, a.deadline_ns);
        let mut status = self.status.ptr();
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
        // SAFETY: the eight arguments match the kernel's parameter list in order and type
        // (symm_world by value, six u64, one int*); the pad, source and destination ranges were
        // checked above to lie in the heap's buffer area (the same on every rank), and `status`
        // is 4 bytes of device memory of this rank.
        unsafe { self.kernel.launch_args(stream, 1, 256, &mut args)? };
        self.generation += 1;
        Ok(())
    }

    /// After the pass's stream finished: `Err` when a wait passed its deadline.
    pub fn status(&self, rank: u16) -> Result<()> {
        let s = self.status.read_at(0, 4)?;
        if s != [0; 4] {
            return Err(CudaError::Expired {
                what: "ring pass",
                rank: Some(rank),
            });
        }
        Ok(())
    }

    /// One pass on a process's communicator, on `stream`, waited for. Collective.
    pub fn run_comm(&mut self, comm: &Comm, a: &PassArgs, stream: &Stream) -> Result<()> {
        let _ctx = device::keep_current()?;
        comm.device().bind()?;
        self.launch(comm.symm_world(), comm.buffer_area(), a, stream)?;
        comm.synchronize(stream)?;
        comm.device().bind()?;
        self.status(comm.rank())
    }
}

/// The ring-pass example, loaded on every rank of a world.
pub struct RingPass {
    ranks: Vec<RankRingPass>,
}

impl RingPass {
    /// Compiles (or loads from cache) the examples and loads them on every rank.
    pub fn new(world: &World) -> Result<RingPass> {
        let _ctx = device::keep_current()?;
        let ranks = (0..world.world())
            .map(|r| RankRingPass::new(world.device(r)?, world.options().nvrtc.as_deref()))
            .collect::<Result<_>>()?;
        Ok(RingPass { ranks })
    }

    /// One pass: rank r's `bytes` at heap offset `src` land at offset `dst` of rank r + 1. `pad`
    /// is the example's private pad (`KINDS * world` u64 slots, zero before the first pass).
    pub fn run(&mut self, world: &World, a: &PassArgs) -> Result<()> {
        let _ctx = device::keep_current()?;
        let w = world.world();
        for (r, p) in (0..w).zip(self.ranks.iter_mut()) {
            let sw = SymmWorld {
                base: world.ptr(r, 0)? - r as u64 * world.stride(),
                stride: world.stride(),
                rank: r as u32,
                world: w as u32,
                abort: world.abort_word(),
            };
            world.device(r)?.bind()?;
            p.launch(sw, world.buffer_area(), a, world.stream(r)?)?;
        }
        for r in 0..w {
            world.stream(r)?.synchronize()?;
        }
        for (r, p) in (0..w).zip(&self.ranks) {
            world.device(r)?.bind()?;
            p.status(r)?;
        }
        Ok(())
    }
}

/// The device API measured on a communicator: a kernel put (`symm_put_block` from every block of
/// a grid) beside the copy engine, and the one-way latency of a signal bounced between ranks 0
/// and 1 (`symm_example_put_bw`, `symm_example_ping_pong`).
pub struct DeviceBench {
    put: Kernel,
    ping: Kernel,
    status: DevBuf,
    bounces: u64,
}

impl DeviceBench {
    /// Loads the examples on `comm`'s device.
    pub fn new(comm: &Comm) -> Result<DeviceBench> {
        let _ctx = device::keep_current()?;
        let dev = comm.device();
        let compiler = Compiler::load(None)?;
        let drv = device::driver_version()?;
        let (cubin, _) = compile::cubin(&compiler, &symm_kernels::EXAMPLES, dev.arch(), drv)?;
        Ok(DeviceBench {
            put: Kernel::load(dev, &cubin, "symm_example_put_bw")?,
            ping: Kernel::load(dev, &cubin, "symm_example_ping_pong")?,
            status: DevBuf::zeroed(dev, 4)?,
            bounces: 0,
        })
    }

    /// Enqueues one kernel put of `bytes` from heap offset `src` to the next rank's `dst`, on
    /// `blocks` blocks of 512 threads. Ranges are checked against the buffer area.
    pub fn put(
        &self,
        comm: &Comm,
        (src, dst, bytes): (u64, u64, u64),
        blocks: u32,
        stream: &Stream,
    ) -> Result<()> {
        let _ctx = device::keep_current()?;
        let (lo, hi) = comm.buffer_area();
        check_range(src, bytes, lo, hi)?;
        check_range(dst, bytes, lo, hi)?;
        let mut sw = comm.symm_world();
        let (mut s, mut d, mut n) = (src, dst, bytes);
        let mut args: [*mut c_void; 4] = [
            (&mut sw as *mut SymmWorld).cast(),
            (&mut s as *mut u64).cast(),
            (&mut d as *mut u64).cast(),
            (&mut n as *mut u64).cast(),
        ];
        comm.device().bind()?;
        // SAFETY: the arguments match `symm_example_put_bw(symm_world, u64, u64, u64)`; both
        // ranges lie in the heap's buffer area (checked above), the same on every rank.
        unsafe {
            self.put
                .launch_args(stream, blocks.clamp(1, 1024), 512, &mut args)
        }
    }

    /// Bounces a signal `iters` times between ranks 0 and 1 over the private pad at `pad`
    /// (`KINDS * world` slots, zero before the first call) and returns this rank's kernel time
    /// per bounce (a round trip) in microseconds. Collective over ranks 0 and 1; the others
    /// return 0.
    pub fn ping_pong(&mut self, comm: &Comm, pad: u64, iters: u64, stream: &Stream) -> Result<f64> {
        let _ctx = device::keep_current()?;
        let (lo, hi) = comm.buffer_area();
        if self.bounces == u64::MAX {
            return Err(CudaError::Expired {
                what: "ping-pong",
                rank: None,
            });
        }
        if !pad.is_multiple_of(8) {
            return Err(CudaError::Misaligned {
                what: "pad",
                offset: pad,
                align: 8,
            });
        }
        check_range(pad, KINDS as u64 * comm.world() as u64 * 8, lo, hi)?;
        let mut sw = comm.symm_world();
        let (mut p, mut base, mut n, mut deadline) = (pad, self.bounces, iters, 5_000_000_000u64);
        let mut status = self.status.ptr();
        let mut args: [*mut c_void; 6] = [
            (&mut sw as *mut SymmWorld).cast(),
            (&mut p as *mut u64).cast(),
            (&mut base as *mut u64).cast(),
            (&mut n as *mut u64).cast(),
            (&mut deadline as *mut u64).cast(),
            (&mut status as *mut u64).cast(),
        ];
        let dev = comm.device();
        let (s, e) = (device::Event::new(dev)?, device::Event::new(dev)?);
        dev.bind()?;
        s.record(stream)?;
        // SAFETY: the arguments match `symm_example_ping_pong(symm_world, u64, u64, u64, u64,
        // int*)`; the pad lies in the buffer area (checked above) and `status` is 4 bytes of
        // this rank's device memory.
        unsafe { self.ping.launch_args(stream, 1, 32, &mut args)? };
        e.record(stream)?;
        let done = comm.synchronize(stream).and_then(|_| {
            dev.bind()?;
            self.check_status(comm.rank())
        });
        if let Err(err) = done {
            self.bounces = u64::MAX;
            return Err(err);
        }
        self.bounces += iters;
        Ok(s.elapsed_ms(&e)? as f64 * 1000.0 / iters.max(1) as f64)
    }

    fn check_status(&self, rank: u16) -> Result<()> {
        let st = self.status.read_at(0, 4)?;
        if st != [0; 4] {
            return Err(CudaError::Expired {
                what: "ping-pong",
                rank: Some(rank),
            });
        }
        Ok(())
    }
}

//! `Comm`: one rank, one GPU, one process: what a job started by `symm-run`, torchrun, mpirun or
//! srun embeds.
//!
//! [`Comm::from_env`] joins the job through the Unix-socket bootstrap (`RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `SYMM_JOB`, `SYMM_TOKEN`), opens GPU `LOCAL_RANK`, loads the plan interpreter
//! and maps the symmetric heap: each process exports its physical memory as a POSIX descriptor,
//! the bootstrap moves every descriptor to every process (SCM_RIGHTS), and each maps peer `r` at
//! `base + r * stride`. The signal pad sits at offset 0 of every heap, buffers after it.
//!
//! * **Allocation is collective**: every rank calls [`Comm::alloc`] / [`Comm::free`] in the same
//!   order; after each call the ranks compare their allocators' call counts and hashes through
//!   the bootstrap, and a mismatch names the first differing call on both sides.
//! * **One door for collectives**: a request is admitted once ([`Comm::admit`]: checked,
//!   planned, its executor fixed) and launched with its buffers on the caller's stream
//!   ([`Comm::launch`]; [`Comm::enqueue`] looks the admission up): no host synchronisation, no
//!   host writes per launch, so a launch can be captured in the caller's CUDA graph. Buffers are
//!   checked against the request and the heap before anything is enqueued.
//! * **Errors are asynchronous**, as NCCL's: a device wait that passes its deadline writes a
//!   record (rank, peer, slot, expected, found) to host-mapped memory, which [`Comm::check`]
//!   (or [`Comm::synchronize`]) turns into [`CudaError::Timeout`].
//! * **A lost peer** (its process died: the bootstrap sees its socket close) raises this
//!   process's abort word from the bootstrap's watcher thread, so kernels stop at their next wait;
//!   calls return [`CudaError::PeerLost`] naming it.
//! * **Poison**: after any such error every call fails fast until [`Comm::reset`], a collective
//!   that zeroes every rank's pad and counters between two bootstrap barriers.
//!
//! Drop frees everything; [`Comm::finish`] first ends the job in order (a last barrier), so the
//! peers do not see this rank's exit as a loss.
//!
//! The `Comm` is the core: the job, the device, the heap and its allocator, launch order, poison
//! and the plan cache. Features are their own types, made from a Comm, holding their own state
//! and launching through the core: framework tensors ([`Tensors`]: blocks, graph pins, spans),
//! [`Signals`], MoE layers ([`MoeLayer`]), the all-to-allv with device counts ([`A2avLayer`]),
//! traced runs ([`Tracer`]), teams ([`CommTeam`]), host access to the heap ([`Memory`]).

mod a2av;
mod admit;
mod agree;
mod allocator;
mod backend;
mod blocks;
mod calls;
mod capture;
mod entry;
pub mod epoch;
mod floor;
mod health;
mod memory;
mod moe;
mod moe_grid;
mod norm;
mod order;
mod plans;
mod sharing;
mod signals;
mod spans;
mod team;
mod tracer;

pub use super::options::CommOptions;
pub use a2av::A2avLayer;
pub use admit::{Admitted, Executor};
use allocator::Alloc;
pub use allocator::AllocSizes;
pub use backend::MAX_GATHER;
pub use blocks::{Tensors, BLOCK_ALIGN};
pub use capture::{Capture, CommGraph};
pub use floor::LaunchFloor;
pub use memory::Memory;
pub use moe::{MoeLayer, MoeStatus, TokenType, MAX_GPU_EXPERTS};
pub use norm::{norm_rows, FusedNorm, NormArgs, NORM_MAX_BLOCKS};
pub use sharing::Sharing;
pub use signals::Signals;
pub use spans::Span;
pub use team::CommTeam;
pub use tracer::Tracer;

use std::sync::{Arc, Mutex};

use symm_core::heap::Heap;
use symm_core::sched::MAX_CHANNELS;
use symm_core::signal::KINDS;
use symm_core::team::MAX_TEAMS;

use super::compile::{self, Compiler};
use super::copy_engine::CopyEngine;
use super::device::{self, DevBuf, Device, HostMapped};
use super::error::{CudaError, Result};
use super::ffi::driver as ffi;
use super::launch::{Kernel, RECORD_BYTES};
use super::rendezvous::{Bootstrap, SocketRendezvous};
use super::vmm::SymmetricHeap;
use crate::bootstrap::SocketBootstrap;

/// Host-mapped bytes before the timeout records: the abort word and padding.
const ABORT_BYTES: usize = 64;

/// One rank of a job: its GPU, its mapping of the symmetric heap, the interpreter and the plans.
///
/// The core only: the job, the device, the heap and its allocator, launch order, poison and the
/// plan cache. Features (framework tensors, signals, MoE, the all-to-allv, tracing, teams) are
/// their own types, made from a Comm and holding their own state.
///
/// Field order is teardown order: plans and kernels before the heap, the heap before the
/// bootstrap (the peers' memory stays mapped until every rank unmapped it at `finish`).
pub struct Comm {
    /// Plans by (team id, request, on copy engines): the world's (id 0) and every team's, alive
    /// as long as the Comm, so no plan goes while a launch may still read it.
    plans: plans::PlanCache,
    /// Held while enqueuing, so collectives reach the GPU in one order; holds that order's
    /// state across streams and the admitted requests (`admit.rs`), which hold plans: it goes
    /// with the plans.
    launching: Mutex<admit::Launching>,
    /// The lost-peer callback's hold on the abort word (`crate::abort`), taken back on drop.
    armed: crate::abort::Arm<HostMapped>,
    interp: Kernel,
    expected: DevBuf,
    host: Arc<HostMapped>,
    heap: SymmetricHeap,
    /// The heap's allocator and what it reserved (`allocator.rs`).
    alloc: Mutex<Alloc>,
    poison: entry::Poison,
    pad_slots: u32,
    data_off: u64,
    opts: CommOptions,
    dev: Device,
    job: Job,
}

/// The job as this rank sees it. Its bootstrap goes last (after the heap: see [`Comm`]).
pub(crate) struct Job {
    rank: u16,
    world: u16,
    /// What ties plans and feature objects to this Comm (`device_plan::next_owner`).
    id: u64,
    /// How this rank's GPU is shared with other ranks of the job.
    sharing: Sharing,
    /// The bootstrap's lost word ([`crate::bootstrap::NOT_LOST`], else the lost rank).
    lost: Arc<std::sync::atomic::AtomicU32>,
    boot: SocketRendezvous,
}

impl Comm {
    /// Joins the job described by the environment on GPU `LOCAL_RANK` (or where `SYMM_DEVICES`
    /// puts it: [`crate::cuda::placement`]), with the environment's settings over `opts`
    /// ([`CommOptions::with_env`], [`CommOptions::join`]).
    pub fn from_env(opts: CommOptions) -> Result<Comm> {
        opts.validate()?;
        opts.with_env()?.join_env()
    }

    /// Opens a rank of `boot`'s job on GPU `ordinal`. Collective: every rank calls it.
    pub fn open(boot: SocketBootstrap, ordinal: i32, opts: CommOptions) -> Result<Comm> {
        let rank = boot.rank();
        let world = boot.world();
        let boot = SocketRendezvous::new(boot, opts.bootstrap_timeout);
        if let Err(e) = opts.validate() {
            boot.abort(rank, &e.to_string());
            return Err(e);
        }
        let _ctx = device::keep_current()?;
        let r = Self::open_inner(&boot, rank, world, ordinal, &opts);
        match r {
            Ok(parts) => Ok(parts.assemble(boot, rank, world, opts)),
            Err(e) => {
                boot.abort(rank, &e.to_string());
                Err(e)
            }
        }
    }

    fn open_inner(
        boot: &SocketRendezvous,
        rank: u16,
        world: u16,
        ordinal: i32,
        opts: &CommOptions,
    ) -> Result<Parts> {
        if world as usize > 64 {
            return Err(CudaError::Unsupported(format!(
                "{world} ranks: one host's NVLink domain here holds at most 64"
            )));
        }
        let dev = Device::open(ordinal)?;
        if dev.attribute(ffi::ATTR_VMM)? == 0 || dev.attribute(ffi::ATTR_POSIX_FD)? == 0 {
            return Err(CudaError::Unsupported(format!(
                "device {ordinal} lacks VMM or POSIX-fd handles"
            )));
        }
        let sharing = sharing::exchange(boot, rank, &dev)?;
        agree_options(boot, rank, opts.copy_engine, opts.deterministic)?;
        sharing::warn_once(&sharing, ordinal, opts.timeout);
        let compiler = Compiler::load(opts.nvrtc.as_deref())?;
        let drv = device::driver_version()?;
        let (cubin, _) = compile::cubin(&compiler, &symm_kernels::INTERP, dev.arch, drv)?;
        // Room for every team id: a team's slots are keyed by its id (symm_core::team).
        // The pad: the counters, then as many flag words (`copy_engine`).
        let pad_slots = MAX_CHANNELS as u32 * KINDS * world as u32 * MAX_TEAMS as u32;
        // Then the call signatures' words (`sig_off`): per channel, two halves of one per rank.
        let sig_bytes = MAX_CHANNELS as u64 * 2 * world as u64 * 8;
        let data_off = (2 * pad_slots as u64 * 8 + sig_bytes).div_ceil(4096) * 4096;
        let total = data_off
            .checked_add(opts.heap_bytes)
            .ok_or(CudaError::Overflow { what: "heap size" })?;
        let heap = SymmetricHeap::create(&dev, rank, total, boot)?;
        let host = Arc::new(HostMapped::new(
            &dev,
            ABORT_BYTES + MAX_CHANNELS as usize * RECORD_BYTES,
        )?);
        // A lost peer raises the abort word: every wait of this rank's kernels stops. The
        // callback runs on the bootstrap's watcher thread; `Drop` disarms it before the context
        // (and with it the host-mapped word) goes away (`crate::abort`).
        let armed = crate::abort::Arm::new(host.clone());
        boot.bootstrap().on_lost(armed.callback());
        Ok(Parts {
            armed,
            interp: Kernel::load(&dev, &cubin, symm_kernels::INTERP_ENTRY)?,
            compiler,
            // The expected counters, then a call counter per channel (the signatures' sequence).
            expected: DevBuf::zeroed(&dev, (pad_slots as usize + MAX_CHANNELS as usize) * 8)?,
            alloc: Heap::new(heap.stride - data_off),
            heap,
            host,
            pad_slots,
            data_off,
            sharing,
            dev,
        })
    }

    /// This rank.
    pub fn rank(&self) -> u16 {
        self.job.rank
    }

    /// Ranks in the job.
    pub fn world(&self) -> u16 {
        self.job.world
    }

    /// The GPU.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// How this rank's GPU is shared with the job's other ranks (and so its wait deadline).
    pub fn sharing(&self) -> Sharing {
        self.job.sharing
    }

    /// Heap offset of the pad's flag words (after its counters; [`crate::cuda::copy_engine`]).
    pub(crate) fn flag_off(&self) -> u64 {
        self.pad_slots as u64 * 8
    }

    /// Heap offset of the call signatures' words (after the flag words; `symm/signature.cuh`).
    pub(crate) fn sig_off(&self) -> u64 {
        2 * self.pad_slots as u64 * 8
    }

    /// The options this Comm was opened with (the copy-engine option in force is
    /// [`Comm::copy_engine`]).
    pub(crate) fn options(&self) -> &CommOptions {
        &self.opts
    }

    /// The copy-engine option in force.
    pub fn copy_engine(&self) -> CopyEngine {
        self.plans.engines()
    }

    /// Collective: every rank switches to `ce` for the requests it enqueues from now on (fails,
    /// changing nothing, unless every rank gives the same). Requests already enqueued or
    /// captured keep the path they were built for; admitted requests are admitted again.
    pub fn set_copy_engine(&self, ce: CopyEngine) -> Result<()> {
        self.live()?;
        agree_options(&self.job.boot, self.job.rank, ce, self.opts.deterministic)?;
        let mut l = self.launch_lock()?;
        self.plans.set_engines(ce);
        l.admitted.clear();
        Ok(())
    }

    /// The heap offsets where buffers live, `[lo, hi)` (the signal pad is below `lo`; `hi` is
    /// each rank's heap stride).
    pub fn buffer_area(&self) -> (u64, u64) {
        (self.data_off, self.heap.stride)
    }

    /// The heap as `symm/device.cuh` sees it (`symm_world`), to pass by value to a user's kernel
    /// that calls the device API on this communicator's heap (see symm-harness's `examples`).
    pub fn symm_world(&self) -> symm_kernels::abi::SymmWorld {
        symm_kernels::abi::SymmWorld {
            base: self.heap.base(),
            stride: self.heap.stride,
            rank: self.job.rank as u32,
            world: self.job.world as u32,
            abort: self.host.dev,
        }
    }

    /// Collective: every rank's `data` (at most 64 KiB), in rank order, through the bootstrap.
    pub fn exchange(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(self.job.boot.all_gather(self.job.rank, data)?.to_vec())
    }

    /// The device address of this rank's timeout record for kernels outside the plans (the
    /// last channel's: signals, MoE, the all-to-allv).
    pub(super) fn record_addr(&self) -> u64 {
        self.host.dev + (ABORT_BYTES + (MAX_CHANNELS as usize - 1) * RECORD_BYTES) as u64
    }
}

/// The GPU of local rank `local_rank` ([`crate::cuda::placement`]: `LOCAL_RANK`, or where
/// `SYMM_DEVICES` puts it).
pub fn placement(local_rank: u16) -> Result<i32> {
    let visible = device::device_count()?;
    super::placement::device_for(local_rank, visible, |k| std::env::var_os(k))
        .map_err(CudaError::Placement)
}

impl Drop for Comm {
    fn drop(&mut self) {
        // No abort-word write may start once the fields (the context among them) begin to go,
        // and the callback no longer holds the word.
        self.armed.disarm();
    }
}

/// Collective: fails unless every rank runs with the same copy-engine option (a rank on copy
/// engines waits on flags that a rank in a kernel never raises) and the same mode (a
/// deterministic rank would decide other algorithms than its peers).
fn agree_options(
    boot: &SocketRendezvous,
    rank: u16,
    ce: CopyEngine,
    deterministic: bool,
) -> Result<()> {
    let mine = [ce.code(), u8::from(deterministic)];
    let all = boot.all_gather(rank, &mine)?;
    for (i, what) in [
        "SYMM_COPY_ENGINE (CommOptions::copy_engine)",
        "SYMM_DETERMINISTIC (CommOptions::deterministic)",
    ]
    .into_iter()
    .enumerate()
    {
        if let Some(r) = all.iter().position(|v| v.get(i) != Some(&mine[i])) {
            return Err(CudaError::Disagree {
                what,
                rank: u16::try_from(r).ok(),
            });
        }
    }
    Ok(())
}

/// What `open_inner` builds before the bootstrap joins it.
struct Parts {
    compiler: Compiler,
    sharing: Sharing,
    armed: crate::abort::Arm<HostMapped>,
    interp: Kernel,
    expected: DevBuf,
    alloc: Heap,
    heap: SymmetricHeap,
    host: Arc<HostMapped>,
    pad_slots: u32,
    data_off: u64,
    dev: Device,
}

impl Parts {
    fn assemble(self, boot: SocketRendezvous, rank: u16, world: u16, opts: CommOptions) -> Comm {
        Comm {
            plans: plans::PlanCache::new(self.compiler, opts.copy_engine),
            launching: Mutex::new(admit::Launching::default()),
            armed: self.armed,
            interp: self.interp,
            expected: self.expected,
            host: self.host,
            heap: self.heap,
            alloc: Mutex::new(Alloc::new(self.alloc)),
            poison: entry::Poison::default(),
            pad_slots: self.pad_slots,
            data_off: self.data_off,
            opts,
            dev: self.dev,
            job: Job {
                rank,
                world,
                id: super::device_plan::next_owner(),
                sharing: self.sharing,
                lost: boot.bootstrap().lost_word(),
                boot,
            },
        }
    }
}

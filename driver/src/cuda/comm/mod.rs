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
//! * **Collectives go on the caller's stream** ([`Comm::enqueue`]): no host synchronisation, no
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

mod a2av;
mod agree;
mod backend;
mod blocks;
mod capture;
pub(crate) mod epoch;
mod launch;
mod memory;
mod moe;
mod moe_grid;
mod order;
mod sharing;
mod signals;
mod spans;
mod team;

pub use super::options::CommOptions;
pub use a2av::A2avLayer;
pub use backend::MAX_GATHER;
pub use blocks::BLOCK_ALIGN;
pub use capture::{Capture, CommGraph};
pub use moe::{MoeLayer, MoeStatus, TokenType, MAX_GPU_EXPERTS};
pub use sharing::Sharing;
pub use spans::Span;
pub use team::CommTeam;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use symm_core::heap::Heap;
use symm_core::sched::{BufferSizes, Request, MAX_CHANNELS};
use symm_core::signal::KINDS;
use symm_core::team::MAX_TEAMS;

use super::bounds::{self as guard, Buffers};
use super::compile::{self, Compiler};
use super::copy_engine::CopyEngine;
use super::device::{self, DevBuf, Device, HostMapped, Stream};
use super::device_plan::DevicePlan;
use super::error::{check, driver, CudaError, Result};
use super::ffi::driver as ffi;
use super::launch::{Kernel, RECORD_BYTES};
use super::records::first_failure;
use super::rendezvous::{Bootstrap, SocketRendezvous};
use super::vmm::SymmetricHeap;
use crate::bootstrap::SocketBootstrap;

/// Host-mapped bytes before the timeout records: the abort word and padding.
const ABORT_BYTES: usize = 64;

/// One rank of a job: its GPU, its mapping of the symmetric heap, the interpreter and the plans.
///
/// Field order is teardown order: plans and kernels before the heap, the heap before the
/// bootstrap (the peers' memory stays mapped until every rank unmapped it at `finish`).
pub struct Comm {
    /// Plans by (team id, request, on copy engines): the world's (id 0) and every team's, alive
    /// as long as the Comm, so no plan goes while a launch may still read it.
    plans: Mutex<HashMap<(u16, Request, bool), Arc<DevicePlan>>>,
    /// The copy-engine option in force ([`CopyEngine::code`]; [`Comm::set_copy_engine`]).
    engines: std::sync::atomic::AtomicU8,
    /// Most blocks of one MoE kernel of this rank ([`Comm::set_moe_sms`]; 0: the default).
    moe_sms: std::sync::atomic::AtomicU32,
    tracing: Mutex<Option<launch::Tracing>>,
    /// The stream signals kernel ([`Comm::put_signal`]), loaded on first use.
    signals: Mutex<Option<Kernel>>,
    /// The lost-peer callback's hold on the abort word (`crate::abort`), taken back on drop.
    armed: crate::abort::Arm<HostMapped>,
    interp: Kernel,
    /// NVRTC, for compiled plans ([`crate::cuda::compiled`]).
    compiler: Arc<Compiler>,
    /// The queue of the background plan compiler (started on first use; it ends when the
    /// Comm drops the sender). Plans run interpreted until their compiled kernel is ready.
    compiling: Mutex<Option<launch::PlanCompiler>>,
    expected: DevBuf,
    host: Arc<HostMapped>,
    heap: SymmetricHeap,
    alloc: Mutex<Heap>,
    /// Held while enqueuing, so collectives reach the GPU in one order; holds that order's
    /// state across streams.
    launching: Mutex<order::StreamOrder>,
    /// Buffer offsets named by live graphs ([`CommGraph`]), with their counts.
    pinned: Mutex<HashMap<u64, usize>>,
    poisoned: Mutex<Option<String>>,
    /// Blocks handed out to a framework ([`Comm::alloc_block`]).
    blocks: Mutex<blocks::Blocks>,
    /// Blocks named by graphs a framework captured ([`blocks`]), with their counts.
    graph_pins: blocks::GraphPins,
    /// Agreed argument sets and workspaces of [`Comm::enqueue_spans`].
    spans: Mutex<spans::Spans>,
    /// The id the next split's teams take (0 is the world).
    next_team: Mutex<u16>,
    /// This rank's teams by id (to name a team wait's peer by its job rank).
    teams: Mutex<HashMap<u16, symm_core::team::Team>>,
    /// Heap offsets of the regions splits reserved (never freed by `free`).
    regions: Mutex<Vec<u64>>,
    rank: u16,
    world: u16,
    pad_slots: u32,
    data_off: u64,
    /// What ties plans to this Comm (`device_plan::next_owner`).
    id: u64,
    /// How this rank's GPU is shared with other ranks of the job.
    sharing: Sharing,
    opts: CommOptions,
    dev: Device,
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

    /// The GPU of local rank `local_rank` ([`crate::cuda::placement`]).
    pub fn placement(local_rank: u16) -> Result<i32> {
        let visible = device::device_count()?;
        super::placement::device_for(local_rank, visible, |k| std::env::var_os(k))
            .map_err(CudaError::Placement)
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
        agree_copy_engine(boot, rank, opts.copy_engine)?;
        sharing::warn_once(&sharing, ordinal, opts.timeout);
        let compiler = Compiler::load(opts.nvrtc.as_deref())?;
        let drv = device::driver_version()?;
        let (cubin, _) = compile::cubin(&compiler, &symm_kernels::INTERP, dev.arch, drv)?;
        // Room for every team id: a team's slots are keyed by its id (symm_core::team).
        // The pad: the counters, then as many flag words (`copy_engine`).
        let pad_slots = MAX_CHANNELS as u32 * KINDS * world as u32 * MAX_TEAMS as u32;
        let data_off = (2 * pad_slots as u64 * 8).div_ceil(4096) * 4096;
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
            expected: DevBuf::zeroed(&dev, pad_slots as usize * 8)?,
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
        self.rank
    }

    /// Ranks in the job.
    pub fn world(&self) -> u16 {
        self.world
    }

    /// The GPU.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// How this rank's GPU is shared with the job's other ranks (and so its wait deadline).
    pub fn sharing(&self) -> Sharing {
        self.sharing
    }

    /// Bytes of each rank's heap (signal pad included).
    pub fn stride(&self) -> u64 {
        self.heap.stride
    }

    /// Heap offset of the pad's flag words (after its counters; [`crate::cuda::copy_engine`]).
    pub(crate) fn flag_off(&self) -> u64 {
        self.pad_slots as u64 * 8
    }

    /// Whether `req` runs on copy engines (its plan in flag form, no kernel).
    pub fn on_copy_engines(&self, req: &Request) -> bool {
        self.copy_engine().takes(req)
    }

    /// The copy-engine option in force.
    pub fn copy_engine(&self) -> CopyEngine {
        CopyEngine::from_code(self.engines.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Collective: every rank switches to `ce` for the requests it enqueues from now on (fails,
    /// changing nothing, unless every rank gives the same). Requests already enqueued or
    /// captured keep the path they were built for.
    pub fn set_copy_engine(&self, ce: CopyEngine) -> Result<()> {
        self.live()?;
        agree_copy_engine(&self.boot, self.rank, ce)?;
        self.engines
            .store(ce.code(), std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// How many SMs `req` occupies while it runs: one block per channel of its plan, each on
    /// one SM, or none on copy engines. Builds the plan if it is not cached yet.
    pub fn sms(&self, req: &Request) -> Result<u32> {
        if self.on_copy_engines(req) {
            return Ok(0);
        }
        let _ctx = device::keep_current()?;
        Ok(self.plan(req)?.host.channels() as u32)
    }

    /// Whether the next launch of `req` runs its plan's compiled kernel (else the interpreter,
    /// or copy engines); builds the plan like [`Comm::prepare`] when it has none yet, without
    /// compiling it.
    pub fn runs_compiled(&self, req: &Request) -> Result<bool> {
        if self.on_copy_engines(req) {
            return Ok(false);
        }
        let _ctx = device::keep_current()?;
        Ok(self.plan(req)?.compiled(false).is_some())
    }

    /// The heap offsets where buffers live, `[lo, hi)` (the signal pad is below `lo`).
    pub fn buffer_area(&self) -> (u64, u64) {
        (self.data_off, self.stride())
    }

    /// The heap as `symm/device.cuh` sees it (`symm_world`), to pass by value to a user's kernel
    /// that calls the device API on this communicator's heap (see [`crate::cuda::examples`]).
    pub fn symm_world(&self) -> crate::cuda::examples::SymmWorld {
        crate::cuda::examples::SymmWorld {
            base: self.heap.base(),
            stride: self.heap.stride,
            rank: self.rank as u32,
            world: self.world as u32,
            abort: self.host.dev,
        }
    }

    /// Device address of heap offset `off` of `peer`, through this rank's mapping (what
    /// `symm_ptr` computes in device code).
    pub fn ptr(&self, peer: u16, off: u64) -> Result<u64> {
        self.heap.ptr(peer, off).ok_or(if peer >= self.world {
            CudaError::BadRank {
                rank: peer,
                world: self.world,
            }
        } else {
            CudaError::OutOfBounds {
                what: "heap offset",
                offset: off,
                len: 0,
                lo: 0,
                hi: self.stride(),
            }
        })
    }

    /// Collective: places buffers for `req` in the heap, at the same offsets on every rank.
    pub fn alloc(&self, req: &Request) -> Result<Buffers> {
        self.alloc_sizes(req.buffer_sizes())
    }

    /// Collective: places buffers of the given sizes (see [`Comm::alloc`]).
    pub fn alloc_sizes(&self, sizes: BufferSizes) -> Result<Buffers> {
        let _ctx = device::keep_current()?;
        self.live()?;
        let b = guard::place(&mut *self.heap_lock()?, sizes, self.data_off)?;
        // Scratch starts zeroed, before the agreement (so before any peer can write into it):
        // low-latency lines a dropped team left in this memory carry that team's epochs, which
        // the job's may repeat, and no flag is 0 (symm_core::ll).
        if b.sizes.scratch > 0 {
            self.heap_fill(b.scratch, b.sizes.scratch, 0)?;
        }
        self.agree()?;
        Ok(b)
    }

    /// Collective: returns buffers to the heap after this rank's work on its device finished.
    /// Every offset is checked first (a live allocation of this heap, not a team's region), so
    /// a bad set frees nothing.
    pub fn free(&self, b: &Buffers) -> Result<()> {
        let _ctx = device::keep_current()?;
        self.check_unpinned(b)?;
        self.sync_device()?;
        {
            let regions = self
                .regions
                .lock()
                .map_err(|_| CudaError::LockPoisoned { what: "region" })?
                .clone();
            // Held until the buffers are back in the heap: no capture pins them meanwhile.
            let pins = self.pin_lock()?;
            capture::check_unpinned_in(&pins, b)?;
            let mut h = self.heap_lock()?;
            let offs = [b.input, b.output, b.scratch].map(|o| o.checked_sub(self.data_off));
            for (o, off) in [b.input, b.output, b.scratch].iter().zip(offs) {
                let live = off.is_some_and(|x| h.is_live(x));
                if !live || regions.contains(o) {
                    return Err(CudaError::NotLive { offset: *o });
                }
            }
            for off in offs.into_iter().flatten() {
                h.free(off).map_err(CudaError::Heap)?;
            }
        }
        self.agree()
    }

    fn heap_lock(&self) -> Result<std::sync::MutexGuard<'_, Heap>> {
        self.alloc
            .lock()
            .map_err(|_| CudaError::LockPoisoned { what: "heap" })
    }

    /// Collective: every rank's `data` (at most 64 KiB), in rank order, through the bootstrap.
    pub fn exchange(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(self.boot.all_gather(self.rank, data)?.to_vec())
    }

    /// Fails fast when the communicator is poisoned or a peer was lost.
    fn live(&self) -> Result<()> {
        if let Some(rank) = self.boot.bootstrap().lost() {
            let e = CudaError::PeerLost { rank };
            self.poison(&e);
            return Err(e);
        }
        match self.poisoned.lock() {
            Ok(p) => p
                .clone()
                .map_or(Ok(()), |why| Err(CudaError::Poisoned(why))),
            Err(_) => Err(CudaError::LockPoisoned { what: "poison" }),
        }
    }

    /// The launch lock, with the state of the order across streams.
    fn launch_lock(&self) -> Result<std::sync::MutexGuard<'_, order::StreamOrder>> {
        self.launching
            .lock()
            .map_err(|_| CudaError::LockPoisoned { what: "launch" })
    }

    fn poison(&self, e: &CudaError) {
        if let Ok(mut p) = self.poisoned.lock() {
            p.get_or_insert_with(|| e.to_string());
        }
    }

    /// Reports asynchronous errors of collectives enqueued so far without waiting for them: a
    /// device timeout (rank, peer, slot, expected, found), a lost peer, an op the interpreter
    /// refused. After an error the communicator is poisoned until [`Comm::reset`].
    pub fn check(&self) -> Result<()> {
        let _ctx = device::keep_current()?;
        if let Some(rank) = self.boot.bootstrap().lost() {
            let e = CudaError::PeerLost { rank };
            self.poison(&e);
            return Err(e);
        }
        let ats = (0..MAX_CHANNELS as usize).map(|c| ABORT_BYTES + c * RECORD_BYTES);
        let found = first_failure(&self.host, ats).map(|e| self.team_peer(e));
        if let Some(e) = found {
            self.poison(&e);
            return Err(e);
        }
        self.live()
    }

    /// Waits for the caller's `stream`, then [`Comm::check`]s.
    pub fn synchronize(&self, stream: &Stream) -> Result<()> {
        let _ctx = device::keep_current()?;
        let r = stream.synchronize();
        if let Err(e) = &r {
            self.poison(e);
        }
        self.check()?;
        r
    }

    fn sync_device(&self) -> Result<()> {
        self.dev.bind()?;
        let api = driver()?;
        // SAFETY: this rank's context is bound; waits for every stream of it.
        check("cuCtxSynchronize", unsafe { (api.ctx_synchronize)() })
    }

    /// Collective: after a timeout, waits for this rank's device, zeroes its signal pad, its
    /// `expected` counters, the records and the abort word between two barriers of every rank,
    /// and lifts the poison. Fails (and stays poisoned) when a peer was lost or the device
    /// cannot be synchronised.
    pub fn reset(&self) -> Result<()> {
        let _ctx = device::keep_current()?;
        if let Some(rank) = self.boot.bootstrap().lost() {
            return Err(CudaError::PeerLost { rank });
        }
        let _g = self.launch_lock()?;
        self.sync_device()?;
        // No rank zeroes before every rank stopped using the protocol.
        self.boot.barrier(self.rank)?;
        let epochs = epoch::highest(self)?;
        self.heap_fill(0, self.data_off, 0)?;
        self.expected.fill(0)?;
        epoch::resume(self, &epochs)?;
        self.sync_device()?;
        self.host.zero_all();
        // No rank signals before every rank zeroed.
        self.boot.barrier(self.rank)?;
        if let Ok(mut p) = self.poisoned.lock() {
            *p = None;
        }
        Ok(())
    }

    /// Ends this rank's part in the job in order: waits for its device, then the bootstrap's
    /// last barrier, after which no rank counts another's exit as a loss. Dropping a `Comm`
    /// without it is seen by the other ranks as this rank's loss.
    pub fn finish(self) -> Result<()> {
        self.close()
    }

    /// [`Comm::finish`] for a Comm that others still hold (a framework's tensors over its heap):
    /// ends this rank's part in the job in order, then refuses new work; the memory stays
    /// mapped until the Comm is dropped.
    pub fn close(&self) -> Result<()> {
        let _ctx = device::keep_current()?;
        self.sync_device()?;
        let r = self
            .boot
            .bootstrap()
            .finish(self.opts.bootstrap_timeout)
            .map_err(CudaError::Bootstrap);
        if let Ok(mut p) = self.poisoned.lock() {
            p.get_or_insert_with(|| "the communicator was finished".to_string());
        }
        r
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // No abort-word write may start once the fields (the context among them) begin to go,
        // and the callback no longer holds the word.
        self.armed.disarm();
    }
}

/// Collective: fails unless every rank runs with the same copy-engine option (a rank on copy
/// engines waits on flags that a rank in a kernel never raises).
fn agree_copy_engine(boot: &SocketRendezvous, rank: u16, mine: CopyEngine) -> Result<()> {
    let all = boot.all_gather(rank, &[mine.code()])?;
    match all.iter().position(|v| v.as_slice() != [mine.code()]) {
        None => Ok(()),
        Some(r) => Err(CudaError::Disagree {
            what: "SYMM_COPY_ENGINE (CommOptions::copy_engine)",
            rank: u16::try_from(r).ok(),
        }),
    }
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
            plans: Mutex::new(HashMap::new()),
            engines: std::sync::atomic::AtomicU8::new(opts.copy_engine.code()),
            moe_sms: std::sync::atomic::AtomicU32::new(0),
            tracing: Mutex::new(None),
            signals: Mutex::new(None),
            armed: self.armed,
            interp: self.interp,
            compiler: Arc::new(self.compiler),
            compiling: Mutex::new(None),
            expected: self.expected,
            host: self.host,
            heap: self.heap,
            alloc: Mutex::new(self.alloc),
            launching: Mutex::new(order::StreamOrder::default()),
            pinned: Mutex::new(HashMap::new()),
            poisoned: Mutex::new(None),
            blocks: Mutex::new(blocks::Blocks::default()),
            graph_pins: blocks::GraphPins::default(),
            spans: Mutex::new(spans::Spans::default()),
            next_team: Mutex::new(1),
            teams: Mutex::new(HashMap::new()),
            regions: Mutex::new(Vec::new()),
            rank,
            world,
            pad_slots: self.pad_slots,
            data_off: self.data_off,
            id: super::device_plan::next_owner(),
            sharing: self.sharing,
            opts,
            dev: self.dev,
            boot,
        }
    }
}

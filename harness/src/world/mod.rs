//! A world of GPUs in one process: the symmetric heap, the plan cache and interpreter launches.
//!
//! [`World::open`] compiles (or loads from cache) the interpreter for the devices' architecture,
//! then runs one thread per GPU that retains the device's context, creates its stream and maps
//! the symmetric heap through a [`ThreadBootstrap`] rendezvous. Afterwards any thread may drive
//! the world: every per-rank call binds that rank's context first.
//!
//! Heap layout (every rank alike): the signal pad (`MAX_CHANNELS * KINDS * world` u64 slots) at
//! offset 0, then buffers placed by symm-core's deterministic allocator. Pads and each rank's
//! `expected` counters persist for the life of the world: counters only grow, and every
//! collective schedule is balanced, so runs of any requests (and graph replays) follow each other
//! without resets.
//!
//! A launch runs one interpreter grid per rank, one block per channel. Completion checks the
//! host-mapped timeout records: a device wait that passed its deadline becomes
//! [`CudaError::Timeout`] naming rank, peer, slot, expected and found.

pub(crate) mod guard;
pub(crate) mod run;

pub use guard::Captured;

use super::bounds as limits;
pub use super::bounds::Buffers;
use super::device_plan::next_owner;
pub use super::device_plan::DevicePlan;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use symm_core::heap::Heap;
use symm_core::sched::{BufferSizes, Request, MAX_CHANNELS};
use symm_core::signal::KINDS;

use super::compile::{self, Compiler};
use super::device::{self, DevBuf, Device, Event, HostMapped, Stream};
use super::error::{CudaError, Result};
use super::ffi::driver as ffi;
use super::launch::{Graph, InterpParams, Kernel, EVENT_BYTES, RECORD_BYTES};
use super::plan::RankPlan;
use super::rendezvous::ThreadBootstrap;
use super::vmm::SymmetricHeap;
use crate::kernel_cache::{CacheError, Origin};

/// How a world is set up.
#[derive(Clone, Debug)]
pub struct Options {
    /// Bytes of each rank's heap available for buffers (the pad comes on top).
    pub heap_bytes: u64,
    /// Deadline of every device wait.
    pub timeout: Duration,
    /// Deadline of every host-side exchange.
    pub rendezvous: Duration,
    /// Trace events kept per (rank, channel).
    pub trace_cap: u32,
    /// libnvrtc to load (default: found on the loader path).
    pub nvrtc: Option<PathBuf>,
}

impl Options {
    /// Fails when an option is out of its range: every deadline more than 0 and at most
    /// [`limits::MAX_WAIT`], the heap at most [`limits::MAX_HEAP_BYTES`].
    pub fn validate(&self) -> Result<()> {
        limits::check_heap("Options::heap_bytes", self.heap_bytes)?;
        limits::check_wait("Options::timeout", self.timeout)?;
        limits::check_wait("Options::rendezvous", self.rendezvous)
    }
}

impl Default for Options {
    fn default() -> Options {
        Options {
            heap_bytes: 64 << 20,
            timeout: Duration::from_secs(10),
            rendezvous: Duration::from_secs(60),
            trace_cap: 1 << 14,
            nvrtc: None,
        }
    }
}

struct Rank {
    interp: Kernel,
    interp_trace: Kernel,
    trace: DevBuf,
    trace_len: DevBuf,
    expected: DevBuf,
    stream: Stream,
    heap: SymmetricHeap,
    dev: Device,
}

/// What compiling the kernels did.
#[derive(Clone, Debug)]
pub struct CompileInfo {
    /// NVRTC (major, minor).
    pub nvrtc: (i32, i32),
    /// Driver CUDA version.
    pub driver: i32,
    /// Architecture (90 for sm_90).
    pub arch: u32,
    /// Variants that came from the disk cache.
    pub cached: usize,
    /// Why the disk cache was not used, when it was not (the kernels were compiled then).
    pub uncached: Option<CacheError>,
    /// Seconds spent compiling.
    pub seconds: f64,
}

/// A world of GPUs in this process.
pub struct World {
    plans: Mutex<HashMap<Request, Arc<Vec<DevicePlan>>>>,
    host: HostMapped,
    ranks: Vec<Rank>,
    alloc: Mutex<Heap>,
    opts: Options,
    world: u16,
    pad_slots: u32,
    data_off: u64,
    /// Held while launching, so every rank receives collectives in one order.
    launching: Mutex<()>,
    /// Why the world cannot be trusted until `reset` (a timeout, a failed launch).
    poisoned: Mutex<Option<String>>,
    /// Live captures by their buffers' input offset.
    captured: Mutex<HashMap<u64, usize>>,
    /// How the kernels were obtained.
    pub compile: CompileInfo,
    /// What ties plans to this world ([`next_owner`]).
    id: u64,
}

const ABORT_BYTES: usize = 64;

impl World {
    /// Opens a world over `devices` (ordinals; rank r is `devices[r]`).
    pub fn open(devices: &[i32], opts: Options) -> Result<World> {
        opts.validate()?;
        let _ctx = device::keep_current()?;
        let world = u16::try_from(devices.len())
            .ok()
            .filter(|&w| w > 0 && w as usize <= 64)
            .ok_or(if devices.is_empty() {
                CudaError::SizeMismatch {
                    what: "devices",
                    have: 0,
                    want: 1,
                }
            } else {
                CudaError::TooLarge {
                    what: "devices",
                    size: devices.len() as u64,
                    limit: 64,
                }
            })?;
        let devs: Vec<Device> = devices
            .iter()
            .map(|&d| Device::open(d))
            .collect::<Result<_>>()?;
        for d in &devs {
            if d.attribute(ffi::ATTR_VMM)? == 0 || d.attribute(ffi::ATTR_POSIX_FD)? == 0 {
                return Err(CudaError::Unsupported(format!(
                    "device {} lacks VMM or POSIX-fd handles",
                    d.ordinal()
                )));
            }
            if d.arch() != devs[0].arch() {
                return Err(CudaError::Unsupported(
                    "devices of different architectures".into(),
                ));
            }
            for o in &devs {
                if o.ordinal() != d.ordinal() && !d.can_access_peer(o)? {
                    return Err(CudaError::Unsupported(format!(
                        "device {} cannot access device {}",
                        d.ordinal(),
                        o.ordinal()
                    )));
                }
            }
        }
        let t = std::time::Instant::now();
        let compiler = Compiler::load(opts.nvrtc.as_deref())?;
        let drv = device::driver_version()?;
        let arch = devs[0].arch();
        let (plain, o1) = compile::cubin(&compiler, &symm_kernels::INTERP, arch, drv)?;
        let (traced, o2) = compile::cubin(&compiler, &symm_kernels::INTERP_TRACE, arch, drv)?;
        let origins = [o1, o2];
        let info = CompileInfo {
            nvrtc: compiler.version(),
            driver: drv,
            arch,
            cached: origins.iter().filter(|o| **o == Origin::Cache).count(),
            uncached: origins.iter().find_map(|o| o.uncached().cloned()),
            seconds: t.elapsed().as_secs_f64(),
        };

        let pad_slots = MAX_CHANNELS as u32 * KINDS * world as u32;
        let data_off = (pad_slots as u64 * 8).div_ceil(4096) * 4096;
        let total = data_off
            .checked_add(opts.heap_bytes)
            .ok_or(CudaError::Overflow { what: "heap size" })?;
        let boot = ThreadBootstrap::new(world, opts.rendezvous);
        let cap = opts.trace_cap as usize;
        let results: Vec<Result<Rank>> = std::thread::scope(|s| {
            let handles: Vec<_> = devs
                .into_iter()
                .enumerate()
                .map(|(r, dev)| {
                    let (boot, plain, traced) = (&boot, &plain, &traced);
                    s.spawn(move || -> Result<Rank> {
                        let heap = SymmetricHeap::create(&dev, r as u16, total, boot)?;
                        let stream = Stream::new(&dev)?;
                        Ok(Rank {
                            interp: Kernel::load(&dev, plain, symm_kernels::INTERP_ENTRY)?,
                            interp_trace: Kernel::load(&dev, traced, symm_kernels::INTERP_ENTRY)?,
                            trace: DevBuf::zeroed(&dev, cap * MAX_CHANNELS as usize * EVENT_BYTES)?,
                            trace_len: DevBuf::zeroed(&dev, MAX_CHANNELS as usize * 4)?,
                            expected: DevBuf::zeroed(&dev, pad_slots as usize * 8)?,
                            stream,
                            heap,
                            dev,
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err(CudaError::RankPanicked)))
                .collect()
        });
        let ranks: Vec<Rank> = results.into_iter().collect::<Result<_>>()?;
        let stride = ranks[0].heap.stride;
        let host = HostMapped::new(
            &ranks[0].dev,
            ABORT_BYTES + world as usize * MAX_CHANNELS as usize * RECORD_BYTES,
        )?;
        Ok(World {
            plans: Mutex::new(HashMap::new()),
            host,
            ranks,
            alloc: Mutex::new(Heap::new(stride - data_off)),
            opts,
            world,
            pad_slots,
            data_off,
            launching: Mutex::new(()),
            poisoned: Mutex::new(None),
            captured: Mutex::new(HashMap::new()),
            compile: info,
            id: next_owner(),
        })
    }

    /// Ranks.
    pub fn world(&self) -> u16 {
        self.world
    }

    /// Device names in rank order.
    pub fn device_names(&self) -> Vec<String> {
        self.ranks
            .iter()
            .map(|r| r.dev.name().to_string())
            .collect()
    }

    /// The options the world was opened with.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    /// Bytes between two peers' heaps.
    pub fn stride(&self) -> u64 {
        self.ranks[0].heap.stride
    }

    /// The heap offsets where buffers live, `[lo, hi)` (the signal pad is below `lo`).
    pub fn buffer_area(&self) -> (u64, u64) {
        (self.data_off, self.stride())
    }

    /// Device address of the abort word the world's kernels poll.
    pub(crate) fn abort_word(&self) -> u64 {
        self.host.dev()
    }

    /// Signal-pad slots per rank.
    pub fn pad_slots(&self) -> u32 {
        self.pad_slots
    }

    fn rank(&self, r: u16) -> Result<&Rank> {
        self.ranks.get(r as usize).ok_or(CudaError::BadRank {
            rank: r,
            world: self.world,
        })
    }

    /// The device of rank `r`.
    pub fn device(&self, r: u16) -> Result<&Device> {
        Ok(&self.rank(r)?.dev)
    }

    /// The stream of rank `r`.
    pub fn stream(&self, r: u16) -> Result<&Stream> {
        Ok(&self.rank(r)?.stream)
    }

    /// Device address of heap offset `off` on rank `r`, as rank `r` sees it.
    pub fn ptr(&self, r: u16, off: u64) -> Result<u64> {
        let k = self.rank(r)?;
        k.heap.ptr(r, off).ok_or(CudaError::OutOfBounds {
            what: "heap offset",
            offset: off,
            len: 0,
            lo: 0,
            hi: self.stride(),
        })
    }

    /// Places a request's buffers in the heap (collective in spirit: same offsets on all ranks).
    pub fn alloc(&self, req: &Request) -> Result<Buffers> {
        self.alloc_sizes(req.buffer_sizes())
    }

    /// Places buffers of the given sizes in the heap.
    pub fn alloc_sizes(&self, sizes: BufferSizes) -> Result<Buffers> {
        let _ctx = device::keep_current()?;
        let mut h = self
            .alloc
            .lock()
            .map_err(|_| CudaError::LockPoisoned { what: "heap" })?;
        limits::place(&mut h, sizes, self.data_off)
    }

    /// Returns a request's buffers to the heap, after launches in flight finished; refused while
    /// a [`Captured`] graph names them.
    pub fn free(&self, b: &Buffers) -> Result<()> {
        let _ctx = device::keep_current()?;
        // Held until the buffers are back in the heap: a capture (which registers under this
        // lock) cannot name them between the check and the free.
        let _g = self
            .launching
            .lock()
            .map_err(|_| CudaError::LockPoisoned { what: "launch" })?;
        if self
            .captured
            .lock()
            .map_err(|_| CudaError::LockPoisoned {
                what: "capture registry",
            })?
            .contains_key(&b.input)
        {
            return Err(CudaError::Pinned);
        }
        self.drain()?;
        let mut h = self
            .alloc
            .lock()
            .map_err(|_| CudaError::LockPoisoned { what: "heap" })?;
        // Every offset is checked before any is freed: a bad set frees nothing.
        let offs = [b.input, b.output, b.scratch].map(|o| o.checked_sub(self.data_off));
        for (o, off) in [b.input, b.output, b.scratch].iter().zip(offs) {
            if !off.is_some_and(|x| h.is_live(x)) {
                return Err(CudaError::NotLive { offset: *o });
            }
        }
        for off in offs.into_iter().flatten() {
            h.free(off).map_err(CudaError::Heap)?;
        }
        Ok(())
    }

    /// Copies bytes into rank `r`'s heap at `off`.
    pub fn write(&self, r: u16, off: u64, bytes: &[u8]) -> Result<()> {
        let _ctx = device::keep_current()?;
        self.check_range(off, bytes.len() as u64)?;
        self.heap_write(r, off, bytes)
    }

    /// Reads `len` bytes of rank `r`'s heap at `off`.
    pub fn read(&self, r: u16, off: u64, len: u64) -> Result<Vec<u8>> {
        let _ctx = device::keep_current()?;
        self.check_range(off, len)?;
        limits::check_range(off, len, 0, self.stride())?;
        let p = self.ptr(r, off)?;
        let len = usize::try_from(len).map_err(|_| CudaError::TooLarge {
            what: "read",
            size: len,
            limit: usize::MAX as u64,
        })?;
        let mut v = vec![0u8; len];
        self.rank(r)?.dev.bind()?;
        // SAFETY: bytes `off .. off + len` lie in rank `r`'s heap (checked above), mapped into
        // its context, bound above.
        unsafe { device::dtoh(&mut v, p) }?;
        Ok(v)
    }

    /// Fills `len` bytes of rank `r`'s heap at `off` with `value`.
    pub fn fill(&self, r: u16, off: u64, len: u64, value: u8) -> Result<()> {
        let _ctx = device::keep_current()?;
        self.check_range(off, len)?;
        self.heap_fill(r, off, len, value)?;
        self.rank(r)?.dev.synchronize()
    }

    /// Copies `bytes` to heap offset `off` of rank `r` (pad included: the caller decides).
    pub(crate) fn heap_write(&self, r: u16, off: u64, bytes: &[u8]) -> Result<()> {
        limits::check_range(off, bytes.len() as u64, 0, self.stride())?;
        let p = self.ptr(r, off)?;
        self.rank(r)?.dev.bind()?;
        // SAFETY: bytes `off .. off + len` lie in rank `r`'s heap (checked above), mapped into
        // its context, bound above.
        unsafe { device::htod(p, bytes) }
    }

    /// Sets `len` bytes at heap offset `off` of rank `r` to `value` (pad included).
    pub(crate) fn heap_fill(&self, r: u16, off: u64, len: u64, value: u8) -> Result<()> {
        limits::check_range(off, len, 0, self.stride())?;
        let p = self.ptr(r, off)?;
        let len = usize::try_from(len).map_err(|_| CudaError::TooLarge {
            what: "fill",
            size: len,
            limit: usize::MAX as u64,
        })?;
        self.rank(r)?.dev.bind()?;
        // SAFETY: bytes `off .. off + len` lie in rank `r`'s heap (checked above), mapped into
        // its context, bound above.
        unsafe { device::memset(p, value, len) }
    }

    fn check_range(&self, off: u64, len: u64) -> Result<()> {
        limits::check_range(off, len, self.data_off, self.stride())
    }

    fn upload(&self, r: u16, plan: RankPlan, sizes: BufferSizes) -> Result<DevicePlan> {
        // SAFETY: `plans` and `user_plans`, the only callers, validated `plan` for rank `r` of
        // this world against `sizes` and its pad; `self.id` came from `next_owner`.
        unsafe { DevicePlan::upload_validated(&self.rank(r)?.dev, plan, sizes, (self.id, r)) }
    }

    /// The uploaded plans of a collective request (built from its schedules once, then cached).
    pub fn plans(&self, req: &Request) -> Result<Arc<Vec<DevicePlan>>> {
        let _ctx = device::keep_current()?;
        if req.world != self.world {
            return Err(CudaError::SizeMismatch {
                what: "ranks in the request",
                have: req.world as u64,
                want: self.world as u64,
            });
        }
        if let Some(p) = self.plans.lock().ok().and_then(|m| m.get(req).cloned()) {
            return Ok(p);
        }
        let sizes = req.buffer_sizes();
        let mut v = Vec::with_capacity(self.world as usize);
        for r in 0..self.world {
            let p = RankPlan::schedule(req, r)?;
            p.validate(r, self.world, &sizes, self.pad_slots, false)?;
            v.push(self.upload(r, p, sizes)?);
        }
        let v = Arc::new(v);
        if let Ok(mut m) = self.plans.lock() {
            m.insert(*req, v.clone());
        }
        Ok(v)
    }

    /// Checks and uploads user-written plans (one per rank), uncached.
    pub fn user_plans(&self, plans: Vec<RankPlan>, sizes: &BufferSizes) -> Result<Vec<DevicePlan>> {
        let _ctx = device::keep_current()?;
        if plans.len() != self.world as usize {
            return Err(CudaError::SizeMismatch {
                what: "plans",
                have: plans.len() as u64,
                want: self.world as u64,
            });
        }
        let mut v = Vec::with_capacity(plans.len());
        for (r, p) in plans.into_iter().enumerate() {
            if p.channels() > MAX_CHANNELS as usize {
                return Err(CudaError::TooLarge {
                    what: "channels",
                    size: p.channels() as u64,
                    limit: MAX_CHANNELS as u64,
                });
            }
            p.validate(r as u16, self.world, sizes, self.pad_slots, false)?;
            v.push(self.upload(r as u16, p, *sizes)?);
        }
        Ok(v)
    }

    /// Rank `r`'s trace buffer and per-channel trace lengths.
    pub(crate) fn trace_buffers(&self, r: u16) -> Result<(&DevBuf, &DevBuf)> {
        let k = self.rank(r)?;
        Ok((&k.trace, &k.trace_len))
    }
}

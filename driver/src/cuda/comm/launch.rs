//! Enqueuing collectives on the caller's stream: plans built once per request, buffers checked
//! before every launch, nothing synchronous in between (so the launch can be graph-captured).

use std::sync::Arc;

use symm_core::sched::{Request, MAX_CHANNELS};

use super::{Comm, ABORT_BYTES};
use crate::cuda::bounds::{check_buffers, Buffers};
use crate::cuda::compile::{self, Compiler};
use crate::cuda::compiled::PlanPath;
use crate::cuda::copy_engine;
use crate::cuda::device::{self, DevBuf, Stream};
use crate::cuda::device_plan::DevicePlan;
use crate::cuda::error::{CudaError, Result};
use crate::cuda::launch::{InterpParams, Kernel, EVENT_BYTES};
use crate::cuda::plan::RankPlan;
use crate::cuda::trace;

/// The background plan compiler of a Comm: its queue and thread. Dropping it (with the Comm)
/// stops the thread after the compile in flight and waits for it, so no compile or module load
/// outlives the Comm or runs while the process exits.
pub(crate) struct PlanCompiler {
    queue: Option<std::sync::mpsc::Sender<Arc<DevicePlan>>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Raised on drop: the thread finishes the compile in flight and skips the rest.
    stop: Arc<std::sync::atomic::AtomicBool>,
}

impl Drop for PlanCompiler {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.queue.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Most ops of a traced plan on copy engines (each takes a timing event).
const MAX_MARKS: usize = 1 << 14;

/// The traced interpreter and its buffers (`cap` events per channel), loaded on first use.
pub(super) struct Tracing {
    kernel: Kernel,
    events: DevBuf,
    lens: DevBuf,
    cap: u32,
    /// Timing events around the ops of a plan on copy engines (one before, one after each op).
    marks: Vec<device::Event>,
}

impl Comm {
    /// This rank's plan of `req` (scheduled, validated against the buffers' sizes and the pad,
    /// uploaded once, then cached).
    pub(super) fn plan(&self, req: &Request) -> Result<Arc<DevicePlan>> {
        self.plan_at(req, false)
    }

    /// [`Comm::plan`]; with `now`, a plan that runs compiled is compiled before this returns
    /// (what [`Comm::prepare`] does) rather than in the background.
    fn plan_at(&self, req: &Request, now: bool) -> Result<Arc<DevicePlan>> {
        if req.world != self.world {
            return Err(CudaError::SizeMismatch {
                what: "ranks in the request",
                have: req.world as u64,
                want: self.world as u64,
            });
        }
        self.cached_plan((0, *req), now, || RankPlan::schedule(req, self.rank))
    }

    /// The plan cached under `key` (team id, request), else `build`'s, validated against this
    /// job, the pad and the request's buffer sizes, uploaded and cached. Every plan stays in the
    /// cache as long as the `Comm`, so none goes while a launch may still read it. A plan that
    /// runs compiled is compiled at once when forced or when `now` (a preparation), else in the
    /// background while the interpreter runs it.
    pub(super) fn cached_plan(
        &self,
        key: (u16, Request),
        now: bool,
        build: impl FnOnce() -> Result<RankPlan>,
    ) -> Result<Arc<DevicePlan>> {
        // A lock poisoned by another thread's panic still holds good plans: keep using it.
        let cache = || self.plans.lock().unwrap_or_else(|e| e.into_inner());
        let engines = self.copy_engine().takes(&key.1);
        let full = (key.0, key.1, engines);
        if let Some(p) = cache().get(&full).cloned() {
            if now {
                self.compile_prepared(&p, key.1.bytes);
            }
            return Ok(p);
        }
        let host = build()?;
        let sizes = key.1.buffer_sizes();
        host.validate(self.rank, self.world, &sizes, self.pad_slots, false)?;
        let ops = host.ops.len();
        let mut p = DevicePlan::upload(&self.dev, host, sizes, (self.id, self.rank))?;
        if engines {
            p = p.on_copy_engines()?;
        }
        let p = Arc::new(p);
        if !engines && self.opts.plans.compiles(key.1.bytes, ops) {
            if self.opts.plans == PlanPath::Compiled {
                // Forced: compiled now, and a plan that does not compile is an error.
                p.compile(&self.compiler, &self.dev, false)?;
            } else if now {
                // Auto, prepared: compiled now; a plan that does not compile stays interpreted.
                let _ = p.compile(&self.compiler, &self.dev, false);
            } else {
                // Auto: the interpreter runs it until the compiled kernel is ready (compiling
                // takes about a second; a plan that does not compile stays interpreted).
                self.compile_later(p.clone());
            }
        }
        cache().insert(full, p.clone());
        Ok(p)
    }

    /// Queues `plan` for the background compiler, starting it on first use.
    fn compile_later(&self, plan: Arc<DevicePlan>) {
        let mut q = self.compiling.lock().unwrap_or_else(|e| e.into_inner());
        if q.is_none() {
            let (tx, rx) = std::sync::mpsc::channel::<Arc<DevicePlan>>();
            let compiler = self.compiler.clone();
            let ordinal = self.dev.ordinal();
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let stopped = stop.clone();
            let spawned = std::thread::Builder::new()
                .name("symm-plan-compiler".into())
                .spawn(move || {
                    // The same primary context as the Comm's: the kernels load where it runs.
                    let Ok(dev) = device::Device::open(ordinal) else {
                        return;
                    };
                    for plan in rx {
                        if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                            break; // the Comm is going: what is queued stays interpreted
                        }
                        let _ = plan.compile(&compiler, &dev, false);
                    }
                });
            match spawned {
                Ok(thread) => {
                    *q = Some(PlanCompiler {
                        queue: Some(tx),
                        thread: Some(thread),
                        stop,
                    })
                }
                Err(_) => return, // no thread: the interpreter keeps running every plan
            }
        }
        if let Some(tx) = q.as_ref().and_then(|w| w.queue.as_ref()) {
            let _ = tx.send(plan);
        }
    }

    /// Builds and uploads this rank's plan of `req` now, and when the plan runs compiled (auto:
    /// requests of at most [`crate::cuda::compiled::AUTO_COMPILED_BYTES`] whose plan holds at
    /// most [`crate::cuda::compiled::AUTO_COMPILED_OPS`] ops), compiles its kernel now too (a
    /// fraction of a second to seconds of NVRTC the first time, then the disk cache). The first
    /// [`Comm::enqueue`] of a request builds the plan otherwise, with the interpreter running it
    /// until a background compile ends. Building allocates device memory, which stream capture
    /// forbids: call this before capturing a request's first launch in a CUDA graph, and the
    /// graph holds the compiled kernel, not the interpreter.
    pub fn prepare(&self, req: &Request) -> Result<()> {
        let _ctx = device::keep_current()?;
        self.plan_at(req, true).map(|_| ())
    }

    /// [`Comm::prepare`] for many requests, the kernels of those that run compiled compiled on
    /// several threads first (into the kernel cache, from which the preparation then loads
    /// them): a second of NVRTC per plan, divided by the threads. Not collective.
    pub fn prepare_all(&self, reqs: &[Request]) -> Result<()> {
        let _ctx = device::keep_current()?;
        self.compile_ahead(reqs, |r| {
            (r.world == self.world)
                .then(|| RankPlan::schedule(r, self.rank).ok())
                .flatten()
        });
        for r in reqs {
            self.plan_at(r, true)?;
        }
        Ok(())
    }

    /// In auto mode, compiles a cached plan that auto runs compiled and that the background
    /// compiler has not finished yet (forced mode compiled it when it was built; a plan that
    /// does not compile stays interpreted, as in the background).
    fn compile_prepared(&self, p: &DevicePlan, bytes: u64) {
        if self.opts.plans == PlanPath::Auto
            && p.flags().is_none()
            && self.opts.plans.compiles(bytes, p.host().ops.len())
        {
            let _ = p.compile(&self.compiler, &self.dev, false);
        }
    }

    /// Unless this Comm only interprets, compiles the plans `build` makes of `reqs` that run
    /// compiled into the kernel cache on several threads (the requests of this world that run
    /// in kernels; only plans that validate are compiled).
    pub(super) fn compile_ahead(
        &self,
        reqs: &[Request],
        build: impl Fn(&Request) -> Option<RankPlan> + Sync,
    ) {
        if self.opts.plans == PlanPath::Interpreted {
            return;
        }
        let todo: Vec<RankPlan> = reqs
            .iter()
            .filter(|r| !self.copy_engine().takes(r))
            .filter_map(|r| {
                let p = build(r)?;
                p.validate(
                    self.rank,
                    self.world,
                    &r.buffer_sizes(),
                    self.pad_slots,
                    false,
                )
                .ok()?;
                self.opts.plans.compiles(r.bytes, p.ops.len()).then_some(p)
            })
            .collect();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = (cores / self.sharing.ranks_on_device.max(1) as usize).clamp(1, 16);
        let next = std::sync::atomic::AtomicUsize::new(0);
        let arch = self.dev.arch();
        std::thread::scope(|s| {
            for _ in 0..threads.min(todo.len()) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(p) = todo.get(i) else { break };
                    // A plan that fails here fails again, with its error, when prepared.
                    let _ = crate::cuda::compiled::cubin(&self.compiler, arch, p, false);
                });
            }
        });
    }

    /// Enqueues this rank's part of collective `req` over buffers `b` on `stream` and returns at
    /// once: no host synchronisation, so the launch may be captured in the caller's CUDA graph
    /// (after [`Comm::prepare`]). Every rank enqueues the same requests in the same order. Errors
    /// of the run itself are reported later by [`Comm::check`] or [`Comm::synchronize`].
    pub fn enqueue(&self, req: &Request, b: &Buffers, stream: &Stream) -> Result<()> {
        let _ctx = device::keep_current()?;
        self.launch(req, b, stream, None).map(|_| ())
    }

    /// Checks and launches; returns the plan launched.
    pub(super) fn launch(
        &self,
        req: &Request,
        b: &Buffers,
        stream: &Stream,
        traced: Option<&Tracing>,
    ) -> Result<Arc<DevicePlan>> {
        // The buffers are checked against the request before its plan is built: a request too
        // large for them costs nothing.
        self.check_request(req, b)?;
        let plan = self.plan(req)?;
        self.launch_plan(&plan, 0, b, (self.data_off, self.stride()), stream, traced)?;
        Ok(plan)
    }

    /// Fails unless the Comm is live, `req` is a valid request of this job and `b` holds its
    /// buffers inside the heap's buffer area.
    pub(super) fn check_request(&self, req: &Request, b: &Buffers) -> Result<()> {
        self.live()?;
        if req.world != self.world {
            return Err(CudaError::SizeMismatch {
                what: "ranks in the request",
                have: req.world as u64,
                want: self.world as u64,
            });
        }
        req.validate().map_err(CudaError::Sched)?;
        check_buffers(b, &req.buffer_sizes(), self.data_off, self.stride())
    }

    /// Launches `plan` over `b`, which must hold the plan's sizes inside `area` (`[lo, hi)` heap
    /// offsets): the whole buffer area, or a team's region.
    pub(super) fn launch_plan(
        &self,
        plan: &DevicePlan,
        team: u16,
        b: &Buffers,
        area: (u64, u64),
        stream: &Stream,
        traced: Option<&Tracing>,
    ) -> Result<()> {
        self.live()?;
        self.own_stream(stream)?;
        plan.check_owner(self.id, self.rank)?;
        check_buffers(b, &plan.sizes, area.0, area.1)?;
        let channels = plan.host.channels() as u32;
        if channels == 0 {
            return Ok(());
        }
        let mut order = self.launch_lock()?;
        if let Some(flags) = plan.flags() {
            let area = copy_engine::Area {
                rank: self.rank,
                base: self.heap.base(),
                stride: self.heap.stride,
                buf_off: [b.input, b.output, b.scratch],
                flag_off: self.flag_off(),
            };
            let marks = traced.map(|t| t.marks.as_slice());
            // SAFETY: the plan was validated for this job and rank against the pad and
            // `plan.sizes`, and `b` was checked to hold those sizes inside `area`, in the heap's
            // buffer area; the flag words follow the counters in every rank's pad.
            let enqueue =
                || unsafe { copy_engine::enqueue(flags, &area, &self.dev, stream, marks) };
            let r = self
                .order_before(&mut order, team, stream)
                .and_then(|record| {
                    enqueue()?;
                    self.ordered_after(&order, team, stream, record)
                });
            if let Err(e) = &r {
                self.poison(e);
            }
            return r;
        }
        let params = InterpParams {
            plan: plan.ops.ptr,
            chan_start: plan.chan.ptr,
            base: self.heap.base(),
            stride: self.heap.stride,
            buf_off: [b.input, b.output, b.scratch],
            pad_off: 0,
            expected: self.expected.ptr,
            mc_base: 0,
            records: self.host.dev + ABORT_BYTES as u64,
            abort_word: self.host.dev,
            trace: traced.map_or(0, |t| t.events.ptr),
            trace_len: traced.map_or(0, |t| t.lens.ptr),
            timeout_ns: self
                .sharing
                .deadline(self.opts.timeout)
                .as_nanos()
                .min(u64::MAX as u128) as u64,
            rank: self.rank as u32,
            world: self.world as u32,
            channels,
            trace_cap: traced.map_or(0, |t| t.cap),
        };
        // A compiled plan runs its own kernel (the traced one for a traced run, compiled
        // before the launch by `run_traced`), else the interpreter.
        let kernel = match traced {
            Some(t) => plan.compiled(true).unwrap_or(&t.kernel),
            None => plan.compiled(false).unwrap_or(&self.interp),
        };
        self.dev.bind()?;
        // SAFETY: `InterpParams` mirrors `symm_interp_params` (the traced variant takes the same
        // block); the plan (every plan, world or team, is kept by the Comm's cache), the heap,
        // the counters, the records and the trace buffers (`cap` events per channel) it names
        // live as long as `self`; the plan was validated against this job, the pad and
        // `plan.sizes`, and `b` was checked to hold those sizes inside `area`, which lies in
        // the heap's buffer area.
        let launch =
            || unsafe { kernel.launch(stream, channels, symm_kernels::INTERP_THREADS, &params) };
        let r = self
            .order_before(&mut order, team, stream)
            .and_then(|record| {
                launch()?;
                self.ordered_after(&order, team, stream, record)
            });
        if let Err(e) = &r {
            self.poison(e);
        }
        r
    }

    /// Runs `req` like [`Comm::run`] with the traced interpreter and returns this rank's part of
    /// the trace (absolute GPU timer values; [`trace::merge`] joins the ranks' parts). The traced
    /// variant is compiled and loaded on the first call. Collective: every rank calls it for
    /// the same request.
    pub fn run_traced(&self, req: &Request, b: &Buffers, stream: &Stream) -> Result<Vec<u8>> {
        let _ctx = device::keep_current()?;
        self.live()?;
        let mut slot = self
            .tracing
            .lock()
            .map_err(|_| CudaError::LockPoisoned { what: "trace" })?;
        if slot.is_none() {
            *slot = Some(self.load_tracing()?);
        }
        let Some(t) = slot.as_mut() else {
            // Loaded just above: a bug here if missing, not something a caller can act on.
            return Err(CudaError::Invalid("tracing not loaded".into()));
        };
        t.lens.fill(0)?;
        self.check_request(req, b)?;
        let plan = self.plan(req)?;
        if plan.compiled(false).is_some() {
            plan.compile(&self.compiler, &self.dev, true)?;
        }
        let ce_ops = plan
            .flags()
            .map(|f| f.channels().iter().map(Vec::len).sum::<usize>());
        if let Some(n) = ce_ops {
            if n + 1 > MAX_MARKS {
                return Err(CudaError::TraceOverflow);
            }
            while t.marks.len() < n + 1 {
                t.marks.push(device::Event::new(&self.dev)?);
            }
        }
        let t = &*t;
        let plan = self.launch(req, b, stream, Some(t))?;
        self.synchronize(stream)?;
        let per = match plan.flags() {
            Some(f) => copy_engine::raw_events(f, &t.marks)?,
            None => {
                let (per, overflow) =
                    trace::read_rank(&t.events, &t.lens, t.cap as usize, plan.host.channels())?;
                if overflow {
                    return Err(CudaError::TraceOverflow);
                }
                per
            }
        };
        let mut events = Vec::new();
        trace::to_events(self.rank, &plan.host, &per, &mut events);
        trace::encode(
            &trace::header(req, std::slice::from_ref(&self.dev.name)),
            &mut events,
        )
    }

    fn load_tracing(&self) -> Result<Tracing> {
        let compiler = Compiler::load(self.opts.nvrtc.as_deref())?;
        let drv = device::driver_version()?;
        let (cubin, _) =
            compile::cubin(&compiler, &symm_kernels::INTERP_TRACE, self.dev.arch, drv)?;
        let cap = self.opts.trace_cap.clamp(1, 1 << 20);
        Ok(Tracing {
            kernel: Kernel::load(&self.dev, &cubin, symm_kernels::INTERP_ENTRY)?,
            events: DevBuf::zeroed(
                &self.dev,
                cap as usize * MAX_CHANNELS as usize * EVENT_BYTES,
            )?,
            lens: DevBuf::zeroed(&self.dev, MAX_CHANNELS as usize * 4)?,
            cap,
            marks: Vec::new(),
        })
    }

    /// Mean microseconds of `req` over `iters` back-to-back launches on `stream` after `warmup`
    /// (CUDA events), then checks for errors. Collective: every rank times the same request.
    pub fn time(
        &self,
        req: &Request,
        b: &Buffers,
        stream: &Stream,
        warmup: u32,
        iters: u32,
    ) -> Result<f64> {
        let _ctx = device::keep_current()?;
        for _ in 0..warmup.max(1) {
            self.enqueue(req, b, stream)?;
        }
        self.synchronize(stream)?;
        let (s, e) = (
            device::Event::new(&self.dev)?,
            device::Event::new(&self.dev)?,
        );
        s.record(stream)?;
        for _ in 0..iters.max(1) {
            self.enqueue(req, b, stream)?;
        }
        e.record(stream)?;
        self.synchronize(stream)?;
        Ok(s.elapsed_ms(&e)? as f64 * 1000.0 / iters.max(1) as f64)
    }

    /// Enqueues `req` on `stream`, waits for it and checks for errors.
    pub fn run(&self, req: &Request, b: &Buffers, stream: &Stream) -> Result<()> {
        let _ctx = device::keep_current()?;
        self.enqueue(req, b, stream)?;
        self.synchronize(stream)
    }
}

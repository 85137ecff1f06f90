//! Admission: the one door every collective goes through.
//!
//! [`Comm::admit`] checks a request once (its world, [`Request::validate`], the buffer sizes
//! the plan is validated against), finds or builds its plan (the plan cache, `plans.rs`) and
//! fixes its [`Executor`] once. What it returns, an [`Admitted`] request, is launched with its
//! buffers on a stream by [`Comm::launch`], which checks only what the admission could not see:
//! the buffers and the stream. Everything that launches a collective goes through that pair:
//! [`Comm::enqueue`], framework tensors, teams, graph captures, traced runs and the bindings.
//!
//! **The admitted cache.** Admitted requests are kept per (team id, request) under the launch
//! lock, which a launch takes anyway (`order.rs`), so a repeated call ([`Comm::enqueue`] of a
//! shape seen before) is one hash lookup with a cheap hasher ([`FastHash`]) under the one lock
//! it needs, and no validation, allocation or plan lookup. A caller that keeps the
//! [`Admitted`] skips even the lookup. The cache is emptied when the copy-engine option
//! changes ([`Comm::set_copy_engine`]): the executor is fixed at admission.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use symm_core::sched::{BufferSizes, Request};

use super::order::StreamOrder;
use super::{Comm, ABORT_BYTES};
use crate::cuda::bounds::{check_buffers, check_buffers_on, Buffers};
use crate::cuda::compiled::PlanPath;
use crate::cuda::copy_engine;
use crate::cuda::device::Stream;
use crate::cuda::device_plan::DevicePlan;
use crate::cuda::error::{CudaError, Result};
use crate::cuda::launch::InterpParams;

/// What runs an admitted request's plan, fixed when it is admitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Executor {
    /// The plan interpreter (one kernel for every plan).
    Interpreter,
    /// The plan's own compiled kernel ([`crate::cuda::compiled`]); until a background compile
    /// finishes, or when the plan does not compile, the interpreter runs it.
    Compiled,
    /// Copy engines, the plan in flag form, no kernel ([`crate::cuda::copy_engine`]).
    CopyEngines,
}

impl Executor {
    /// The executor of a plan whose kernel holds `ops` ops (`compiled::compiled_ops`): copy
    /// engines when the copy-engine option takes the request, else compiled when `path`
    /// compiles it, else the interpreter.
    pub(crate) fn choose(engines: bool, path: PlanPath, ops: usize) -> Executor {
        if engines {
            Executor::CopyEngines
        } else if path.compiles(ops) {
            Executor::Compiled
        } else {
            Executor::Interpreter
        }
    }
}

/// A request admitted by one [`Comm`] (or one of its teams): checked, its plan built and its
/// executor fixed. Cheap to clone (one reference count); launch it with [`Comm::launch`]. It
/// keeps the executor it was admitted with, as a captured graph keeps its launches: after
/// [`Comm::set_copy_engine`], admit again (what [`Comm::enqueue`] does).
#[derive(Clone)]
pub struct Admitted(Arc<Inner>);

struct Inner {
    req: Request,
    /// The Comm that admitted it (`device_plan::next_owner`).
    owner: u64,
    /// Blocks of its kernel: the plan's channels.
    channels: u32,
    /// Its kernel's parameter block but for the buffers and the trace, filled at admission.
    params: InterpParams,
    /// The team id (0: the job).
    team: u16,
    /// Where its buffers must lie, `[lo, hi)` heap offsets: the buffer area or a team's region.
    area: (u64, u64),
    plan: Arc<DevicePlan>,
    exec: Executor,
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("request", &self.0.req)
            .field("team", &self.0.team)
            .field("executor", &self.0.exec)
            .finish_non_exhaustive()
    }
}

impl Admitted {
    /// The request.
    pub fn request(&self) -> &Request {
        &self.0.req
    }

    /// What runs it.
    pub fn executor(&self) -> Executor {
        self.0.exec
    }

    /// The buffer sizes it needs (at least).
    pub fn sizes(&self) -> BufferSizes {
        self.0.plan.sizes
    }

    /// The plan as validated.
    pub fn plan(&self) -> &DevicePlan {
        &self.0.plan
    }

    /// How many SMs it occupies while it runs: one block per channel of its plan, each on one
    /// SM, or none on copy engines.
    pub fn sms(&self) -> u32 {
        match self.0.exec {
            Executor::CopyEngines => 0,
            _ => self.0.channels,
        }
    }

    /// Whether its next launch runs the plan's compiled kernel (else the interpreter, or copy
    /// engines).
    pub fn runs_compiled(&self) -> bool {
        self.0.exec == Executor::Compiled && self.0.plan.compiled(false).is_some()
    }

    /// Fails unless `comm` admitted it and `b` holds the admitted sizes inside the admitted
    /// area: what every launch checks.
    pub(crate) fn check(&self, comm: &Comm, b: &Buffers) -> Result<()> {
        self.check_owned(comm, b, [false; 2])
    }

    /// [`Admitted::check`], with the sides in `owned` outside the heap
    /// ([`check_buffers_on`]): allowed only where the request owns them (`Request::owns`) and a
    /// kernel runs it (the copy engines address every side in the heap).
    fn check_owned(&self, comm: &Comm, b: &Buffers, owned: [bool; 2]) -> Result<()> {
        let owns = self.0.req.owns();
        let kernel = self.0.exec != Executor::CopyEngines;
        if (0..2).any(|i| owned[i] && !(owns[i] && kernel)) {
            return Err(CudaError::Invalid(format!(
                "{} on {:?} does not own the sides {owned:?} it was given outside the heap",
                self.0.req.algorithm.name(),
                self.0.exec
            )));
        }
        if self.0.owner != comm.job.id {
            // Its plan was validated by another Comm (every plan an admission holds is its
            // Comm's).
            return Err(CudaError::ForeignPlan(
                "the request was admitted by another Comm".into(),
            ));
        }
        check_buffers_on(b, &self.0.plan.sizes, self.0.area, owned)
    }

    pub(crate) fn team(&self) -> u16 {
        self.0.team
    }

    /// Blocks of its kernel (its plan's channels).
    pub(super) fn channels(&self) -> u32 {
        self.0.channels
    }

    /// Its kernel's parameter block as admitted (no buffers, no trace).
    pub(super) fn params(&self) -> &InterpParams {
        &self.0.params
    }

    pub(crate) fn plan_arc(&self) -> &Arc<DevicePlan> {
        &self.0.plan
    }
}

/// A multiply-rotate hasher for the admitted cache's small keys (a team id and a request of a
/// few words): an order of magnitude cheaper than the default SipHash, and the keys come from
/// this process, not from an adversary.
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.write_u64(u64::from(*b));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }

    fn write_u16(&mut self, i: u16) {
        self.write_u64(u64::from(i));
    }

    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }

    fn write_u64(&mut self, i: u64) {
        self.0 = (self.0.rotate_left(5) ^ i).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
}

/// [`FastHasher`] for `HashMap`s.
pub(crate) type FastHash = BuildHasherDefault<FastHasher>;

/// What admitted requests are found by: the team id (0: the job) and the request.
pub(crate) type AdmitKey = (u16, Request);

/// Admitted values by key (generic so the cache is testable without a GPU).
pub(crate) struct AdmitCache<V> {
    map: HashMap<AdmitKey, V, FastHash>,
}

impl<V> Default for AdmitCache<V> {
    fn default() -> Self {
        AdmitCache {
            map: HashMap::default(),
        }
    }
}

impl<V> AdmitCache<V> {
    pub(crate) fn get(&self, key: &AdmitKey) -> Option<&V> {
        self.map.get(key)
    }

    pub(crate) fn insert(&mut self, key: AdmitKey, v: V) {
        self.map.insert(key, v);
    }

    /// Forgets every entry (the executor of each may change).
    pub(crate) fn clear(&mut self) {
        self.map.clear();
    }
}

/// What the launch lock guards: the order across streams and the admitted cache.
#[derive(Default)]
pub(crate) struct Launching {
    pub(super) order: StreamOrder,
    pub(super) admitted: AdmitCache<Admitted>,
}

/// A traced launch's device buffers (the traced kernel and where events go).
pub(crate) struct TraceTarget<'t> {
    pub(crate) kernel: &'t crate::cuda::launch::Kernel,
    pub(crate) events: u64,
    pub(crate) lens: u64,
    pub(crate) cap: u32,
    pub(crate) marks: &'t [crate::cuda::device::Event],
}

impl Comm {
    /// The launch lock, with the state of the order across streams and the admitted requests.
    pub(super) fn launch_lock(&self) -> Result<std::sync::MutexGuard<'_, Launching>> {
        self.launching
            .lock()
            .map_err(|_| CudaError::LockPoisoned { what: "launch" })
    }

    /// Admits `req` for this job: checks its world and [`Request::validate`], finds or builds
    /// this rank's plan (validated against the request's buffer sizes and the pad, uploaded,
    /// cached for the Comm's life) and fixes its executor. Building allocates device memory,
    /// which stream capture forbids: admit a request before capturing its first launch.
    pub fn admit(&self, req: &Request) -> Result<Admitted> {
        let _g = self.enter()?;
        if let Some(a) = self.cached_admission(&(0, *req))? {
            return Ok(a);
        }
        self.check_shape(req, self.job.world)?;
        self.admit_checked((0, *req), self.buffer_area(), false, || {
            crate::cuda::plan::RankPlan::schedule(req, self.job.rank)
        })
    }

    /// Fails unless `req` is a valid request of `world` ranks (the job's or a team's), and one
    /// that honours deterministic mode in a deterministic job ([`CommOptions::deterministic`]).
    ///
    /// [`CommOptions::deterministic`]: crate::cuda::CommOptions::deterministic
    pub(super) fn check_shape(&self, req: &Request, world: u16) -> Result<()> {
        if req.world != world {
            return Err(CudaError::SizeMismatch {
                what: "ranks in the request",
                have: req.world as u64,
                want: world as u64,
            });
        }
        req.validate().map_err(CudaError::Sched)?;
        if self.opts.deterministic {
            req.deterministic().map_err(CudaError::Sched)?;
        }
        Ok(())
    }

    /// The admitted request under `key`, when it was admitted before.
    pub(super) fn cached_admission(&self, key: &AdmitKey) -> Result<Option<Admitted>> {
        Ok(self.launch_lock()?.admitted.get(key).cloned())
    }

    /// Admits a request already checked ([`Comm::check_shape`]) under `key`, its buffers in
    /// `area`: its plan from the cache or `build`, compiled now when `now` (a preparation).
    pub(super) fn admit_checked(
        &self,
        key: AdmitKey,
        area: (u64, u64),
        now: bool,
        build: impl FnOnce() -> Result<crate::cuda::plan::RankPlan>,
    ) -> Result<Admitted> {
        let (plan, exec) = self.cached_plan(key, now, build)?;
        let engines = exec == Executor::CopyEngines;
        let channels = plan.host().channels() as u32;
        let params = self.params_of(&plan, channels, &key);
        let a = Admitted(Arc::new(Inner {
            req: key.1,
            owner: self.job.id,
            channels,
            params,
            team: key.0,
            area,
            plan,
            exec,
        }));
        let mut l = self.launch_lock()?;
        // Kept only while the option it was admitted under holds (a `set_copy_engine` on
        // another thread meanwhile emptied the cache for the new option).
        if self.plans.engines().takes(&key.1) == engines {
            l.admitted.insert(key, a.clone());
        }
        Ok(a)
    }

    /// Admits a request whose plan exists already (what a capture may launch: building a plan
    /// allocates, which capture forbids); [`CudaError::NotPrepared`] otherwise.
    pub(super) fn admit_prepared(
        &self,
        key: AdmitKey,
        area: (u64, u64),
        world: u16,
    ) -> Result<Admitted> {
        if let Some(a) = self.cached_admission(&key)? {
            return Ok(a);
        }
        self.prepared(key)?;
        self.check_shape(&key.1, world)?;
        self.admit_checked(key, area, false, || Err(CudaError::NotPrepared))
    }

    /// Launches `a` over buffers `b` on `stream` and returns at once: no host
    /// synchronisation, so the launch may be captured in the caller's CUDA graph. The buffers
    /// must hold the admitted sizes inside the heap's buffer area (or the team's region).
    /// Every rank (or member) launches the same requests in the same order. Errors of the run
    /// itself are reported later by [`Comm::check`] or [`Comm::synchronize`].
    pub fn launch(&self, a: &Admitted, b: &Buffers, stream: &Stream) -> Result<()> {
        let _g = self.enter_on(stream)?;
        self.launch_entered(a, (b, [false; 2]), stream, None, None)
    }

    /// Enqueues this rank's part of collective `req` over buffers `b` on `stream`: a lookup of
    /// its admission when the shape was seen before ([`Comm::admit`] on its first use), then
    /// [`Comm::launch`]. Every rank enqueues the same requests in the same order.
    pub fn enqueue(&self, req: &Request, b: &Buffers, stream: &Stream) -> Result<()> {
        let _g = self.enter_on(stream)?;
        self.enqueue_entered((0, *req), b, stream, |comm| {
            comm.check_shape(req, comm.job.world)?;
            // The buffers are checked against the request before its plan is built: a request
            // too large for them costs nothing.
            let (lo, hi) = comm.buffer_area();
            check_buffers(b, &req.buffer_sizes(), lo, hi)?;
            comm.admit_checked((0, *req), (lo, hi), false, || {
                crate::cuda::plan::RankPlan::schedule(req, comm.job.rank)
            })
        })
    }

    /// The cached launch of `key` (inside a guard with the stream checked), else `admit`'s.
    pub(super) fn enqueue_entered(
        &self,
        key: AdmitKey,
        b: &Buffers,
        stream: &Stream,
        admit: impl FnOnce(&Comm) -> Result<Admitted>,
    ) -> Result<()> {
        {
            let mut l = self.launch_lock()?;
            let Launching { order, admitted } = &mut *l;
            if let Some(a) = admitted.get(&key) {
                return self.launch_locked(order, a, (b, [false; 2]), (stream, None), None);
            }
        }
        let a = admit(self)?;
        self.launch_entered(&a, (b, [false; 2]), stream, None, None)
    }

    /// [`Comm::launch`] inside a guard whose stream was checked; `capturing` is whether the
    /// stream captures when the caller asked already (`None`: the order asks when it matters);
    /// `traced` runs the traced kernel (or times copy-engine ops) into its buffers. `b` is the
    /// buffers and which of input and output lie outside the heap, in memory the caller checked
    /// (`check_buffers_on`; all `false` but for `Tensors::enqueue`'s owned sides).
    pub(crate) fn launch_entered(
        &self,
        a: &Admitted,
        b: (&Buffers, [bool; 2]),
        stream: &Stream,
        capturing: Option<bool>,
        traced: Option<&TraceTarget<'_>>,
    ) -> Result<()> {
        let mut l = self.launch_lock()?;
        self.launch_locked(&mut l.order, a, b, (stream, capturing), traced)
    }

    /// The launch itself, launch lock held (`order` is its state), on `on`: the stream and
    /// whether it captures when known.
    fn launch_locked(
        &self,
        order: &mut StreamOrder,
        a: &Admitted,
        (b, owned): (&Buffers, [bool; 2]),
        on: (&Stream, Option<bool>),
        traced: Option<&TraceTarget<'_>>,
    ) -> Result<()> {
        let (stream, capturing) = on;
        let (plan, team) = (&*a.0.plan, a.0.team);
        a.check_owned(self, b, owned)?;
        if a.0.channels == 0 {
            return Ok(());
        }
        let r = match (a.0.exec, plan.flags()) {
            (Executor::CopyEngines, Some(flags)) => {
                let area = copy_engine::Area {
                    rank: self.job.rank,
                    base: self.heap.base(),
                    stride: self.heap.stride,
                    buf_off: [b.input, b.output, b.scratch],
                    flag_off: self.flag_off(),
                };
                let marks = traced.map(|t| t.marks);
                // SAFETY: the plan was validated for this job and rank against the pad and
                // `plan.sizes`, and `b` was checked to hold those sizes inside `area`, in the
                // heap's buffer area; the flag words follow the counters in every rank's pad.
                let enqueue =
                    || unsafe { copy_engine::enqueue(flags, &area, &self.dev, stream, marks) };
                self.order_before(order, team, stream, capturing)
                    .and_then(|record| {
                        enqueue()?;
                        self.ordered_after(order, team, stream, record)
                    })
            }
            (Executor::CopyEngines, None) => Err(CudaError::Invalid(
                "a plan admitted for copy engines has no flag form".into(),
            )),
            _ => self.launch_kernel(order, a, b, on, traced),
        };
        if let Err(e) = &r {
            self.poison.raise(e);
        }
        r
    }

    /// Launches the plan's kernel (compiled, else the interpreter; the traced one for a traced
    /// run), launch lock held, context bound by the caller's guard.
    fn launch_kernel(
        &self,
        order: &mut StreamOrder,
        a: &Admitted,
        b: &Buffers,
        (stream, capturing): (&Stream, Option<bool>),
        traced: Option<&TraceTarget<'_>>,
    ) -> Result<()> {
        let (plan, team, channels) = (&*a.0.plan, a.0.team, a.0.channels);
        let params = InterpParams {
            buf_off: [b.input, b.output, b.scratch],
            trace: traced.map_or(0, |t| t.events),
            trace_len: traced.map_or(0, |t| t.lens),
            trace_cap: traced.map_or(0, |t| t.cap),
            ..a.0.params
        };
        // A compiled plan runs its own kernel (the traced one for a traced run, compiled
        // before the launch by the tracer), else the interpreter.
        let kernel = match traced {
            Some(t) => plan.compiled(true).unwrap_or(t.kernel),
            None => plan.compiled(false).unwrap_or(&self.interp),
        };
        // SAFETY: `InterpParams` mirrors `symm_interp_params` (the traced variant takes the same
        // block); this Comm filled it when it admitted `a` (`a.check` saw this Comm's id), so
        // the plan (every plan, world or team, is kept by the Comm's cache, and `a` holds it),
        // the heap, the counters and the records it names live as long as `self`, and the
        // trace buffers (`cap` events per channel) as long as the caller's tracer; the plan was
        // validated against this job, the pad and `plan.sizes`, and `b` was checked to hold
        // those sizes inside the admitted area, which lies in the heap's buffer area, except a
        // side the request owns (only this rank's ops name it, `Request::owns`, checked in
        // `check_owned`), which the caller checked to be exactly those sizes of one device
        // allocation of this context. The context is bound by the caller's guard.
        let launch =
            || unsafe { kernel.launch(stream, channels, symm_kernels::INTERP_THREADS, &params) };
        self.order_before(order, team, stream, capturing)
            .and_then(|record| {
                launch()?;
                self.ordered_after(order, team, stream, record)
            })
    }

    /// The interpreter's parameter block for `plan` of `channels` channels admitted under `key`,
    /// without buffers or trace (a launch fills those). A call of the job carries its signature
    /// (`Request::signature`, the sequence number the kernel's own: `symm/signature.cuh`); a team's
    /// carries none (its slots name team ranks, not the job's).
    fn params_of(&self, plan: &DevicePlan, channels: u32, key: &AdmitKey) -> InterpParams {
        let (team, req) = key;
        InterpParams {
            sig: if *team == 0 { req.signature(0).0 } else { 0 },
            sig_off: self.sig_off(),
            calls: self.expected.ptr + self.flag_off(),
            plan: plan.ops.ptr,
            chan_start: plan.chan.ptr,
            base: self.heap.base(),
            stride: self.heap.stride,
            buf_off: [0; 3],
            pad_off: 0,
            expected: self.expected.ptr,
            mc_base: 0,
            records: self.host.dev + ABORT_BYTES as u64,
            abort_word: self.host.dev,
            trace: 0,
            trace_len: 0,
            timeout_ns: self.deadline_ns(),
            rank: self.job.rank as u32,
            world: self.job.world as u32,
            channels,
            trace_cap: 0,
        }
    }

    /// Every device wait's deadline in nanoseconds (scaled when the GPU is time sliced).
    pub(super) fn deadline_ns(&self) -> u64 {
        self.job
            .sharing
            .deadline(self.opts.timeout)
            .as_nanos()
            .min(u64::MAX as u128) as u64
    }
}

#[cfg(test)]
mod tests;

//! The plan cache: every plan a Comm built, world or team, kept for the Comm's life (so none
//! goes while a launch may still read it), and the background compiler that turns small plans
//! into their own kernels while the interpreter runs them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use symm_core::sched::Request;

use super::admit::{AdmitKey, Executor};
use super::Comm;
use crate::cuda::compile::Compiler;
use crate::cuda::compiled::PlanPath;
use crate::cuda::copy_engine::CopyEngine;
use crate::cuda::device;
use crate::cuda::device_plan::DevicePlan;
use crate::cuda::error::{CudaError, Result};
use crate::cuda::plan::RankPlan;

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

/// A Comm's plans and what builds them. Field order is teardown order: the background
/// compiler stops before the plans go.
pub(crate) struct PlanCache {
    /// The queue of the background plan compiler (started on first use; it ends when the
    /// cache drops the sender). Plans run interpreted until their compiled kernel is ready.
    compiling: Mutex<Option<PlanCompiler>>,
    /// Plans by (team id, request, on copy engines).
    plans: Mutex<HashMap<(u16, Request, bool), Arc<DevicePlan>>>,
    /// NVRTC, for compiled plans ([`crate::cuda::compiled`]).
    compiler: Arc<Compiler>,
    /// The copy-engine option in force ([`CopyEngine::code`]; [`Comm::set_copy_engine`]).
    engines: AtomicU8,
}

impl PlanCache {
    pub(super) fn new(compiler: Compiler, engines: CopyEngine) -> PlanCache {
        PlanCache {
            compiling: Mutex::new(None),
            plans: Mutex::new(HashMap::new()),
            compiler: Arc::new(compiler),
            engines: AtomicU8::new(engines.code()),
        }
    }

    /// The copy-engine option in force.
    pub(super) fn engines(&self) -> CopyEngine {
        CopyEngine::from_code(self.engines.load(Ordering::Relaxed))
    }

    pub(super) fn set_engines(&self, ce: CopyEngine) {
        self.engines.store(ce.code(), Ordering::Relaxed);
    }

    pub(super) fn compiler(&self) -> &Compiler {
        &self.compiler
    }

    /// The cached plan under `key`, else `None` (a poisoned lock still holds good plans).
    fn get(&self, key: &(u16, Request, bool)) -> Option<Arc<DevicePlan>> {
        self.plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .cloned()
    }
}

impl Comm {
    /// The plan cached under `key` (team id, request), else `build`'s, validated against this
    /// job, the pad and the request's buffer sizes, uploaded and cached; and its executor, the
    /// one place it is decided ([`Executor::choose`]). Every plan stays in the cache as long as the `Comm`, so none goes while a
    /// launch may still read it. A plan that runs compiled is compiled at once when forced or
    /// when `now` (a preparation), else in the background while the interpreter runs it.
    pub(super) fn cached_plan(
        &self,
        key: AdmitKey,
        now: bool,
        build: impl FnOnce() -> Result<RankPlan>,
    ) -> Result<(Arc<DevicePlan>, Executor)> {
        let engines = self.plans.engines().takes(&key.1);
        let full = (key.0, key.1, engines);
        let path = self.opts.plans;
        if let Some(p) = self.plans.get(&full) {
            let exec = Executor::choose(engines, path, p.compiled_ops());
            if now && path == PlanPath::Auto && exec == Executor::Compiled {
                // Prepared: a plan the background compiler has not finished yet is compiled
                // now (forced mode compiled it when it was built; a plan that does not compile
                // stays interpreted, as in the background).
                let _ = p.compile(self.plans.compiler(), &self.dev, false);
            }
            return Ok((p, exec));
        }
        let host = build()?;
        let sizes = key.1.buffer_sizes();
        host.validate(self.job.rank, self.job.world, &sizes, self.pad_slots, false)?;
        let mut p = DevicePlan::upload(&self.dev, host, sizes, (self.job.id, self.job.rank))?;
        let exec = Executor::choose(engines, path, p.compiled_ops());
        if engines {
            p = p.on_copy_engines()?;
        }
        let p = Arc::new(p);
        if exec == Executor::Compiled {
            if path == PlanPath::Compiled {
                // Forced: compiled now, and a plan that does not compile is an error.
                p.compile(self.plans.compiler(), &self.dev, false)?;
            } else if now {
                // Auto, prepared: compiled now; a plan that does not compile stays interpreted.
                let _ = p.compile(self.plans.compiler(), &self.dev, false);
            } else {
                // Auto: the interpreter runs it until the compiled kernel is ready (compiling
                // takes about a second; a plan that does not compile stays interpreted).
                self.compile_later(p.clone());
            }
        }
        self.plans
            .plans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(full, p.clone());
        Ok((p, exec))
    }

    /// The cached plan under `key`, which a capture needs to exist already.
    pub(super) fn prepared(&self, key: AdmitKey) -> Result<Arc<DevicePlan>> {
        let full = (key.0, key.1, self.plans.engines().takes(&key.1));
        self.plans.get(&full).ok_or(CudaError::NotPrepared)
    }

    /// Queues `plan` for the background compiler, starting it on first use.
    fn compile_later(&self, plan: Arc<DevicePlan>) {
        let mut q = self
            .plans
            .compiling
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if q.is_none() {
            let (tx, rx) = std::sync::mpsc::channel::<Arc<DevicePlan>>();
            let compiler = self.plans.compiler.clone();
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

    /// Admits `reqs` now ([`Comm::admit`]), and for each whose plan runs compiled (auto: plans
    /// whose kernel holds at most [`crate::cuda::compiled::AUTO_COMPILED_OPS`] ops, one channel
    /// of each shape) compiles its kernel now too: the
    /// kernels on several threads first (into the kernel cache, from which the preparation then
    /// loads them), a fraction of a second to seconds of NVRTC per plan the first time, then
    /// the disk cache. The first [`Comm::enqueue`] of a request builds the plan otherwise, with
    /// the interpreter running it until a background compile ends. Building allocates device
    /// memory, which stream capture forbids: call this before capturing a request's first
    /// launch in a CUDA graph, and the graph holds the compiled kernel, not the interpreter.
    /// Not collective.
    pub fn prepare(&self, reqs: &[Request]) -> Result<()> {
        let _g = self.enter_any()?;
        if reqs.len() > 1 {
            self.compile_ahead(reqs, |r| {
                (r.world == self.job.world)
                    .then(|| RankPlan::schedule(r, self.job.rank).ok())
                    .flatten()
            });
        }
        for r in reqs {
            self.check_shape(r, self.job.world)?;
            self.admit_checked((0, *r), self.buffer_area(), true, || {
                RankPlan::schedule(r, self.job.rank)
            })?;
        }
        Ok(())
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
        let engines = self.plans.engines();
        let todo: Vec<RankPlan> = reqs
            .iter()
            .filter(|r| !engines.takes(r))
            .filter_map(|r| {
                let p = build(r)?;
                p.validate(
                    self.job.rank,
                    self.job.world,
                    &r.buffer_sizes(),
                    self.pad_slots,
                    false,
                )
                .ok()?;
                // What its admission will decide ([`Executor::choose`]).
                let ops = crate::cuda::compiled::compiled_ops(&p);
                let exec = Executor::choose(engines.takes(r), self.opts.plans, ops);
                (exec == Executor::Compiled).then_some(p)
            })
            .collect();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = (cores / self.job.sharing.ranks_on_device.max(1) as usize).clamp(1, 16);
        let next = std::sync::atomic::AtomicUsize::new(0);
        let arch = self.dev.arch();
        std::thread::scope(|s| {
            for _ in 0..threads.min(todo.len()) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(p) = todo.get(i) else { break };
                    // A plan that fails here fails again, with its error, when prepared.
                    let _ = crate::cuda::compiled::cubin(self.plans.compiler(), arch, p, false);
                });
            }
        });
    }
}

//! Traced runs: a collective run by the traced interpreter (or its plan's traced compiled
//! kernel, or timed op by op on copy engines), returning this rank's part of the trace.
//!
//! A [`Tracer`] owns the traced kernel and its buffers (`trace_cap` events per channel, from
//! [`crate::cuda::CommOptions::trace_cap`]); it is made from the [`Comm`] it traces
//! ([`Tracer::load`]) and launches through the Comm's admission like every other call.

use symm_core::sched::{Request, MAX_CHANNELS};

use super::admit::{Executor, TraceTarget};
use super::Comm;
use crate::cuda::bounds::Buffers;
use crate::cuda::compile::{self, Compiler};
use crate::cuda::copy_engine;
use crate::cuda::device::{self, DevBuf, Stream};
use crate::cuda::error::{CudaError, Result};
use crate::cuda::launch::{Kernel, EVENT_BYTES};
use crate::cuda::trace;

/// Most ops of a traced plan on copy engines (each takes a timing event).
const MAX_MARKS: usize = 1 << 14;

/// The traced interpreter of one Comm and its buffers (see the module doc).
pub struct Tracer {
    /// The Comm it was loaded for (`device_plan::next_owner`).
    owner: u64,
    kernel: Kernel,
    events: DevBuf,
    lens: DevBuf,
    cap: u32,
    /// Timing events around the ops of a plan on copy engines (one before, one after each op).
    marks: Vec<device::Event>,
}

impl Tracer {
    /// Compiles (or finds in the kernel cache) and loads the traced interpreter on `comm`'s
    /// device, with room for `trace_cap` events per channel.
    pub fn load(comm: &Comm) -> Result<Tracer> {
        let _g = comm.enter_any()?;
        let compiler = Compiler::load(comm.opts.nvrtc.as_deref())?;
        let drv = device::driver_version()?;
        let (cubin, _) =
            compile::cubin(&compiler, &symm_kernels::INTERP_TRACE, comm.dev.arch, drv)?;
        let cap = comm.opts.trace_cap.clamp(1, 1 << 20);
        Ok(Tracer {
            owner: comm.job.id,
            kernel: Kernel::load(&comm.dev, &cubin, symm_kernels::INTERP_ENTRY)?,
            events: DevBuf::zeroed(
                &comm.dev,
                cap as usize * MAX_CHANNELS as usize * EVENT_BYTES,
            )?,
            lens: DevBuf::zeroed(&comm.dev, MAX_CHANNELS as usize * 4)?,
            cap,
            marks: Vec::new(),
        })
    }

    /// Runs `req` over `b` on `stream` traced, waits for it and returns this rank's part of the
    /// trace (absolute GPU timer values; [`trace::merge`] joins the ranks' parts). Collective:
    /// every rank calls it for the same request.
    pub fn run(
        &mut self,
        comm: &Comm,
        req: &Request,
        b: &Buffers,
        stream: &Stream,
    ) -> Result<Vec<u8>> {
        if self.owner != comm.job.id {
            return Err(CudaError::WrongOwner { what: "the tracer" });
        }
        let _g = comm.enter_on(stream)?;
        self.lens.fill(0)?;
        let a = comm.admit(req)?;
        let plan = a.plan_arc().clone();
        if a.executor() == Executor::Compiled && plan.compiled(false).is_some() {
            plan.compile(comm.plans.compiler(), &comm.dev, true)?;
        }
        let ce_ops = plan
            .flags()
            .map(|f| f.channels().iter().map(Vec::len).sum::<usize>());
        if let Some(n) = ce_ops {
            if n + 1 > MAX_MARKS {
                return Err(CudaError::TraceOverflow);
            }
            while self.marks.len() < n + 1 {
                self.marks.push(device::Event::new(&comm.dev)?);
            }
        }
        let target = TraceTarget {
            kernel: &self.kernel,
            events: self.events.ptr,
            lens: self.lens.ptr,
            cap: self.cap,
            marks: &self.marks,
        };
        comm.launch_entered(&a, (b, [false; 2]), stream, None, Some(&target))?;
        comm.synchronize(stream)?;
        let per = match plan.flags() {
            Some(f) => copy_engine::raw_events(f, &self.marks)?,
            None => {
                let (per, overflow) = trace::read_rank(
                    &self.events,
                    &self.lens,
                    self.cap as usize,
                    plan.host.channels(),
                )?;
                if overflow {
                    return Err(CudaError::TraceOverflow);
                }
                per
            }
        };
        let mut events = Vec::new();
        trace::to_events(comm.job.rank, &plan.host, &per, &mut events);
        trace::encode(
            &trace::header(req, std::slice::from_ref(&comm.dev.name)),
            &mut events,
        )
    }
}

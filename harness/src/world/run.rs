//! Launching plans, waiting for them, graphs and timing.

use super::*;
use crate::cuda::records::first_failure;

impl World {
    fn params(&self, r: u16, p: &DevicePlan, b: &Buffers, trace: bool) -> Result<InterpParams> {
        let k = self.rank(r)?;
        Ok(InterpParams {
            plan: p.device_ops().0,
            chan_start: p.device_ops().1,
            base: k.heap.base(),
            stride: k.heap.stride,
            buf_off: [b.input, b.output, b.scratch],
            pad_off: 0,
            expected: k.expected.ptr(),
            mc_base: 0,
            records: self.host.dev()
                + (ABORT_BYTES + r as usize * MAX_CHANNELS as usize * RECORD_BYTES) as u64,
            abort_word: self.host.dev(),
            trace: if trace { k.trace.ptr() } else { 0 },
            trace_len: if trace { k.trace_len.ptr() } else { 0 },
            timeout_ns: self.opts.timeout.as_nanos().min(u64::MAX as u128) as u64,
            rank: r as u32,
            world: self.world as u32,
            channels: p.host().channels() as u32,
            trace_cap: self.opts.trace_cap,
            // One process drives every rank: no call can differ, so no signature check.
            sig: 0,
            sig_off: 0,
            calls: 0,
        })
    }

    pub(super) fn reset_records(&self) {
        self.host.zero_all();
    }

    fn enqueue(&self, r: u16, p: &DevicePlan, b: &Buffers, trace: bool) -> Result<()> {
        let k = self.rank(r)?;
        let channels = p.host().channels() as u32;
        if channels == 0 {
            return Ok(());
        }
        let params = self.params(r, p, b, trace)?;
        k.dev.bind()?;
        let kern = if trace { &k.interp_trace } else { &k.interp };
        // SAFETY: `InterpParams` mirrors `symm_interp_params`; the plan, heap, counters, records
        // and trace buffers it names are alive for the launch (owned by `self` and `p`), and the
        // plan was validated against this world, these buffer sizes and the pad.
        unsafe { kern.launch(&k.stream, channels, symm_kernels::INTERP_THREADS, &params) }
    }

    /// Checks the buffers and enqueues every rank's plan (launch lock held). A failure after
    /// some ranks were launched poisons the world: those ranks wait for signals that will not
    /// come and stop at their deadline.
    fn launch_locked(&self, plans: &[DevicePlan], b: &Buffers, trace: bool) -> Result<()> {
        self.check_plans(plans, b)?;
        self.reset_records();
        if trace {
            for k in &self.ranks {
                k.trace_len.fill(0)?;
            }
        }
        self.enqueue_all(plans, b, trace)
    }

    fn enqueue_all(&self, plans: &[DevicePlan], b: &Buffers, trace: bool) -> Result<()> {
        for (r, p) in plans.iter().enumerate() {
            if let Err(e) = self.enqueue(r as u16, p, b, trace) {
                if r > 0 {
                    self.poison(&e);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Launches plans on every rank without waiting (`wait` completes them). The buffers must
    /// be at least the sizes the plans were validated for and lie in the heap's buffer area.
    pub fn launch(&self, plans: &[DevicePlan], b: &Buffers, trace: bool) -> Result<()> {
        let _ctx = device::keep_current()?;
        let _g = self.launch_lock()?;
        self.launch_locked(plans, b, trace)
    }

    /// Launches plans without resetting records (back-to-back timing).
    pub fn launch_again(&self, plans: &[DevicePlan], b: &Buffers) -> Result<()> {
        let _ctx = device::keep_current()?;
        let _g = self.launch_lock()?;
        self.check_plans(plans, b)?;
        self.enqueue_all(plans, b, false)
    }

    /// Waits for every rank and turns timeout records into errors; any failure poisons the
    /// world until [`World::reset`].
    pub fn wait(&self) -> Result<()> {
        let _ctx = device::keep_current()?;
        let mut first = None;
        for k in &self.ranks {
            if let Err(e) = k.stream.synchronize() {
                first.get_or_insert(e);
            }
        }
        let r = match first {
            Some(e) => Err(e),
            None => self.check_records(),
        };
        if let Err(e) = &r {
            self.poison(e);
        }
        r
    }

    fn check_records(&self) -> Result<()> {
        let ats = (0..self.world as usize * MAX_CHANNELS as usize)
            .map(|k| ABORT_BYTES + k * RECORD_BYTES);
        first_failure(&self.host, ats).map_or(Ok(()), Err)
    }

    /// Runs a collective request to completion (plans cached).
    pub fn run(&self, req: &Request, b: &Buffers, trace: bool) -> Result<()> {
        let _ctx = device::keep_current()?;
        let plans = self.plans(req)?;
        {
            let _g = self.launch_lock()?;
            self.launch_locked(&plans, b, trace)?;
        }
        self.wait()
    }

    /// Captures one launch of a request's plans per rank into CUDA graphs. The capture borrows
    /// the world, and `free` refuses its buffers while it lives.
    pub fn capture(&self, req: &Request, b: &Buffers) -> Result<Captured<'_>> {
        let _ctx = device::keep_current()?;
        let plans = self.plans(req)?;
        let _g = self.launch_lock()?;
        self.check_plans(&plans, b)?;
        let mut graphs = Vec::with_capacity(self.ranks.len());
        for (r, p) in plans.iter().enumerate() {
            let k = &self.ranks[r];
            graphs.push(Graph::capture(&k.dev, &k.stream, || {
                self.enqueue(r as u16, p, b, false)
            })?);
        }
        *self
            .captured
            .lock()
            .map_err(|_| CudaError::LockPoisoned {
                what: "capture registry",
            })?
            .entry(b.input)
            .or_insert(0) += 1;
        Ok(Captured {
            world: self,
            graphs,
            buffers: *b,
        })
    }

    /// Replays captured graphs once on every rank and waits.
    pub fn replay(&self, captured: &Captured<'_>) -> Result<()> {
        let _ctx = device::keep_current()?;
        if !std::ptr::eq(captured.world, self) {
            return Err(CudaError::WrongOwner {
                what: "the captured graphs",
            });
        }
        {
            let _g = self.launch_lock()?;
            self.reset_records();
            for (g, k) in captured.graphs.iter().zip(&self.ranks) {
                // SAFETY: `captured` borrows this world and pins its buffers (`free` refuses
                // them), its plans are held by the plan cache, and `k.stream` is its rank's.
                unsafe { g.replay(&k.stream)? };
            }
        }
        self.wait()
    }

    /// Mean microseconds per launch of `req` over `iters` back-to-back launches (after `warmup`),
    /// the slowest rank's events.
    pub fn time(&self, req: &Request, b: &Buffers, warmup: u32, iters: u32) -> Result<f64> {
        let _ctx = device::keep_current()?;
        let plans = self.plans(req)?;
        self.launch(&plans, b, false)?;
        for _ in 1..warmup.max(1) {
            self.launch_again(&plans, b)?;
        }
        self.wait()?;
        let ev: Vec<(Event, Event)> = self
            .ranks
            .iter()
            .map(|k| Ok((Event::new(&k.dev)?, Event::new(&k.dev)?)))
            .collect::<Result<_>>()?;
        for (k, (s, _)) in self.ranks.iter().zip(&ev) {
            s.record(&k.stream)?;
        }
        for _ in 0..iters.max(1) {
            self.launch_again(&plans, b)?;
        }
        for (k, (_, e)) in self.ranks.iter().zip(&ev) {
            e.record(&k.stream)?;
        }
        self.wait()?;
        let mut worst = 0f64;
        for (s, e) in &ev {
            worst = worst.max(s.elapsed_ms(e)? as f64);
        }
        Ok(worst * 1000.0 / iters.max(1) as f64)
    }
}

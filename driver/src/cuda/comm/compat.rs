//! The Comm methods the Python and C bindings call today, kept with their signatures over the
//! new core and features. They go once the bindings move to the new API: a binding then holds
//! its [`Tensors`] (and loads its [`Signals`]) beside its Comm, and calls the features and
//! [`Comm::memory`] directly. Each method names what it maps to.
//!
//! The feature state behind them ([`Legacy`]) is the one field of [`Comm`] that is not core,
//! and goes with them.

use std::sync::{Mutex, OnceLock};

use symm_core::cost::{self, Topology};
use symm_core::moe::{Mode, MoeConfig};
use symm_core::sched::Request;

use super::{A2avLayer, Comm, MoeLayer, MoeStatus, Signals, Span, Tensors, TokenType, Tracer};
use crate::cuda::bounds::Buffers;
use crate::cuda::device::Stream;
use crate::cuda::error::{CudaError, Result};

/// The features the compatibility methods use, made on first use.
#[derive(Default)]
pub(crate) struct Legacy {
    tensors: OnceLock<Tensors>,
    signals: OnceLock<Signals>,
    /// Serialises the signals kernel's first load (a capture must find it loaded).
    signals_loading: Mutex<()>,
    tracer: Mutex<Option<Tracer>>,
}

impl Legacy {
    fn tensors(&self, comm: &Comm) -> &Tensors {
        self.tensors.get_or_init(|| Tensors::new(comm))
    }

    fn signals(&self, comm: &Comm) -> Result<&Signals> {
        if let Some(s) = self.signals.get() {
            return Ok(s);
        }
        let _one = self
            .signals_loading
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(s) = self.signals.get() {
            return Ok(s);
        }
        let s = Signals::load(comm)?;
        Ok(self.signals.get_or_init(|| s))
    }

    /// A traced run of `req` ([`Tracer::run`]), the tracer loaded on first use.
    pub(super) fn trace(
        &self,
        comm: &Comm,
        req: &Request,
        b: &Buffers,
        stream: &Stream,
    ) -> Result<Vec<u8>> {
        comm.live()?;
        let mut slot = self
            .tracer
            .lock()
            .map_err(|_| CudaError::LockPoisoned { what: "trace" })?;
        let t = match &mut *slot {
            Some(t) => t,
            None => slot.insert(Tracer::load(comm)?),
        };
        t.run(comm, req, b, stream)
    }
}

/// Compatibility: what the bindings call today (see the module doc).
impl Comm {
    /// Compatibility: [`super::placement`].
    pub fn placement(local_rank: u16) -> Result<i32> {
        super::placement(local_rank)
    }

    /// Compatibility: `comm.buffer_area().1` (bytes of each rank's heap, signal pad included).
    pub fn stride(&self) -> u64 {
        self.buffer_area().1
    }

    /// Compatibility: `comm.memory().ptr(peer, off)`.
    pub fn ptr(&self, peer: u16, off: u64) -> Result<u64> {
        self.memory().ptr(peer, off)
    }

    /// Compatibility: `comm.sharing().topology()`.
    pub fn topology(&self) -> Topology {
        self.sharing().topology()
    }

    /// Compatibility: `cost::tune_on(req, comm.sharing().topology())`: `req` with symm's
    /// default algorithm and channels for this job.
    pub fn tuned(&self, req: Request) -> Request {
        cost::tune_on(req, self.topology()).0
    }

    /// Compatibility: [`Tensors::alloc_block`].
    pub fn alloc_block(&self, len: u64, stream: &Stream) -> Result<u64> {
        self.legacy.tensors(self).alloc_block(self, len, stream)
    }

    /// Compatibility: [`Tensors::release_block`].
    pub fn release_block(&self, off: u64) -> Result<()> {
        self.legacy.tensors(self).release_block(off)
    }

    /// Compatibility: [`Tensors::collect_blocks`].
    pub fn collect_blocks(&self) -> Result<usize> {
        self.legacy.tensors(self).collect_blocks(self)
    }

    /// Compatibility: [`Tensors::block_usage`].
    pub fn block_usage(&self) -> Result<(usize, u64)> {
        self.legacy.tensors(self).block_usage()
    }

    /// Compatibility: [`Tensors::ready`].
    pub fn spans_ready(&self, req: &Request, input: Span, output: Span) -> bool {
        self.legacy.tensors(self).ready(self, req, input, output)
    }

    /// Compatibility: [`Tensors::enqueue`].
    ///
    /// # Safety
    /// As [`Tensors::enqueue`].
    pub unsafe fn enqueue_spans(
        &self,
        req: &Request,
        input: Span,
        output: Span,
        stream: &Stream,
    ) -> Result<()> {
        // SAFETY: the caller's contract is `Tensors::enqueue`'s.
        unsafe {
            self.legacy
                .tensors(self)
                .enqueue(self, req, input, output, stream)
        }
    }

    /// Compatibility: [`Signals::load`].
    pub fn load_signals(&self) -> Result<()> {
        self.legacy.signals(self).map(|_| ())
    }

    /// Compatibility: [`Signals::put`] (the kernel loaded on first use, not while capturing).
    pub fn put_signal(
        &self,
        pad: u64,
        pad_len: u64,
        peer: u16,
        slot: u32,
        stream: &Stream,
    ) -> Result<()> {
        self.loaded_signals(stream)?
            .put(self, (pad, pad_len), peer, slot, stream)
    }

    /// Compatibility: [`Signals::wait`] (the kernel loaded on first use, not while capturing).
    pub fn wait_signal(
        &self,
        pad: u64,
        pad_len: u64,
        peer: u16,
        slot: u32,
        stream: &Stream,
    ) -> Result<()> {
        self.loaded_signals(stream)?
            .wait(self, (pad, pad_len), peer, slot, stream)
    }

    /// The legacy signals kernel; [`CudaError::NotPrepared`] when it is not loaded and `stream`
    /// captures (loading compiles and allocates).
    fn loaded_signals(&self, stream: &Stream) -> Result<&Signals> {
        if self.legacy.signals.get().is_none() {
            let _g = self.enter_on(stream)?;
            if stream.capturing_bound()? {
                return Err(CudaError::NotPrepared);
            }
        }
        self.legacy.signals(self)
    }

    /// Compatibility: [`MoeLayer::new`].
    pub fn moe_layer(&self, cfg: MoeConfig, ty: TokenType, stream: &Stream) -> Result<MoeLayer> {
        MoeLayer::new(self, self.legacy.tensors(self), cfg, ty, stream)
    }

    /// Compatibility: [`MoeLayer::dispatch`].
    ///
    /// # Safety
    /// As [`MoeLayer::dispatch`].
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn moe_dispatch(
        &self,
        layer: &MoeLayer,
        mode: Mode,
        tokens: u32,
        x: Span,
        idx: Span,
        weights: Span,
        stream: &Stream,
    ) -> Result<()> {
        let t = self.legacy.tensors(self);
        // SAFETY: the caller's contract is `MoeLayer::dispatch`'s.
        unsafe { layer.dispatch(self, t, mode, tokens, x, idx, weights, stream) }
    }

    /// Compatibility: [`MoeLayer::combine`].
    ///
    /// # Safety
    /// As [`MoeLayer::combine`].
    pub unsafe fn moe_combine(
        &self,
        layer: &MoeLayer,
        mode: Mode,
        expert_out: Span,
        out: Span,
        stream: &Stream,
    ) -> Result<()> {
        let t = self.legacy.tensors(self);
        // SAFETY: the caller's contract is `MoeLayer::combine`'s.
        unsafe { layer.combine(self, t, mode, expert_out, out, stream) }
    }

    /// Compatibility: [`MoeLayer::status`].
    pub fn moe_status(&self, layer: &MoeLayer) -> Result<MoeStatus> {
        layer.status(self)
    }

    /// Compatibility: [`A2avLayer::new`].
    pub fn a2av_layer(&self, elem: u64, out_max: u64, stream: &Stream) -> Result<A2avLayer> {
        A2avLayer::new(self, self.legacy.tensors(self), elem, out_max, stream)
    }

    /// Compatibility: [`A2avLayer::enqueue`].
    ///
    /// # Safety
    /// As [`A2avLayer::enqueue`].
    pub unsafe fn all_to_allv_device(
        &self,
        layer: &A2avLayer,
        send_counts: Span,
        input: Span,
        recv_counts: Span,
        stream: &Stream,
    ) -> Result<()> {
        let t = self.legacy.tensors(self);
        // SAFETY: the caller's contract is `A2avLayer::enqueue`'s.
        unsafe { layer.enqueue(self, t, send_counts, input, recv_counts, stream) }
    }

    /// Compatibility: [`A2avLayer::dropped`].
    pub fn a2av_dropped(&self, layer: &A2avLayer) -> Result<u32> {
        layer.dropped(self)
    }
}

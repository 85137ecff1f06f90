//! MoE dispatch and combine on the GPU, and the all-to-allv whose counts stay on the device
//! (`kernels/symm/moe.cu`; the layout and protocol are `symm_core::moe`'s).
//!
//! * **A layer** ([`MoeLayer::new`], collective) holds one symmetric block sized from a
//!   [`MoeConfig`]: two halves of staging rows and tagged header words for dispatch and for
//!   combine, and this rank's local state (epochs, routing slots, combine metadata, the expert
//!   rows and their spans). It is zeroed and the ranks meet before any kernel writes into it.
//! * **No host synchronisation.** [`MoeLayer::dispatch`] and [`MoeLayer::combine`] read the
//!   routing, the weights and the tokens where the user's kernels wrote them, exchange counts
//!   through the tagged headers and compute every offset on the device. The epoch lives in the
//!   layer's state, so a captured graph replays them as they are.
//! * **Modes.** [`Mode::LowLatency`] is one kernel per call with a few blocks (at most
//!   [`LL_MAX_TOKENS`] tokens); [`Mode::Normal`] a send kernel and a receive kernel with many
//!   blocks. Results are the same.
//! * **Bounds.** Token counts are checked on the host; expert indices and peers' counts on the
//!   device, where invalid indices are skipped and rows past `rows_max` dropped, both counted
//!   ([`MoeLayer::status`]). Every user span is checked to lie in one device allocation of
//!   this rank's context, with exactly the bytes the shape needs.
//! * The all-to-allv with device counts (`a2av.rs`) shares the regions' carving, the span
//!   checks and the timeout record with these layers.

use std::sync::Arc;

use symm_core::moe::{Mode, MoeConfig};

use symm_core::cost::Topology;

use super::{Comm, Tensors};
use crate::cuda::compile::{self, Compiler};
use crate::cuda::device::{self, Stream};
use crate::cuda::error::{CudaError, Result};
use crate::cuda::launch::Kernel;
use crate::cuda::Span;
// `symm_moe_params`, defined once in the kernels' ABI.
use symm_kernels::abi::MoeParams as Params;

/// Most experts a layer may have on the GPU (routing counts live in shared memory).
pub const MAX_GPU_EXPERTS: u32 = 4096;
pub(super) const STATE_WORDS: u64 = 16;
pub(super) const THREADS: u32 = symm_kernels::MOE_THREADS;
/// State word indices (`SYMM_MOE_*` in moe.cu).
const INVALID: u64 = 4;
pub(super) const DROPPED: u64 = 5;

/// The element type of tokens and expert outputs: the host reference's
/// ([`crate::host::moe::MoeDtype`]).
pub type TokenType = crate::host::moe::MoeDtype;

fn elem(ty: TokenType) -> u64 {
    ty.bytes() as u64
}

/// What the device found since the last [`MoeLayer::status`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MoeStatus {
    /// Expert indices at or past the number of experts (skipped).
    pub invalid: u32,
    /// Expert rows past `rows_max`, or all-to-allv elements past the output (dropped).
    pub dropped: u32,
}

/// Heap offsets of a layer's regions (`symm_moe_params` in moe.cu).
#[derive(Clone, Copy, Debug, Default)]
struct Regions {
    hdr: u64,
    chdr: u64,
    stage: u64,
    cstage: u64,
    state: u64,
    slots: u64,
    cin: u64,
    cmeta: u64,
    totals: u64,
    xout: u64,
    spans: u64,
}

/// One MoE layer's symmetric block on this rank (see the module doc).
#[derive(Debug)]
pub struct MoeLayer {
    owner: u64,
    /// Most blocks of one of its kernels ([`MoeLayer::set_sms`]; 0: the default).
    sms: std::sync::atomic::AtomicU32,
    cfg: MoeConfig,
    ty: TokenType,
    block: u64,
    len: u64,
    at: Regions,
    kernels: Arc<MoeKernels>,
    /// Tokens of the last dispatch (combine returns that many).
    tokens: std::sync::atomic::AtomicU32,
}

/// The loaded kernels of `moe.cu`.
pub(crate) struct MoeKernels {
    dispatch: Kernel,
    combine: Kernel,
}

impl std::fmt::Debug for MoeKernels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MoeKernels")
    }
}

use super::moe_grid::{self, RECV, SEND};

/// A region list laid out from `base`, each 256-byte aligned.
pub(super) struct Carve {
    pub(super) at: u64,
}

impl Carve {
    pub(super) fn take(&mut self, bytes: u64) -> Result<u64> {
        let start = self.at.div_ceil(256) * 256;
        self.at = start.checked_add(bytes).ok_or(CudaError::Overflow {
            what: "MoE layer size",
        })?;
        Ok(start)
    }
}

fn regions(cfg: &MoeConfig, ty: TokenType) -> Result<(Regions, u64)> {
    let (w, l) = (u64::from(cfg.world), u64::from(cfg.local_experts()));
    let rows = cfg.stage_rows();
    let mut c = Carve { at: 0 };
    let at = Regions {
        hdr: c.take(2 * w * (1 + l) * 8)?,
        chdr: c.take(2 * w * 8)?,
        stage: c.take(2 * rows * cfg.row_bytes(elem(ty)))?,
        cstage: c.take(2 * rows * cfg.partial_bytes())?,
        state: c.take(STATE_WORDS * 4)?,
        slots: c.take(u64::from(cfg.tokens_max) * w * 4)?,
        cin: c.take(w * 4)?,
        cmeta: c.take(rows * u64::from(cfg.topk) * 8)?,
        totals: c.take((w + u64::from(cfg.experts)) * 4)?,
        xout: c.take(u64::from(cfg.rows_max) * u64::from(cfg.hidden) * elem(ty))?,
        spans: c.take(l * 8)?,
    };
    Ok((at, c.at))
}

/// Compiles (or finds in the cache) and loads `moe.cu` on `comm`'s device.
fn kernels(comm: &Comm) -> Result<Arc<MoeKernels>> {
    let compiler = Compiler::load(comm.opts.nvrtc.as_deref())?;
    let drv = device::driver_version()?;
    let (cubin, _) = compile::cubin(&compiler, &symm_kernels::MOE, comm.dev.arch, drv)?;
    Ok(Arc::new(MoeKernels {
        dispatch: Kernel::load(&comm.dev, &cubin, symm_kernels::MOE_DISPATCH_ENTRY)?,
        combine: Kernel::load(&comm.dev, &cubin, symm_kernels::MOE_COMBINE_ENTRY)?,
    }))
}

/// Refuses (with [`CudaError::Capturing`]) while `stream` captures a graph: making a layer
/// loads kernels, zeroes memory and waits for the peers, none of which a capture allows.
pub(super) fn refuse_capture(stream: &Stream, what: &'static str) -> Result<()> {
    if stream.is_capturing()? {
        return Err(CudaError::Capturing { what });
    }
    Ok(())
}

impl Tensors {
    /// Collective, not while capturing: allocates and zeroes a block of `len` bytes on every
    /// rank, and returns once every rank's block is zeroed (so no peer's first write is lost).
    pub(super) fn zeroed_block(&self, comm: &Comm, len: u64, stream: &Stream) -> Result<u64> {
        // `alloc_block` goes on during a capture; zeroing and waiting for the peers cannot.
        refuse_capture(stream, "a layer's zeroed block")?;
        let block = self.alloc_block(comm, len, stream)?;
        comm.heap_fill(block, len, 0)?;
        comm.dev.synchronize()?;
        comm.exchange(b"moe layer zeroed")?;
        Ok(block)
    }
}

impl MoeLayer {
    /// Collective: a layer for `cfg` with tokens of type `ty` (compiles the kernels on first
    /// use; not while `stream` captures a graph).
    pub fn new(
        comm: &Comm,
        tensors: &Tensors,
        cfg: MoeConfig,
        ty: TokenType,
        stream: &Stream,
    ) -> Result<MoeLayer> {
        tensors.own(comm)?;
        let _g = comm.enter()?;
        refuse_capture(stream, "a MoE layer")?;
        let cfg = cfg.checked().map_err(CudaError::Moe)?;
        if cfg.world != comm.job.world {
            return Err(CudaError::SizeMismatch {
                what: "ranks in the MoE shape",
                have: u64::from(cfg.world),
                want: u64::from(comm.job.world),
            });
        }
        if cfg.experts > MAX_GPU_EXPERTS {
            return Err(CudaError::TooLarge {
                what: "experts of a GPU MoE layer",
                size: u64::from(cfg.experts),
                limit: u64::from(MAX_GPU_EXPERTS),
            });
        }
        let (rel, len) = regions(&cfg, ty)?;
        let kernels = kernels(comm)?;
        let block = tensors.zeroed_block(comm, len, stream)?;
        let shift = |o: u64| block + o;
        let at = Regions {
            hdr: shift(rel.hdr),
            chdr: shift(rel.chdr),
            stage: shift(rel.stage),
            cstage: shift(rel.cstage),
            state: shift(rel.state),
            slots: shift(rel.slots),
            cin: shift(rel.cin),
            cmeta: shift(rel.cmeta),
            totals: shift(rel.totals),
            xout: shift(rel.xout),
            spans: shift(rel.spans),
        };
        Ok(MoeLayer {
            owner: comm.job.id,
            sms: std::sync::atomic::AtomicU32::new(0),
            cfg,
            ty,
            block,
            len,
            at,
            kernels,
            tokens: std::sync::atomic::AtomicU32::new(0),
        })
    }

    /// The checks every dispatch and combine makes first; returns the layer's shape.
    fn call(&self, comm: &Comm, tensors: &Tensors, mode: Mode, tokens: u32) -> Result<MoeConfig> {
        self.own(comm)?;
        tensors.own(comm)?;
        tensors.block_in_use(self.block)?;
        self.cfg
            .check_tokens(tokens, mode)
            .map_err(CudaError::Moe)?;
        Ok(self.cfg)
    }

    fn own(&self, comm: &Comm) -> Result<()> {
        if self.owner != comm.job.id {
            return Err(CudaError::WrongOwner {
                what: "the MoE layer",
            });
        }
        Ok(())
    }
}

impl Comm {
    /// Checks a user span: exactly `want` bytes, aligned to `align` (its elements), in this
    /// rank's buffer area or in one device allocation of this context.
    pub(super) fn moe_span(
        &self,
        what: &'static str,
        s: Span,
        want: u64,
        align: u64,
    ) -> Result<()> {
        if !s.ptr.is_multiple_of(align) {
            return Err(CudaError::Misaligned {
                what,
                offset: s.ptr,
                align,
            });
        }
        if s.len != want {
            return Err(CudaError::SizeMismatch {
                what,
                have: s.len,
                want,
            });
        }
        if want > 0 && self.heap_offset(s).is_none() {
            self.check_device_span(s)?;
        }
        Ok(())
    }
}

impl MoeLayer {
    fn params(&self, comm: &Comm, tokens: u32) -> Params {
        let (c, a) = (&self.cfg, &self.at);
        Params {
            w: comm.symm_world(),
            at: [
                a.hdr, a.chdr, a.stage, a.cstage, a.state, a.slots, a.cin, a.cmeta, a.totals,
                a.xout, a.spans,
            ],
            x: 0,
            idx: 0,
            weights: 0,
            expert_out: 0,
            out: 0,
            row_bytes: c.row_bytes(elem(self.ty)),
            data_bytes: c.data_bytes(elem(self.ty)),
            pbytes: c.partial_bytes(),
            deadline_ns: comm.deadline_ns(),
            record: comm.record_addr(),
            tokens,
            tokens_max: c.tokens_max,
            hidden: c.hidden,
            topk: u32::from(c.topk),
            experts: c.experts,
            local: c.local_experts(),
            rows_max: c.rows_max,
            elem: elem(self.ty) as u32,
            phase: 0,
            pad: 0,
        }
    }

    /// Launches `kernel` once per phase list entry: `(phase, blocks)`.
    #[allow(clippy::too_many_arguments)]
    fn launch(
        &self,
        comm: &Comm,
        tensors: &Tensors,
        kernel: &Kernel,
        mut p: Params,
        launches: &[(u32, u32)],
        smem: u32,
        stream: &Stream,
    ) -> Result<()> {
        if stream.capturing_bound()? {
            tensors.pin_to_capture(stream, &[(self.block, self.len)])?;
        }
        let _order = comm.launch_lock()?;
        for &(phase, blocks) in launches {
            p.phase = phase;
            // SAFETY: `Params` is `symm_moe_params` field for field; every heap offset lies in
            // the layer's block (checked against the buffer area when the layer was made and
            // owned by this Comm), the user spans were checked to lie in device allocations of
            // this context with the bytes the shape needs, and the kernel bounds every index
            // it reads from memory by the shape. The context is bound by the caller's guard.
            let r = unsafe { kernel.launch_smem(stream, blocks, THREADS, smem, &p) };
            if let Err(e) = &r {
                comm.poison.raise(e);
                return r;
            }
        }
        Ok(())
    }

    /// Caps the blocks (one per SM) of this layer's later kernels at `sms`, as DeepEP's
    /// `num_sms` does, leaving the other SMs to overlapping work; 0 restores the default (a
    /// waiting block per four tokens of the call, at least 16, at most one per SM of its own
    /// GPU or of its share when ranks share it: see `moe_grid`). Local to this rank: the
    /// kernels work with any grid. Calls already enqueued or captured keep their grids.
    pub fn set_sms(&self, sms: u32) {
        self.sms.store(sms, std::sync::atomic::Ordering::Relaxed);
    }

    /// `(phase, blocks)` per launch (see [`moe_grid`]).
    fn grids(&self, comm: &Comm, mode: Mode, tokens: u32) -> Vec<(u32, u32)> {
        let cfg = &self.cfg;
        let gpu = moe_grid::Gpu {
            sms: comm
                .dev
                .attribute(crate::cuda::ffi::driver::ATTR_SM_COUNT)
                .map_or(64, |n| u32::try_from(n).unwrap_or(1)),
            shared: comm.job.sharing.time_sliced()
                || comm.job.sharing.topology() == Topology::SharedDevice,
            world: u32::from(cfg.world),
        };
        let rows = u32::try_from(cfg.stage_rows()).unwrap_or(u32::MAX);
        let cap = self.sms.load(std::sync::atomic::Ordering::Relaxed);
        moe_grid::grids(mode, tokens, rows, gpu, cap)
    }

    /// Enqueues a dispatch of `tokens` tokens on `stream`: `x` holds `tokens x hidden`
    /// elements, `idx` `tokens x topk` i64 expert indices, `weights` `tokens x topk` f32. The
    /// expert rows land in the layer ([`MoeLayer::expert_rows`], spans at
    /// [`MoeLayer::spans_ptr`]). Collective: every rank dispatches on the layer in the same
    /// order; token counts may differ.
    ///
    /// # Safety
    /// The spans must stay allocated and unchanged until the enqueued work has finished, as for
    /// any copy the caller enqueues on `stream`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn dispatch(
        &self,
        comm: &Comm,
        tensors: &Tensors,
        mode: Mode,
        tokens: u32,
        x: Span,
        idx: Span,
        weights: Span,
        stream: &Stream,
    ) -> Result<()> {
        let _g = comm.enter_on(stream)?;
        let c = self.call(comm, tensors, mode, tokens)?;
        let t = u64::from(tokens);
        let es = elem(self.ty);
        comm.moe_span("token bytes", x, t * u64::from(c.hidden) * es, 1)?;
        comm.moe_span("expert index bytes", idx, t * u64::from(c.topk) * 8, 8)?;
        comm.moe_span("weight bytes", weights, t * u64::from(c.topk) * 4, 4)?;
        let mut p = self.params(comm, tokens);
        (p.x, p.idx, p.weights) = (x.ptr, idx.ptr, weights.ptr);
        let w = u32::from(c.world);
        let chunk = symm_kernels::MOE_CHUNK;
        let send = (w + c.experts + chunk * w + chunk * u32::from(c.topk)) * 4;
        let recv = (w + 2 * w * c.local_experts()) * 4;
        let grids = self.grids(comm, mode, tokens);
        self.launch(
            comm,
            tensors,
            &self.kernels.dispatch,
            p,
            &grids,
            send.max(recv),
            stream,
        )?;
        self.tokens
            .store(tokens, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Enqueues the combine of the layer's last dispatch: `expert_out` holds `rows_max x
    /// hidden` elements (the experts' outputs in the rows dispatch filled), `out` receives
    /// `tokens x hidden` elements, each token's weighted sum in its original place.
    ///
    /// # Safety
    /// As [`MoeLayer::dispatch`].
    pub unsafe fn combine(
        &self,
        comm: &Comm,
        tensors: &Tensors,
        mode: Mode,
        expert_out: Span,
        out: Span,
        stream: &Stream,
    ) -> Result<()> {
        let _g = comm.enter_on(stream)?;
        let tokens = self.tokens.load(std::sync::atomic::Ordering::Relaxed);
        let c = self.call(comm, tensors, mode, tokens)?;
        let es = elem(self.ty);
        let rows = u64::from(c.rows_max) * u64::from(c.hidden) * es;
        comm.moe_span("expert output bytes", expert_out, rows, es)?;
        comm.moe_span(
            "combined bytes",
            out,
            u64::from(tokens) * u64::from(c.hidden) * es,
            es,
        )?;
        let mut p = self.params(comm, tokens);
        (p.expert_out, p.out) = (expert_out.ptr, out.ptr);
        let grids = match mode {
            Mode::LowLatency => self.grids(comm, mode, tokens),
            _ => {
                let g = self.grids(comm, mode, tokens);
                vec![(SEND, g[1].1), (RECV, g[1].1)]
            }
        };
        let k = &self.kernels.combine;
        self.launch(comm, tensors, k, p, &grids, 0, stream)
    }

    /// Reads and clears the layer's counters of skipped indices and dropped rows (waits for
    /// this rank's device).
    pub fn status(&self, comm: &Comm) -> Result<MoeStatus> {
        let _g = comm.enter_any()?;
        self.own(comm)?;
        comm.dev.synchronize()?;
        let read = |i: u64| -> Result<u32> {
            let b = comm.memory().read(self.at.state + 4 * i, 4)?;
            Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        let s = MoeStatus {
            invalid: read(INVALID)?,
            dropped: read(DROPPED)?,
        };
        for i in [INVALID, DROPPED] {
            comm.heap_write(self.at.state + 4 * i, &[0; 4])?;
        }
        Ok(s)
    }

    /// Reads the spans `(first row, rows)` of every local expert from the last dispatch (waits
    /// for this rank's device).
    pub fn spans(&self, comm: &Comm) -> Result<Vec<(u32, u32)>> {
        let _g = comm.enter_any()?;
        self.own(comm)?;
        comm.dev.synchronize()?;
        let l = u64::from(self.cfg.local_experts());
        let b = comm.memory().read(self.at.spans, l * 8)?;
        Ok(b.chunks_exact(8)
            .map(|c| {
                (
                    u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
                    u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
                )
            })
            .collect())
    }

    /// Reads `rows` expert rows from `first` (waits for this rank's device).
    pub fn read_rows(&self, comm: &Comm, first: u32, rows: u32) -> Result<Vec<u8>> {
        let _g = comm.enter_any()?;
        self.own(comm)?;
        let row = u64::from(self.cfg.hidden) * elem(self.ty);
        let end = u64::from(first) + u64::from(rows);
        if end > u64::from(self.cfg.rows_max) {
            return Err(CudaError::OutOfBounds {
                what: "expert rows",
                offset: u64::from(first),
                len: u64::from(rows),
                lo: 0,
                hi: u64::from(self.cfg.rows_max),
            });
        }
        comm.dev.synchronize()?;
        comm.memory()
            .read(self.at.xout + u64::from(first) * row, u64::from(rows) * row)
    }

    /// Collective: returns the layer's block to the heap (after this rank's device finished
    /// with it).
    pub fn free(self, comm: &Comm, tensors: &Tensors) -> Result<()> {
        self.own(comm)?;
        let _g = comm.enter_any()?;
        comm.dev.synchronize()?;
        tensors.release_block(self.block)
    }
}

impl MoeLayer {
    /// The shape.
    pub fn config(&self) -> MoeConfig {
        self.cfg
    }

    /// The token type.
    pub fn token_type(&self) -> TokenType {
        self.ty
    }

    /// Heap offset and bytes of the layer's block.
    pub fn block(&self) -> (u64, u64) {
        (self.block, self.len)
    }

    /// Heap offset of the expert rows (`rows_max x hidden` elements, expert major).
    pub fn expert_rows(&self) -> u64 {
        self.at.xout
    }

    /// Heap offset of the spans, `local_experts` pairs of u32 (first row, rows).
    pub fn spans_ptr(&self) -> u64 {
        self.at.spans
    }

    /// Tokens of the last dispatch.
    pub fn tokens(&self) -> u32 {
        self.tokens.load(std::sync::atomic::Ordering::Relaxed)
    }
}

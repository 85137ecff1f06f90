//! The all-to-allv whose counts stay on the device (`kernels/symm/a2av.cu`).
//!
//! An [`A2avLayer`] ([`Comm::a2av_layer`], collective) holds tagged header words (each rank's
//! row of counts), tagged done words, state words and a fixed output of `out_max` elements.
//! [`Comm::all_to_allv_device`] reads the send counts where a kernel wrote them, exchanges the
//! rows through the headers (a row also says its sender entered the call, so its output may be
//! written), computes every offset on the device and writes the received counts back to device
//! memory: no host synchronisation, so a graph replays it with new counts. A negative count is 0,
//! a row stops where the input ends, and elements past the output are dropped and counted
//! ([`Comm::a2av_dropped`]).

use std::sync::Arc;

use symm_core::moe::MoeError;

use super::moe::{Carve, DROPPED, STATE_WORDS, THREADS};
use super::Comm;
use crate::cuda::compile::{self, Compiler};
use crate::cuda::device::{self, Stream};
use crate::cuda::error::{CudaError, Result};
use crate::cuda::launch::Kernel;
use crate::cuda::Span;
use symm_kernels::abi::A2avParams;

/// The all-to-allv layer: header and done words, and an output of `out_max` elements.
pub struct A2avLayer {
    owner: u64,
    world: u16,
    elem: u64,
    out_max: u64,
    block: u64,
    hdr: u64,
    done: u64,
    out: u64,
    state: u64,
    kernel: Arc<Kernel>,
}

impl std::fmt::Debug for A2avLayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("A2avLayer")
            .field("world", &self.world)
            .field("elem", &self.elem)
            .field("out_max", &self.out_max)
            .field("block", &self.block)
            .finish_non_exhaustive()
    }
}

impl A2avLayer {
    /// Heap offset of the output (`out_max` elements, received blocks in sender order).
    pub fn output(&self) -> u64 {
        self.out
    }

    /// Elements the output holds.
    pub fn out_max(&self) -> u64 {
        self.out_max
    }

    /// Heap offset of the layer's block (what [`Comm::release_block`] takes).
    pub fn block(&self) -> u64 {
        self.block
    }
}

impl Comm {
    /// Collective: an all-to-allv layer for elements of `elem` bytes with room for `out_max`
    /// received elements.
    pub fn a2av_layer(&self, elem: u64, out_max: u64, stream: &Stream) -> Result<A2avLayer> {
        let _ctx = device::keep_current()?;
        self.live()?;
        if !matches!(elem, 1 | 2 | 4 | 8 | 16) {
            return Err(CudaError::Invalid(format!(
                "all-to-allv elements of {elem} bytes (1, 2, 4, 8 or 16)"
            )));
        }
        let w = u64::from(self.world);
        if w > u64::from(symm_core::moe::MAX_WORLD) {
            return Err(CudaError::Moe(MoeError::BadWorld { world: self.world }));
        }
        let mut c = Carve { at: 0 };
        let hdr = c.take(2 * w * w * 8)?;
        let done = c.take(2 * w * 8)?;
        let state = c.take(STATE_WORDS * 4)?;
        let out_bytes = out_max.checked_mul(elem).ok_or(CudaError::Overflow {
            what: "all-to-allv output",
        })?;
        let out = c.take(out_bytes)?;
        let compiler = Compiler::load(self.opts.nvrtc.as_deref())?;
        let drv = device::driver_version()?;
        let (cubin, _) = compile::cubin(&compiler, &symm_kernels::A2AV, self.dev.arch, drv)?;
        let kernel = Arc::new(Kernel::load(&self.dev, &cubin, symm_kernels::A2AV_ENTRY)?);
        let block = self.zeroed_block(c.at, stream)?;
        Ok(A2avLayer {
            owner: self.id,
            world: self.world,
            elem,
            out_max,
            block,
            hdr: block + hdr,
            done: block + done,
            out: block + out,
            state: block + state,
            kernel,
        })
    }

    /// Enqueues an all-to-allv on `stream` whose counts stay on the device: `send_counts`
    /// holds `world` i64 element counts (written by a kernel), `input` the elements packed by
    /// destination (at most `input.len / elem` are read), `recv_counts` receives `world` i64
    /// counts (what each sender's block holds in the output, clipped to it). The output is the
    /// layer's ([`A2avLayer::output`]), blocks in sender order. Collective.
    ///
    /// # Safety
    /// As [`Comm::moe_dispatch`].
    pub unsafe fn all_to_allv_device(
        &self,
        layer: &A2avLayer,
        send_counts: Span,
        input: Span,
        recv_counts: Span,
        stream: &Stream,
    ) -> Result<()> {
        let _ctx = device::keep_current()?;
        self.live()?;
        self.own_stream(stream)?;
        if layer.owner != self.id {
            return Err(CudaError::WrongOwner {
                what: "the all-to-allv layer",
            });
        }
        let w = u64::from(layer.world);
        self.block_in_use(layer.block)?;
        self.moe_span("send count bytes", send_counts, w * 8, 8)?;
        self.moe_span("receive count bytes", recv_counts, w * 8, 8)?;
        if !input.len.is_multiple_of(layer.elem) {
            return Err(CudaError::SizeMismatch {
                what: "input bytes (a multiple of the element size)",
                have: input.len,
                want: input.len / layer.elem * layer.elem,
            });
        }
        if input.len > 0 && self.heap_offset(input).is_none() {
            self.check_device_span(input)?;
        }
        // Peers write the output while this rank still reads its input: they must not meet.
        let out = self.ptr(self.rank, layer.out)?;
        let out_end = out.saturating_add(layer.out_max.saturating_mul(layer.elem));
        if input.len > 0 && input.ptr < out_end && out < input.ptr.saturating_add(input.len) {
            return Err(CudaError::Invalid(
                "the all-to-allv's input overlaps its layer's output".into(),
            ));
        }
        let in_max = input.len / layer.elem;
        let blocks = (in_max * layer.elem).div_ceil(1 << 16).clamp(1, 32) as u32;
        let p = A2avParams {
            w: self.symm_world(),
            hdr: layer.hdr,
            done: layer.done,
            out: layer.out,
            state: layer.state,
            send_counts: send_counts.ptr,
            input: input.ptr,
            recv_counts: recv_counts.ptr,
            in_max,
            out_max: layer.out_max,
            deadline_ns: self.deadline_ns(),
            record: self.record_addr(),
            elem: layer.elem as u32,
            pad: 0,
        };
        let smem = (w * w * 4) as u32;
        if stream.is_capturing()? {
            self.pin_to_capture(
                stream,
                &[(
                    layer.block,
                    layer.out - layer.block + layer.out_max * layer.elem,
                )],
            )?;
        }
        self.dev.bind()?;
        let _order = self.launch_lock()?;
        // SAFETY: `A2avParams` is `symm_a2av_params` field for field; the heap offsets lie in
        // the layer's block, the spans were checked above, and the kernel clips every count it
        // reads to the input and the output.
        let r = unsafe { layer.kernel.launch_smem(stream, blocks, THREADS, smem, &p) };
        if let Err(e) = &r {
            self.poison(e);
        }
        r
    }

    /// Reads and clears the all-to-allv layer's dropped-element count (waits for the device).
    pub fn a2av_dropped(&self, layer: &A2avLayer) -> Result<u32> {
        let _ctx = device::keep_current()?;
        if layer.owner != self.id {
            return Err(CudaError::WrongOwner {
                what: "the all-to-allv layer",
            });
        }
        self.dev.synchronize()?;
        let b = self.read(layer.state + 4 * DROPPED, 4)?;
        self.heap_write(layer.state + 4 * DROPPED, &[0; 4])?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

//! The all-to-allv whose counts stay on the device (`kernels/symm/a2av.cu`).
//!
//! An [`A2avLayer`] ([`A2avLayer::new`], collective) holds tagged header words (each rank's
//! row of counts), tagged done words, state words and a fixed output of `out_max` elements.
//! [`A2avLayer::enqueue`] reads the send counts where a kernel wrote them, exchanges the
//! rows through the headers (a row also says its sender entered the call, so its output may be
//! written), computes every offset on the device and writes the received counts back to device
//! memory: no host synchronisation, so a graph replays it with new counts. A negative count is 0,
//! a row stops where the input ends, and elements past the output are dropped and counted
//! ([`A2avLayer::dropped`]).

use std::sync::Arc;

use symm_core::moe::MoeError;

use super::moe::{refuse_capture, Carve, DROPPED, STATE_WORDS, THREADS};
use super::{Comm, Tensors};
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

    /// Heap offset of the layer's block (what [`Tensors::release_block`] takes).
    pub fn block(&self) -> u64 {
        self.block
    }
}

impl A2avLayer {
    /// Collective: an all-to-allv layer for elements of `elem` bytes with room for `out_max`
    /// received elements.
    pub fn new(
        comm: &Comm,
        tensors: &Tensors,
        elem: u64,
        out_max: u64,
        stream: &Stream,
    ) -> Result<A2avLayer> {
        tensors.own(comm)?;
        let _g = comm.enter()?;
        refuse_capture(stream, "an all-to-allv layer")?;
        if !matches!(elem, 1 | 2 | 4 | 8 | 16) {
            return Err(CudaError::BadElementSize {
                what: "all-to-allv elements",
                bytes: elem,
                takes: "1, 2, 4, 8 or 16",
            });
        }
        let w = u64::from(comm.job.world);
        if w > u64::from(symm_core::moe::MAX_WORLD) {
            return Err(CudaError::Moe(MoeError::BadWorld {
                world: comm.job.world,
            }));
        }
        let mut c = Carve { at: 0 };
        let hdr = c.take(2 * w * w * 8)?;
        let done = c.take(2 * w * 8)?;
        let state = c.take(STATE_WORDS * 4)?;
        let out_bytes = out_max.checked_mul(elem).ok_or(CudaError::Overflow {
            what: "all-to-allv output",
        })?;
        let out = c.take(out_bytes)?;
        let compiler = Compiler::load(comm.opts.nvrtc.as_deref())?;
        let drv = device::driver_version()?;
        let (cubin, _) = compile::cubin(&compiler, &symm_kernels::A2AV, comm.dev.arch, drv)?;
        let kernel = Arc::new(Kernel::load(&comm.dev, &cubin, symm_kernels::A2AV_ENTRY)?);
        let block = tensors.zeroed_block(comm, c.at, stream)?;
        Ok(A2avLayer {
            owner: comm.job.id,
            world: comm.job.world,
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
    /// As [`crate::cuda::MoeLayer::dispatch`].
    pub unsafe fn enqueue(
        &self,
        comm: &Comm,
        tensors: &Tensors,
        send_counts: Span,
        input: Span,
        recv_counts: Span,
        stream: &Stream,
    ) -> Result<()> {
        let _g = comm.enter_on(stream)?;
        tensors.own(comm)?;
        if self.owner != comm.job.id {
            return Err(CudaError::WrongOwner {
                what: "the all-to-allv layer",
            });
        }
        let w = u64::from(self.world);
        tensors.block_in_use(self.block)?;
        comm.moe_span("send count bytes", send_counts, w * 8, 8)?;
        comm.moe_span("receive count bytes", recv_counts, w * 8, 8)?;
        if !input.len.is_multiple_of(self.elem) {
            return Err(CudaError::SizeMismatch {
                what: "input bytes (a multiple of the element size)",
                have: input.len,
                want: input.len / self.elem * self.elem,
            });
        }
        if input.len > 0 && comm.heap_offset(input).is_none() {
            comm.check_device_span(input)?;
        }
        // Peers write the output while this rank still reads its input: they must not meet.
        let out = comm.heap_ptr(comm.job.rank, self.out)?;
        let out_end = out.saturating_add(self.out_max.saturating_mul(self.elem));
        if input.len > 0 && input.ptr < out_end && out < input.ptr.saturating_add(input.len) {
            return Err(CudaError::Overlap {
                read: "all-to-allv's input",
                written: "layer's output",
            });
        }
        let in_max = input.len / self.elem;
        let blocks = (in_max * self.elem).div_ceil(1 << 16).clamp(1, 32) as u32;
        let p = A2avParams {
            w: comm.symm_world(),
            hdr: self.hdr,
            done: self.done,
            out: self.out,
            state: self.state,
            send_counts: send_counts.ptr,
            input: input.ptr,
            recv_counts: recv_counts.ptr,
            in_max,
            out_max: self.out_max,
            deadline_ns: comm.deadline_ns(),
            record: comm.record_addr(),
            elem: self.elem as u32,
            pad: 0,
        };
        let smem = (w * w * 4) as u32;
        if stream.capturing_bound()? {
            tensors.pin_to_capture(
                stream,
                &[(self.block, self.out - self.block + self.out_max * self.elem)],
            )?;
        }
        let _order = comm.launch_lock()?;
        // SAFETY: `A2avParams` is `symm_a2av_params` field for field; the heap offsets lie in
        // the layer's block, the spans were checked above, and the kernel clips every count it
        // reads to the input and the output. The context is bound by the guard.
        let r = unsafe { self.kernel.launch_smem(stream, blocks, THREADS, smem, &p) };
        if let Err(e) = &r {
            comm.poison.raise(e);
        }
        r
    }

    /// Reads and clears the all-to-allv layer's dropped-element count (waits for the device).
    pub fn dropped(&self, comm: &Comm) -> Result<u32> {
        let _g = comm.enter_any()?;
        if self.owner != comm.job.id {
            return Err(CudaError::WrongOwner {
                what: "the all-to-allv layer",
            });
        }
        comm.dev.synchronize()?;
        let b = comm.memory().read(self.state + 4 * DROPPED, 4)?;
        comm.heap_write(self.state + 4 * DROPPED, &[0; 4])?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

//! The fused all-reduce, residual add and RMSNorm (`kernels/symm/norm.cu`): one kernel computes
//! `residual_out = residual + sum over ranks of x` and `out = rmsnorm(residual_out) * weight`
//! in the order and with the roundings of [`symm_core::norm`], bit for bit.
//!
//! A [`FusedNorm`] ([`FusedNorm::new`], collective) holds one heap block: this rank's state
//! (the call epoch), flag words (one per kernel block and rank) and two staging halves of
//! `max_rows` rows. [`FusedNorm::enqueue`] takes the caller's tensors where they lie (any
//! device memory of the rank's GPU: the kernel copies the input into the staging half peers
//! read), so a plain tensor costs no copy node and a graph replays the call. The protocol (one
//! barrier per call, halves picked by the epoch's parity, the rows carried in the flag words
//! so ranks that call with different rows fail at once with [`CudaError::RanksDiffer`]) is
//! in the kernel's header.
//!
//! The protocol assumes one call at a time, in the order every rank enqueued them: calls on
//! different streams are ordered like the job's collectives (`order`), and an op made before a
//! [`Comm::reset`] (whose failure may have left the ranks' epochs apart) is refused
//! ([`CudaError::Stale`]): make a new one.

use std::sync::Arc;

use symm_core::norm::{check_hidden, NormError};

use super::moe::Carve;
use super::{Comm, Tensors};
use crate::cuda::compile::{self, Compiler};
use crate::cuda::device::{self, Stream};
use crate::cuda::error::{CudaError, Result};
use crate::cuda::launch::Kernel;
use crate::cuda::Span;
use symm_kernels::abi::NormParams;

/// Most kernel blocks of a call (rows beyond are taken in turn by the same blocks): the flag
/// words are sized for this many.
pub const NORM_MAX_BLOCKS: u32 = 128;
/// Blocks times ranks a call keeps at most: every block loads a vector from every rank at
/// once, and at world 4 on H100s 128 blocks reading 128 rows ran 2.6x slower than 32 (the
/// links congest), while at world 2 128 blocks were 1.8x faster than 32.
const NORM_BLOCK_RANKS: u32 = 256;
/// Most rows of a call ([`symm_core::norm::MAX_ROWS`]): a peer whose call has other rows is
/// named on the device (`RanksDiffer`), not waited for.
pub const NORM_MAX_ROWS: u32 = symm_core::norm::MAX_ROWS;

// The kernel is compiled with the host's constants (`symm_kernels::NORM`'s defines); these are
// the specification's.
const _: () = assert!(symm_kernels::NORM_THREADS as usize == symm_core::norm::THREADS);
const _: () = assert!(NORM_MAX_ROWS == (1 << symm_kernels::NORM_ROW_BITS) - 1);

/// The fused all-reduce + RMSNorm of one width (see the module doc).
pub struct FusedNorm {
    owner: u64,
    world: u16,
    hidden: u32,
    max_rows: u32,
    block: u64,
    block_len: u64,
    state: u64,
    flags: u64,
    stage: u64,
    kernel: Arc<Kernel>,
    /// The Comm's resets when it was made: its epochs are not used across one.
    resets: u64,
}

impl std::fmt::Debug for FusedNorm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FusedNorm")
            .field("hidden", &self.hidden)
            .field("max_rows", &self.max_rows)
            .field("block", &self.block)
            .finish_non_exhaustive()
    }
}

/// The tensors of one call, as device spans.
#[derive(Clone, Copy, Debug)]
pub struct NormArgs {
    /// This rank's input: rows x hidden bf16.
    pub x: Span,
    /// The residual: rows x hidden bf16.
    pub residual: Span,
    /// The new residual: rows x hidden bf16 (the residual itself, or apart from every span).
    pub residual_out: Span,
    /// The weight: hidden bf16.
    pub weight: Span,
    /// The output: rows x hidden bf16 (another of the row tensors, or apart from them).
    pub out: Span,
    /// The norm's epsilon (finite, not negative).
    pub eps: f32,
}

/// The rows of a call of width `hidden` with at most `max_rows` rows, or why it is refused:
/// every row tensor holds the same whole rows of 16-byte-aligned bf16, the weight one row, two
/// row tensors are the same span or apart, the weight is apart from the outputs, and `eps` is
/// finite and not negative. (The spans' memory is checked by the caller.)
pub fn norm_rows(hidden: u32, max_rows: u32, a: &NormArgs) -> Result<u32> {
    check_hidden(hidden as usize).map_err(CudaError::Norm)?;
    let row = u64::from(hidden) * 2;
    let n = a.x.len;
    let rows = n / row;
    if !n.is_multiple_of(row) || rows > u64::from(max_rows) {
        return Err(CudaError::SizeMismatch {
            what: "input bytes (whole rows, at most the op's max_rows)",
            have: n,
            want: rows.min(u64::from(max_rows)) * row,
        });
    }
    let tensors = [
        ("input", "input bytes", a.x, n),
        ("residual", "residual bytes", a.residual, n),
        ("new residual", "new residual bytes", a.residual_out, n),
        ("weight", "weight bytes (one row)", a.weight, row),
        ("output", "output bytes", a.out, n),
    ];
    for (what, bytes, s, want) in tensors {
        if s.len != want {
            return Err(CudaError::SizeMismatch {
                what: bytes,
                have: s.len,
                want,
            });
        }
        if !s.ptr.is_multiple_of(16) {
            return Err(CudaError::Misaligned {
                what,
                offset: s.ptr,
                align: 16,
            });
        }
    }
    let meet = |p: Span, q: Span| {
        p.ptr < q.ptr.saturating_add(q.len) && q.ptr < p.ptr.saturating_add(p.len)
    };
    let rows_of = [tensors[0], tensors[1], tensors[2], tensors[4]];
    for (i, &(what_i, _, p, _)) in rows_of.iter().enumerate() {
        for &(what_j, _, q, _) in &rows_of[i + 1..] {
            if p.ptr != q.ptr && meet(p, q) {
                return Err(CudaError::Overlap {
                    read: what_i,
                    written: what_j,
                });
            }
        }
    }
    for (what, s) in [("new residual", a.residual_out), ("output", a.out)] {
        if n > 0 && meet(a.weight, s) {
            return Err(CudaError::Overlap {
                read: "weight",
                written: what,
            });
        }
    }
    if !a.eps.is_finite() || a.eps < 0.0 {
        return Err(CudaError::Norm(NormError::BadEps));
    }
    Ok(rows as u32)
}

/// The blocks a call of `rows` rows launches at world `world` (the same on every rank).
pub fn norm_blocks(rows: u32, world: u16) -> u32 {
    let cap = (NORM_BLOCK_RANKS / u32::from(world.max(1))).clamp(16, NORM_MAX_BLOCKS);
    rows.min(cap)
}

impl FusedNorm {
    /// Collective: the fused op for rows of `hidden` bf16 elements, at most `max_rows` rows a
    /// call. Compiles (or finds in the kernel cache) its kernel; not while `stream` captures.
    pub fn new(
        comm: &Comm,
        tensors: &Tensors,
        hidden: u32,
        max_rows: u32,
        stream: &Stream,
    ) -> Result<FusedNorm> {
        tensors.own(comm)?;
        let _g = comm.enter()?;
        check_hidden(hidden as usize).map_err(CudaError::Norm)?;
        if max_rows == 0 || max_rows > NORM_MAX_ROWS {
            return Err(CudaError::Norm(NormError::BadLength {
                what: "max_rows (1 to 2^20 - 1)",
                have: max_rows as usize,
                want: max_rows.clamp(1, NORM_MAX_ROWS) as usize,
            }));
        }
        let w = u64::from(comm.job.world);
        let mut c = Carve { at: 0 };
        let state = c.take(16)?;
        let flags = c.take(u64::from(NORM_MAX_BLOCKS) * w * 8)?;
        let stage_bytes = 2 * u64::from(max_rows) * u64::from(hidden) * 2;
        let stage = c.take(stage_bytes)?;
        let compiler = Compiler::load(comm.opts.nvrtc.as_deref())?;
        let drv = device::driver_version()?;
        let (cubin, _) = compile::cubin(&compiler, &symm_kernels::NORM, comm.dev.arch, drv)?;
        let kernel = Arc::new(Kernel::load(&comm.dev, &cubin, symm_kernels::NORM_ENTRY)?);
        if stream.is_capturing()? {
            return Err(CudaError::Capturing {
                what: "a fused all-reduce + RMSNorm's creation",
            });
        }
        let block = tensors.zeroed_block(comm, c.at, stream)?;
        Ok(FusedNorm {
            owner: comm.job.id,
            world: comm.job.world,
            hidden,
            max_rows,
            block,
            block_len: c.at,
            state: block + state,
            flags: block + flags,
            stage: block + stage,
            kernel,
            resets: comm.poison.lifts(),
        })
    }

    /// Elements per row.
    pub fn hidden(&self) -> u32 {
        self.hidden
    }

    /// Most rows a call takes.
    pub fn max_rows(&self) -> u32 {
        self.max_rows
    }

    /// Heap offset of the op's block (what [`Tensors::release_block`] takes).
    pub fn block(&self) -> u64 {
        self.block
    }

    /// Enqueues the fused op over `a` on `stream` (see the module doc). Collective: every
    /// rank enqueues the same calls with the same rows, in the same order.
    ///
    /// # Safety
    /// The spans must stay allocated, and not be written by other work, until the enqueued
    /// work has finished, as for any kernel the caller enqueues on `stream`; each is checked to
    /// lie in this rank's heap or in one device allocation of this rank's context.
    pub unsafe fn enqueue(
        &self,
        comm: &Comm,
        tensors: &Tensors,
        a: &NormArgs,
        stream: &Stream,
    ) -> Result<()> {
        let _g = comm.enter_on(stream)?;
        tensors.own(comm)?;
        if self.owner != comm.job.id || self.world != comm.job.world {
            return Err(CudaError::WrongOwner {
                what: "the fused all-reduce + RMSNorm",
            });
        }
        if self.resets != comm.poison.lifts() {
            return Err(CudaError::Stale {
                what: "the fused all-reduce + RMSNorm",
            });
        }
        tensors.block_in_use(self.block)?;
        let rows = norm_rows(self.hidden, self.max_rows, a)?;
        if rows == 0 {
            return Ok(());
        }
        for s in [a.x, a.residual, a.residual_out, a.weight, a.out] {
            if comm.heap_offset(s).is_none() {
                comm.check_device_span(s)?;
            }
        }
        let p = NormParams {
            w: comm.symm_world(),
            x: a.x.ptr,
            residual: a.residual.ptr,
            residual_out: a.residual_out.ptr,
            weight: a.weight.ptr,
            out: a.out.ptr,
            stage: self.stage,
            flags: self.flags,
            state: self.state,
            deadline_ns: comm.deadline_ns(),
            record: comm.record_addr(),
            rows,
            hidden: self.hidden,
            max_rows: self.max_rows,
            eps: a.eps,
        };
        let capturing = stream.capturing_bound()?;
        if capturing {
            tensors.pin_to_capture(stream, &[(self.block, self.block_len)])?;
        }
        let blocks = norm_blocks(rows, self.world);
        let mut l = comm.launch_lock()?;
        // Calls on different streams run one at a time, in the order they were enqueued, as
        // the job's collectives do (the epochs and staging halves assume it).
        let record = comm.order_before(&mut l.order, 0, stream, Some(capturing))?;
        // SAFETY: `NormParams` is `symm_norm_params` field for field; the heap offsets lie in
        // the op's block (state, flags for NORM_MAX_BLOCKS blocks, two halves of max_rows
        // rows), the spans were checked above to hold `rows` rows (the weight one) in memory
        // of this rank's device, and the kernel touches no more. The context is bound by the
        // guard.
        let r = unsafe {
            self.kernel
                .launch_smem(stream, blocks, symm_kernels::NORM_THREADS, 0, &p)
        };
        if let Err(e) = &r {
            comm.poison.raise(e);
        }
        r?;
        comm.ordered_after(&l.order, 0, stream, record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(rows: u64, hidden: u64) -> NormArgs {
        let n = rows * hidden * 2;
        let s = |at: u64, len: u64| Span { ptr: at, len };
        NormArgs {
            x: s(0x10000, n),
            residual: s(0x20000, n),
            residual_out: s(0x20000, n),
            weight: s(0x40000, hidden * 2),
            out: s(0x50000, n),
            eps: 1e-6,
        }
    }

    #[test]
    fn blocks_are_the_rows_up_to_a_cap_by_world() {
        assert_eq!(norm_blocks(1, 4), 1);
        assert_eq!(norm_blocks(512, 2), 128);
        assert_eq!(norm_blocks(512, 4), 64);
        assert_eq!(norm_blocks(512, 64), 16);
        assert_eq!(norm_blocks(512, 0), 128);
        assert!((1..=8).all(|w| norm_blocks(u32::MAX, w) <= NORM_MAX_BLOCKS));
    }

    #[test]
    fn a_call_is_whole_rows_of_aligned_apart_tensors() {
        assert_eq!(norm_rows(64, 8, &args(3, 64)).unwrap(), 3);
        assert_eq!(norm_rows(64, 8, &args(0, 64)).unwrap(), 0);
        // Too many rows, a partial row, a short weight.
        assert!(matches!(
            norm_rows(64, 2, &args(3, 64)),
            Err(CudaError::SizeMismatch { .. })
        ));
        let mut a = args(2, 64);
        a.x.len -= 2;
        assert!(matches!(
            norm_rows(64, 8, &a),
            Err(CudaError::SizeMismatch { .. })
        ));
        let mut a = args(2, 64);
        a.weight.len = 64;
        assert!(matches!(
            norm_rows(64, 8, &a),
            Err(CudaError::SizeMismatch {
                what: "weight bytes (one row)",
                ..
            })
        ));
        // A width the kernel cannot take.
        assert!(matches!(
            norm_rows(60, 8, &args(2, 60)),
            Err(CudaError::Norm(NormError::BadHidden { hidden: 60 }))
        ));
        // Misaligned, overlapping, an output over the weight, a bad epsilon.
        let mut a = args(2, 64);
        a.out.ptr += 8;
        assert!(matches!(
            norm_rows(64, 8, &a),
            Err(CudaError::Misaligned { .. })
        ));
        let mut a = args(2, 64);
        a.out.ptr = a.residual.ptr + 16;
        assert!(matches!(
            norm_rows(64, 8, &a),
            Err(CudaError::Overlap { .. })
        ));
        let mut a = args(2, 64);
        a.weight.ptr = a.out.ptr + 128;
        assert!(matches!(
            norm_rows(64, 8, &a),
            Err(CudaError::Overlap { .. })
        ));
        for eps in [f32::NAN, -1.0, f32::INFINITY] {
            let mut a = args(2, 64);
            a.eps = eps;
            assert!(matches!(
                norm_rows(64, 8, &a),
                Err(CudaError::Norm(NormError::BadEps))
            ));
        }
        // The same span twice (in place) is taken.
        let mut a = args(2, 64);
        a.out = a.x;
        assert_eq!(norm_rows(64, 8, &a).unwrap(), 2);
    }
}

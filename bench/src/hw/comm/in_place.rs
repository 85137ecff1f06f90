//! In-place all-reduce over a symmetric block: [`Tensors::enqueue`] with the output span equal
//! to the input span, as a framework's `all_reduce(t)` on a symmetric tensor passes it. A
//! request that runs in place (`Request::runs_in_place`: two-shot, the one-shot low-latency
//! all-reduces) runs on the block itself; one that does not (one-shot) is staged through its
//! workspace. Every rank's block is checked bit exact against the host reference after each
//! call, and again after a second call on the result (the same block, the next epoch).

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::cuda::device::Stream;
use symm_driver::cuda::{Comm, Span, Tensors};
use symm_driver::host;
use symm_tests::matrix::exact;

use super::super::data;
use super::e;

/// Sizes of the check (bytes of bf16; small: every request keeps its workspace as long as the
/// Comm, and the checks after this one need the heap).
const SIZES: [u64; 2] = [4 << 10, 64 << 10];

/// The in-place all-reduces, each on a fresh symmetric block: the number of calls checked.
pub(super) fn all_reduce(comm: &Comm, stream: &Stream) -> Result<String, String> {
    let tensors = Tensors::new(comm);
    let (me, w) = (comm.rank() as usize, comm.world());
    let mut calls = 0;
    let mut on_block = 0;
    for alg in [
        Algorithm::TwoShot,
        Algorithm::OneShotLl,
        Algorithm::OneShotLl128,
        Algorithm::OneShot,
    ] {
        for bytes in SIZES {
            for channels in [1u16, 4] {
                let req = Request::new(
                    Collective::AllReduce,
                    alg,
                    w,
                    bytes,
                    DType::Bf16,
                    ReduceOp::Sum,
                )
                .with_channels(channels);
                if req.validate().is_err() {
                    continue;
                }
                let block = tensors.alloc_block(comm, bytes, stream).map_err(e)?;
                let span = Span {
                    ptr: comm.memory().ptr(comm.rank(), block).map_err(e)?,
                    len: bytes,
                };
                let mut inputs = data::inputs(&req, bytes + u64::from(channels));
                comm.memory().write(block, &inputs[me]).map_err(e)?;
                for round in 0..2 {
                    let want = host::reference(&req, &inputs);
                    // SAFETY: the span is a live block of this rank's heap, exactly the
                    // request's bytes; nothing else writes it until the synchronize below.
                    unsafe { tensors.enqueue(comm, &req, span, span, stream) }.map_err(e)?;
                    comm.synchronize(stream).map_err(e)?;
                    let got = comm.memory().read(block, bytes).map_err(e)?;
                    exact(&req, std::slice::from_ref(&got), &want[me..me + 1]).map_err(|m| {
                        format!("{} {bytes} B {channels} ch, call {round}: {m}", alg.name())
                    })?;
                    calls += 1;
                    // Every rank's block now holds the sum: the next call reduces that.
                    inputs = want;
                }
                on_block += usize::from(req.runs_in_place());
                tensors.release_block(block).map_err(e)?;
            }
        }
    }
    Ok(format!(
        "{calls} in-place bf16 all-reduces bit exact ({on_block} requests ran on the block \
         itself, the others staged)"
    ))
}

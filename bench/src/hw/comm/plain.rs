//! Collectives over plain device memory (outside the symmetric heap), as a framework passes an
//! ordinary tensor: [`Tensors::enqueue`] runs a side the request owns (`Request::owns`: no
//! peer's op names it) where it lies, and stages the others through the request's workspace.
//! Each request runs on freshly allocated device buffers of this rank, including an in-place
//! call whose output is its input, and every rank's output is checked bit exact against the
//! host reference.

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::cuda::device::{DevBuf, Stream};
use symm_driver::cuda::{Comm, Span, Tensors};
use symm_driver::host;
use symm_tests::matrix::exact;

use super::super::data;
use super::e;

/// The requests: every pattern of owned sides (both, input only, output only, neither).
fn requests(w: u16) -> Vec<Request> {
    let r = |c, a, bytes, channels| {
        Request::new(c, a, w, bytes, DType::Bf16, ReduceOp::Sum).with_channels(channels)
    };
    vec![
        r(Collective::AllReduce, Algorithm::OneShotLl, 4 << 10, 1),
        r(
            Collective::AllReduce,
            Algorithm::OneShotLl128,
            (64 << 10) + 2,
            4,
        ),
        r(Collective::AllGather, Algorithm::DirectLl, 4 << 10, 2),
        r(
            Collective::ReduceScatter,
            Algorithm::DirectLl128,
            8 << 10,
            2,
        ),
        r(Collective::AllToAll, Algorithm::DirectLl, 2 << 10, 1),
        r(Collective::AllReduce, Algorithm::Ring, 256 << 10, 2),
        r(Collective::AllReduce, Algorithm::OneShot, 16 << 10, 1),
        r(Collective::ReduceScatter, Algorithm::Ring, 64 << 10, 2),
        r(Collective::AllReduce, Algorithm::TwoShot, 256 << 10, 4),
    ]
}

/// Runs every request on plain buffers (and in place where it runs so): what was checked.
pub(super) fn run(comm: &Comm, stream: &Stream) -> Result<String, String> {
    let tensors = Tensors::new(comm);
    let me = comm.rank() as usize;
    let (mut calls, mut owned) = (0, 0);
    for req in requests(comm.world()) {
        req.validate().map_err(|x| x.to_string())?;
        let sz = req.buffer_sizes();
        let len = |n: u64| usize::try_from(n).map_err(|x| x.to_string());
        let input = DevBuf::zeroed(comm.device(), len(sz.input)?).map_err(e)?;
        let output = DevBuf::zeroed(comm.device(), len(sz.output)?).map_err(e)?;
        let span = |b: &DevBuf, n: u64| Span {
            ptr: b.ptr(),
            len: n,
        };
        let (ins, outs) = (span(&input, sz.input), span(&output, sz.output));
        let in_place = req.runs_in_place();
        for round in 0..2u64 {
            let inputs = data::inputs(&req, req.bytes + round);
            let want = host::reference(&req, &inputs);
            input.upload(&inputs[me]).map_err(e)?;
            // Round 1 of a request that runs in place reduces the input buffer into itself.
            let to = if round == 1 && in_place { ins } else { outs };
            // SAFETY: both buffers are live device allocations of this rank of the request's
            // sizes, written by nothing else until the synchronize below.
            unsafe { tensors.enqueue(comm, &req, ins, to, stream) }.map_err(e)?;
            comm.synchronize(stream).map_err(e)?;
            let got = if to == ins {
                input.download()
            } else {
                output.download()
            }
            .map_err(e)?;
            exact(&req, std::slice::from_ref(&got), &want[me..me + 1]).map_err(|m| {
                format!(
                    "{} {} {} B, call {round}: {m}",
                    req.collective.name(),
                    req.algorithm.name(),
                    req.bytes
                )
            })?;
            calls += 1;
        }
        owned += req.owns().iter().filter(|&&o| o).count();
    }
    Ok(format!(
        "{calls} calls on plain device buffers bit exact ({owned} sides ran where they lie, \
         the others staged)"
    ))
}

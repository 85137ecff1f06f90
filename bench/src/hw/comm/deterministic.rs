//! Phase `deterministic`: deterministic mode on the GPU, in a job opened with
//! `CommOptions::deterministic` (what `SYMM_DETERMINISTIC=1` sets).
//!
//! Inputs are `host::hard_inputs`: sums that cancel, magnitudes far apart and values near the
//! type's largest, so that a different order of addition gives different bits. Every reducing
//! collective (all-reduce, reduce-scatter, reduce) in bf16, f16 and f32 runs with every
//! algorithm that honours the mode at this world, on 1, 2 and 4 channels, at sizes from 4 KiB
//! to 16 MiB (odd element counts included), and every rank's output must equal the rank-order
//! reference (`host::reference_in_rank_order`) bit for bit. The all-reduce's inputs of a
//! smaller call are a prefix of a larger one's, so the check also shows an element getting the
//! same bits in a 4 KiB call and a 16 MiB call. The same requests run on plain device buffers
//! (outside the heap, staged or where they lie) and as CUDA graph replays. The plan path
//! (compiled or interpreted) is the job's `SYMM_PLANS`: the phase runs under each.
//!
//! The job's mode is checked at its door: admission refuses an algorithm that cannot honour
//! it, and the job's automatic requests all honour it. [`default_mode`] runs in a default job
//! (the `correct` phase) and counts how often the other algorithms' bits differ.

use std::collections::BTreeSet;
use std::time::Duration;

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{algorithms, Algorithm, Collective, Forced, Request, SchedError};
use symm_driver::cuda::device::{DevBuf, Stream};
use symm_driver::cuda::{AutoRequests, Buffers, Comm, CudaError, Span, Tensors};
use symm_driver::host::{self, hard_inputs, reference_in_rank_order};
use symm_tests::matrix::exact_rank;

use super::{e, opts, Check, Params};

/// Bytes per rank (per block for reduce-scatter): odd element counts of every type, up to
/// 16 MiB.
const SIZES: [u64; 4] = [4096 + 12, (48 << 10) + 12, (1 << 20) + 12, 16 << 20];

/// Channel counts each algorithm runs on.
const CHANNELS: [u16; 3] = [1, 2, 4];

/// Graph replays per captured request.
const REPLAYS: u64 = 3;

/// The reducing collectives at world `w`.
fn collectives(w: u16) -> [Collective; 3] {
    [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::Reduce { root: w - 1 },
    ]
}

/// Every request of (`c`, `dt`, `bytes`) that honours the mode at world `w` (never multicast).
fn requests(c: Collective, w: u16, bytes: u64, dt: DType) -> Vec<Request> {
    let mut v = Vec::new();
    for &a in algorithms(c) {
        if a == Algorithm::Multicast {
            continue;
        }
        for ch in CHANNELS {
            let r = Request::new(c, a, w, bytes, dt, ReduceOp::Sum).with_channels(ch);
            if r.validate().is_ok() && r.is_deterministic() {
                v.push(r);
            }
        }
    }
    v
}

/// The seed of (`c`, `dt`): the same for every algorithm, channel count and size, so a smaller
/// all-reduce's inputs are a prefix of a larger one's (`hard_inputs` draws element by element).
fn seed(c: Collective, dt: DType) -> u64 {
    let code = Collective::ALL.iter().position(|x| x.name() == c.name());
    0xde7 ^ ((code.unwrap_or(0) as u64) << 8) ^ dt as u64
}

/// The phase's checks, in a deterministic job.
pub(super) fn run(p: &Params) -> Result<Vec<Check>, String> {
    let world: u16 = std::env::var("WORLD_SIZE")
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or("WORLD_SIZE is not set")?;
    let max = p.max_bytes.min(16 << 20);
    // Room for the largest request's buffers twice over (a graph's and an eager call's).
    let heap = 4 * (u64::from(world) + 2) * max + (64 << 20);
    let mut o = opts(Duration::from_secs(20), heap);
    o.deterministic = true;
    let comm = Comm::from_env(o).map_err(e)?;
    let stream = Stream::new(comm.device()).map_err(e)?;
    let sizes: Vec<u64> = SIZES.iter().copied().filter(|&b| b <= max).collect();
    let mut checks = vec![Check::timed(
        "deterministic job: admission refuses what cannot honour it, auto requests honour it",
        3,
        || door(&comm),
    )];
    let n = 3 * 3 * sizes.len();
    checks.push(Check::timed(
        "deterministic mode: every algorithm, channel count and size gives the rank-order bits",
        n,
        || eager(&comm, &stream, &sizes),
    ));
    checks.push(Check::timed(
        "deterministic mode: plain device buffers, the rank-order bits",
        3 * 2,
        || plain(&comm, &stream, &sizes),
    ));
    checks.push(Check::timed(
        "deterministic mode: CUDA graph replays, the rank-order bits",
        9,
        || graphs(&comm, &stream, max),
    ));
    drop(stream);
    comm.finish().map_err(e)?;
    Ok(checks)
}

/// Admission in a deterministic job, and its automatic requests.
fn door(comm: &Comm) -> Result<String, String> {
    let w = comm.world();
    let ring = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        w,
        1 << 20,
        DType::Bf16,
        ReduceOp::Sum,
    );
    match comm.admit(&ring) {
        Err(CudaError::Sched(SchedError::NotDeterministic { .. })) => {}
        other => return Err(format!("a bf16 ring was admitted: {other:?}")),
    }
    // Integers sum in any order to the same bits: a ring of them is admitted.
    let ints = Request {
        dtype: DType::I32,
        ..ring
    };
    comm.admit(&ints).map_err(e)?;
    let auto = AutoRequests::of(comm);
    if !auto.deterministic() {
        return Err("the job's automatic requests are not in deterministic mode".into());
    }
    let mut picked = BTreeSet::new();
    for c in collectives(w) {
        for shift in (10..=28).step_by(2) {
            let r = auto
                .get(c, 1 << shift, DType::Bf16, ReduceOp::Sum, Forced::default())
                .map_err(|x| x.to_string())?;
            if !r.is_deterministic() {
                return Err(format!("automatic request {r:?} is not deterministic"));
            }
            comm.admit(&r).map_err(e)?;
            picked.insert(r.algorithm.name());
        }
    }
    Ok(format!(
        "a bf16 ring refused, an i32 ring admitted; automatic requests from 1 KiB to 256 MiB \
         admitted: {}",
        picked.into_iter().collect::<Vec<_>>().join(", ")
    ))
}

/// Runs `req` on fresh symmetric buffers with this rank's `input`; returns its output.
fn on_heap(comm: &Comm, stream: &Stream, req: &Request, input: &[u8]) -> Result<Vec<u8>, String> {
    let b: Buffers = comm.alloc(req).map_err(e)?;
    let r = (|| {
        comm.memory().write(b.input, input).map_err(e)?;
        comm.memory()
            .fill(b.output, b.sizes.output, host::POISON)
            .map_err(e)?;
        comm.enqueue(req, &b, stream).map_err(e)?;
        comm.synchronize(stream).map_err(e)?;
        comm.memory().read(b.output, b.sizes.output).map_err(e)
    })();
    comm.free(&b).map_err(e)?;
    r
}

/// What a case is called in a failure.
fn name(req: &Request) -> String {
    format!(
        "{} {} {} {} B {} ch",
        req.collective.name(),
        req.algorithm.name(),
        req.dtype.name(),
        req.bytes,
        req.channels
    )
}

/// Every deterministic request on symmetric buffers, eager.
fn eager(comm: &Comm, stream: &Stream, sizes: &[u64]) -> Result<String, String> {
    let (w, me) = (comm.world(), comm.rank() as usize);
    let (mut runs, mut algs) = (0, BTreeSet::new());
    for c in collectives(w) {
        for dt in [DType::Bf16, DType::F16, DType::F32] {
            // The largest all-reduce's output: every smaller one must be its prefix.
            let mut largest: Option<Vec<u8>> = None;
            for &size in sizes.iter().rev() {
                let bytes = size / dt.size() * dt.size();
                let reqs = requests(c, w, bytes, dt);
                let Some(first) = reqs.first() else {
                    continue;
                };
                // The same inputs and reference for every algorithm and channel count.
                let inputs = hard_inputs(first, seed(c, dt));
                let want = reference_in_rank_order(first, &inputs);
                for req in reqs {
                    let got = on_heap(comm, stream, &req, &inputs[me])?;
                    exact_rank(&req, me, &got, &want[me])
                        .map_err(|m| format!("{}: {m}", name(&req)))?;
                    if c == Collective::AllReduce {
                        match &largest {
                            None => largest = Some(got),
                            Some(big) if big.starts_with(&got) => {}
                            Some(_) => {
                                return Err(format!(
                                    "{}: not a prefix of the largest call's bits",
                                    name(&req)
                                ))
                            }
                        }
                    }
                    runs += 1;
                    algs.insert(req.algorithm.name());
                }
            }
        }
    }
    Ok(format!(
        "{runs} runs bit exact against the rank-order reference ({}); each all-reduce element \
         the same bits from 4 KiB to the largest size",
        algs.into_iter().collect::<Vec<_>>().join(", ")
    ))
}

/// Every deterministic request at 2 channels on plain device buffers of this rank, bf16, at
/// the smallest and largest size (each request keeps a workspace for the Comm's life).
fn plain(comm: &Comm, stream: &Stream, sizes: &[u64]) -> Result<String, String> {
    let (w, me) = (comm.world(), comm.rank() as usize);
    let tensors = Tensors::new(comm);
    let mut runs = 0;
    let ends = [sizes.first(), sizes.last()];
    for c in collectives(w) {
        for dt in [DType::Bf16] {
            for &size in ends.into_iter().flatten() {
                let bytes = size / dt.size() * dt.size();
                let reqs: Vec<Request> = requests(c, w, bytes, dt)
                    .into_iter()
                    .filter(|r| r.channels == 2)
                    .collect();
                let Some(first) = reqs.first() else {
                    continue;
                };
                let inputs = hard_inputs(first, seed(c, dt));
                let want = reference_in_rank_order(first, &inputs);
                for req in reqs {
                    let sz = req.buffer_sizes();
                    let len = |n: u64| usize::try_from(n).map_err(|x| x.to_string());
                    let input = DevBuf::zeroed(comm.device(), len(sz.input)?).map_err(e)?;
                    let output = DevBuf::zeroed(comm.device(), len(sz.output)?).map_err(e)?;
                    output
                        .upload(&vec![host::POISON; len(sz.output)?])
                        .map_err(e)?;
                    input.upload(&inputs[me]).map_err(e)?;
                    let span = |b: &DevBuf, n: u64| Span {
                        ptr: b.ptr(),
                        len: n,
                    };
                    // SAFETY: both buffers are live device allocations of this rank of the
                    // request's sizes, written by nothing else until the synchronize below.
                    unsafe {
                        tensors.enqueue(
                            comm,
                            &req,
                            span(&input, sz.input),
                            span(&output, sz.output),
                            stream,
                        )
                    }
                    .map_err(e)?;
                    comm.synchronize(stream).map_err(e)?;
                    let got = output.download().map_err(e)?;
                    exact_rank(&req, me, &got, &want[me])
                        .map_err(|m| format!("{}: {m}", name(&req)))?;
                    runs += 1;
                }
            }
        }
    }
    Ok(format!(
        "{runs} runs on plain buffers bit exact against the rank-order reference"
    ))
}

/// The job's automatic request of each collective and type at the largest size, captured once
/// and replayed with new inputs.
fn graphs(comm: &Comm, stream: &Stream, max: u64) -> Result<String, String> {
    let (w, me) = (comm.world(), comm.rank() as usize);
    let auto = AutoRequests::of(comm);
    let mut shown = Vec::new();
    for c in collectives(w) {
        for dt in [DType::Bf16, DType::F16, DType::F32] {
            let bytes = max / dt.size() * dt.size();
            let req = auto
                .get(c, bytes, dt, ReduceOp::Sum, Forced::default())
                .map_err(|x| x.to_string())?;
            let b: Buffers = comm.alloc(&req).map_err(e)?;
            let r = (|| -> Result<(), String> {
                comm.prepare(&[req]).map_err(e)?;
                let g = comm
                    .capture(stream, |cap| cap.enqueue(&req, &b))
                    .map_err(e)?;
                for i in 0..REPLAYS {
                    let inputs = hard_inputs(&req, seed(c, dt) + 1 + i);
                    comm.memory().write(b.input, &inputs[me]).map_err(e)?;
                    comm.memory()
                        .fill(b.output, b.sizes.output, host::POISON)
                        .map_err(e)?;
                    g.launch(stream).map_err(e)?;
                    comm.synchronize(stream).map_err(e)?;
                    let got = comm.memory().read(b.output, b.sizes.output).map_err(e)?;
                    let want = reference_in_rank_order(&req, &inputs);
                    exact_rank(&req, me, &got, &want[me])
                        .map_err(|m| format!("{} replay {i}: {m}", name(&req)))?;
                }
                Ok(())
            })();
            comm.free(&b).map_err(e)?;
            r?;
            shown.push(format!("{} {}", c.name(), req.algorithm.name()));
        }
    }
    shown.dedup();
    Ok(format!(
        "{REPLAYS} replays each of {} requests at {max} B bit exact ({})",
        3 * 3,
        shown.join(", ")
    ))
}

/// In a default job: the algorithms that do not honour the mode, on the same inputs, and how
/// often their bits differ from the rank-order reference (they must still be correct sums:
/// the matrix checks that).
pub(super) fn default_mode(comm: &Comm, stream: &Stream, max: u64) -> Result<String, String> {
    let (w, me) = (comm.world(), comm.rank() as usize);
    let (mut differ, mut total, mut runs) = (0usize, 0usize, 0);
    let bytes = max.min(1 << 20);
    for c in collectives(w) {
        for dt in [DType::Bf16, DType::F16, DType::F32] {
            let bytes = bytes / dt.size() * dt.size();
            for &a in algorithms(c) {
                let req = Request::new(c, a, w, bytes, dt, ReduceOp::Sum).with_channels(2);
                if a == Algorithm::Multicast || req.validate().is_err() || req.is_deterministic() {
                    continue;
                }
                let inputs = hard_inputs(&req, seed(c, dt));
                let want = reference_in_rank_order(&req, &inputs);
                let got = on_heap(comm, stream, &req, &inputs[me])?;
                let es = dt.size() as usize;
                let defined = want[me]
                    .chunks(es)
                    .filter(|x| x.iter().any(|&b| b != host::POISON));
                total += defined.count();
                differ += got
                    .chunks(es)
                    .zip(want[me].chunks(es))
                    .filter(|(g, w)| g != w)
                    .count();
                runs += 1;
            }
        }
    }
    // Two values add to the same bits in either order: only three ranks or more can differ.
    if w > 2 && runs > 0 && differ == 0 {
        return Err(format!(
            "{runs} runs of unordered algorithms gave the rank-order bits everywhere: the \
             inputs do not tell orders apart"
        ));
    }
    Ok(format!(
        "{runs} runs of algorithms outside the mode: {differ} of {total} elements ({:.1}%) \
         differ from the rank-order bits on this rank",
        100.0 * differ as f64 / total.max(1) as f64
    ))
}

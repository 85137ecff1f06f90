//! One rank of `symm-bench bench`: every collective at every size on this process's `Comm`,
//! symm and NCCL on the same buffers and stream, eager and in CUDA graphs.
//!
//! For each (collective, size) symm runs its candidate (algorithm, channels) pairs eagerly and
//! keeps the fastest; that pair is then timed in a CUDA graph. NCCL (`ncclCommInitRank` in the
//! same process) runs the same operation on the same buffers, eager and in a graph. A time is
//! the slowest rank's mean over back-to-back launches (CUDA events), after warm-up; the number
//! of launches is `-n`, or chosen so that each measurement lasts about 20 ms. Outputs up to 16 MiB are
//! checked against the reference after the timing (symm bit exact; the count of wrong elements
//! is the `#wrong` column); larger inputs are a device fill and go unchecked. A calibration run
//! also keeps every candidate's eager time (system `symm-candidate`), for the link fit.

use std::time::Duration;

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, BufferSizes, Collective, Request};
use symm_driver::cuda::device::{Event, Stream};
use symm_driver::cuda::{Buffers, Capture, Comm, CommOptions, CopyEngine, CudaError};
use symm_driver::host;
use symm_harness::examples::DeviceBench;
use symm_harness::nccl::{NcclOp, NcclRank};

use super::super::data;
use super::{Kind, Sample};

fn e(e: CudaError) -> String {
    e.to_string()
}

/// Largest output checked against the reference.
const CHECKED: u64 = 16 << 20;
/// How long one measurement aims to last.
const TARGET_US: f64 = 20_000.0;

/// Iterations of each measurement (nccl-tests' `-n` and `-w`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// Timed calls per measurement (0: enough for [`TARGET_US`]).
    pub iters: u32,
    /// Calls before each measurement.
    pub warmup: u32,
}

/// The run's [`Timing`], set once by [`run`].
static TIMING: std::sync::OnceLock<Timing> = std::sync::OnceLock::new();

fn timing() -> Timing {
    TIMING.get().copied().unwrap_or(Timing {
        iters: 0,
        warmup: 1,
    })
}

/// The request of `kind` whose nccl-tests size is `size` bytes.
pub(super) fn request(kind: Kind, size: u64, world: u16, a: Algorithm, ch: u16) -> Option<Request> {
    let per = |s: u64| s / world as u64;
    let (c, bytes) = match kind {
        Kind::AllReduce => (Collective::AllReduce, size),
        Kind::AllGather => (Collective::AllGather, per(size)),
        Kind::ReduceScatter => (Collective::ReduceScatter, per(size)),
        Kind::AllToAll => (Collective::AllToAll, per(size)),
        Kind::Broadcast => (Collective::Broadcast { root: 0 }, size),
        Kind::Put | Kind::Signal => return None,
    };
    Some(Request::new(c, a, world, bytes, DType::Bf16, ReduceOp::Sum).with_channels(ch))
}

/// The (algorithm, channels) pairs symm tries: every algorithm of the collective (multicast
/// never) at the default channels for the size, with `wide` also a quarter and four times as
/// many (the calibration run), and always `cost::tune`'s pick.
fn candidates(kind: Kind, size: u64, world: u16, wide: bool) -> Vec<(Algorithm, u16)> {
    let Some(probe) = request(kind, size, world, Algorithm::Ring, 1) else {
        return Vec::new();
    };
    let ch = symm_core::cost::default_channels(probe.bytes);
    let chans: Vec<u16> = if wide {
        let mut v = vec![(ch / 4).max(1), ch, (ch * 4).min(64)];
        v.dedup();
        v
    } else {
        vec![ch]
    };
    let mut out = Vec::new();
    for &a in symm_core::sched::algorithms(probe.collective) {
        if a == Algorithm::Multicast {
            continue;
        }
        // The low-latency algorithms take more on more channels.
        for &c in chans.iter().filter(|&&c| a.takes_on(probe.bytes, c)) {
            out.push((a, c));
        }
    }
    // What symm picks by default (the calibration table, else the model) is always measured.
    let (tuned, _) = symm_core::cost::tune(probe);
    if !out.contains(&(tuned.algorithm, tuned.channels)) {
        out.push((tuned.algorithm, tuned.channels));
    }
    out
}

fn nccl_op(kind: Kind) -> NcclOp {
    match kind {
        Kind::AllReduce => NcclOp::AllReduce,
        Kind::AllGather => NcclOp::AllGather,
        Kind::ReduceScatter => NcclOp::ReduceScatter,
        Kind::AllToAll => NcclOp::AllToAll,
        Kind::Broadcast | Kind::Put | Kind::Signal => NcclOp::Broadcast,
    }
}

/// NCCL's element count for `req` (bf16): per block for the gathered and scattered ones.
fn nccl_count(req: &Request) -> usize {
    (req.bytes / 2) as usize
}

/// Microseconds per call of `call` over `n` back-to-back calls (after the warm-up calls, at
/// least one), the slowest rank's.
fn timed(
    comm: &Comm,
    stream: &Stream,
    n: u32,
    call: &dyn Fn() -> Result<(), CudaError>,
) -> Result<f64, String> {
    for _ in 0..timing().warmup.max(1) {
        call().map_err(e)?;
    }
    stream.synchronize().map_err(e)?;
    let (s, t) = (
        Event::new(comm.device()).map_err(e)?,
        Event::new(comm.device()).map_err(e)?,
    );
    s.record(stream).map_err(e)?;
    for _ in 0..n {
        call().map_err(e)?;
    }
    t.record(stream).map_err(e)?;
    comm.synchronize(stream).map_err(e)?;
    let us = s.elapsed_ms(&t).map_err(e)? as f64 * 1000.0 / n.max(1) as f64;
    slowest(comm, us)
}

fn slowest(comm: &Comm, us: f64) -> Result<f64, String> {
    Ok(comm
        .exchange(&us.to_le_bytes())
        .map_err(e)?
        .iter()
        .filter_map(|v| v.as_slice().try_into().ok().map(f64::from_le_bytes))
        .fold(0.0, f64::max))
}

/// Calls per measurement: `-n` when given, else enough for [`TARGET_US`], from a first estimate
/// (agreed by all ranks).
fn count(
    comm: &Comm,
    stream: &Stream,
    call: &dyn Fn() -> Result<(), CudaError>,
) -> Result<u32, String> {
    if timing().iters > 0 {
        return Ok(timing().iters);
    }
    let first = timed(comm, stream, 3, call)?;
    Ok((TARGET_US / first.max(1.0)).clamp(5.0, 1000.0) as u32)
}

/// Microseconds per call inside a CUDA graph of `k` calls, replayed until `n` calls ran.
fn graphed(
    comm: &Comm,
    stream: &Stream,
    n: u32,
    call: &dyn Fn(&Capture<'_>) -> Result<(), CudaError>,
) -> Result<f64, String> {
    let k = n.clamp(1, 50);
    let g = comm
        .capture(stream, |cap| {
            for _ in 0..k {
                call(cap)?;
            }
            Ok(())
        })
        .map_err(e)?;
    let reps = n.div_ceil(k).max(2);
    g.launch(stream).map_err(e)?;
    stream.synchronize().map_err(e)?;
    let (s, t) = (
        Event::new(comm.device()).map_err(e)?,
        Event::new(comm.device()).map_err(e)?,
    );
    s.record(stream).map_err(e)?;
    for _ in 0..reps {
        g.launch(stream).map_err(e)?;
    }
    t.record(stream).map_err(e)?;
    comm.synchronize(stream).map_err(e)?;
    let us = s.elapsed_ms(&t).map_err(e)? as f64 * 1000.0 / (reps * k) as f64;
    slowest(comm, us)
}

/// Writes inputs (checked sizes: reference data; larger: a device fill) and returns the
/// reference of this rank's output when checked.
fn fill(comm: &Comm, req: &Request, b: &Buffers, seed: u64) -> Result<Option<Vec<u8>>, String> {
    let me = comm.rank() as usize;
    if b.sizes.output <= CHECKED {
        let inputs = data::inputs(req, seed);
        comm.memory().write(b.input, &inputs[me]).map_err(e)?;
        Ok(host::reference(req, &inputs).into_iter().nth(me))
    } else {
        comm.memory()
            .fill(b.input, b.sizes.input, 0x3f)
            .map_err(e)?;
        Ok(None)
    }
}

fn wrong(found: &[u8], want: &[u8]) -> u64 {
    found
        .chunks(2)
        .zip(want.chunks(2))
        .filter(|(a, b)| a != b)
        .count() as u64
        + (found.len().abs_diff(want.len()) / 2) as u64
}

/// Every sample of this rank's run (all ranks measure; rank 0's list is the result), and the
/// profile of the small all-reduce (`profile.rs`).
pub(super) fn run(
    sizes: &[u64],
    kinds: &[Kind],
    wide: bool,
    timing: Timing,
) -> Result<(Vec<Sample>, String), String> {
    let _ = TIMING.set(timing);
    let comm = Comm::from_env(CommOptions {
        heap_bytes: 5 << 30,
        timeout: Duration::from_secs(20),
        ..CommOptions::default()
    })
    .map_err(e)?;
    let stream = Stream::new(comm.device()).map_err(e)?;
    // NCCL takes one GPU per rank; ranks that share one are measured without it.
    let nccl = if comm.sharing().topology() == symm_core::cost::Topology::SharedDevice {
        Err("not run: ranks share a GPU (NCCL needs one per rank)".to_string())
    } else {
        NcclRank::new(&comm).map_err(e)
    };
    let w = comm.world();
    let mut out = Vec::new();
    for &kind in kinds {
        for &size in sizes {
            let mut best: Option<(f64, Request, u32, u64)> = None;
            let reqs: Vec<Request> = candidates(kind, size, w, wide)
                .into_iter()
                .filter_map(|(a, ch)| request(kind, size, w, a, ch))
                .filter(|r| r.validate().is_ok())
                .collect();
            // Every candidate's kernel compiled first, on several threads: each is then timed
            // as it runs once prepared, not on the interpreter while a background compile runs.
            comm.prepare(&reqs).map_err(e)?;
            for req in reqs {
                let (a, ch) = (req.algorithm, req.channels);
                let b = comm.alloc(&req).map_err(e)?;
                let r = (|| -> Result<(f64, u32, u64), String> {
                    let want = fill(&comm, &req, &b, size ^ a as u64)?;
                    let call = || comm.enqueue(&req, &b, &stream);
                    let n = count(&comm, &stream, &call)?;
                    let us = timed(&comm, &stream, n, &call)?;
                    let bad = match want {
                        Some(want) => {
                            let found = comm.memory().read(b.output, b.sizes.output).map_err(e)?;
                            wrong(&found, &want)
                        }
                        None => u64::MAX,
                    };
                    Ok((us, n, bad))
                })();
                comm.free(&b).map_err(e)?;
                let (us, n, bad) = r?;
                if wide {
                    // Every candidate's time: the simulator's link is fitted to them.
                    let label = format!("{}/{ch}ch", a.name());
                    out.push(Sample::new(
                        kind,
                        size,
                        super::CANDIDATE,
                        "eager",
                        us,
                        bad,
                        &label,
                    ));
                }
                if best.is_none_or(|x| us < x.0) {
                    best = Some((us, req, n, bad));
                }
            }
            let Some((us, req, n, bad)) = best else {
                continue;
            };
            let (a, ch) = (req.algorithm, req.channels);
            let admitted = comm.admit(&req).map_err(e)?;
            let sms = admitted.sms();
            let path = match admitted.runs_compiled() {
                true => " compiled",
                false => "",
            };
            let label = format!("{}/{ch}ch {sms}sm{path}", a.name());
            out.push(Sample::new(kind, size, "symm", "eager", us, bad, &label));
            let b = comm.alloc(&req).map_err(e)?;
            let r = (|| -> Result<(), String> {
                fill(&comm, &req, &b, 7)?;
                let g = graphed(&comm, &stream, n, &|cap| cap.enqueue(&req, &b))?;
                out.push(Sample::new(
                    kind,
                    size,
                    "symm",
                    "graph",
                    g,
                    u64::MAX,
                    &label,
                ));
                if let Ok(nc) = &nccl {
                    let op = nccl_op(kind);
                    let on = |s: &Stream| {
                        nc.enqueue(
                            &comm,
                            op,
                            &b,
                            nccl_count(&req),
                            DType::Bf16,
                            ReduceOp::Sum,
                            s,
                        )
                    };
                    let call = || on(&stream);
                    let n = count(&comm, &stream, &call)?;
                    let us = timed(&comm, &stream, n, &call)?;
                    out.push(Sample::new(
                        kind,
                        size,
                        "nccl",
                        "eager",
                        us,
                        u64::MAX,
                        "nccl",
                    ));
                    let g = graphed(&comm, &stream, n, &|cap| {
                        cap.pin(&b);
                        on(cap.stream())
                    })?;
                    out.push(Sample::new(
                        kind,
                        size,
                        "nccl",
                        "graph",
                        g,
                        u64::MAX,
                        "nccl",
                    ));
                }
                Ok(())
            })();
            comm.free(&b).map_err(e)?;
            r?;
            copy_engines(&comm, &stream, kind, size, &mut out)?;
        }
    }
    device_api(&comm, &stream, sizes, &mut out)?;
    let (tuned, _) = symm_core::cost::tune(Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        w,
        1024,
        DType::Bf16,
        ReduceOp::Sum,
    ));
    let mut algos = vec![tuned.algorithm];
    for a in [Algorithm::OneShot, Algorithm::OneShotLl] {
        if !algos.contains(&a) {
            algos.push(a);
        }
    }
    let profile = super::profile::profile(&comm, &stream, &algos)?;
    drop(stream);
    drop(nccl);
    comm.finish().map_err(e)?;
    Ok((out, profile))
}

/// The copy-engine request of `kind` at `size` (its one-hop schedule on one channel), for the
/// collectives that only move bytes.
fn ce_request(kind: Kind, size: u64, world: u16) -> Option<Request> {
    let a = match kind {
        Kind::AllGather | Kind::Broadcast => Algorithm::Direct,
        Kind::AllToAll => Algorithm::Pairwise,
        _ => return None,
    };
    request(kind, size, world, a, 1).filter(symm_core::flag::eligible)
}

/// The same collective on copy engines (system `symm-ce`, no SM), eager and in a graph, beside
/// the kernel path's best: every rank switches the path together and back.
fn copy_engines(
    comm: &Comm,
    stream: &Stream,
    kind: Kind,
    size: u64,
    out: &mut Vec<Sample>,
) -> Result<(), String> {
    let Some(req) = ce_request(kind, size, comm.world()) else {
        return Ok(());
    };
    comm.set_copy_engine(CopyEngine::Always).map_err(e)?;
    let b = comm.alloc(&req).map_err(e);
    let r = b.as_ref().map_err(Clone::clone).and_then(|b| {
        let want = fill(comm, &req, b, size ^ 0xCE)?;
        comm.prepare(&[req]).map_err(e)?;
        let call = || comm.enqueue(&req, b, stream);
        let n = count(comm, stream, &call)?;
        let us = timed(comm, stream, n, &call)?;
        let bad = match want {
            Some(want) => wrong(
                &comm.memory().read(b.output, b.sizes.output).map_err(e)?,
                &want,
            ),
            None => u64::MAX,
        };
        let label = format!(
            "{}/1ch {}sm",
            req.algorithm.name(),
            comm.admit(&req).map_err(e)?.sms()
        );
        out.push(Sample::new(kind, size, "symm-ce", "eager", us, bad, &label));
        let g = graphed(comm, stream, n, &|cap| cap.enqueue(&req, b))?;
        out.push(Sample::new(
            kind,
            size,
            "symm-ce",
            "graph",
            g,
            u64::MAX,
            &label,
        ));
        Ok(())
    });
    if let Ok(b) = &b {
        comm.free(b).map_err(e)?;
    }
    comm.set_copy_engine(CopyEngine::Off).map_err(e)?;
    r
}

/// The device API: a kernel put (the best of several grid sizes) beside the copy engine at
/// 1 MiB, 16 MiB and 256 MiB (the bench's sizes allowing), every rank putting to the next at
/// once; and a signal's one-way latency, bounced between ranks 0 and 1 (the faster rank's
/// kernel time per round trip, halved: the slower one also counts its wait for the other's
/// launch).
fn device_api(
    comm: &Comm,
    stream: &Stream,
    sizes: &[u64],
    out: &mut Vec<Sample>,
) -> Result<(), String> {
    let mut bench = DeviceBench::new(comm).map_err(e)?;
    let next = (comm.rank() + 1) % comm.world();
    let most = sizes.iter().copied().max().unwrap_or(0);
    for size in [1u64 << 20, 16 << 20, 256 << 20]
        .into_iter()
        .filter(|&s| s <= most.max(1 << 20))
    {
        let b = comm
            .alloc(&BufferSizes {
                input: size,
                output: size,
                scratch: 16,
            })
            .map_err(e)?;
        let r = (|| -> Result<(), String> {
            comm.memory().fill(b.input, size, 0x5a).map_err(e)?;
            comm.exchange(&[]).map_err(e)?;
            let mut best = (f64::MAX, 0u32);
            for blocks in [16u32, 32, 66, 132, 264] {
                let call = || bench.put(comm, (b.input, b.output, size), blocks, stream);
                let n = count(comm, stream, &call)?;
                let us = timed(comm, stream, n, &call)?;
                if us < best.0 {
                    best = (us, blocks);
                }
            }
            let label = format!("{} blocks", best.1);
            out.push(Sample::new(
                Kind::Put,
                size,
                "symm-put-kernel",
                "eager",
                best.0,
                u64::MAX,
                &label,
            ));
            let call = || {
                comm.memory()
                    .put_on_stream(next, b.output, b.input, size, stream)
            };
            let n = count(comm, stream, &call)?;
            let us = timed(comm, stream, n, &call)?;
            out.push(Sample::new(
                Kind::Put,
                size,
                "copy-engine",
                "eager",
                us,
                u64::MAX,
                "cuMemcpyDtoDAsync",
            ));
            Ok(())
        })();
        comm.free(&b).map_err(e)?;
        r?;
    }
    let pad = comm
        .alloc(&BufferSizes {
            input: 4096,
            output: 16,
            scratch: 16,
        })
        .map_err(e)?;
    let r = (|| -> Result<(), String> {
        comm.memory().fill(pad.input, 4096, 0).map_err(e)?;
        comm.exchange(&[]).map_err(e)?;
        bench.ping_pong(comm, pad.input, 1000, stream).map_err(e)?;
        comm.exchange(&[]).map_err(e)?;
        let mine = bench
            .ping_pong(comm, pad.input, 20_000, stream)
            .map_err(e)?;
        let all = comm.exchange(&mine.to_le_bytes()).map_err(e)?;
        let fastest = all
            .iter()
            .take(2)
            .filter_map(|v| v.as_slice().try_into().ok().map(f64::from_le_bytes))
            .fold(f64::MAX, f64::min);
        out.push(Sample::new(
            Kind::Signal,
            8,
            "symm-signal",
            "eager",
            fastest / 2.0,
            u64::MAX,
            "one way, half a round trip",
        ));
        Ok(())
    })();
    comm.free(&pad).map_err(e)?;
    r
}

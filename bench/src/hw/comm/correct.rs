//! Phase `correct`: every correctness check of one rank process on its `Comm`.
//!
//! * the shared conformance matrix (`symm_tests::matrix`, the one `tests/` runs on the host
//!   backends) with the `Comm` as its backend: every collective x algorithm (multicast never) x
//!   the hw sizes up to `--max-bytes` x {f32, bf16, i32} x {sum, max}, on fresh collective
//!   allocations, every rank's output bit exact against the reference (checked in its own
//!   process; only the verdicts are gathered);
//! * the fused reductions' rounding: fractional floats bit exact against the host executor
//!   (`fold.rs`);
//! * 64 low-latency all-reduces enqueued back to back on one scratch buffer (`fold.rs`);
//! * 100 replays each of a two-shot and a low-latency all-reduce captured in a CUDA graph on
//!   the rank's stream;
//! * the device-API ring pass (`symm/examples.cu`) launched on the Comm's heap;
//! * six all-reduce algorithms (one low-latency) traced through the backend interface: each process traces its
//!   rank, the parts are merged and compared op by op with the host simulator's trace;
//! * the copy-engine path: its matrix, traces, graph replays and alternation with the kernel
//!   path (`engines.rs`);
//! * in-place all-reduces on symmetric blocks, on the block where the request runs in place
//!   and staged where not (`in_place.rs`);
//! * collectives on plain device buffers, the sides a request owns unstaged (`plain.rs`);
//! * a forced timeout (rank 1 skips a collective): `Timeout` from `synchronize`, `Poisoned`
//!   after it, 100 bit-exact collectives after `reset()` (`refused.rs`);
//! * hostile calls (short buffers, buffers over the pad, divergent allocation), last
//!   (`refused.rs`);
//! * the calling thread's context unchanged by the matrix and by dropping the Comm.

use std::time::Duration;

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, BufferSizes, Collective, Request};
use symm_driver::backend::Backend;
use symm_driver::cuda::device::{self, Device, Stream};
use symm_driver::cuda::{Buffers, Comm, CommTeam, CudaError};
use symm_driver::host;
use symm_harness::examples::{PassArgs, RankRingPass};
use symm_tests::matrix::exact;

use super::super::checks::{hw_matrix, semantic_diff};
use super::super::{data, heap_for, MATRIX_SIZES};
use super::refused::{foreign_stream, hostile, pinned_during_capture, poison_reset};
use super::{e, opts, Check, Params};

/// Heap the team splits reserve (three splits of 16 MiB, with room to spare).
const TEAM_HEAPS: u64 = 64 << 20;

/// Runs the checks in order; an error opening the job ends the phase.
pub(super) fn run(p: &Params) -> Result<Vec<Check>, String> {
    let local: u16 = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or("LOCAL_RANK is not set")?;
    let local = symm_driver::cuda::comm::placement(local).map_err(e)?;
    let world: u16 = std::env::var("WORLD_SIZE")
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or("WORLD_SIZE is not set")?;
    let sizes: Vec<u64> = MATRIX_SIZES
        .iter()
        .copied()
        .filter(|&b| b <= p.max_bytes)
        .collect();
    let dev = Device::open(local).map_err(e)?;
    let ctx_before = device::current_context().map_err(e)?;
    let mut comm = Comm::from_env(opts(
        Duration::from_secs(10),
        heap_for(world, &sizes) + TEAM_HEAPS,
    ))
    .map_err(e)?;
    let stream = Stream::new(comm.device()).map_err(e)?;
    let mut checks = Vec::new();
    // First: its timing runs before any check uses a second stream (no order event yet).
    checks.push(Check::timed(
        "a cached call is a lookup: host time of enqueue, launch and the bare launch",
        4,
        || super::host_cost::cached_calls(&comm, &stream),
    ));
    let n = 2 * 3 * sizes.len();
    checks.push(Check::timed("conformance matrix (Comm backend)", n, || {
        matrix(&mut comm, &sizes)
    }));
    checks.push(Check::timed(
        "fused reductions: fractional floats vs host executor",
        super::fold::cases(),
        || super::fold::run(&mut comm),
    ));
    checks.push(Check::timed(
        "default mode: how often unordered algorithms differ from the rank-order bits",
        9,
        || super::deterministic::default_mode(&comm, &stream, p.max_bytes),
    ));
    checks.push(Check::timed(
        "low-latency all-reduce back to back, one scratch",
        super::fold::CALLS as usize,
        || super::fold::ll_back_to_back(&comm, &stream),
    ));
    checks.push(Check::timed(
        "prepare compiles what the plan path runs compiled",
        2,
        || super::plans::prepared(&comm),
    ));
    checks.push(Check::timed(
        "CUDA graph replay on the caller's stream",
        200,
        || graph(&comm, &stream),
    ));
    checks.push(Check::timed(
        "device API ring pass on the Comm heap",
        10,
        || device_api(&comm, &stream, 10),
    ));
    checks.push(Check::timed(
        "trace diff: merged process traces vs simulator",
        6,
        || trace_diff(&mut comm, p),
    ));
    checks.push(Check::timed(
        "copy engines: matrix, traces, graph replay, alternating with kernels",
        4,
        || super::engines::run(&mut comm, &stream, p, &sizes),
    ));
    checks.push(Check::timed(
        "teams: split 1+1, reversed 2, strided; concurrent",
        4,
        || teams(&comm, p.max_bytes),
    ));
    checks.push(Check::timed(
        "in-place all-reduce on a symmetric block, on the block or staged",
        32,
        || super::in_place::all_reduce(&comm, &stream),
    ));
    checks.push(Check::timed(
        "plain device buffers: owned sides where they lie, the others staged",
        18,
        || super::plain::run(&comm, &stream),
    ));
    checks.push(Check::timed(
        "one team's collectives on two streams, in the Comm's order",
        100,
        || super::streams::two_streams(&comm),
    ));
    checks.push(Check::timed(
        "host time of a cached call once a second stream was used",
        2,
        || super::host_cost::after_second_stream(&comm, &stream),
    ));
    checks.push(Check::timed("forced timeout, poison, reset", 100, || {
        poison_reset(&comm, &stream)
    }));
    checks.push(Check::timed(
        "a buffer is pinned from its capture on, for every thread",
        1,
        || pinned_during_capture(&comm, &stream),
    ));
    checks.push(Check::timed(
        "a stream of another device refused",
        3,
        || foreign_stream(&comm, &stream),
    ));
    // Last: the allocators differ afterwards.
    checks.push(Check::timed("hostile calls refused", 3, || {
        hostile(&comm, &stream)
    }));
    drop(stream);
    checks.push(Check::timed(
        "caller's context after the checks and drop",
        1,
        || {
            let during = device::current_context().map_err(e)?;
            comm.finish().map_err(e)?;
            let after = device::current_context().map_err(e)?;
            drop(dev);
            if during != ctx_before || after != ctx_before {
                return Err(format!(
                "context {ctx_before:?} before, {during:?} after the checks, {after:?} after finish"
            ));
            }
            Ok(format!("unchanged ({ctx_before:?})"))
        },
    ));
    Ok(checks)
}

/// One case on fresh collective buffers; `Ok(false)` when the output is wrong.
pub(super) fn case(
    comm: &Comm,
    stream: &Stream,
    req: &Request,
    seed: u64,
) -> Result<Result<(), String>, String> {
    let me = comm.rank() as usize;
    let b = comm.alloc(req).map_err(e)?;
    let inputs = data::inputs(req, seed);
    let r = (|| {
        comm.memory().write(b.input, &inputs[me]).map_err(e)?;
        comm.memory()
            .fill(b.output, b.sizes.output, host::POISON)
            .map_err(e)?;
        // No scratch fill: a peer's low-latency lines may already be there.
        comm.enqueue(req, &b, stream).map_err(e)?;
        comm.synchronize(stream).map_err(e)?;
        let found = comm.memory().read(b.output, b.sizes.output).map_err(e)?;
        let want = host::reference(req, &inputs);
        Ok(exact(req, &[found], &want[me..me + 1]))
    })();
    comm.free(&b).map_err(e)?;
    r
}

/// The shared conformance matrix (`symm_tests::matrix`), run by every rank on the job.
fn matrix(comm: &mut Comm, sizes: &[u64]) -> Result<String, String> {
    let m = hw_matrix(comm.world(), sizes);
    // Every plan first (compiled on several threads when plans are compiled before use).
    let reqs: Vec<Request> = symm_tests::matrix::groups(&m, comm.world())
        .into_iter()
        .flat_map(|(_, cases)| cases)
        .collect();
    comm.prepare(&reqs).map_err(e)?;
    let rep = symm_tests::matrix::run(comm, &m, &mut 1);
    if let Some(f) = rep.failures.first() {
        return Err(format!(
            "{} of {} cases failed; first: {f}",
            rep.failures.len(),
            rep.cases
        ));
    }
    Ok(format!(
        "{} cases bit exact (every rank's output)",
        rep.cases
    ))
}

/// The device-API example on this Comm's heap: `passes` ring passes of fresh data, each checked.
fn device_api(comm: &Comm, stream: &Stream, passes: u32) -> Result<String, String> {
    let bytes = 1u64 << 20;
    let w = comm.world();
    let me = comm.rank();
    let b = comm
        .alloc(&BufferSizes {
            input: bytes,
            output: bytes,
            scratch: 4096,
        })
        .map_err(e)?;
    comm.memory().fill(b.scratch, 4096, 0).map_err(e)?;
    let mut ex = RankRingPass::new(comm.device(), None).map_err(e)?;
    for pass in 0..passes {
        let mut rng = symm_core::symbolic::Rng::new(77 + pass as u64);
        let data: Vec<Vec<u8>> = (0..w)
            .map(|_| (0..bytes).map(|_| rng.next_u64() as u8).collect())
            .collect();
        comm.memory()
            .write(b.input, &data[me as usize])
            .map_err(e)?;
        comm.memory()
            .fill(b.output, bytes, host::POISON)
            .map_err(e)?;
        // The predecessor's put lands in this output: not before it was poisoned.
        comm.exchange(&[]).map_err(e)?;
        let a = PassArgs {
            pad: b.scratch,
            src: b.input,
            dst: b.output,
            bytes,
            deadline_ns: 5_000_000_000,
        };
        ex.run_comm(comm, &a, stream).map_err(e)?;
        let got = comm.memory().read(b.output, bytes).map_err(e)?;
        if got != data[((me + w - 1) % w) as usize] {
            return Err(format!(
                "pass {pass}: rank {me} did not receive its predecessor's data"
            ));
        }
    }
    // A pad past the heap is refused before launch.
    let bad = PassArgs {
        pad: comm.buffer_area().1 - 8,
        src: b.input,
        dst: b.output,
        bytes,
        deadline_ns: 1,
    };
    if ex.run_comm(comm, &bad, stream).is_ok() {
        return Err("a pad past the heap was accepted".into());
    }
    comm.exchange(&[]).map_err(e)?;
    comm.free(&b).map_err(e)?;
    Ok(format!(
        "{passes} passes of 1 MiB bit exact; a pad past the heap refused"
    ))
}

/// Seven all-reduce algorithms (both low-latency line formats among them) run traced through the
/// backend interface: outputs bit exact, the merged trace's op sequence per (rank, channel)
/// equal to the simulator's. Rank 0 keeps the traces under `OUT`.
fn trace_diff(comm: &mut Comm, p: &Params) -> Result<String, String> {
    let w = comm.world();
    let mut ops = 0;
    for (i, a) in [
        Algorithm::Ring,
        Algorithm::Tree,
        Algorithm::OneShot,
        Algorithm::TwoShot,
        Algorithm::Rhd,
        Algorithm::OneShotLl,
        Algorithm::OneShotLl128,
    ]
    .into_iter()
    .enumerate()
    {
        // 1 MiB (64 KiB for the low-latency ones), within --max-bytes.
        let bytes = if a.takes(1 << 20) { 1 << 20 } else { 64 << 10 }.min(p.max_bytes.max(1024));
        let req = Request::new(
            Collective::AllReduce,
            a,
            w,
            bytes,
            DType::F32,
            ReduceOp::Sum,
        )
        .with_channels(2);
        let inputs = data::inputs(&req, 300 + i as u64);
        let out =
            Backend::run(comm, &req, &inputs, true).map_err(|m| format!("{}: {m}", a.name()))?;
        exact(&req, &out.outputs, &host::reference(&req, &inputs))
            .map_err(|m| format!("{}: {m}", a.name()))?;
        let gpu = out.trace.ok_or_else(|| format!("{}: no trace", a.name()))?;
        if comm.rank() == 0 {
            let _ = std::fs::write(
                p.out
                    .join(format!("gpu-w{w}-all_reduce-{}-procs.trace", a.name())),
                &gpu,
            );
        }
        let sim = host::simulate(&req, &inputs, &host::SimOptions::default())
            .map_err(|m| m.to_string())?;
        ops += semantic_diff(&gpu, &sim.trace).map_err(|m| format!("{}: {m}", a.name()))?;
    }
    Ok(format!(
        "7 algorithms, {ops} ops in the same order per (rank, channel) as the simulator"
    ))
}

/// The matrix on teams (each rank alone, both ranks in reverse order, a strided team of every
/// rank), then a job collective and a team collective in flight at the same time on two streams.
fn teams(comm: &Comm, max_bytes: u64) -> Result<String, String> {
    let sizes: Vec<u64> = [4, 1024, 65538, 1 << 20]
        .into_iter()
        .filter(|&b| b <= max_bytes)
        .collect();
    let m = |world| hw_matrix(world, &sizes);
    let w = comm.world();
    let me = comm.rank();
    let mut notes = Vec::new();
    let heap = 16 << 20;
    let splits: [(&str, Option<(i32, i32)>); 3] = [
        ("alone", Some((me as i32, 0))),
        ("reversed", Some((0, -(me as i32)))),
        ("strided", None),
    ];
    let mut reversed = None;
    for (name, how) in splits {
        let team = match how {
            Some((color, key)) => CommTeam::split(comm, color, key, heap),
            None => CommTeam::split_strided(comm, 0, 1, w, heap),
        }
        .map_err(e)?
        .ok_or_else(|| format!("{name}: rank {me} got no team"))?;
        let mut team = team;
        let matrix = m(team.size());
        let reqs: Vec<Request> = symm_tests::matrix::groups(&matrix, team.size())
            .into_iter()
            .flat_map(|(_, cases)| cases)
            .collect();
        team.prepare(&reqs).map_err(e)?;
        let rep = symm_tests::matrix::run(&mut team, &matrix, &mut 7);
        if let Some(f) = rep.failures.first().or(rep.stopped.as_ref()) {
            return Err(format!("{name} team {:?}: {f}", team.team().members()));
        }
        notes.push(format!(
            "{name} {:?} (id {}): {} cases",
            team.team().members(),
            team.team().id(),
            rep.cases
        ));
        if name == "reversed" {
            reversed = Some(team);
        }
    }
    let team = reversed.ok_or("no reversed team")?;
    // A job all-reduce and a team all-gather in flight at once, on two streams.
    let (s1, s2) = (
        Stream::new(comm.device()).map_err(e)?,
        Stream::new(comm.device()).map_err(e)?,
    );
    let ar = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        w,
        1 << 20,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_channels(4);
    let ag = Request::new(
        Collective::AllGather,
        Algorithm::Ring,
        team.size(),
        1 << 18,
        DType::I32,
        ReduceOp::Sum,
    )
    .with_channels(4);
    let (bw, bt) = (comm.alloc(&ar).map_err(e)?, team.alloc(&ag).map_err(e)?);
    let (iw, it) = (data::inputs(&ar, 41), data::inputs(&ag, 42));
    comm.memory().write(bw.input, &iw[me as usize]).map_err(e)?;
    comm.memory()
        .write(bt.input, &it[team.rank() as usize])
        .map_err(e)?;
    comm.prepare(&[ar]).map_err(e)?;
    team.prepare(&[ag]).map_err(e)?;
    comm.exchange(&[]).map_err(e)?;
    for _ in 0..20 {
        comm.enqueue(&ar, &bw, &s1).map_err(e)?;
        team.enqueue(&ag, &bt, &s2).map_err(e)?;
    }
    comm.synchronize(&s1).map_err(e)?;
    comm.synchronize(&s2).map_err(e)?;
    // The all-gather is idempotent; the all-reduce of the last launch reads inputs it does not
    // overwrite (out of place), so both are checked against one launch's reference.
    let found = comm.memory().read(bw.output, bw.sizes.output).map_err(e)?;
    exact(
        &ar,
        &[found],
        &host::reference(&ar, &iw)[me as usize..me as usize + 1],
    )
    .map_err(|m| format!("job all-reduce beside the team: {m}"))?;
    let found = comm.memory().read(bt.output, bt.sizes.output).map_err(e)?;
    let tr = team.rank() as usize;
    exact(&ag, &[found], &host::reference(&ag, &it)[tr..tr + 1])
        .map_err(|m| format!("team all-gather beside the job: {m}"))?;
    comm.free(&bw).map_err(e)?;
    team.free(&bt).map_err(e)?;
    notes.push("20 job all-reduces and 20 team all-gathers in flight at once: bit exact".into());
    Ok(notes.join("; "))
}

/// 100 replays of a captured two-shot all-reduce, then of a low-latency one (whose epochs the
/// replays advance in device memory).
fn graph(comm: &Comm, stream: &Stream) -> Result<String, String> {
    for a in [Algorithm::TwoShot, Algorithm::OneShotLl] {
        graph_of(comm, stream, a).map_err(|m| format!("{}: {m}", a.name()))?;
    }
    Ok("100 graph replays each of two_shot and one_shot_ll bit exact".into())
}

fn graph_of(comm: &Comm, stream: &Stream, a: Algorithm) -> Result<(), String> {
    let me = comm.rank() as usize;
    let req = Request::new(
        Collective::AllReduce,
        a,
        comm.world(),
        64 << 10,
        DType::Bf16,
        ReduceOp::Sum,
    )
    .with_channels(2);
    let b: Buffers = comm.alloc(&req).map_err(e)?;
    // Plans are built (device memory allocated) before capture, which forbids allocation.
    comm.prepare(&[req]).map_err(e)?;
    let g = comm
        .capture(stream, |cap| cap.enqueue(&req, &b))
        .map_err(e)?;
    // The capture pins its buffers: they cannot be freed (and reused) while it lives.
    match comm.free(&b) {
        Err(CudaError::Pinned) => {}
        other => return Err(format!("free of captured buffers gave {other:?}")),
    }
    for i in 0..100u64 {
        let inputs = data::inputs(&req, 1000 + i);
        comm.memory().write(b.input, &inputs[me]).map_err(e)?;
        comm.memory()
            .fill(b.output, b.sizes.output, host::POISON)
            .map_err(e)?;
        g.launch(stream).map_err(e)?;
        comm.synchronize(stream).map_err(e)?;
        let found = comm.memory().read(b.output, b.sizes.output).map_err(e)?;
        exact(&req, &[found], &host::reference(&req, &inputs)[me..me + 1])
            .map_err(|m| format!("replay {i}: {m}"))?;
    }
    drop(g);
    comm.free(&b).map_err(e)?;
    Ok(())
}

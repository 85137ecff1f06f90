//! `cargo xtask hw --comm`: the checks with one process per GPU.
//!
//! The parent starts one process per rank (this same binary, `hw comm-rank PHASE`) with the job
//! environment `symm-run` would set (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `SYMM_JOB`,
//! `SYMM_TOKEN`, and the multicast-off variables), waits for them and collects their reports.
//!
//! * phase `matrix`: the shared conformance matrix (`symm_tests::matrix`, the one `tests/` runs
//!   on the host backends) with the `Comm` as its backend: every collective x algorithm
//!   (multicast never) x {4 B, 1 KiB, 64 KiB + 2 B, 1 MiB} x {f32, bf16, i32} x {sum, max}, on
//!   fresh collective allocations, every rank's output gathered and bit exact against the
//!   reference; 100 replays of a CUDA graph
//!   captured on that stream; hostile calls (short buffers, buffers over the pad, divergent
//!   allocation) refused with typed errors; a forced timeout (rank 1 skips a collective) turned into
//!   `Timeout` by `check()`, `Poisoned` after it, and 100 correct collectives after `reset()`.
//! * phase `bench`: all-reduce bf16 sum at 1 KiB, 1 MiB and 256 MiB, symm's `Comm` on the rank's
//!   stream beside NCCL (`ncclCommInitRank`) on the same buffers and stream, the slowest rank's
//!   CUDA-event time per op over back-to-back launches.
//! * phase `death`: rank 1 is killed (SIGKILL) while rank 0 waits inside an all-reduce; rank 0
//!   must see `PeerLost { rank: 1 }` within 2 s, and its GPU's free memory must return to its
//!   starting value once the communicator is dropped.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::bootstrap::Token;
use symm_driver::cuda::device::{Device, Stream};
use symm_driver::cuda::launch::Graph;
use symm_driver::cuda::{Buffers, Comm, CommOptions, CudaError};
use symm_driver::host;
use symm_tests::matrix::{exact, Compare, Matrix};

use super::checks::channels_for;
use super::{data, Row};

const SIZES: [u64; 4] = [4, 1024, 65538, 1 << 20];

/// Heap of the death phase: large enough that a heap left mapped cannot hide in the context's
/// own reservations.
const DEATH_HEAP: u64 = 1 << 30;

/// Starts `world` rank processes of `phase` and returns their exit codes and outputs.
fn spawn(world: u16, phase: &str) -> Result<Vec<(i32, String)>, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let token = Token::random().map_err(|e| e.to_string())?;
    let job = format!("hw-{}-{phase}", std::process::id());
    let children: Vec<_> = (0..world)
        .map(|r| {
            Command::new(&exe)
                .args(["hw", "comm-rank", phase])
                .env("RANK", r.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("SYMM_JOB", &job)
                .env("SYMM_TOKEN", token.to_hex())
                .env("NCCL_NVLS_ENABLE", "0")
                .env("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
                .env("NVSHMEM_DISABLE_NVLS", "1")
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("rank {r}: {e}"))
        })
        .collect::<Result<_, _>>()?;
    children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().map_err(|e| e.to_string())?;
            let text = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            Ok((out.status.code().unwrap_or(-1), text))
        })
        .collect()
}

/// The parent: runs both phases at world `w` and turns the ranks' reports into rows.
pub fn run(w: u16) -> Vec<Row> {
    let mut rows = Vec::new();
    for phase in ["matrix", "death", "bench"] {
        let t = Instant::now();
        let mut row = Row::new(&format!("process per GPU: {phase}"), w);
        row.cases = w as usize;
        match spawn(w, phase) {
            Err(e) => row.fail(e),
            Ok(ranks) => {
                for (r, (code, text)) in ranks.iter().enumerate() {
                    for l in text.lines() {
                        println!("[{r}] {l}");
                    }
                    let killed = phase == "death" && r == 1;
                    if *code != 0 && !killed {
                        row.fail(format!("rank {r} exited {code}"));
                    }
                    if r == 0 {
                        if let Some(l) = text.lines().rev().find(|l| l.starts_with("summary: ")) {
                            row.note = l.trim_start_matches("summary: ").to_string();
                        }
                    }
                }
            }
        }
        row.seconds = t.elapsed().as_secs_f64();
        rows.push(row);
    }
    rows
}

fn opts(timeout: Duration, heap_bytes: u64) -> CommOptions {
    CommOptions {
        heap_bytes,
        timeout,
        bootstrap_timeout: Duration::from_secs(60),
        nvrtc: None,
    }
}

/// One case on fresh collective buffers; `Ok(false)` when the output is wrong.
fn case(
    comm: &Comm,
    stream: &Stream,
    req: &Request,
    seed: u64,
) -> Result<Result<(), String>, String> {
    let e = |e: CudaError| e.to_string();
    let me = comm.rank() as usize;
    let b = comm.alloc(req).map_err(e)?;
    let inputs = data::inputs(req, seed);
    let r = (|| {
        comm.write(b.input, &inputs[me]).map_err(e)?;
        comm.fill(b.output, b.sizes.output, host::POISON)
            .map_err(e)?;
        comm.fill(b.scratch, b.sizes.scratch.max(16), host::POISON)
            .map_err(e)?;
        comm.run(req, &b, stream).map_err(e)?;
        let found = comm.read(b.output, b.sizes.output).map_err(e)?;
        let want = host::reference(req, &inputs);
        Ok(exact(req, &[found], &want[me..me + 1]))
    })();
    comm.free(&b).map_err(e)?;
    r
}

/// The shared conformance matrix (`symm_tests::matrix`), run by every rank on the job.
fn matrix(comm: &mut Comm) -> Result<String, String> {
    let m = Matrix {
        worlds: vec![comm.world()],
        sizes: SIZES.to_vec(),
        dtypes: vec![DType::F32, DType::Bf16, DType::I32],
        ops: vec![ReduceOp::Sum, ReduceOp::Max],
        multicast: false,
        shape: |r: Request| r.with_channels(channels_for(r.bytes)),
        keep: |_| true,
        inputs: data::inputs,
        compare: Compare::Exact,
    };
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

fn graph(comm: &Comm, stream: &Stream) -> Result<String, String> {
    let e = |e: CudaError| e.to_string();
    let me = comm.rank() as usize;
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::TwoShot,
        comm.world(),
        64 << 10,
        DType::Bf16,
        ReduceOp::Sum,
    )
    .with_channels(2);
    let b: Buffers = comm.alloc(&req).map_err(e)?;
    // Plans are built (device memory allocated) before capture, which forbids allocation.
    comm.prepare(&req).map_err(e)?;
    let g = Graph::capture(comm.device(), stream, || comm.enqueue(&req, &b, stream)).map_err(e)?;
    for i in 0..100u64 {
        let inputs = data::inputs(&req, 1000 + i);
        comm.write(b.input, &inputs[me]).map_err(e)?;
        comm.fill(b.output, b.sizes.output, host::POISON)
            .map_err(e)?;
        g.launch(stream).map_err(e)?;
        comm.synchronize(stream).map_err(e)?;
        let found = comm.read(b.output, b.sizes.output).map_err(e)?;
        exact(&req, &[found], &host::reference(&req, &inputs)[me..me + 1])
            .map_err(|m| format!("replay {i}: {m}"))?;
    }
    drop(g);
    comm.free(&b).map_err(e)?;
    Ok("100 graph replays bit exact".into())
}

fn poison_reset(comm: &Comm, stream: &Stream) -> Result<String, String> {
    let e = |e: CudaError| e.to_string();
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::OneShot,
        comm.world(),
        4096,
        DType::F32,
        ReduceOp::Sum,
    );
    let b = comm.alloc(&req).map_err(e)?;
    // Rank 1 skips this collective: every other rank times out waiting for it.
    if comm.rank() != 1 {
        comm.enqueue(&req, &b, stream).map_err(e)?;
        match comm.synchronize(stream) {
            Err(CudaError::Timeout { .. }) => {}
            other => return Err(format!("a collective rank 1 skipped gave {other:?}")),
        }
        match comm.enqueue(&req, &b, stream) {
            Err(CudaError::Poisoned(_)) => {}
            other => return Err(format!("after the timeout, enqueue gave {other:?}")),
        }
    }
    comm.reset().map_err(e)?;
    let mut n = 0;
    for i in 0..100u64 {
        let a = [
            Algorithm::Ring,
            Algorithm::OneShot,
            Algorithm::TwoShot,
            Algorithm::Rhd,
        ][i as usize % 4];
        let req = Request {
            algorithm: a,
            ..req
        };
        case(comm, stream, &req, 5000 + i)?.map_err(|m| format!("after reset, run {i}: {m}"))?;
        n += 1;
    }
    comm.free(&b).map_err(e)?;
    Ok(format!(
        "timeout -> Timeout, Poisoned, reset() -> {n} bit exact"
    ))
}

fn death(comm: Comm, stream: Stream, dev: &Device, free_before: usize) -> Result<String, String> {
    let e = |e: CudaError| e.to_string();
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        comm.world(),
        1 << 20,
        DType::F32,
        ReduceOp::Sum,
    );
    let b = comm.alloc(&req).map_err(e)?;
    if comm.rank() == 1 {
        std::thread::sleep(Duration::from_millis(300));
        let _ = Command::new("kill")
            .args(["-9", &std::process::id().to_string()])
            .status();
        std::thread::sleep(Duration::from_secs(10));
        return Err("still alive after kill -9".into());
    }
    comm.enqueue(&req, &b, &stream).map_err(e)?;
    let t = Instant::now();
    let lost = loop {
        match comm.check() {
            Err(CudaError::PeerLost { rank }) => break rank,
            Err(other) => return Err(format!("expected PeerLost, got {other}")),
            Ok(()) if t.elapsed() > Duration::from_secs(20) => {
                return Err("no PeerLost after 20 s".into())
            }
            Ok(()) => std::thread::sleep(Duration::from_millis(1)),
        }
    };
    let seen = t.elapsed();
    // The kernel stops at its next wait once the abort word is up.
    let stopped = stream.synchronize();
    drop(stream);
    let after = Instant::now();
    drop(comm);
    let drop_took = after.elapsed();
    // The dead peer's process still holds an import of this heap until the driver has torn it
    // down, which it does after the process ends: wait for it, briefly.
    let (mut free_after, _) = dev.mem_info().map_err(e)?;
    let waited = Instant::now();
    while free_before.saturating_sub(free_after) as u64 > DEATH_HEAP / 2
        && waited.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(20));
        free_after = dev.mem_info().map_err(e)?.0;
    }
    let returned_after = waited.elapsed();
    if lost != 1 {
        return Err(format!("PeerLost named rank {lost}"));
    }
    // The kill comes 300 ms after the collective was enqueued.
    if seen > Duration::from_millis(2300) {
        return Err(format!("PeerLost after {seen:?}"));
    }
    // The heap is 1 GiB: anything of it left mapped shows. What the context reserves at its first
    // kernel launch (local memory for every thread the GPU can hold, tens of MiB) stays with the
    // context and is reported, not counted.
    let drift = free_before as i64 - free_after as i64;
    if drift > (DEATH_HEAP / 2) as i64 {
        return Err(format!(
            "free memory {free_before} B before the job, {free_after} B after drop"
        ));
    }
    Ok(format!(
        "PeerLost {{ rank: 1 }} {:.0} ms after enqueue (kill at 300 ms); kernel stopped: {}; drop {:.0} ms; 1 GiB heap returned {:.0} ms after drop (drift {drift} B)",
        seen.as_secs_f64() * 1e3,
        stopped.is_ok(),
        drop_took.as_secs_f64() * 1e3,
        returned_after.as_secs_f64() * 1e3,
    ))
}

/// Bytes, timed iterations, and the (algorithm, channels) tried.
type BenchCase = (u64, u32, &'static [(Algorithm, u16)]);

/// Hostile calls: buffers short of the plan or over the signal pad are refused before anything is
/// enqueued (the next collective is bit exact), and ranks that allocate differently get an
/// error naming the call on both sides. Runs last: the allocators differ afterwards.
fn hostile(comm: &Comm, stream: &Stream) -> Result<String, String> {
    let e = |e: CudaError| e.to_string();
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        comm.world(),
        64 << 10,
        DType::F32,
        ReduceOp::Sum,
    );
    let b = comm.alloc(&req).map_err(e)?;
    let mut short = b;
    short.sizes.output -= 4;
    let mut pad = b;
    pad.output = 0;
    for (what, bad) in [("4 bytes short", short), ("over the signal pad", pad)] {
        match comm.enqueue(&req, &bad, stream) {
            Err(CudaError::Invalid(_)) => {}
            other => return Err(format!("an output {what} gave {other:?}")),
        }
    }
    comm.free(&b).map_err(e)?;
    case(comm, stream, &req, 9000)?.map_err(|m| format!("after the refusals: {m}"))?;
    let n = if comm.rank() == 0 { 4096 } else { 8192 };
    let sizes = symm_core::sched::BufferSizes {
        input: n,
        output: n,
        scratch: 0,
    };
    match comm.alloc_sizes(sizes) {
        Err(CudaError::Invalid(m)) if m.contains("diverged") => Ok(format!(
            "2 bad buffer sets refused; divergent allocation named: {m}"
        )),
        other => Err(format!("divergent allocation gave {other:?}")),
    }
}

/// All-reduce bf16 sum, one process per GPU: symm's `Comm` on its own stream against NCCL
/// (ncclCommInitRank) on the same buffers and stream, the slowest rank's CUDA-event time.
fn bench(comm: &Comm, stream: &Stream) -> Result<String, String> {
    use symm_driver::cuda::ffi::nccl as nffi;
    use symm_driver::cuda::nccl::NcclRank;
    let e = |e: CudaError| e.to_string();
    let nccl = NcclRank::new(comm).map_err(e);
    let w = comm.world();
    let mut lines = Vec::new();
    let cases: [BenchCase; 3] = [
        (
            1 << 10,
            500,
            &[(Algorithm::OneShot, 1), (Algorithm::TwoShot, 1)],
        ),
        (
            1 << 20,
            200,
            &[(Algorithm::OneShot, 16), (Algorithm::TwoShot, 16)],
        ),
        (
            256 << 20,
            10,
            &[(Algorithm::TwoShot, 64), (Algorithm::Ring, 64)],
        ),
    ];
    for (bytes, iters, algos) in cases {
        let mut best = (f64::MAX, String::new());
        for &(a, ch) in algos {
            let req = Request::new(
                Collective::AllReduce,
                a,
                w,
                bytes,
                DType::Bf16,
                ReduceOp::Sum,
            )
            .with_channels(ch);
            let b = comm.alloc(&req).map_err(e)?;
            let inputs = data::inputs(&req, bytes ^ ch as u64);
            let me = comm.rank() as usize;
            comm.write(b.input, &inputs[me]).map_err(e)?;
            let us = comm.time(&req, &b, stream, 10, iters).map_err(e)?;
            let found = comm.read(b.output, b.sizes.output).map_err(e)?;
            exact(&req, &[found], &host::reference(&req, &inputs)[me..me + 1])
                .map_err(|m| format!("{} {bytes} B after timing: {m}", a.name()))?;
            let slowest = comm
                .exchange(&us.to_le_bytes())
                .map_err(e)?
                .iter()
                .filter_map(|v| v.as_slice().try_into().ok().map(f64::from_le_bytes))
                .fold(0.0, f64::max);
            if slowest < best.0 {
                best = (slowest, format!("{}/{ch}ch", a.name()));
            }
            let nccl_us = match &nccl {
                Ok(n) => {
                    let t = n
                        .time_all_reduce(
                            comm,
                            (b.input, b.output),
                            (bytes / 2) as usize,
                            nffi::BFLOAT16,
                            nffi::SUM,
                            stream,
                            (10, iters),
                        )
                        .map_err(e)?;
                    comm.exchange(&t.to_le_bytes())
                        .map_err(e)?
                        .iter()
                        .filter_map(|v| v.as_slice().try_into().ok().map(f64::from_le_bytes))
                        .fold(0.0, f64::max)
                }
                Err(_) => f64::NAN,
            };
            comm.free(&b).map_err(e)?;
            if a == algos[algos.len() - 1].0 {
                let busbw = |t: f64| bytes as f64 / t / 1e3 * 2.0 * (w as f64 - 1.0) / w as f64;
                lines.push(format!(
                    "{bytes} B: symm {:.2} us ({:.0} GB/s, {}) vs NCCL {:.2} us ({:.0} GB/s)",
                    best.0,
                    busbw(best.0),
                    best.1,
                    nccl_us,
                    busbw(nccl_us)
                ));
            }
        }
    }
    if let Err(m) = &nccl {
        lines.push(format!("NCCL unavailable: {m}"));
    }
    Ok(lines.join("; "))
}

/// The child: one rank of `phase`. Prints `summary: ...` last on success.
pub fn rank(phase: &str) -> Result<(), String> {
    let e = |e: CudaError| e.to_string();
    let local: i32 = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or("LOCAL_RANK is not set")?;
    let dev = Device::open(local).map_err(e)?;
    let (free_before, _) = dev.mem_info().map_err(e)?;
    let (timeout, heap) = match phase {
        "death" => (30, DEATH_HEAP),
        "bench" => (10, 1 << 30),
        _ => (2, 64 << 20),
    };
    let comm = Comm::from_env(opts(Duration::from_secs(timeout), heap)).map_err(e)?;
    let stream = Stream::new(comm.device()).map_err(e)?;
    let summary = match phase {
        "matrix" => {
            let mut comm = comm;
            let before = symm_driver::cuda::device::current_context().map_err(e)?;
            let m = matrix(&mut comm)?;
            if symm_driver::cuda::device::current_context().map_err(e)? != before {
                return Err("the matrix changed the calling thread's context".into());
            }
            let g = graph(&comm, &stream)?;
            let p = poison_reset(&comm, &stream)?;
            let h = hostile(&comm, &stream)?;
            drop(stream);
            comm.finish().map_err(e)?;
            format!("{m}; {g}; {p}; {h}")
        }
        "death" => death(comm, stream, &dev, free_before)?,
        "bench" => {
            let r = bench(&comm, &stream)?;
            drop(stream);
            comm.finish().map_err(e)?;
            r
        }
        other => return Err(format!("unknown phase {other:?}")),
    };
    println!("summary: {summary}");
    Ok(())
}

//! The host backend from user code: an all-reduce on eight simulated ranks, without a GPU.
//!
//! ```sh
//! cargo run -p symm-examples --bin host-allreduce
//! ```
//!
//! What a user of symm does to try a collective before touching a GPU:
//!
//! 1. build a [`Request`] (collective, algorithm, world, bytes, dtype, operator) and shape it
//!    (channels, pipelining chunk and scratch slots); `validate` says what is wrong with it, and
//!    `buffer_sizes` what each rank must provide;
//! 2. draw one input per rank (here: small random integers, so every float sum is exact);
//! 3. run it on the deterministic simulator ([`host::simulate`], virtual time on a link model)
//!    and on real threads ([`host::run_threads`], one OS thread per (rank, channel), real atomics),
//!    directly and through the [`Backend`] interface every backend shares;
//! 4. compare every rank's output with the sequential reference ([`host::reference`]);
//! 5. print the cost model's prediction ([`cost::predict`]) beside the simulated time;
//! 6. write the simulator's trace to a file (what `cargo xtask viz` replays) and decode it back.
//!
//! Every algorithm of all-reduce but multicast runs (multicast needs NVLink multicast hardware on
//! a GPU, though the host model runs it too). Any mismatch is an error: the program exits with a
//! non-zero status, so `cargo xtask test` runs it as a check.
#![forbid(unsafe_code)]

use std::error::Error;
use std::path::PathBuf;

use symm_core::cost::{self, Link};
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{algorithms, Algorithm, Collective, Request};
use symm_core::trace::{self, EventKind, Source};
use symm_driver::backend::{Backend, Simulator, Threads};
use symm_driver::host::{self, SimOptions, ThreadOptions};

/// A plain error with a message, for the checks below.
fn fail(msg: String) -> Box<dyn Error> {
    msg.into()
}

/// Checks `found` against the reference for `req`, naming `what` ran it.
fn check(
    req: &Request,
    what: &str,
    found: &[Vec<u8>],
    want: &[Vec<u8>],
) -> Result<(), Box<dyn Error>> {
    host::compare(req, found, want).map_err(|m| {
        fail(format!(
            "{} on {what}: rank {} element {} is {}, the reference says {}",
            req.algorithm.name(),
            m.rank,
            m.elem,
            m.found,
            m.want
        ))
    })
}

/// A temporary file name of this process (removed at the end).
fn temp_trace(alg: Algorithm) -> PathBuf {
    std::env::temp_dir().join(format!(
        "symm-host-allreduce-{}-{}.trace",
        std::process::id(),
        alg.name()
    ))
}

/// Writes `bytes` to a temporary file, reads it back, decodes it and checks it describes `req`
/// with one begin and one end event per op. Returns the number of events.
fn round_trip_trace(req: &Request, bytes: &[u8], ops: u64) -> Result<usize, Box<dyn Error>> {
    let path = temp_trace(req.algorithm);
    std::fs::write(&path, bytes).map_err(|e| fail(format!("{}: {e}", path.display())))?;
    let read = std::fs::read(&path);
    // Remove the file whatever happened next.
    let _ = std::fs::remove_file(&path);
    let read = read.map_err(|e| fail(format!("{}: {e}", path.display())))?;
    let decoded = trace::decode(&read).map_err(|e| fail(format!("{}: {e}", path.display())))?;
    if let Some(w) = decoded.warning {
        return Err(fail(format!("the trace reads with a warning: {w}")));
    }
    let h = &decoded.header;
    if h.request != *req || h.source != (Source::Host { simulated: true }) {
        return Err(fail(format!("the trace's header is not this run's: {h:?}")));
    }
    let ends = decoded
        .events
        .iter()
        .filter(|e| e.kind == EventKind::End)
        .count() as u64;
    if ends != ops || decoded.events.len() as u64 != 2 * ops {
        return Err(fail(format!(
            "the trace has {} events ({ends} ends) for {ops} ops",
            decoded.events.len()
        )));
    }
    Ok(decoded.events.len())
}

fn run() -> Result<(), Box<dyn Error>> {
    let link = Link::NVLINK4;
    let world = 8;
    let bytes = 1 << 20; // 1 MiB of f32 per rank
    let base = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        world,
        bytes,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_channels(2)
    .with_pipeline(64 << 10, 2);
    base.validate()
        .map_err(|e| fail(format!("the request: {e}")))?;
    let sz = base.buffer_sizes();
    println!(
        "all_reduce, {world} ranks, {bytes} B of f32 per rank, {} channels: \
         input {} B, output {} B per rank",
        base.channels, sz.input, sz.output
    );

    // A request the schedules refuse, refused with a reason rather than a panic.
    let bad = base.with_pipeline(64 << 10, 1);
    match bad.validate() {
        Err(e) => println!("one scratch slot is refused: {e}"),
        Ok(()) => return Err(fail("a ring all-reduce with one slot validated".into())),
    }

    let inputs = host::random_inputs(&base, 2024);
    let want = host::reference(&base, &inputs);
    println!(
        "\n{:<12} {:>8} {:>10} {:>10} {:>8}   checked against the reference",
        "algorithm", "ops", "model us", "sim us", "events"
    );
    for &alg in algorithms(Collective::AllReduce) {
        if alg == Algorithm::Multicast || !alg.takes(base.bytes) {
            continue;
        }
        let req = Request {
            algorithm: alg,
            ..base
        };
        req.validate()
            .map_err(|e| fail(format!("{}: {e}", alg.name())))?;

        // The simulator, called directly: outputs, op count, virtual time, trace.
        let sim = host::simulate(&req, &inputs, &SimOptions::default())?;
        check(&req, "the simulator", &sim.outputs, &want)?;

        // Real threads, called directly (no trace: the run is about the data).
        let opts = ThreadOptions {
            trace: false,
            ..ThreadOptions::default()
        };
        let threads = host::run_threads(&req, &inputs, &opts)?;
        check(&req, "threads", &threads.outputs, &want)?;
        if threads.ops != sim.ops {
            return Err(fail(format!(
                "{}: threads ran {} ops, the simulator {}",
                alg.name(),
                threads.ops,
                sim.ops
            )));
        }

        // The same two through the one interface every backend (CUDA included) implements.
        let backends: [&mut dyn Backend; 2] = [&mut Simulator::default(), &mut Threads::default()];
        for b in backends {
            let out = b.run(&req, &inputs, false)?;
            check(&req, &b.name(), &out.outputs, &want)?;
        }

        // Both columns leave out the launch, as the viewer shows them.
        let model = cost::predict(&req, &link) - link.launch_us;
        let simulated = sim.time_us - link.launch_us;
        let events = round_trip_trace(&req, &sim.trace, sim.ops)?;
        println!(
            "{:<12} {:>8} {:>10.1} {:>10.1} {:>8}   simulator, threads, 2 backends: pass",
            alg.name(),
            sim.ops,
            model,
            simulated,
            events
        );
    }
    let pick = cost::select(&base, &link, false);
    println!(
        "\ncost::select picks {} for this request on NVLink 4 (multicast not considered)",
        pick.name()
    );
    println!("host-allreduce: every algorithm matches the reference");
    Ok(())
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("host-allreduce: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

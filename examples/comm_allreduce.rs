//! All-reduce with one process per GPU: the shape of a program that embeds symm.
//!
//! ```sh
//! cargo build --release -p symm-examples -p symm-bootstrap --bin comm-allreduce --bin symm-run
//! target/release/symm-run -n 2 -- target/release/comm-allreduce [BYTES] [ITERS]
//! ```
//!
//! Each process joins the job from its environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
//! `SYMM_JOB`, `SYMM_TOKEN`, as `symm-run` sets them), opens GPU `LOCAL_RANK`, allocates the
//! collective's buffers in the symmetric heap, fills its input with `rank + 1` in every f32
//! element, runs a sum all-reduce on its own stream, captures it in a CUDA graph and replays it,
//! and checks every element against `w (w + 1) / 2` after each run. It prints one line per rank
//! and exits non-zero on any error, which makes `symm-run` end the job.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::cuda::device::{Event, Stream};
use symm_driver::cuda::{Comm, CommOptions, CudaError};

fn main() -> ExitCode {
    match run() {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("comm-allreduce: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Parses argument `i` as a number, with a default.
fn arg(i: usize, default: u64) -> Result<u64, String> {
    match std::env::args().nth(i) {
        None => Ok(default),
        Some(v) => v
            .parse()
            .map_err(|_| format!("argument {i} ({v:?}) is not a number")),
    }
}

fn run() -> Result<String, String> {
    let bytes = arg(1, 1 << 20)?;
    let iters = arg(2, 20)?;
    if bytes == 0 || bytes % 4 != 0 || bytes > 1 << 30 {
        return Err(format!("{bytes} bytes: a multiple of 4 up to 1 GiB"));
    }
    let e = |e: CudaError| e.to_string();
    let comm = Comm::from_env(CommOptions {
        heap_bytes: 3 * bytes + (64 << 20),
        ..CommOptions::default()
    })
    .map_err(e)?;
    let (rank, world) = (comm.rank(), comm.world());
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::TwoShot,
        world,
        bytes,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_channels(if bytes >= 1 << 20 { 16 } else { 1 });
    let b = comm.alloc(&req).map_err(e)?;
    let stream = Stream::new(comm.device()).map_err(e)?;
    let mine: Vec<u8> = (0..bytes / 4)
        .flat_map(|_| (rank as f32 + 1.0).to_le_bytes())
        .collect();
    let want = (world as f32) * (world as f32 + 1.0) / 2.0;
    let check = |what: &str| -> Result<(), String> {
        let out = comm.memory().read(b.output, bytes).map_err(e)?;
        match out
            .chunks_exact(4)
            .position(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) != want)
        {
            None => Ok(()),
            Some(i) => Err(format!("{what}: element {i} is not {want}")),
        }
    };
    // Eager: admitted once (checked, planned, its executor fixed), then launched on our stream
    // and waited for (errors are reported by synchronize).
    comm.memory().write(b.input, &mine).map_err(e)?;
    let ar = comm.admit(&req).map_err(e)?;
    comm.launch(&ar, &b, &stream).map_err(e)?;
    comm.synchronize(&stream).map_err(e)?;
    check("eager")?;
    // In a CUDA graph: prepare first (it compiles the plan's kernel), capture once, replay.
    comm.prepare(&[req]).map_err(e)?;
    let g = comm
        .capture(&stream, |cap| cap.enqueue(&req, &b))
        .map_err(e)?;
    for _ in 0..iters {
        g.launch(&stream).map_err(e)?;
    }
    comm.synchronize(&stream).map_err(e)?;
    check("graph")?;
    // Timed back to back with CUDA events: each launch of the admitted request is a launch,
    // no lookup.
    let (start, end) = (
        Event::new(comm.device()).map_err(e)?,
        Event::new(comm.device()).map_err(e)?,
    );
    start.record(&stream).map_err(e)?;
    for _ in 0..iters {
        comm.launch(&ar, &b, &stream).map_err(e)?;
    }
    end.record(&stream).map_err(e)?;
    comm.synchronize(&stream).map_err(e)?;
    let us = start.elapsed_ms(&end).map_err(e)? as f64 * 1000.0 / iters.max(1) as f64;
    check("timed")?;
    drop(g);
    comm.free(&b).map_err(e)?;
    drop(stream);
    let name = comm.device().name().to_string();
    comm.finish().map_err(e)?;
    Ok(format!(
        "rank {rank}/{world} on {name}: {bytes} B f32 sum all-reduce correct (eager, {iters} graph replays); {us:.2} us per op"
    ))
}

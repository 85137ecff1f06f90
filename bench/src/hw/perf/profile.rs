//! Where the time of a small all-reduce goes inside the kernel: the interpreter's own trace.
//!
//! Each algorithm runs traced (`Tracer::run`: the GPU's global timer at every op's begin and
//! end, thread 0 of each block) a number of times after warm-up; the table gives each op's mean
//! time on channel 0, the gap before it (the interpreter's own work between ops: fetching the
//! op, block barriers), and the kernel body from the first begin to the last end. Beside the
//! eager time per operation of the bench, the difference is the launch and the host.

use std::fmt::Write;

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_core::trace::{self, EventKind};
use symm_driver::cuda::device::Stream;
use symm_driver::cuda::{Comm, Tracer};

const RUNS: usize = 20;

/// The table for 1 KiB bf16 all-reduce with each of `algos`, as markdown.
pub(super) fn profile(comm: &Comm, stream: &Stream, algos: &[Algorithm]) -> Result<String, String> {
    let e = |x: symm_driver::cuda::CudaError| x.to_string();
    let mut text = String::new();
    for &a in algos {
        let req = Request::new(
            Collective::AllReduce,
            a,
            comm.world(),
            1024,
            DType::Bf16,
            ReduceOp::Sum,
        );
        let b = comm.alloc(&req).map_err(e)?;
        let r = (|| -> Result<(), String> {
            comm.memory().write(b.input, &vec![0x3f; 1024]).map_err(e)?;
            // op index -> (name, sum of durations, sum of gaps, runs); body sum.
            let mut ops: Vec<(&'static str, u64, u64, u64)> = Vec::new();
            let mut body = 0u64;
            let mut tracer = Tracer::load(comm).map_err(e)?;
            for run in 0..RUNS + 5 {
                comm.exchange(&[]).map_err(e)?;
                let part = tracer.run(comm, &req, &b, stream).map_err(e)?;
                if run < 5 {
                    continue;
                }
                let t = trace::decode(&part).map_err(|x| format!("{x:?}"))?;
                let mut begin = vec![None; 0];
                let mut prev_end: Option<u64> = None;
                let (mut first, mut last) = (u64::MAX, 0u64);
                for ev in t.events.iter().filter(|ev| ev.channel == 0) {
                    let i = ev.index as usize;
                    if begin.len() <= i {
                        begin.resize(i + 1, None);
                    }
                    if ops.len() <= i {
                        ops.resize(i + 1, ("", 0, 0, 0));
                    }
                    match ev.kind {
                        EventKind::Begin => {
                            begin[i] = Some(ev.time);
                            first = first.min(ev.time);
                            if let Some(p) = prev_end {
                                ops[i].2 += ev.time.saturating_sub(p);
                            }
                        }
                        EventKind::End => {
                            if let Some(s) = begin[i] {
                                ops[i].0 = ev.op.kind_name();
                                ops[i].1 += ev.time.saturating_sub(s);
                                ops[i].3 += 1;
                            }
                            prev_end = Some(ev.time);
                            last = last.max(ev.time);
                        }
                        _ => {}
                    }
                }
                body += last.saturating_sub(first);
            }
            let _ = writeln!(
                text,
                "\n{} 1 KiB bf16, rank {}, channel 0, mean of {RUNS} traced runs: kernel body {:.2} us",
                a.name(),
                comm.rank(),
                body as f64 / RUNS as f64 / 1000.0
            );
            let _ = writeln!(
                text,
                "\n| op | kind | time (us) | gap before (us) |\n|---|---|---|---|"
            );
            for (i, (name, d, g, n)) in ops.iter().enumerate() {
                let n = (*n).max(1) as f64;
                let _ = writeln!(
                    text,
                    "| {i} | {name} | {:.2} | {:.2} |",
                    *d as f64 / n / 1000.0,
                    *g as f64 / n / 1000.0
                );
            }
            Ok(())
        })();
        comm.free(&b).map_err(e)?;
        r?;
    }
    Ok(text)
}

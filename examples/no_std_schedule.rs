//! The host side of the `no_std` example: `symm-example-no-std`'s counts and plans, checked.
//!
//! ```sh
//! cargo run -p symm-examples --bin no-std-schedule
//! ```
//!
//! `examples/no_std/` walks schedules with `core` alone ([`tally`], [`plan_into`]); `cargo xtask
//! test` builds it for `thumbv7em-none-eabihf`. This program runs the same functions on the host
//! and checks them against three `alloc`-based paths of symm: every stream collected into a
//! `Vec<Op>` and counted here, the symbolic checker's op count (`symbolic::check`, which also
//! proves the schedule correct) and the simulator's (`host::simulate`, timing only). It covers
//! every collective x algorithm at worlds 1, 2, 3, 5 and 8 with one and two channels, then prints
//! the counts of an 8-rank 1 MiB all-reduce per algorithm. Any disagreement exits non-zero.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::error::Error;

use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::Op;
use symm_core::plan::PlanOp;
use symm_core::sched::{algorithms, pairs, Collective, Request, SchedError, Schedule};
use symm_core::symbolic;
use symm_driver::host::{self, SimOptions};
use symm_example_no_std::{plan_into, tally, PlanIntoError, Tally};

/// Every op of every stream of `req`, collected.
fn collect(req: &Request) -> Result<Vec<(u16, Vec<Op>)>, SchedError> {
    let mut all = Vec::new();
    for r in 0..req.world {
        for c in 0..req.channels {
            all.push((r, Schedule::new(*req, r, c)?.collect()));
        }
    }
    Ok(all)
}

/// The counts of [`Tally`], computed from the collected ops with other code.
fn tally_of(streams: &[(u16, Vec<Op>)]) -> Tally {
    let mut kinds = BTreeMap::<&str, u64>::new();
    let mut t = Tally::default();
    for (me, ops) in streams {
        for op in ops {
            *kinds.entry(op.kind_name()).or_default() += 1;
            t.bytes += op.bytes();
            let local = |l: &symm_core::op::Loc| l.rank == *me;
            let remote = match op {
                Op::Copy { src, dst, .. } => !(local(src) && local(dst)),
                Op::Reduce { a, b, dst, .. } => !(local(a) && local(b) && local(dst)),
                Op::ReduceN { ranks, dst, .. } => {
                    !local(dst) || ranks.as_slice().iter().any(|r| r != me)
                }
                Op::LlPut { src, dst, .. } | Op::LlReduce { src, dst, .. } => {
                    !(local(src) && local(dst))
                }
                Op::McReduce { .. } | Op::McStore { .. } => true,
                Op::Signal { .. } | Op::Wait { .. } => false,
            };
            if remote {
                t.remote_bytes += op.bytes();
            }
        }
        t.longest = t.longest.max(ops.len() as u64);
    }
    let n = |k| kinds.get(k).copied().unwrap_or(0);
    t.copies = n("copy") + n("ll_put") + n("ll128_put");
    t.reduces = n("reduce") + n("reduce_n") + n("ll_reduce") + n("ll128_reduce");
    t.signals = n("signal");
    t.waits = n("wait");
    t.multicast = n("mc_reduce") + n("mc_store");
    t
}

/// Checks one request; returns its op count.
fn check(req: &Request) -> Result<u64, Box<dyn Error>> {
    let name = format!(
        "{} {} w{} {} B ({} ch)",
        req.collective.name(),
        req.algorithm.name(),
        req.world,
        req.bytes,
        req.channels
    );
    let t = tally(req).map_err(|e| format!("{name}: {e}"))?;
    let streams = collect(req).map_err(|e| format!("{name}: {e}"))?;
    let want = tally_of(&streams);
    if t != want {
        return Err(format!("{name}: no_std counts {t:?}, collected ops {want:?}").into());
    }
    let sym = symbolic::check(req, 7).map_err(|e| format!("{name}: symbolic: {e:?}"))?;
    let timing_only = SimOptions {
        trace: false,
        data: false,
        ..SimOptions::default()
    };
    let sim = host::simulate(req, &[], &timing_only)?;
    if sym.ops != t.ops() || sim.ops != t.ops() {
        return Err(format!(
            "{name}: no_std counts {} ops, the symbolic checker ran {}, the simulator {}",
            t.ops(),
            sym.ops,
            sim.ops
        )
        .into());
    }
    // The plan of the last rank's last channel, into an array of exactly its length, then into
    // one op too few.
    let (rank, ops) = streams.last().ok_or("no streams")?;
    let channel = req.channels - 1;
    let mut plan = vec![PlanOp::default(); ops.len()];
    let n = plan_into(req, *rank, channel, &mut plan).map_err(|e| format!("{name}: {e:?}"))?;
    let encoded: Vec<PlanOp> = ops.iter().map(PlanOp::encode).collect();
    if plan[..n] != encoded[..] {
        return Err(format!("{name}: plan_into differs from the encoded stream").into());
    }
    if let Some(short) = ops.len().checked_sub(1) {
        let got = plan_into(req, *rank, channel, &mut plan[..short]);
        if got != Err(PlanIntoError::TooLong { needed: n as u64 }) {
            return Err(format!("{name}: a short plan array gave {got:?}").into());
        }
    }
    Ok(t.ops())
}

fn run() -> Result<(), Box<dyn Error>> {
    let mut requests = 0;
    let mut ops = 0;
    for world in [1u16, 2, 3, 5, 8] {
        for (c, a) in pairs(world) {
            for (channels, bytes) in [(1, 1024), (2, 4096 + 8)] {
                let req = Request::new(c, a, world, bytes, DType::F32, ReduceOp::Sum)
                    .with_channels(channels)
                    .with_pipeline(256, 2);
                ops += check(&req)?;
                requests += 1;
            }
        }
    }
    // What the no_std path refuses, it refuses with the schedule's error.
    let v = Request::new(
        Collective::AllToAllV,
        algorithms(Collective::AllToAllV)[0],
        4,
        64,
        DType::F32,
        ReduceOp::Sum,
    );
    if tally(&v) != Err(SchedError::NeedsCounts) {
        return Err("an all-to-allv without counts was not refused".into());
    }
    println!(
        "no_std tallies and plans of {requests} requests ({ops} ops) equal the collected ops, the \
         symbolic checker's and the simulator's counts"
    );

    let base = Request::new(
        Collective::AllReduce,
        algorithms(Collective::AllReduce)[0],
        8,
        1 << 20,
        DType::F32,
        ReduceOp::Sum,
    );
    println!("\nall_reduce, 8 ranks, 1 MiB f32: counted with core alone");
    println!(
        "{:<12} {:>7} {:>7} {:>7} {:>7} {:>7} {:>12} {:>12} {:>8}",
        "algorithm", "copy", "reduce", "signal", "wait", "mc", "bytes", "remote", "longest"
    );
    for &a in algorithms(Collective::AllReduce) {
        if !a.takes(base.bytes) {
            continue;
        }
        let req = Request {
            algorithm: a,
            ..base
        };
        let t = tally(&req).map_err(|e| format!("{}: {e}", a.name()))?;
        println!(
            "{:<12} {:>7} {:>7} {:>7} {:>7} {:>7} {:>12} {:>12} {:>8}",
            a.name(),
            t.copies,
            t.reduces,
            t.signals,
            t.waits,
            t.multicast,
            t.bytes,
            t.remote_bytes,
            t.longest
        );
    }
    println!("no-std-schedule: pass");
    Ok(())
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("no-std-schedule: FAILED: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

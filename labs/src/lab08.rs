//! Lab 8's checker: multicast all-reduce on the host model of NVLink SHARP.
//!
//! Multicast runs only on the host model here (the simulator and the thread backend execute
//! `McReduce` and `McStore`; on GPUs the library compiles it only with the `multicast` feature
//! and refuses it unless explicitly enabled). Besides the usual checks, the schedule must move
//! its data through the switch: no copy or reduce may touch another rank's memory.

#[path = "../08-multicast/skeleton.rs"]
pub mod skeleton;
#[path = "../08-multicast/solution.rs"]
pub mod solution;

use crate::grade::{Graded, Grader};
use crate::problem::count;
use crate::problem::Problem;
use crate::run::{Case, Plan};
use symm_core::cost::predict;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::At;
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::host::DEFAULT_LINK;

fn request(algorithm: Algorithm, world: u16, bytes: u64) -> Request {
    Request::new(
        Collective::AllReduce,
        algorithm,
        world,
        bytes,
        DType::F32,
        ReduceOp::Sum,
    )
}

fn case(world: u16, n: u64) -> Case {
    let label = format!("world {world}, {}", count(n, "element"));
    Case::new(label, request(Algorithm::Multicast, world, n * 4))
}

fn hint(p: &Problem) -> Option<String> {
    Some(match p {
        Problem::Wrong { found, .. } if found.count == 0 => "segments other than your own \
            never reach your output: each rank multicast-stores its summed segment into \
            everyone's output"
            .into(),
        Problem::ReadUnwritten { .. } => "the multicast store reads your summed segment: \
            load-reduce it first"
            .into(),
        Problem::Unbalanced { .. } | Problem::Deadlock { .. } => "one Data signal to every \
            peer after your store, and one wait for every peer's"
            .into(),
        _ => return None,
    })
}

/// Grades lab 8.
pub fn check(g: &mut Grader) -> Graded {
    let plan: Plan = g.pick(&skeleton::all_reduce, &solution::all_reduce);
    g.traces(&case(4, 16), plan, &solution::all_reduce);
    for (w, n) in [(4, 16), (2, 5), (3, 7), (5, 3), (8, 21)] {
        let c = case(w, n);
        let passed = g.case(&c, plan, &hint)?;
        let unicast = passed.streams.iter().enumerate().find_map(|(r, ops)| {
            let r = r as u16;
            ops.iter()
                // An op that names another rank's bytes (multicast ranges name every rank's
                // at once).
                .position(|op| {
                    op.footprint()
                        .ranges()
                        .iter()
                        .any(|x| matches!(x.at, At::Rank(l) if l.rank != r))
                })
                .map(|i| (r, i))
        });
        if let Some((r, i)) = unicast {
            return Err(Grader::lab_failure(
                &c,
                "multicast",
                format!("rank {r}'s op {i} moves data to or from another rank by itself"),
                "let the switch do it: k.mc_reduce reads every rank's copy of an input \
                 segment, k.mc_store writes every rank's copy of an output segment",
            ));
        }
    }
    g.note("pass  every byte between ranks goes through a multicast op");
    for (bytes, size) in [(64 << 10, "64 KiB"), (16 << 20, "16 MiB")] {
        let at = |a| predict(&request(a, 8, bytes), &DEFAULT_LINK);
        g.note(format!(
            "note  the cost model at world 8, {size}: multicast {:.1} us, two-shot {:.1} us, \
             ring {:.1} us",
            at(Algorithm::Multicast),
            at(Algorithm::TwoShot),
            at(Algorithm::Ring)
        ));
    }
    Ok(())
}

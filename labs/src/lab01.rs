//! Lab 1's checker: ring all-gather over worlds 2..=6 and uneven block sizes.

#[path = "../01-ring-all-gather/skeleton.rs"]
pub mod skeleton;
#[path = "../01-ring-all-gather/solution.rs"]
pub mod solution;

use crate::grade::{Graded, Grader};
use crate::problem::Problem;
use crate::run::{Case, Plan};
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};

fn case(world: u16, elems: u64) -> Case {
    let req = Request::new(
        Collective::AllGather,
        Algorithm::Ring,
        world,
        elems * 4,
        DType::F32,
        ReduceOp::Sum,
    );
    Case::new(format!("world {world}, {elems} elements per block"), req)
}

fn hint(p: &Problem) -> Option<String> {
    Some(match p {
        Problem::ReadUnwritten { .. } => "you forward a block you do not hold yet: at step s \
            rank r holds its own block and those of r-1, ..., r-s, so it forwards block \
            (r - s) mod world, i.e. (rank + world - step) % world, after waiting for prev's Data"
            .into(),
        Problem::Wrong { found, .. } if found.count == 0 => "a block never arrived: each block \
            travels world - 1 hops, one per step, so every rank forwards world - 1 blocks"
            .into(),
        Problem::Wrong { .. } => "a block landed at the wrong place: block q belongs at output \
            elements q * n .. (q + 1) * n on every rank, and it is forwarded at the same offset"
            .into(),
        Problem::Unbalanced { .. } => "prev signals Data once per block it forwards to you \
            (world - 1 times): wait for each, the last one after your final send"
            .into(),
        _ => return None,
    })
}

/// Grades lab 1.
pub fn check(g: &mut Grader) -> Graded {
    let plan: Plan = g.pick(&skeleton::all_gather, &solution::all_gather);
    g.traces(&case(4, 8), plan, &solution::all_gather);
    for (w, n) in [(4, 8), (2, 4), (3, 5), (5, 3), (6, 7)] {
        g.case(&case(w, n), plan, &hint)?;
    }
    Ok(())
}

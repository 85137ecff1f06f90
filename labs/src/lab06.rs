//! Lab 6's checker: recursive halving-doubling all-reduce, powers of two first, then every
//! world from 2 to 7.
//!
//! The scratch holds one whole buffer per region: region 0 for the fold of the extra ranks,
//! region i + 1 for halving step i (its partner writes there while this rank may still be
//! reading step i's), so no slot is ever reused and `Data` signals suffice.

#[path = "../06-halving-doubling/skeleton.rs"]
pub mod skeleton;
#[path = "../06-halving-doubling/solution.rs"]
pub mod solution;

use crate::grade::{Graded, Grader};
use crate::problem::count;
use crate::problem::Problem;
use crate::run::{Case, Plan};
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};

fn case(world: u16, n: u64) -> Case {
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Rhd,
        world,
        n * 4,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_pipeline(n * 4, 1);
    Case::new(format!("world {world}, {}", count(n, "element")), req)
}

fn hint(p: &Problem) -> Option<String> {
    Some(match p {
        Problem::RankOutside { .. } | Problem::OutsideBuffer { .. } => {
            "this world is not a power of two: fold the extra ranks \
            (the even ranks below 2e) into their odd neighbours first, run halving-doubling over \
            the p virtual ranks, map virtual ranks back to real ones, and unfold at the end"
                .into()
        }
        Problem::Wrong { found, want, .. } if found.count < want.count => "an output misses \
            contributions: after halving, each rank holds only its segment reduced; doubling \
            swaps ranges with partner v ^ (1 << j) until every rank holds all segments, and \
            the extras must get the result back (the unfold)"
            .into(),
        Problem::Wrong { .. } => "a contribution is counted twice: an extra's input must reach \
            the sum once, through its partner's fold, and the extra itself must not take part \
            in halving"
            .into(),
        Problem::Deadlock { .. } => "pair every wait with the partner's signal: in each \
            halving and doubling step both partners signal Data once and wait once; the extra \
            and its partner exchange one Data each way (fold, unfold)"
            .into(),
        _ => return None,
    })
}

/// Grades lab 6.
pub fn check(g: &mut Grader) -> Graded {
    let plan: Plan = g.pick(&skeleton::all_reduce, &solution::all_reduce);
    check_plan(g, plan)
}

/// Grades `plan` as lab 6's all-reduce.
pub fn check_plan(g: &mut Grader, plan: Plan) -> Graded {
    g.traces(&case(6, 24), plan, &solution::all_reduce);
    for (w, n) in [(4, 16), (8, 13), (2, 5), (3, 7), (5, 10), (6, 12), (7, 9)] {
        g.case(&case(w, n), plan, &hint)?;
    }
    Ok(())
}

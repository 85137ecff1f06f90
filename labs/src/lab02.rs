//! Lab 2's checker: ring reduce-scatter, then ring all-reduce, over worlds 2..=6.
//!
//! The scratch holds `world - 1` slots of one block (reduce-scatter) or one segment
//! (all-reduce): step s of the ring has a slot of its own, so this lab needs no flow control.

#[path = "../02-ring-reduce-scatter/skeleton.rs"]
pub mod skeleton;
#[path = "../02-ring-reduce-scatter/solution.rs"]
pub mod solution;

use crate::grade::{Graded, Grader};
use crate::problem::count;
use crate::problem::Problem;
use crate::run::{Case, Plan};
use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::Buf;
use symm_core::sched::{Algorithm, Collective, Request};

fn reduce_scatter(world: u16, n: u64) -> Case {
    let req = Request::new(
        Collective::ReduceScatter,
        Algorithm::Ring,
        world,
        n * 4,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_pipeline(n * 4, world as u8 - 1);
    Case::new(
        format!(
            "reduce-scatter, world {world}, {} per block",
            count(n, "element")
        ),
        req,
    )
}

fn all_reduce(world: u16, n: u64) -> Case {
    let seg = n.div_ceil(world as u64);
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        world,
        n * 4,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_pipeline(seg * 4, world as u8 - 1);
    Case::new(
        format!("all-reduce, world {world}, {}", count(n, "element")),
        req,
    )
}

fn hint(p: &Problem) -> Option<String> {
    Some(match p {
        Problem::Wrong { found, want, .. } if found.count > 0 && found.count < want.count => {
            "a partial sum missed contributions: at step s > 0 add your input of the block to \
             the partial prev sent you (k.reduce) and forward the sum, and add your own input \
             once more at the end"
                .into()
        }
        Problem::Wrong { found, .. } if found.count == 0 => "an output element was never \
            written: the reduce-scatter ends with rank r writing its reduced block or segment \
            to its output; in the all-reduce, the all-gather pass then forwards each segment \
            world - 1 times"
            .into(),
        Problem::Mixed { .. } => "a reduce added different elements: your input of block b \
            (or segment b) and the partial of block b in your scratch must line up"
            .into(),
        Problem::ReadUnwritten { loc, .. } if loc.buf == Buf::Scratch => "you read a scratch \
            slot before prev filled it: wait for prev's Data first"
            .into(),
        Problem::OutsideBuffer { loc, .. } if loc.buf == Buf::Scratch => "the scratch holds \
            world - 1 slots of one block (or one segment): step s uses k.scratch_slot(s)"
            .into(),
        Problem::Unbalanced { .. } => "prev signals Data once per send: world - 1 times in a \
            reduce-scatter, twice that in an all-reduce; wait for every one"
            .into(),
        _ => return None,
    })
}

/// Grades lab 2.
pub fn check(g: &mut Grader) -> Graded {
    let rs: Plan = g.pick(&skeleton::reduce_scatter, &solution::reduce_scatter);
    let ar: Plan = g.pick(&skeleton::all_reduce, &solution::all_reduce);
    g.traces(&all_reduce(4, 16), ar, &solution::all_reduce);
    for (w, n) in [(4, 6), (2, 3), (3, 5), (5, 2), (6, 4)] {
        g.case(&reduce_scatter(w, n), rs, &hint)?;
    }
    for (w, n) in [(4, 16), (2, 5), (3, 7), (5, 13), (6, 3)] {
        g.case(&all_reduce(w, n), ar, &hint)?;
    }
    Ok(())
}

//! Lab 9's checker: pairwise all-to-all, then a mixture-of-experts layer's dispatch and combine
//! as all-to-allv with uneven, partly empty counts, then the MoE dispatch placement with top-k
//! routing ([`moe`]).
//!
//! Dispatch and combine are compared with `host::alltoallv_reference` (the symbolic check still
//! looks for deadlocks, unwritten reads and unbalanced signals); then dispatch followed by
//! combine must bring every token back to where it started. The traces show the MoE dispatch at
//! world 4 (`yours.trace`, `reference.trace`) and the all-to-allv dispatch
//! (`alltoallv-yours.trace`, `alltoallv-reference.trace`).

#[path = "../09-moe-all-to-all/skeleton.rs"]
pub mod skeleton;
#[path = "../09-moe-all-to-all/solution.rs"]
pub mod solution;

pub mod moe;

use crate::evidence::Cause;
use crate::grade::{Graded, Grader};
use crate::kit::Kit;
use crate::problem::Problem;
use crate::run::{self, Case, Plan};
use symm_core::dtype::{DType, ReduceOp};
use symm_core::moe::sched::RowFn;
use symm_core::op::Op;
use symm_core::sched::{alltoallv_capacity, Algorithm, Collective, Request};
use symm_driver::host::{alltoallv_reference, random_inputs};

/// A counts signature: rank r's function of the world's counts.
pub type Routed<'a> = &'a dyn Fn(&Kit, &[u64]) -> Vec<Op>;

fn all_to_all(world: u16, n: u64) -> Case {
    let req = Request::new(
        Collective::AllToAll,
        Algorithm::Pairwise,
        world,
        n * 4,
        DType::F32,
        ReduceOp::Sum,
    );
    Case::new(
        format!("all-to-all, world {world}, {n} elements per block"),
        req,
    )
}

/// Tokens (elements) rank r routes to the expert on rank q: uneven, some pairs empty.
fn routing(world: u16, salt: u64) -> Vec<u64> {
    let w = world as u64;
    (0..w * w)
        .map(|i| ((i / w + 2 * (i % w) + salt) % 5) * 2)
        .collect()
}

fn transpose(counts: &[u64], world: u16) -> Vec<u64> {
    let w = world as usize;
    (0..w * w).map(|i| counts[(i % w) * w + i / w]).collect()
}

/// An all-to-allv case with `counts`, compared with the all-to-allv reference.
fn routed(what: &str, world: u16, counts: &[u64]) -> Case {
    let cap = alltoallv_capacity(world, counts).unwrap_or(0).max(1);
    let req = Request::new(
        Collective::AllToAllV,
        Algorithm::Pairwise,
        world,
        cap * 4,
        DType::F32,
        ReduceOp::Sum,
    );
    let c = counts.to_vec();
    let shown = if world <= 3 {
        format!("counts {counts:?}")
    } else {
        "uneven counts, some pairs empty".to_string()
    };
    Case::new(format!("{what}, world {world}, {shown}"), req).reference(Box::new(
        move |req, inputs| alltoallv_reference(req, inputs, &c),
    ))
}

fn hint(p: &Problem) -> Option<String> {
    Some(match p {
        Problem::Wrong { .. } => "rank r's input block q is meant for rank q, and lands in q's \
            output at block r"
            .into(),
        Problem::Numbers { .. } => "rank r's elements for q start after its elements for \
            0 .. q in its input (a prefix sum over counts[r * world + p]), and land in q's \
            output after those of ranks 0 .. r (a prefix sum over counts[p * world + q])"
            .into(),
        Problem::Deadlock { .. } | Problem::Unbalanced { .. } => "every peer waits for one \
            Data from each other rank, so signal each peer once, even when you send it nothing"
            .into(),
        _ => return None,
    })
}

/// A combine that sends what dispatch's counts say, not their transpose: rank r returns to q
/// `counts[r][q]` elements where q sent it `counts[q][r]`.
fn untransposed(c: &Case, plan: Plan, counts: &[u64]) -> Option<String> {
    let w = c.req.world as usize;
    let streams = run::build(c, plan).ok()?;
    let mut sent = vec![0u64; w * w];
    for (s, ops) in streams.iter().enumerate() {
        let r = s / c.req.channels.max(1) as usize;
        for op in ops {
            if let Op::Copy { dst, bytes, .. } = *op {
                if let Some(x) = sent.get_mut(r * w + dst.rank as usize) {
                    *x += bytes / c.req.dtype.size();
                }
            }
        }
    }
    let back = transpose(counts, c.req.world);
    (sent == counts && sent != back).then(|| {
        "combine returns with dispatch's counts: rank r sends q counts[r * world + q] elements, \
         but q sent r counts[q * world + r] in dispatch, and that is what goes back; the two \
         sides disagree on the map: transpose the counts"
            .into()
    })
}

/// Dispatch then combine on the simulator must return every rank's routed tokens home.
fn round_trip(g: &mut Grader, world: u16, dispatch: Routed, combine: Routed) -> Graded {
    let counts = routing(world, 1);
    let there = routed("dispatch", world, &counts);
    let back = routed("combine", world, &counts);
    let fail = |p: Problem| Grader::fail(&there, p, &hint, &[]);
    let go = run::build(&there, &|k: &Kit| dispatch(k, &counts)).map_err(fail)?;
    let ret = run::build(&back, &|k: &Kit| combine(k, &counts)).map_err(fail)?;
    let host = |error| {
        Grader::fail(
            &there,
            Problem::Host {
                backend: "simulator",
                error,
            },
            &hint,
            &[],
        )
    };
    let inputs = random_inputs(&there.req, 5);
    let mid = run::simulate(&there.req, &go, &inputs, false).map_err(host)?;
    let end = run::simulate(&back.req, &ret, &mid.outputs, false).map_err(host)?;
    let w = world as usize;
    for r in 0..w {
        let sent: u64 = counts[r * w..(r + 1) * w].iter().sum();
        let len = sent as usize * 4;
        if end.outputs[r][..len] != inputs[r][..len] {
            return Err(Grader::lab_failure(
                &there,
                "round trip",
                format!(
                    "after dispatch then combine, rank {r}'s {sent} routed elements are not \
                     back where they started"
                ),
                "combine is the all-to-allv that undoes dispatch: rank q returns to r exactly \
                 what r sent q, so its counts are dispatch's transposed",
            ));
        }
    }
    g.note(format!(
        "pass  dispatch then combine brings every token home (world {world})"
    ));
    Ok(())
}

/// Grades lab 9.
pub fn check(g: &mut Grader) -> Graded {
    let a2a: Plan = g.pick(&skeleton::all_to_all, &solution::all_to_all);
    let dispatch: Routed = g.pick(&skeleton::dispatch, &solution::dispatch);
    let combine: Routed = g.pick(&skeleton::combine, &solution::combine);
    let route: moe::RouteFn = g.pick(&skeleton::route, &solution::route);
    let rows: RowFn = g.pick(&skeleton::expert_row, &solution::expert_row);
    check_parts(g, a2a, dispatch, combine, route, rows)
}

/// Grades the parts of lab 9: the all-to-all, the all-to-allv's dispatch and combine, and the
/// MoE placement.
pub fn check_parts(
    g: &mut Grader,
    a2a: Plan,
    dispatch: Routed,
    combine: Routed,
    route: moe::RouteFn,
    rows: RowFn,
) -> Graded {
    let b = moe::showcase();
    g.traces(
        &moe::dispatch_case(&b),
        &|k: &Kit| moe::plan_ops(&b, route, rows, k, true),
        &|k: &Kit| moe::plan_ops(&b, &solution::route, &solution::expert_row, k, true),
    );
    let show = routing(4, 0);
    let show_case = routed("dispatch", 4, &show);
    g.trace("alltoallv-yours.trace", &show_case, &|k: &Kit| {
        dispatch(k, &show)
    });
    g.trace("alltoallv-reference.trace", &show_case, &|k: &Kit| {
        solution::dispatch(k, &show)
    });
    for (w, n) in [(4, 3), (2, 5), (3, 2), (5, 4), (6, 1)] {
        g.case(&all_to_all(w, n), a2a, &hint)?;
    }
    for (w, salt) in [(4, 0), (2, 3), (3, 1), (6, 2)] {
        let counts = routing(w, salt);
        g.case(
            &routed("dispatch", w, &counts),
            &|k: &Kit| dispatch(k, &counts),
            &hint,
        )?;
        let back = transpose(&counts, w);
        let c = routed("combine", w, &back);
        let plan = |k: &Kit| combine(k, &counts);
        g.case(&c, &plan, &hint).map_err(|mut f| {
            if let Some(h) = untransposed(&c, &plan, &counts) {
                f.hint = Some(h);
                f.cause = Some(Cause::Mapping);
            }
            f
        })?;
    }
    round_trip(g, 4, dispatch, combine)?;
    round_trip(g, 5, dispatch, combine)?;
    moe::check(g, route, rows)
}

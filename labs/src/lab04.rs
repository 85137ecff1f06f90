//! Lab 4's checker, first half: the barrier's ops. The memory orderings are the second half,
//! a loom model (`labs/tests/lab04_loom.rs`), which `cargo xtask lab check 4` runs with
//! `--cfg loom`.
//!
//! The barrier is checked inside an all-gather written with it: every rank copies its block into
//! its own output, passes the barrier, *gets* every peer's block from the peer's output, and
//! passes a second barrier before it leaves (so no peer is still reading its output). Without
//! the barrier's waits a get reads a block not written yet; with a wrong count the second
//! barrier passes early or never.

#[path = "../04-signal-barrier/skeleton.rs"]
pub mod skeleton;
#[path = "../04-signal-barrier/solution.rs"]
pub mod solution;

use crate::grade::{Graded, Grader};
use crate::kit::Kit;
use crate::problem::Problem;
use crate::run::Case;
use std::sync::atomic::Ordering;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::{Buf, Op};
use symm_core::sched::{Algorithm, Collective, Request};

fn case(world: u16, n: u64) -> Case {
    let req = Request::new(
        Collective::AllGather,
        Algorithm::Direct,
        world,
        n * 4,
        DType::F32,
        ReduceOp::Sum,
    );
    Case::new(
        format!("an all-gather by gets between two barriers, world {world}"),
        req,
    )
}

/// The all-gather by gets around `barrier`.
pub fn gather(k: &Kit, barrier: &dyn Fn(&Kit) -> Vec<Op>) -> Vec<Op> {
    let (me, n) = (k.rank(), k.elems());
    let block = |q: u16| q as u64 * n;
    let mut ops = vec![k.copy(k.at(me, Buf::Input, 0), k.at(me, Buf::Output, block(me)), n)];
    ops.extend(barrier(k));
    for q in (0..k.world()).filter(|&q| q != me) {
        ops.push(k.copy(
            k.at(q, Buf::Output, block(q)),
            k.at(me, Buf::Output, block(q)),
            n,
        ));
    }
    ops.extend(barrier(k));
    ops
}

fn hint(p: &Problem) -> Option<String> {
    Some(match p {
        Problem::ReadUnwritten { .. } => "a rank passed the barrier before a peer arrived: \
            after arriving, wait for one Barrier signal from every peer"
            .into(),
        Problem::Deadlock { .. } => "every wait needs a signal: each rank signals every peer \
            once per barrier and waits once for each peer, with count 1"
            .into(),
        Problem::Unbalanced { .. } => "one wait per peer per barrier, each for count 1: the \
            counters keep counting across barriers"
            .into(),
        _ => return None,
    })
}

/// Orderings refused before loom runs, with why and a hint: a wait is a load, and a load cannot
/// release. `None` when `signal` and `wait` are orderings the ops can have (loom then judges
/// whether they are strong enough).
pub fn refused_orderings(signal: Ordering, wait: Ordering) -> Option<(String, String)> {
    let _ = signal; // a signal is a read-modify-write: every ordering is one it can have
    matches!(wait, Ordering::Release | Ordering::AcqRel).then(|| {
        (
            format!(
                "WAIT = {wait:?} is refused before loom runs: a wait is a load, and a load cannot \
                 release (it writes nothing to publish)"
            ),
            "a load can be Relaxed, Acquire or SeqCst: pick the one that receives what the \
             signal published"
                .to_string(),
        )
    })
}

/// Grades lab 4's first half.
pub fn check(g: &mut Grader) -> Graded {
    let barrier: &dyn Fn(&Kit) -> Vec<Op> = g.pick(&skeleton::barrier, &solution::barrier);
    let plan = |k: &Kit| gather(k, barrier);
    let reference = |k: &Kit| gather(k, &solution::barrier);
    g.traces(&case(4, 4), &plan, &reference);
    for (w, n) in [(4, 4), (2, 3), (3, 2), (5, 1), (8, 2)] {
        g.case(&case(w, n), &plan, &hint)?;
    }
    g.note("note  the orderings are checked by loom: cargo xtask lab check 4 runs it next");
    Ok(())
}

//! Lab 5's checker: double binary tree broadcast.
//!
//! Every case is checked as usual; then, for worlds of 4 and more, no rank may send more than
//! the buffer once over (the root sends each half once, and a rank is interior in at most one
//! of the two trees), which a single binary tree breaks: its interior ranks send everything
//! twice.

#[path = "../05-double-binary-tree/skeleton.rs"]
pub mod skeleton;
#[path = "../05-double-binary-tree/solution.rs"]
pub mod solution;

use crate::grade::{Graded, Grader};
use crate::problem::Problem;
use crate::run::{self, Case, Plan};
use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::Op;
use symm_core::sched::{Algorithm, Collective, Request};

fn case(world: u16, root: u16, n: u64, chunk: u64) -> Case {
    let req = Request::new(
        Collective::Broadcast { root },
        Algorithm::Tree,
        world,
        n * 4,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_pipeline(chunk * 4, 2);
    let label = format!("world {world}, root {root}, {n} elements, chunks of {chunk}");
    Case::new(label, req)
}

/// Elements each rank copies into other ranks' memory.
fn sent(req: &Request, streams: &[Vec<Op>]) -> Vec<u64> {
    let channels = req.channels.max(1) as usize;
    let mut out = vec![0; req.world as usize];
    for (s, ops) in streams.iter().enumerate() {
        let rank = (s / channels) as u16;
        for op in ops {
            if let Op::Copy { dst, bytes, .. } = *op {
                if dst.rank != rank {
                    out[rank as usize] += bytes / req.dtype.size();
                }
            }
        }
    }
    out
}

fn hint(p: &Problem) -> Option<String> {
    Some(match p {
        Problem::Deadlock { .. } | Problem::Unbalanced { .. } => "one Ready to your parent in \
            each tree (your parent waits for each of its children in each tree), then each \
            chunk's Data (tree 0) or DataB (tree 1) from the parent that sends it"
            .into(),
        Problem::ReadUnwritten { .. } => "a rank forwards a chunk only after its parent in \
            that tree signalled it"
            .into(),
        Problem::Wrong { found, .. } if found.count == 0 => "some rank never received part of \
            the data: is every rank in both trees? Mirroring index i gives w - 2 - i, and \
            rank_at must undo exactly what index does"
            .into(),
        _ => return None,
    })
}

/// Grades lab 5.
pub fn check(g: &mut Grader) -> Graded {
    let plan: Plan = g.pick(&skeleton::broadcast, &solution::broadcast);
    check_plan(g, plan)
}

/// Grades `plan` as lab 5's broadcast.
pub fn check_plan(g: &mut Grader, plan: Plan) -> Graded {
    let show = case(8, 0, 32, 4);
    g.traces(&show, plan, &solution::broadcast);
    for (w, root, n, chunk) in [
        (4, 0, 16, 4),
        (2, 1, 5, 2),
        (3, 2, 7, 3),
        (5, 1, 10, 3),
        (6, 0, 12, 4),
        (8, 3, 16, 2),
        (7, 6, 9, 9),
    ] {
        let c = case(w, root, n, chunk);
        let passed = g.case(&c, plan, &hint)?;
        if w < 4 {
            continue;
        }
        let limit = n.div_ceil(2) * 2;
        let over = sent(&c.req, &passed.streams)
            .into_iter()
            .enumerate()
            .find(|&(_, e)| e > limit);
        if let Some((r, e)) = over {
            let message = format!(
                "rank {r} sends {e} elements, more than the {n} of the whole buffer: it forwards \
                 everything to two children"
            );
            return Err(Grader::lab_failure(
                &c,
                "traffic",
                message,
                "in one binary tree every interior rank sends the buffer twice; send each half \
                 down its own tree, the second tree mirrored, so that a rank interior in one \
                 tree is a leaf of the other and sends at most one buffer in all",
            ));
        }
    }
    g.note("pass  no rank sends more than one buffer (worlds 4 and up)");
    if let Ok(streams) = run::build(&show, plan) {
        let per_rank: Vec<String> = sent(&show.req, &streams)
            .iter()
            .enumerate()
            .map(|(r, e)| format!("{r}: {e}"))
            .collect();
        g.note(format!(
            "note  elements each rank sends at world 8 (32 in the buffer): {}",
            per_rank.join(", ")
        ));
    }
    // Speed is the lesson: the two trees run side by side. Yours beside the reference's.
    let time = |p: Plan| {
        let streams = run::build(&show, p).ok()?;
        run::time_us(&show.req, &streams, symm_driver::host::DEFAULT_LINK).ok()
    };
    if let (Some(yours), Some(reference)) = (time(plan), time(&solution::broadcast)) {
        g.note(format!(
            "note  simulated time at world 8: yours {yours:.2} us, the reference's {reference:.2} us"
        ));
        if yours > SLOWER * reference {
            g.note(format!(
                "warn  yours takes {:.1}x the reference's time: the trees should not wait on each \
                 other (each half on its own signals, their chunks interleaved so both trees \
                 are busy at once)",
                yours / reference
            ));
        }
    }
    Ok(())
}

/// How much slower than the reference's a passing schedule may be before the checker warns.
const SLOWER: f64 = 1.5;

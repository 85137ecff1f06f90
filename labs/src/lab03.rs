//! Lab 3's checker: pipelined ring reduce-scatter with credits, and why one slot deadlocks.
//!
//! The cases vary the world, the chunk size (one chunk per scratch slot) and the slot count;
//! the symbolic check's odd seeds run each rank as far ahead as it can get, which overwrites
//! any slot reused without a credit. Then `min_slots` is compared with the library's answer
//! (`Request::min_slots`), and the schedule is run with one slot at world 3, where it must
//! deadlock: its trace, ending in the stalled waits, is written as `one-slot.trace`.

// The skeleton imports what the finished schedule uses (`Credit`) before the student uses it.
#[allow(unused_imports)]
#[path = "../03-pipelining-credits/skeleton.rs"]
pub mod skeleton;
#[path = "../03-pipelining-credits/solution.rs"]
pub mod solution;

use crate::grade::{Graded, Grader};
use crate::problem::Problem;
use crate::run::{self, Case, Plan};
use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::Buf;
use symm_core::sched::{Algorithm, Collective, Request};
use symm_core::signal::SlotKind;

/// The request of a case: it allocates at least two slots, since the library refuses one slot at
/// three or more ranks; a case with one slot tells the schedule to use one ([`Case::slots`]),
/// and its trace names one.
fn request(world: u16, n: u64, chunk: u64, slots: u64) -> Request {
    Request::new(
        Collective::ReduceScatter,
        Algorithm::Ring,
        world,
        n * 4,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_pipeline(chunk * 4, slots.max(2) as u8)
}

pub fn case(world: u16, n: u64, chunk: u64, slots: u64) -> Case {
    let label =
        format!("world {world}, {n} elements per block, chunks of {chunk}, {slots} slot(s)");
    Case::new(label, request(world, n, chunk, slots)).slots(slots)
}

fn hint(p: &Problem) -> Option<String> {
    let req = request(3, 1, 1, 2);
    let credit = |slot: u32| req.layout().key(slot).map(|k| k.kind) == Some(SlotKind::Credit);
    Some(match p {
        Problem::Mixed { .. } | Problem::Wrong { .. } | Problem::Numbers { .. } => "a scratch \
            slot was overwritten before its reader consumed it: transfer j reuses slot \
            j % slots, so for j >= slots wait for next's Credit first, and signal prev a Credit \
            after consuming a transfer"
            .into(),
        Problem::Unbalanced { slot, .. } if credit(*slot) => "a credit no one waits for: prev \
            waits for the credit of its transfer i only when it sends a transfer i + slots, \
            so signal the credit of transfer j - 1 only when j - 1 + slots < chunks * (world - 1)"
            .into(),
        Problem::OutsideBuffer { loc, .. } if loc.buf == Buf::Scratch => "a slot holds one \
            chunk: cut every block into k.chunks(n) chunks with k.chunk(..)"
            .into(),
        _ => return None,
    })
}

/// Runs `plan` with `slots` scratch slots at worlds 2..=6 and stops at the first problem (with
/// one slot: the deadlock from world 3 on, which the failure's words follow rank by rank).
pub fn check_slots(g: &mut Grader, plan: Plan, slots: u64) -> Graded {
    let slots = slots.max(1);
    g.trace("one-slot.trace", &case(3, 8, 2, 1), plan);
    for w in 2..=6u16 {
        g.case(&case(w, 8, 2, slots), plan, &hint)?;
    }
    Ok(())
}

/// Grades lab 3 (with `g.slots` set: only [`check_slots`]).
pub fn check(g: &mut Grader) -> Graded {
    let plan: Plan = g.pick(&skeleton::reduce_scatter, &solution::reduce_scatter);
    if let Some(slots) = g.slots {
        return check_slots(g, plan, slots);
    }
    let min_slots: &dyn Fn(u16) -> u64 = g.pick(&skeleton::min_slots, &solution::min_slots);
    g.traces(&case(4, 16, 4, 2), plan, &solution::reduce_scatter);
    let one = case(3, 8, 2, 1);
    g.trace("one-slot.trace", &one, plan);
    for (w, n, chunk, slots) in [
        (4, 16, 4, 2),
        (3, 9, 2, 2),
        (2, 7, 3, 1),
        (5, 10, 3, 3),
        (3, 8, 8, 2),
        (6, 12, 5, 2),
    ] {
        g.case(&case(w, n, chunk, slots), plan, &hint)?;
    }
    for w in 2..=6u16 {
        let want = request(w, 8, 2, 2).min_slots() as u64;
        let said = min_slots(w);
        if said != want {
            let message = format!(
                "min_slots({w}) says {said}; the schedule needs {want} slot(s) at {w} ranks"
            );
            return Err(Grader::lab_failure(
                &case(w, 8, 2, 2),
                "min_slots",
                message,
                "run the schedule with one slot at world 3 and follow the deadlock's chain; then \
                 ask what is different with two ranks (where does the last step write?)",
            ));
        }
    }
    g.note("pass  min_slots agrees with the library's Request::min_slots for worlds 2..=6");
    let streams = run::build(&one, plan).map_err(|p| Grader::fail(&one, p, &hint, &[]))?;
    match run::symbolic(&one.req, &streams, 0, true).result {
        Err(p @ Problem::Deadlock { .. }) => {
            g.note(format!(
                "note  with one slot at world 3 the schedule deadlocks, as it must:\n      {}",
                p.words(&one.req)
                    .to_string()
                    .trim_end()
                    .replace('\n', "\n      ")
            ));
            Ok(())
        }
        other => {
            let what = match other {
                Ok(_) => "runs through".to_string(),
                Err(p) => format!("fails otherwise: {}", p.words(&one.req)),
            };
            let message = format!(
                "with one slot at world 3 the schedule {what}; with credits it must deadlock"
            );
            Err(Grader::lab_failure(
                &one,
                "one slot",
                message,
                "a sender must wait for a credit before reusing its receiver's only slot",
            ))
        }
    }
}

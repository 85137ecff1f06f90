//! Lab 1's checker: ring all-gather over worlds 2..=6 and uneven block sizes.
//!
//! A hint names the fault behind a problem ([`diagnose`] reads it off the ops). The one for the
//! block forwarded at each step points at the idea first and states the formula only once that
//! check has failed before (counted in the output folder, see [`Grader::failed_before`]).

#[path = "../01-ring-all-gather/skeleton.rs"]
pub mod skeleton;
#[path = "../01-ring-all-gather/solution.rs"]
pub mod solution;

use crate::grade::{Graded, Grader};
use crate::kit::Kit;
use crate::problem::count;
use crate::problem::Problem;
use crate::run::{self, Case, Plan};
use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::{Buf, Op};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_core::signal::SlotKind;

pub fn case(world: u16, elems: u64) -> Case {
    let req = Request::new(
        Collective::AllGather,
        Algorithm::Ring,
        world,
        elems * 4,
        DType::F32,
        ReduceOp::Sum,
    );
    Case::new(
        format!("world {world}, {} per block", count(elems, "element")),
        req,
    )
}

/// The fault behind a failing lab-1 schedule, read off its ops: the checker's problem says what
/// went wrong in the outputs, this says which part of the schedule did it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// A `Data` signal to next comes before the copy it announces.
    SignalBeforeCopy,
    /// A block is written into next's output at another offset than it is read from.
    Destination,
    /// The blocks are forwarded in another order than the ring's.
    BlockOrder,
}

/// The fault in `plan`'s ops on `case`, if one of [`Fault`]'s is there (the first in the order
/// they are listed, over every rank). `None` when the ops cannot be built.
pub fn diagnose(case: &Case, plan: Plan) -> Option<Fault> {
    let streams = run::build(case, plan).ok()?;
    let w = case.req.world as u64;
    let bytes = case.req.elems().saturating_mul(case.req.dtype.size());
    let mut found = Vec::new();
    for (r, ops) in streams.iter().enumerate() {
        let k = Kit::new(case.req, r as u16, 0);
        let data = k.slot(SlotKind::Data, k.rank());
        let (mut copies, mut signals) = (0u64, 0u64);
        for op in ops {
            match *op {
                Op::Copy { src, dst, .. } if dst.rank == k.next() && dst.buf == Buf::Output => {
                    if dst.offset != src.offset {
                        found.push(Fault::Destination);
                    }
                    let block = (r as u64 + w - copies % w) % w;
                    if src.offset != block.saturating_mul(bytes) {
                        found.push(Fault::BlockOrder);
                    }
                    copies += 1;
                }
                Op::Signal { peer, slot, .. } if peer == k.next() && slot == data => {
                    signals += 1;
                    if signals > copies {
                        found.push(Fault::SignalBeforeCopy);
                    }
                }
                Op::Copy { .. }
                | Op::Reduce { .. }
                | Op::Signal { .. }
                | Op::Wait { .. }
                | Op::ReduceN { .. }
                | Op::LlPut { .. }
                | Op::LlReduce { .. }
                | Op::McReduce { .. }
                | Op::McStore { .. } => {}
            }
        }
    }
    found.into_iter().min_by_key(|f| *f as u8)
}

/// Whether a problem is one a wrong block, offset or signal order shows up as.
fn misplaced(p: &Problem) -> bool {
    matches!(
        p,
        Problem::ReadUnwritten { .. }
            | Problem::Wrong { .. }
            | Problem::Numbers { .. }
            | Problem::Mixed { .. }
    )
}

/// Lab 1's hint for `p` on `req`, knowing the schedule's `fault`; `again`: the same check failed
/// before, so the hint may state the formula.
pub fn hint(req: &Request, fault: Option<Fault>, again: bool, p: &Problem) -> Option<String> {
    Some(match (fault, p) {
        (Some(Fault::SignalBeforeCopy), p) if misplaced(p) => "you signal next's Data before \
            the copy it announces, so next may forward a block that has not arrived: signal \
            Data right after the copy into next's output"
            .into(),
        (Some(Fault::Destination), p) if misplaced(p) => "a block is written into next's output \
            at another offset than it is read from: block q sits at output elements \
            q * n .. (q + 1) * n on every rank, so a forward reads and writes the same offset"
            .into(),
        (Some(Fault::BlockOrder), p) if misplaced(p) && again => "at step s rank r holds its \
            own block and those of r-1, ..., r-s, so it forwards block (r - s) mod world, i.e. \
            (rank + world - step) % world, after waiting for prev's Data"
            .into(),
        (Some(Fault::BlockOrder), p) if misplaced(p) => "you forward a block you do not hold \
            yet: blocks travel the ring towards next, so the block you receive at a step came \
            from prev, and it is the one you forward at the following step. Which rank's block \
            is that, counted from your own?"
            .into(),
        (_, Problem::ReadUnwritten { .. }) => "you forward a block before it has arrived: \
            wait for prev's Data signal before forwarding a block you received"
            .into(),
        (_, Problem::Wrong { found, .. }) if found.count == 0 => "a block never arrived: each \
            block travels world - 1 hops, one per step, so every rank forwards world - 1 blocks"
            .into(),
        (_, Problem::Wrong { .. }) => "a block landed at the wrong place: block q belongs at \
            output elements q * n .. (q + 1) * n on every rank, and it is forwarded at the same \
            offset"
            .into(),
        (_, Problem::Unbalanced { slot, .. })
            if req.layout().key(*slot).map(|k| k.kind) == Some(SlotKind::Ready) =>
        {
            "next signals your ready slot once, to say it is there before you write into its \
             output: wait for it (k.wait(k.next(), Ready, 1)) before your first send"
                .into()
        }
        (_, Problem::Unbalanced { .. }) => "prev signals Data once per block it forwards to you \
            (world - 1 times): wait for each, the last one after your final send"
            .into(),
        _ => return None,
    })
}

/// The failure counter of the check that the blocks are forwarded in the ring's order.
pub const BLOCK_ORDER: &str = "lab01-block-order";

/// Grades `plan` as lab 1, writing its trace beside the reference solution's.
pub fn check_plan(g: &mut Grader, plan: Plan) -> Graded {
    g.traces(&case(4, 8), plan, &solution::all_gather);
    for (w, n) in [(4, 8), (2, 4), (3, 5), (5, 3), (6, 7)] {
        let c = case(w, n);
        let fault = diagnose(&c, plan);
        if let Err(mut f) = g.case(&c, plan, &|p| hint(&c.req, fault, false, p)) {
            if fault == Some(Fault::BlockOrder) && misplaced(&f.problem) {
                let again = g.failed_before(BLOCK_ORDER) > 0;
                f.hint = hint(&c.req, fault, again, &f.problem).or(f.hint);
            }
            return Err(f);
        }
    }
    Ok(())
}

/// Grades lab 1.
pub fn check(g: &mut Grader) -> Graded {
    let plan: Plan = g.pick(&skeleton::all_gather, &solution::all_gather);
    check_plan(g, plan)
}

//! The bug catalogue: realistic mistakes planted in the reference solutions, to show that every
//! one fails its lab's check and that the hint names its cause.
//!
//! A bug is either a *mutation* of the ops a solution builds, the op-level image of one slip in
//! its source (every `Data` wait naming the mirrored neighbour is `k.wait(k.next(), ..)` written
//! for `k.wait(k.prev(), ..)`; the first copy into a peer one block further is an off-by-one in
//! a block formula), or a whole *variant* of a lab's schedule written with the slip in its
//! source (a `rank_at` that does not undo `index`). The mutation is planted while one lab's
//! check runs ([`plant`]): [`crate::run::build`] passes every stream it builds through it, so
//! the lab's own cases, checks and hints run unchanged on the bugged ops.
//!
//! Each entry names the [`Cause`] a student would have to find; the entry's hint names the cause
//! when the failure's evidence ([`crate::evidence`]) concludes the same. `cargo xtask lab bugs`
//! prints the table, and `labs/tests/catalogue.rs` requires that every bug fails and that at
//! least 90% of the hints name their cause.

use crate::evidence::Cause;
use crate::grade::{Failure, Grader, Which};
use crate::kit::Kit;
use std::cell::RefCell;
use symm_core::op::{Buf, Loc, Op};
use symm_core::signal::SlotKind;

/// A slip, applied to the ops of one (rank, channel) stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Mutation {
    /// Every wait for an announcing signal (`Data`, `DataB`, a barrier's) names the mirrored
    /// neighbour (`2 * rank - peer`): `next` for `prev`.
    WaitMirror,
    /// Every wait for an announcing signal names the waiting rank itself.
    WaitSelf,
    /// The first wait for an announcing signal is left out.
    NoWait,
    /// Every announcing signal comes before the copy or reduce it announces.
    SignalFirst,
    /// The last announcing signal is left out.
    NoSignal,
    /// The first copy into a peer's buffer lands one block (its own length) further.
    WriteOffset,
    /// The first op after a wait for an announcing signal reads one block (its own length)
    /// further than it should.
    ReadOffset,
}

/// One bug of the catalogue.
pub struct Bug {
    /// The lab it is planted in.
    pub lab: u8,
    /// What the slip is, in a student's words.
    pub name: &'static str,
    /// How it is planted.
    pub how: How,
    /// The cause a hint must name.
    pub cause: Cause,
}

/// How a bug is planted.
pub enum How {
    /// A mutation of the solution's ops.
    Mutate(Mutation),
    /// A variant of the lab's check with the slip in a schedule's source.
    Variant(fn(&mut Grader) -> crate::grade::Graded),
}

/// What one bug did to its lab's check.
pub struct Outcome {
    /// The lab.
    pub lab: u8,
    /// The bug.
    pub name: &'static str,
    /// The cause the hint should name.
    pub cause: Cause,
    /// The failure, `None` when the bugged schedule passed.
    pub failure: Option<Box<Failure>>,
}

impl Outcome {
    /// Whether the hint names the cause.
    pub fn named(&self) -> bool {
        self.failure.as_ref().and_then(|f| f.cause) == Some(self.cause)
    }
}

thread_local! {
    static PLANTED: RefCell<Option<Mutation>> = const { RefCell::new(None) };
}

/// Runs `f` with `m` planted in every stream [`crate::run::build`] builds on this thread.
pub fn plant<T>(m: Mutation, f: impl FnOnce() -> T) -> T {
    struct Unplant;
    impl Drop for Unplant {
        fn drop(&mut self) {
            PLANTED.with(|p| *p.borrow_mut() = None);
        }
    }
    PLANTED.with(|p| *p.borrow_mut() = Some(m));
    let _unplant = Unplant;
    f()
}

/// The ops `ops` of `k`'s stream with the planted mutation, if any.
pub fn planted(k: &Kit, ops: Vec<Op>) -> Vec<Op> {
    match PLANTED.with(|p| *p.borrow()) {
        Some(m) => mutate(k, m, ops),
        None => ops,
    }
}

/// Whether a slot kind announces data (or, for a barrier, arrival) rather than presence.
fn announces(kind: SlotKind) -> bool {
    matches!(
        kind,
        SlotKind::Data | SlotKind::DataB | SlotKind::Barrier | SlotKind::Done
    )
}

/// The announcing kind and writer of a wait, if it is one.
fn announced_wait(k: &Kit, op: &Op) -> Option<(SlotKind, u16)> {
    let Op::Wait { slot, .. } = *op else {
        return None;
    };
    let key = k.request().layout().key(slot)?;
    announces(key.kind).then_some((key.kind, key.peer))
}

fn announced_signal(k: &Kit, op: &Op) -> bool {
    let Op::Signal { slot, .. } = *op else {
        return false;
    };
    let layout = k.request().layout();
    layout.key(slot).is_some_and(|key| announces(key.kind))
}

/// `l` moved one block of `bytes` further, wrapping inside its buffer.
fn further(k: &Kit, l: Loc, bytes: u64) -> Loc {
    let sz = k.request().buffer_sizes();
    let size = match l.buf {
        Buf::Input => sz.input,
        Buf::Output => sz.output,
        Buf::Scratch => sz.scratch,
    };
    let mut offset = l.offset.saturating_add(bytes);
    if offset.saturating_add(bytes) > size {
        offset = 0;
    }
    Loc { offset, ..l }
}

fn mutate(k: &Kit, m: Mutation, mut ops: Vec<Op>) -> Vec<Op> {
    let (me, w) = (k.rank(), k.world());
    let waits: Vec<usize> = (0..ops.len())
        .filter(|&i| announced_wait(k, &ops[i]).is_some())
        .collect();
    match m {
        Mutation::WaitMirror | Mutation::WaitSelf => {
            for &i in &waits {
                let Some((kind, peer)) = announced_wait(k, &ops[i]) else {
                    continue;
                };
                let to = if m == Mutation::WaitSelf {
                    me
                } else {
                    let mirror =
                        ((2 * me as u32 + w as u32 - peer as u32 % w as u32) % w as u32) as u16;
                    if mirror != peer && mirror != me {
                        mirror
                    } else {
                        (1..w)
                            .map(|d| (peer + d) % w)
                            .find(|&q| q != me)
                            .unwrap_or(peer)
                    }
                };
                if let Op::Wait { count, .. } = ops[i] {
                    ops[i] = k.wait(to, kind, count);
                }
            }
        }
        Mutation::NoWait => {
            if let Some(&i) = waits.first() {
                ops.remove(i);
            }
        }
        Mutation::SignalFirst => {
            for i in 1..ops.len() {
                let moves = matches!(
                    ops[i - 1],
                    Op::Copy { .. } | Op::Reduce { .. } | Op::ReduceN { .. } | Op::LlPut { .. }
                );
                if announced_signal(k, &ops[i]) && moves {
                    ops.swap(i - 1, i);
                }
            }
        }
        Mutation::NoSignal => {
            if let Some(i) = (0..ops.len()).rev().find(|&i| announced_signal(k, &ops[i])) {
                ops.remove(i);
            }
        }
        Mutation::WriteOffset => {
            let first = ops.iter().position(
                |op| matches!(*op, Op::Copy { src, dst, .. } if dst.rank != me || src.rank != me),
            );
            if let Some(i) = first {
                if let Op::Copy { src, dst, bytes } = ops[i] {
                    ops[i] = Op::Copy {
                        src,
                        dst: further(k, dst, bytes),
                        bytes,
                    };
                }
            }
        }
        Mutation::ReadOffset => {
            // After a wait for data, else (a schedule that reads its peers' inputs once they
            // are Ready) after any wait.
            let reads = |i: &usize| {
                matches!(
                    ops.get(*i),
                    Some(Op::Copy { .. }) | Some(Op::Reduce { .. }) | Some(Op::ReduceN { .. })
                )
            };
            let any: Vec<usize> = (0..ops.len())
                .filter(|&i| matches!(ops[i], Op::Wait { .. }))
                .collect();
            let after = (waits.iter().map(|&i| i + 1).find(reads))
                .or_else(|| any.iter().map(|&i| i + 1).find(reads));
            if let Some(i) = after {
                ops[i] = match ops[i] {
                    Op::Copy { src, dst, bytes } => Op::Copy {
                        src: further(k, src, bytes),
                        dst,
                        bytes,
                    },
                    Op::Reduce {
                        a,
                        b,
                        dst,
                        elems,
                        dtype,
                        op,
                        div,
                    } => {
                        let bytes = elems.saturating_mul(dtype.size());
                        // The operand a peer wrote: the one that is not this rank's own.
                        let (a, b) = if b.rank != me || b.buf == Buf::Scratch {
                            (a, further(k, b, bytes))
                        } else {
                            (further(k, a, bytes), b)
                        };
                        Op::Reduce {
                            a,
                            b,
                            dst,
                            elems,
                            dtype,
                            op,
                            div,
                        }
                    }
                    Op::ReduceN {
                        buf,
                        offset,
                        ranks,
                        dst,
                        elems,
                        dtype,
                        op,
                        div,
                    } => {
                        let bytes = elems.saturating_mul(dtype.size());
                        let at = further(k, Loc::new(me, buf, offset), bytes);
                        Op::ReduceN {
                            buf,
                            offset: at.offset,
                            ranks,
                            dst,
                            elems,
                            dtype,
                            op,
                            div,
                        }
                    }
                    o @ (Op::Signal { .. }
                    | Op::Wait { .. }
                    | Op::LlPut { .. }
                    | Op::LlReduce { .. }
                    | Op::McReduce { .. }
                    | Op::McStore { .. }) => o,
                };
            }
        }
    }
    ops
}

/// Runs one bug: its lab's check on the bugged solution.
pub fn run(bug: &Bug) -> Outcome {
    let mut g = Grader::new(Which::Solution, None);
    let result = match bug.how {
        How::Mutate(m) => match crate::lab(bug.lab) {
            Some(lab) => plant(m, || (lab.check)(&mut g)),
            None => Ok(()),
        },
        How::Variant(check) => check(&mut g),
    };
    Outcome {
        lab: bug.lab,
        name: bug.name,
        cause: bug.cause,
        failure: result.err(),
    }
}

/// The catalogue: every lab's realistic bugs.
pub fn bugs() -> Vec<Bug> {
    use Mutation::*;
    let mutate = |lab, name, m, cause| Bug {
        lab,
        name,
        how: How::Mutate(m),
        cause,
    };
    let common: [(&'static str, Mutation, Cause); 7] = [
        (
            "waits name the wrong neighbour (next for prev)",
            WaitMirror,
            Cause::WrongPeer,
        ),
        ("a rank waits on its own slot", WaitSelf, Cause::WaitsOnSelf),
        ("the first wait is missing", NoWait, Cause::MissingWait),
        (
            "the signal comes before the copy it announces",
            SignalFirst,
            Cause::SignalBeforeWrite,
        ),
        ("the last signal is missing", NoSignal, Cause::MissingSignal),
        (
            "off by one block: the first copy into a peer goes one block further",
            WriteOffset,
            Cause::Offset,
        ),
        (
            "wrong slot after a correct wait: the read is one block further",
            ReadOffset,
            Cause::Offset,
        ),
    ];
    let mut out = Vec::new();
    for lab in [1u8, 2, 3, 4, 5, 6, 7, 8, 9] {
        for &(name, m, cause) in &common {
            // Lab 8 moves data with multicast ops only: its slips are in its signals.
            let moves_data = matches!(m, SignalFirst | WriteOffset | ReadOffset);
            if lab == 8 && moves_data {
                continue;
            }
            out.push(mutate(lab, name, m, cause));
        }
    }
    out.extend(crate::mistakes::bugs());
    out
}

/// The catalogue's table: a line per bug, then one per lab ("lab 5: 9 bugs, 9 fail, 9 hints
/// name the cause"), then the total; and whether it holds (every bug fails, at least 90% of the
/// hints name their cause, at least four bugs per lab).
pub fn report(outcomes: &[Outcome]) -> (String, bool) {
    let mut out = String::new();
    for o in outcomes {
        let mark = match (&o.failure, o.named()) {
            (None, _) => "PASSES",
            (Some(_), true) => "named",
            (Some(_), false) => "missed",
        };
        out.push_str(&format!(
            "lab {} {mark:7} {:?}: {}\n",
            o.lab, o.cause, o.name
        ));
        if let (Some(f), false) = (&o.failure, o.named()) {
            for line in f.to_string().lines() {
                out.push_str(&format!("        {line}\n"));
            }
        }
    }
    let mut holds = true;
    for l in crate::LABS {
        let of: Vec<&Outcome> = outcomes.iter().filter(|o| o.lab == l.number).collect();
        let failed = of.iter().filter(|o| o.failure.is_some()).count();
        let named = of.iter().filter(|o| o.named()).count();
        out.push_str(&format!(
            "lab {}: {} bugs, {failed} fail the check, {named} hints name the cause\n",
            l.number,
            of.len()
        ));
        holds &= of.len() >= 4 && failed == of.len();
    }
    let named = outcomes.iter().filter(|o| o.named()).count();
    let n = outcomes.len();
    out.push_str(&format!(
        "all: {n} bugs, {} fail the check, {named} hints name the cause ({}%)\n",
        outcomes.iter().filter(|o| o.failure.is_some()).count(),
        (named * 100).checked_div(n).unwrap_or(0)
    ));
    holds &= named * 10 >= n * 9;
    (out, holds)
}

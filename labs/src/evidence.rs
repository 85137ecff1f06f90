//! Hints chosen from the evidence: what the failing run and the schedule's own ops say about
//! the cause, before any hint chosen by the kind of problem.
//!
//! Each rule reads facts the checker already has, and names one [`Cause`]:
//!
//! - a deadlocked rank waiting on its own slot ([`Cause::WaitsOnSelf`]);
//! - a deadlocked wait for more signals than the awaited rank ever sends: when another rank
//!   sends the waiter signals of that kind it never waits for, the wait names the wrong peer
//!   ([`Cause::WrongPeer`]); when the awaited rank sends them to another rank that never waits
//!   for them, the two ranks disagree on who is whose neighbour ([`Cause::Mapping`]); else a
//!   signal is missing ([`Cause::MissingSignal`]);
//! - a deadlock in which every awaited signal is sent in the end, but the waiter already holds
//!   a signal of the same kind from another rank that it has not waited for yet: at this point
//!   its wait names the wrong peer ([`Cause::WrongPeer`]);
//! - a read of data nobody wrote yet: with no wait for the writer before it
//!   ([`Cause::MissingWait`]); with a wait whose signal the writer sends just before the write
//!   ([`Cause::SignalBeforeWrite`]); else the read's and the writes' offsets disagree, and both
//!   ops are named ([`Cause::Offset`]);
//! - a reduction of mismatched elements, a wrong output element written twice, or by none while
//!   another is written twice: the offsets disagree, and the writers are named
//!   ([`Cause::Offset`]); else the op that last wrote the element ([`Cause::Suspect`]);
//! - a touch of a rank after it finished: the toucher signalled before the touch
//!   ([`Cause::SignalBeforeWrite`]), or the finished rank never waited for it
//!   ([`Cause::MissingWait`]);
//! - a slot left with signals nobody waited for ([`Cause::MissingWait`]).

use crate::problem::{op_words, slot_words, Problem};
use symm_core::op::{Buf, Loc, Op};
use symm_core::sched::Request;
use symm_core::signal::SlotKind;

/// The cause a hint names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Cause {
    /// A rank waits on a slot only it could signal.
    WaitsOnSelf,
    /// A wait names another peer than the one that signals.
    WrongPeer,
    /// Two ranks' mappings disagree (a `rank_at` that does not undo `index`).
    Mapping,
    /// A signal the waiter needs is never sent.
    MissingSignal,
    /// A rank reads what a peer writes without waiting for the peer's signal.
    MissingWait,
    /// A signal is sent before the write it announces.
    SignalBeforeWrite,
    /// A writer's and a reader's offsets (block, chunk or slot index) disagree: one of the two
    /// is off, and the words name the side the evidence singles out, or both.
    Offset,
    /// The op that last wrote a wrong value, named as the suspect.
    Suspect,
}

/// A hint and the cause it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evidence {
    /// The cause.
    pub cause: Cause,
    /// The hint in words.
    pub words: String,
}

fn says(cause: Cause, words: String) -> Option<Evidence> {
    Some(Evidence { cause, words })
}

mod facts;
use facts::Ops;

/// The hint the evidence gives for `problem`, found running `streams` on `req`.
pub fn evidence(problem: &Problem, req: &Request, streams: &[Vec<Op>]) -> Option<Evidence> {
    let ops = Ops {
        req,
        layout: req.layout(),
        streams,
        channels: req.channels.max(1) as usize,
    };
    match problem {
        Problem::Deadlock { chain } => deadlock(&ops, chain),
        Problem::ReadUnwritten {
            rank, index, loc, ..
        } => unwritten(&ops, *rank, *index, *loc),
        Problem::Mixed { rank, index, op } => mixed(&ops, *rank, *index, op),
        Problem::TouchAfterDone {
            rank,
            index,
            op,
            peer,
        } => after_done(&ops, *rank, *index, op, *peer),
        Problem::Wrong {
            rank,
            elem,
            found,
            want,
        } => wrong(
            &ops,
            *rank,
            *elem,
            found.index != want.index && found.count > 0,
        ),
        Problem::Numbers {
            mismatch,
            unwritten: true,
            ..
        } => {
            // The op that fills the element read it from a peer: why was it not there?
            let es = req.dtype.size().max(1);
            let rank = u16::try_from(mismatch.rank).ok()?;
            let l = Loc::new(rank, Buf::Output, (mismatch.elem as u64).saturating_mul(es));
            let (_, _, i, op) = ops.touching(l, true).into_iter().find(|w| w.1 == rank)?;
            let (from, _) = ops
                .locs(&op, false)
                .into_iter()
                .find(|(m, _)| m.rank != rank)?;
            unwritten(&ops, rank, i, from)
        }
        Problem::TouchBeforeReady {
            rank,
            index,
            op,
            peer,
        } => early_touch(&ops, *rank, *index, op, *peer),
        Problem::Unbalanced {
            rank,
            slot,
            pad,
            expected,
        } => {
            let k = ops.layout.key(*slot)?;
            says(
                Cause::MissingWait,
                format!(
                    "rank {rank} receives {pad} signal{} on slot {} but waits for {expected}: \
                     a wait for rank {p} is missing before rank {rank} reads what rank {p} \
                     writes (or rank {p} signals once too often)",
                    if *pad == 1 { "" } else { "s" },
                    slot_words(&ops.layout, *slot),
                    p = k.peer
                ),
            )
        }
        _ => None,
    }
}

/// The stream of `rank` that holds `op` at `index`.
fn stream_of(ops: &Ops, rank: u16, index: usize, op: &Op) -> Option<usize> {
    (0..ops.streams.len())
        .filter(|&s| ops.rank_of(s) == rank)
        .find(|&s| ops.streams[s].get(index) == Some(op))
}

fn deadlock(ops: &Ops, chain: &[crate::problem::Blocked]) -> Option<Evidence> {
    let layout = &ops.layout;
    let writer = |b: &crate::problem::Blocked| layout.key(b.slot).map(|k| (k.peer, k.kind));
    if let Some(b) = chain
        .iter()
        .find(|b| writer(b).map(|w| w.0) == Some(b.rank))
    {
        return says(
            Cause::WaitsOnSelf,
            format!(
                "rank {r} waits on its own slot ({}): no rank signals itself, so the wait must \
                 name the peer whose signal it needs (k.wait(peer, kind, n))",
                slot_words(layout, b.slot),
                r = b.rank
            ),
        );
    }
    let Some(b) = chain.iter().find(|b| b.sent_in_all < b.target) else {
        return pending(ops, chain);
    };
    let (p, kind) = writer(b)?;
    let r = b.rank;
    let name = kind.name();
    let world = ops.req.world;
    // The disagreement shows in the presence handshake as well as in the data: the ranks' map of
    // each other is wrong, not one call.
    let unbalanced = |k: SlotKind| {
        (0..world).any(|x| (0..world).any(|y| x != y && ops.sent(x, y, k) != ops.awaited(y, x, k)))
    };
    if unbalanced(SlotKind::Ready)
        && [
            SlotKind::Data,
            SlotKind::DataB,
            SlotKind::Done,
            SlotKind::Barrier,
        ]
        .into_iter()
        .any(unbalanced)
    {
        return says(
            Cause::Mapping,
            format!(
                "rank {r} waits for rank {p}'s '{name}', but rank {p} sends it {} of {}; the \
                 ranks' signals and waits disagree in more than one kind (the Ready handshake \
                 too), so the ranks disagree on who is whose neighbour: the formula each rank \
                 uses to find the other (a rank_at that does not undo index, a mapping that \
                 differs between the two sides) is off",
                b.sent_in_all, b.target
            ),
        );
    }
    // Another rank sends r signals of this kind that r never waits for: r names the wrong one.
    if let Some(x) = (0..world)
        .filter(|&x| x != p && x != r)
        .find(|&x| ops.sent(x, r, kind) > ops.awaited(r, x, kind))
    {
        return says(
            Cause::WrongPeer,
            format!(
                "rank {r} waits for {} on slot {} but rank {p} sends it only {}, while rank {x} \
                 sends rank {r} '{name}' signals it never waits for: the wait names the wrong \
                 peer (rank {x}, not rank {p})",
                crate::problem::count(b.target, "signal"),
                slot_words(layout, b.slot),
                b.sent_in_all
            ),
        );
    }
    // p sends this kind to another rank that never waits for it: p and r disagree on the map.
    if let Some(q) = (0..world)
        .filter(|&q| q != p && q != r)
        .find(|&q| ops.sent(p, q, kind) > ops.awaited(q, p, kind))
    {
        return says(
            Cause::Mapping,
            format!(
                "rank {r} waits for rank {p}'s '{name}', but rank {p} sends it to rank {q}, \
                 which never waits for it: ranks {p} and {r} disagree on who is whose neighbour \
                 (each side computes the other's rank: a rank_at that does not undo index, or \
                 two formulas that differ)"
            ),
        );
    }
    says(
        Cause::MissingSignal,
        format!(
            "rank {r} waits for {} on slot {}, but rank {p} sends rank {r} only {} in its whole \
             schedule: a signal is missing from rank {p}'s schedule (or rank {r} waits once too \
             often)",
            crate::problem::count(b.target, "signal"),
            slot_words(layout, b.slot),
            b.sent_in_all
        ),
    )
}

/// Every awaited signal comes in the end: does a waiter hold another rank's signal of the same
/// kind that it has not waited for yet?
fn pending(ops: &Ops, chain: &[crate::problem::Blocked]) -> Option<Evidence> {
    let layout = &ops.layout;
    // How far each rank got: its blocked op, or its whole stream.
    let reached = |x: u16| -> Option<usize> { chain.iter().find(|b| b.rank == x).map(|b| b.index) };
    for b in chain {
        let (p, kind) = layout.key(b.slot).map(|k| (k.peer, k.kind))?;
        let r = b.rank;
        let s = (0..ops.streams.len()).find(|&s| {
            ops.rank_of(s) == r
                && ops.streams[s]
                    .get(b.index)
                    .is_some_and(|o| matches!(o, Op::Wait { slot, .. } if *slot == b.slot))
        })?;
        for x in (0..ops.req.world).filter(|&x| x != p && x != r) {
            let slot = layout
                .index(symm_core::signal::SlotKey {
                    peer: x,
                    kind,
                    ..layout.key(b.slot)?
                })
                .ok();
            let Some(slot) = slot else { continue };
            let sent: u64 = (0..ops.streams.len())
                .filter(|&t| ops.rank_of(t) == x)
                .map(|t| {
                    let upto = reached(x).unwrap_or(ops.streams[t].len());
                    ops.signals_before(t, upto, r, slot)
                })
                .sum();
            let waited: u64 = ops.streams[s][..b.index]
                .iter()
                .filter_map(facts::wait_of)
                .filter(|&(s2, _)| s2 == slot)
                .map(|(_, count)| count)
                .sum();
            if sent > waited {
                return says(
                    Cause::WrongPeer,
                    format!(
                        "rank {r} waits for rank {p}'s '{}' at its op {}, while rank {x}'s \
                         '{}' signal is already there and not yet waited for, and rank {p} \
                         signals only later: at this point the wait names the wrong peer (rank \
                         {x}, not rank {p})",
                        kind.name(),
                        b.index,
                        kind.name()
                    ),
                );
            }
        }
    }
    None
}

fn unwritten(ops: &Ops, rank: u16, index: usize, loc: Loc) -> Option<Evidence> {
    let s = (0..ops.streams.len())
        .filter(|&s| ops.rank_of(s) == rank)
        .find(|&s| index < ops.streams[s].len())?;
    let at = ops.range(loc, ops.req.dtype.size());
    let writers: Vec<_> = ops
        .touching(loc, true)
        .into_iter()
        .filter(|&(_, w, _, _)| w != rank)
        .collect();
    if let Some(&(ws, w, j, wop)) = writers.first() {
        let Some((slot, target)) = ops.waits_for(s, index, w) else {
            return says(
                Cause::MissingWait,
                format!(
                    "rank {rank}'s op {index} reads {at}, which rank {w} writes at its op {j} \
                     ({}), but rank {rank} never waits for a signal from rank {w} before it: \
                     wait for rank {w}'s signal first",
                    op_words(ops.req, &wop)
                ),
            );
        };
        let before = ops.signals_before(ws, j, rank, slot);
        let silent = ops.announced(w, rank, slot, target).is_empty();
        if before == target && (silent || ops.unannounced(w, rank, slot)) {
            return says(
                Cause::SignalBeforeWrite,
                format!(
                    "rank {w} sends signal {target} to rank {rank} (slot {}) before it writes \
                     {at} at its op {j} ({}): the signal announces data that is not there yet; \
                     write first, then signal",
                    slot_words(&ops.layout, slot),
                    op_words(ops.req, &wop)
                ),
            );
        }
        if before >= target {
            let announced = ops.announced(w, rank, slot, target);
            let what = announced
                .first()
                .map(|&(l, b, j2, _)| format!("rank {w}'s op {j2} writing {}", ops.range(l, b)))
                .unwrap_or_else(|| "no write".into());
            return says(
                Cause::Offset,
                format!(
                    "rank {rank}'s op {index} reads {at} after waiting for {} from rank {w}, but \
                     rank {w} writes it only after its signal {before} (its op {j}); the signal \
                     awaited announces {what}: the read's offset and that write's disagree \
                     (block, chunk or slot index: one of the two is off)",
                    crate::problem::count(target, "signal")
                ),
            );
        }
        return None;
    }
    // Nothing writes what was read: the read and the awaited writes disagree.
    let (_, slot, p) = ops.last_wait(s, index)?;
    let (_, target) = ops.waits_for(s, index, p)?;
    let announced = ops.announced(p, rank, slot, target);
    let (l, bytes, j, wop) = *announced.first()?;
    says(
        Cause::Offset,
        format!(
            "rank {rank}'s op {index} reads {at} after waiting for rank {p}, but nothing in any \
             schedule writes it; the signal it waited for announces rank {p}'s op {j} ({}), \
             which writes {}: the read's offset and that write's disagree (block, chunk or slot \
             index: one of the two is off)",
            op_words(ops.req, &wop),
            ops.range(l, bytes)
        ),
    )
}

/// The writers of a reduction's operands, in words.
fn mixed(ops: &Ops, rank: u16, index: usize, op: &Op) -> Option<Evidence> {
    let mut named = Vec::new();
    for (l, _) in ops.locs(op, false) {
        // Writers that can come before this op: other ranks', and this stream's earlier ops.
        let writers: Vec<String> = ops
            .touching(l, true)
            .into_iter()
            .filter(|&(_, w, j, _)| w != rank || j < index)
            .take(2)
            .map(|(_, w, j, wop)| format!("rank {w}'s op {j} ({})", op_words(ops.req, &wop)))
            .collect();
        let by = if writers.is_empty() {
            "never written: it holds its own position".to_string()
        } else {
            format!("written by {}", writers.join(" or "))
        };
        named.push(format!("{} is {by}", ops.range(l, ops.req.dtype.size())));
    }
    says(
        Cause::Offset,
        format!(
            "rank {rank}'s op {index} ({}) adds up elements of different positions: {}; an \
             offset (block, chunk or slot index) is off in one of those ops",
            op_words(ops.req, op),
            named.join("; ")
        ),
    )
}

/// A touch of `peer` before waiting for its `Ready` or a barrier: what did the rank wait for?
fn early_touch(ops: &Ops, rank: u16, index: usize, op: &Op, peer: u16) -> Option<Evidence> {
    let s = stream_of(ops, rank, index, op)?;
    let entered = |k: SlotKind| matches!(k, SlotKind::Ready | SlotKind::Barrier);
    let waited: Vec<(u16, SlotKind)> = ops.streams[s][..index]
        .iter()
        .filter_map(|o| {
            let (slot, _) = facts::wait_of(o)?;
            ops.layout.key(slot).map(|k| (k.peer, k.kind))
        })
        .filter(|&(_, k)| entered(k))
        .collect();
    if waited.iter().any(|&(p, _)| p == rank) {
        return says(
            Cause::WaitsOnSelf,
            format!(
                "rank {rank} waits on its own slot before touching rank {peer}: no rank signals \
                 itself, so that wait says nothing about rank {peer}; name the peer whose signal \
                 it needs"
            ),
        );
    }
    if let Some(&(y, kind)) = waited
        .iter()
        .find(|&&(y, kind)| ops.sent(y, rank, kind) < ops.awaited(rank, y, kind))
    {
        return says(
            Cause::WrongPeer,
            format!(
                "before touching rank {peer}, rank {rank} waits for rank {y}'s '{}', which rank \
                 {y} sends it fewer times than it waits: the wait names the wrong peer",
                kind.name()
            ),
        );
    }
    let skipped = [SlotKind::Ready, SlotKind::Barrier]
        .into_iter()
        .find(|&k| ops.sent(peer, rank, k) > ops.awaited(rank, peer, k))?;
    says(
        Cause::MissingWait,
        format!(
            "rank {peer} sends rank {rank} its '{}' signal, and rank {rank} never waits for it \
             before touching rank {peer}'s buffers at its op {index}: a wait is missing \
             (k.wait({peer}, {skipped:?}, 1))",
            skipped.name()
        ),
    )
}

/// A touch of `peer` after it finished.
fn after_done(ops: &Ops, rank: u16, index: usize, op: &Op, peer: u16) -> Option<Evidence> {
    let s = stream_of(ops, rank, index, op)?;
    let signalled = ops.streams[s][..index].iter().rposition(|o| {
        matches!(*o, Op::Signal { peer: q, slot, .. }
            if q == peer && ops.layout.key(slot).is_some_and(|k| k.kind != SlotKind::Ready))
    });
    let writes = ops.locs(op, true).iter().any(|(l, _)| l.rank == peer);
    let touch = if writes { "writes into" } else { "reads" };
    match signalled {
        Some(i) => says(
            Cause::SignalBeforeWrite,
            format!(
                "rank {rank} signals rank {peer} at its op {i}, then {touch} rank {peer}'s \
                 buffers at its op {index} ({}): rank {peer} counted the signal and finished \
                 first; signal only after the last touch it announces",
                op_words(ops.req, op)
            ),
        ),
        _ => says(
            Cause::MissingWait,
            format!(
                "rank {peer} finished while rank {rank} still had to touch its buffers (rank \
                 {rank}'s op {index}, {}): rank {peer} must wait for a signal rank {rank} sends \
                 after its last touch before it finishes",
                op_words(ops.req, op)
            ),
        ),
    }
}

/// A wrong output element: `moved` when it holds the data of another position.
fn wrong(ops: &Ops, rank: u16, elem: u64, moved: bool) -> Option<Evidence> {
    let es = ops.req.dtype.size().max(1);
    let loc = Loc::new(rank, Buf::Output, elem * es);
    let at = ops.range(loc, es);
    let writers = ops.touching(loc, true);
    if let [(_, a, i, _), (_, b, j, _), ..] = writers[..] {
        return says(
            Cause::Offset,
            format!(
                "{at} is written twice, by rank {a}'s op {i} and rank {b}'s op {j}: one of the \
                 two writes goes to the wrong block (check its offset)"
            ),
        );
    }
    if writers.is_empty() {
        let (l, (a, i), (b, j)) = ops.written_twice(rank, Buf::Output)?;
        return says(
            Cause::Offset,
            format!(
                "nothing writes {at}, while {} is written twice, by rank {a}'s op {i} and rank \
                 {b}'s op {j}: one of those writes belongs at {at} (check its offset)",
                ops.range(l, es)
            ),
        );
    }
    let (s, w, i, op) = writers[0];
    if moved {
        return says(
            Cause::Offset,
            format!(
                "{at} holds the data of another position, and rank {w}'s op {i} ({}) wrote it: \
                 the offset it reads from and the one it writes to disagree, or the op that \
                 wrote what it read put it in the wrong place (block, chunk or slot index)",
                op_words(ops.req, &op)
            ),
        );
    }
    let after_wait = ops
        .last_wait(s, i)
        .filter(|&(wi, _, _)| wi + 1 == i)
        .map(|(_, _, p)| p);
    if let Some(p) = after_wait {
        return says(
            Cause::Offset,
            format!(
                "{at} was written by rank {w}'s op {i} ({}), right after its wait for rank {p}: \
                 that op reads what rank {p} wrote at the wrong offset (block, chunk or slot \
                 index)",
                op_words(ops.req, &op)
            ),
        );
    }
    says(
        Cause::Suspect,
        format!(
            "{at} was last written by rank {w}'s op {i} ({}): start from that op, and from \
             the ops that wrote what it read",
            op_words(ops.req, &op)
        ),
    )
}

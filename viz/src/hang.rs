//! Hang analysis: the waits that never finished and the chain of waits that blocked them.
//!
//! A `Stall` event marks a wait that timed out: it needed its slot to reach `target` and found
//! `found`. The slot names the rank expected to signal it ([`symm_core::signal::SlotLayout::key`]),
//! so every stalled wait is an edge "rank p waits for rank q" of a *wait-for graph*. Following the
//! edges from any stalled rank ends either at a rank that is not itself stuck in a wait (the
//! *root*: it crashed, finished without signalling, or is slow) or in a cycle (a deadlock).

use crate::model::Trace;
use symm_core::op::Op;

/// One wait that never finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stall {
    /// The wait's span.
    pub span: usize,
    /// The waiting rank.
    pub rank: u16,
    /// Its channel.
    pub channel: u16,
    /// The rank expected to signal.
    pub waits_for: Option<u16>,
    /// The slot value it needed.
    pub target: u64,
    /// The value it found.
    pub found: u64,
}

/// What the chains of waits end in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Root {
    /// A rank that is not stuck in a wait.
    Rank(u16),
    /// A cycle of ranks each waiting for the next.
    Cycle(Vec<u16>),
    /// The slot of the first stalled wait names no rank.
    Unknown,
}

/// The hang report of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hang {
    /// Every stalled wait.
    pub stalls: Vec<Stall>,
    /// The chain from the first stalled rank: ranks in wait-for order.
    pub chain: Vec<u16>,
    /// Where the chain ends.
    pub root: Root,
}

/// Analyses the stalls of a trace; `None` when nothing stalled.
pub fn analyse(t: &Trace) -> Option<Hang> {
    if t.stalled == 0 {
        return None;
    }
    let layout = t.header.request.layout();
    let stalls: Vec<Stall> = t
        .stalls()
        .map(|(i, s)| {
            // Only a wait stalls.
            let waits_for = if let Op::Wait { slot, .. } = s.op {
                layout.key(slot).map(|k| k.peer)
            } else {
                None
            };
            let (target, found) = s.stall.unwrap_or((0, 0));
            Stall {
                span: i,
                rank: s.rank,
                channel: s.channel,
                waits_for,
                target,
                found,
            }
        })
        .collect();
    let first = stalls.first()?;
    // The first stall of each rank: what it waits for.
    let mut by_rank: std::collections::HashMap<u16, Option<u16>> = std::collections::HashMap::new();
    for s in &stalls {
        by_rank.entry(s.rank).or_insert(s.waits_for);
    }
    let next = |r: u16| by_rank.get(&r).copied().flatten();
    let mut chain = vec![first.rank];
    let mut cur = first.rank;
    let root = loop {
        let Some(q) = next(cur) else {
            break if chain.len() == 1 {
                Root::Unknown
            } else {
                Root::Rank(cur)
            };
        };
        if let Some(at) = chain.iter().position(|r| *r == q) {
            break Root::Cycle(chain[at..].to_vec());
        }
        chain.push(q);
        if !by_rank.contains_key(&q) {
            break Root::Rank(q);
        }
        cur = q;
    };
    Some(Hang {
        stalls,
        chain,
        root,
    })
}

/// The root in words.
pub fn describe_root(t: &Trace, root: &Root) -> String {
    match root {
        Root::Rank(r) => {
            let last = t
                .lanes
                .iter()
                .filter(|l| l.rank == *r)
                .filter_map(|l| l.spans.last())
                .map(|s| &t.spans[*s as usize])
                .max_by_key(|s| s.begin);
            match last {
                Some(s) => format!(
                    "root: rank {r} is not waiting; its last recorded op is #{} ({}) on channel {}, so it stopped before sending the signal",
                    s.index,
                    s.op.kind_name(),
                    s.channel
                ),
                None => format!("root: rank {r} recorded no ops at all"),
            }
        }
        Root::Cycle(c) => {
            let names: Vec<String> = c.iter().map(|r| format!("rank {r}")).collect();
            format!(
                "root: a deadlock cycle {} -> {}",
                names.join(" -> "),
                names[0]
            )
        }
        Root::Unknown => "root: unknown (the stalled slot names no rank)".to_string(),
    }
}

/// Most stalled waits the hang panel lists; it counts the others.
pub const MAX_ROWS: usize = 50;

/// The hang panel's contents, computed once per trace: what it shows stays the same size
/// however many waits stalled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Report {
    /// Stalled waits.
    pub stalls: usize,
    /// The first of them, at most the limit, in words.
    pub rows: Vec<String>,
    /// Stalled waits not listed.
    pub more: usize,
    /// The wait-for chain, in words.
    pub chain: String,
    /// Where the chain ends, in words ([`describe_root`]).
    pub root: String,
}

/// A stalled wait in words: where it waits, on which slot, what it found.
pub fn describe_stall(t: &Trace, s: &Stall) -> String {
    let sp = &t.spans[s.span];
    // Only a wait stalls.
    let slot = if let Op::Wait { slot, .. } = sp.op {
        t.header
            .request
            .layout()
            .key(slot)
            .map(|k| format!("(c{}, {} from r{})", k.channel, k.kind.name(), k.peer))
            .unwrap_or_else(|| format!("#{slot}"))
    } else {
        String::new()
    };
    format!(
        "rank {} channel {} op #{}: waits on slot {slot}: expected {}, found {}{}",
        s.rank,
        s.channel,
        sp.index,
        s.target,
        s.found,
        s.waits_for
            .map(|q| format!(" -> waits for rank {q}"))
            .unwrap_or_default()
    )
}

/// The hang panel of a trace, listing at most `limit` stalled waits; `None` when nothing
/// stalled.
pub fn report(t: &Trace, limit: usize) -> Option<Report> {
    let h = analyse(t)?;
    let rows = h
        .stalls
        .iter()
        .take(limit)
        .map(|s| describe_stall(t, s))
        .collect::<Vec<_>>();
    let chain = h
        .chain
        .iter()
        .map(|r| format!("rank {r}"))
        .collect::<Vec<_>>()
        .join(" -> ");
    Some(Report {
        stalls: h.stalls.len(),
        more: h.stalls.len() - rows.len(),
        rows,
        chain,
        root: describe_root(t, &h.root),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::{header, small};
    use symm_core::signal::SlotKind;
    use symm_core::trace::{Event, EventKind, Writer};

    #[test]
    fn names_the_rank_that_never_signalled() {
        let t = Trace::decode("hang", small(true)).unwrap();
        let h = analyse(&t).unwrap();
        assert_eq!(h.stalls.len(), 1);
        assert_eq!(h.stalls[0].waits_for, Some(0));
        assert_eq!((h.stalls[0].target, h.stalls[0].found), (1, 0));
        assert_eq!(h.chain, vec![1, 0]);
        assert_eq!(h.root, Root::Rank(0));
        assert!(describe_root(&t, &h.root).contains("rank 0 is not waiting"));
        let ok = Trace::decode("ok", small(false)).unwrap();
        assert!(analyse(&ok).is_none());
    }

    #[test]
    fn the_report_lists_a_bounded_number_of_stalls() {
        let t = Trace::decode("hang", small(true)).unwrap();
        let r = report(&t, MAX_ROWS).unwrap();
        assert_eq!((r.stalls, r.more), (1, 0));
        assert_eq!(
            r.rows,
            vec![
                "rank 1 channel 0 op #0: waits on slot (c0, data from r0): expected 1, found 0 -> waits for rank 0"
            ]
        );
        assert_eq!(r.chain, "rank 1 -> rank 0");
        assert!(r.root.contains("rank 0 is not waiting"), "{}", r.root);
        assert!(report(&Trace::decode("ok", small(false)).unwrap(), MAX_ROWS).is_none());

        // Rank 1 stalls in 100,000 waits on rank 0: the panel lists the first few, counts the rest.
        let n = 100_000u32;
        let h = header(2);
        let slot = h.request.layout().index_unchecked(0, 0, SlotKind::Data, 0);
        let wait = Op::Wait { slot, count: 1 };
        let mut w = Writer::new(Vec::new(), &h).unwrap();
        for index in 0..n {
            let ev = |time, kind| Event {
                time,
                rank: 1,
                channel: 0,
                index,
                kind,
                op: wait,
                contents: None,
            };
            w.event(&ev(2 * index as u64, EventKind::Begin)).unwrap();
            let stall = EventKind::Stall {
                target: 1 + index as u64,
                found: 0,
            };
            w.event(&ev(2 * index as u64 + 1, stall)).unwrap();
        }
        let t = Trace::decode("many", w.finish().unwrap()).unwrap();
        let r = report(&t, MAX_ROWS).unwrap();
        assert_eq!(r.stalls, n as usize);
        assert_eq!(r.rows.len(), MAX_ROWS);
        assert_eq!(r.more, n as usize - MAX_ROWS);
        assert!(r.rows[MAX_ROWS - 1].contains("op #49:"), "{}", r.rows[49]);
        assert!(
            r.rows[MAX_ROWS - 1].contains("expected 50, found 0"),
            "{}",
            r.rows[49]
        );
        assert_eq!(r.chain, "rank 1 -> rank 0");
    }
}

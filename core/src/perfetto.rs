//! Export of a trace to Chrome trace JSON, which Perfetto (ui.perfetto.dev) and `chrome://tracing`
//! open.
//!
//! The mapping:
//!
//! * every rank with events is a *process* (`pid` = rank, named "rank r"), every channel with
//!   events a *thread* of it (`tid` = channel, named "channel c"); the rows come from the events,
//!   not from the header's world and channel counts;
//! * every op is a complete slice (`"ph": "X"`) from its `Begin` to its `End` event, named after
//!   the op kind, with the op's operands in `args`; a wait that never finished (a `Stall` event) is
//!   a slice named `wait (stalled)` that lasts to the end of the trace and carries what it
//!   expected and found;
//! * every Signal -> Wait pair is a flow arrow: the signal's slice has `"bind_id": k, "flow_out":
//!   true`, the wait's slice `"bind_id": k, "flow_in": true`, with integer ids.
//!
//! Pairing follows the signal protocol ([`crate::signal`]): a signal from rank r to slot s of rank
//! p is consumed by a wait on slot s of rank p. Signals to one slot come from a single writer, so
//! they are ordered; the waits on the slot consume them in order, `count` at a time (a wait with
//! count c consumes the next c). A wait is *released* by the last signal it consumes: that pair is
//! the flow. [`spans`] and [`pairs`] are the building blocks the browser viewer uses too.
//!
//! The JSON is written by hand (the crate has no JSON dependency); strings written are all ASCII
//! names generated here, so no escaping beyond the basics is needed.
//!
//! Everything here is sized by the events given, never by header fields or by values inside an
//! event, so memory stays a small multiple of the trace's size: an op index far beyond a
//! stream's last one goes to a sparse map instead of growing the dense index table, and slot
//! names use the checked [`crate::signal::SlotLayout::new`]. [`fold`] reads a trace file straight
//! into spans, and [`write_json`] streams the JSON, so an export need not hold either the events or
//! the JSON.

use crate::op::Op;
use crate::sched::{MAX_CHANNELS, MAX_WORLD};
use crate::trace::{Event, EventKind, Header, Reader, TraceError};
use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;

/// One op of one (rank, channel) stream, from its begin to its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// Rank.
    pub rank: u16,
    /// Channel.
    pub channel: u16,
    /// Position of the op in its stream.
    pub index: u32,
    /// The op.
    pub op: Op,
    /// Begin time (header units). A span seen only through its end begins there.
    pub begin: u64,
    /// End time, `None` while the op never finished.
    pub end: Option<u64>,
    /// For a wait that never finished: (target, found) of the slot.
    pub stall: Option<(u64, u64)>,
    /// Ranks whose contributions the destination holds after the op.
    pub contents: Option<u64>,
}

/// Most op indices a stream may skip ahead before spans fall back to a slower map (each event
/// grows a stream's dense table by at most this many entries).
const DENSE_GAP: usize = 16;

/// Entries of the direct (rank, channel) -> lane table: ranks below 64 (others use a map).
const DIRECT_MAX: usize = 64 * MAX_CHANNELS as usize;

/// Folds begin, end and stall events into spans, in order of first appearance.
pub fn spans(events: &[Event]) -> Vec<Span> {
    spans_indexed(events).0
}

/// [`spans`], with the span of every event (`owner[i]` is the span of `events[i]`).
pub fn spans_indexed(events: &[Event]) -> (Vec<Span>, Vec<u32>) {
    let mut b = SpanBuilder::with_capacity(events.len() / 2 + 1);
    let owner = events.iter().map(|e| b.push(e)).collect();
    (b.finish(), owner)
}

/// Builds spans one event at a time, so a reader can fold a trace without keeping its events.
#[derive(Default)]
pub struct SpanBuilder {
    out: Vec<Span>,
    // (rank, channel) -> lane number (a direct table for in-range keys); per lane a dense
    // op index -> span table.
    direct: Vec<u32>,
    lanes: BTreeMap<(u16, u16), usize>,
    dense: Vec<Vec<u32>>,
    sparse: BTreeMap<(u16, u16, u32), usize>,
    last_lane: Option<((u16, u16), usize)>,
}

impl SpanBuilder {
    /// A builder expecting about `spans` spans.
    pub fn with_capacity(spans: usize) -> SpanBuilder {
        SpanBuilder {
            out: Vec::with_capacity(spans),
            ..SpanBuilder::default()
        }
    }

    /// Folds in one event and returns the number of its span.
    pub fn push(&mut self, e: &Event) -> u32 {
        let key = (e.rank, e.channel);
        let lane = match self.last_lane {
            Some((k, l)) if k == key => l,
            _ => {
                let slot = (e.channel < MAX_CHANNELS && e.rank < MAX_WORLD)
                    .then(|| e.rank as usize * MAX_CHANNELS as usize + e.channel as usize)
                    .filter(|i| *i < DIRECT_MAX);
                let known = match slot {
                    Some(i) => self
                        .direct
                        .get(i)
                        .copied()
                        .filter(|l| *l != u32::MAX)
                        .map(|l| l as usize),
                    None => self.lanes.get(&key).copied(),
                };
                let l = match known {
                    Some(l) => l,
                    None => {
                        let l = self.dense.len();
                        self.dense.push(Vec::new());
                        match slot {
                            Some(i) => {
                                if self.direct.len() <= i {
                                    self.direct.resize(i + 1, u32::MAX);
                                }
                                self.direct[i] = l as u32;
                            }
                            None => {
                                self.lanes.insert(key, l);
                            }
                        }
                        l
                    }
                };
                self.last_lane = Some((key, l));
                l
            }
        };
        let idx = e.index as usize;
        let table = &mut self.dense[lane];
        let slot = if idx < table.len() {
            match table[idx] {
                u32::MAX => None,
                s => Some(s as usize),
            }
        } else if idx <= table.len() + DENSE_GAP {
            None
        } else {
            self.sparse.get(&(e.rank, e.channel, e.index)).copied()
        };
        let span = match slot {
            Some(s) => s,
            None => {
                let s = self.out.len();
                self.out.push(Span {
                    rank: e.rank,
                    channel: e.channel,
                    index: e.index,
                    op: e.op,
                    begin: e.time,
                    end: None,
                    stall: None,
                    contents: None,
                });
                if idx <= table.len() + DENSE_GAP {
                    if idx >= table.len() {
                        table.resize(idx + 1, u32::MAX);
                    }
                    table[idx] = s as u32;
                } else {
                    self.sparse.insert((e.rank, e.channel, e.index), s);
                }
                s
            }
        };
        let sp = &mut self.out[span];
        match e.kind {
            EventKind::Begin => sp.begin = sp.begin.min(e.time),
            EventKind::End => {
                sp.end = Some(e.time);
                if e.contents.is_some() {
                    sp.contents = e.contents;
                }
            }
            EventKind::Stall { target, found } => sp.stall = Some((target, found)),
        }
        span as u32
    }

    /// The spans, in order of first appearance.
    pub fn finish(self) -> Vec<Span> {
        self.out
    }
}

/// A Signal -> Wait pair: indices into the span list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair {
    /// The signal's span.
    pub signal: usize,
    /// The span of the wait it released.
    pub wait: usize,
}

/// Pairs every wait that finished with the signal that released it (see the module docs).
pub fn pairs(spans: &[Span]) -> Vec<Pair> {
    // (owner rank, slot) -> (signals, waits)
    let mut by_slot: BTreeMap<(u16, u32), (Vec<usize>, Vec<usize>)> = BTreeMap::new();
    for (i, s) in spans.iter().enumerate() {
        match s.op {
            Op::Signal { peer, slot, .. } => by_slot.entry((peer, slot)).or_default().0.push(i),
            Op::Wait { slot, .. } => by_slot.entry((s.rank, slot)).or_default().1.push(i),
            Op::Copy { .. }
            | Op::Reduce { .. }
            | Op::ReduceN { .. }
            | Op::LlPut { .. }
            | Op::LlReduce { .. }
            | Op::McReduce { .. }
            | Op::McStore { .. } => {}
        }
    }
    let mut out = Vec::new();
    for (_, (mut sig, mut wait)) in by_slot {
        let order = |i: &usize| {
            let s = &spans[*i];
            (s.begin, s.index, s.rank, s.channel)
        };
        sig.sort_by_key(order);
        wait.sort_by_key(|i| (spans[*i].index, spans[*i].begin));
        let mut consumed: u64 = 0;
        for w in wait {
            let Op::Wait { count, .. } = spans[w].op else {
                continue;
            };
            if count == 0 || spans[w].end.is_none() {
                consumed = consumed.saturating_add(count);
                continue;
            }
            let last = consumed.saturating_add(count - 1);
            consumed = consumed.saturating_add(count);
            if let Some(&s) = usize::try_from(last).ok().and_then(|l| sig.get(l)) {
                out.push(Pair { signal: s, wait: w });
            }
        }
    }
    out.sort_by_key(|p| (p.wait, p.signal));
    out
}

mod json;
pub use json::{spans_to_json, to_json, write_json};

/// A trace file folded into spans and pairs as it is decoded, with no copy of its events: what
/// `cargo xtask trace export --perfetto` exports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Folded {
    /// The trace's header.
    pub header: Header,
    /// Op spans, in order of first appearance.
    pub spans: Vec<Span>,
    /// Signal -> Wait pairs.
    pub pairs: Vec<Pair>,
    /// The latest event time.
    pub last: u64,
    /// Events read.
    pub events: u64,
    /// Set when the trace was cut short: the events are those before the offset it names.
    pub warning: Option<TraceError>,
}

impl Folded {
    /// The JSON (see the module docs).
    pub fn to_json(&self) -> String {
        spans_to_json(&self.header, &self.spans, &self.pairs, self.last)
    }

    /// Writes the JSON to `out` without holding it in memory.
    pub fn write_json(&self, out: &mut dyn Write) -> core::fmt::Result {
        write_json(out, &self.header, &self.spans, &self.pairs, self.last)
    }
}

/// Decodes a trace and folds its events into spans and pairs. A trace cut short is folded up to
/// the cut, with a warning; any other problem is an error.
pub fn fold(bytes: &[u8]) -> Result<Folded, TraceError> {
    let reader = Reader::new(bytes)?;
    let header = reader.header().clone();
    let mut b = SpanBuilder::default();
    let (mut last, mut events, mut warning) = (0, 0, None);
    for e in reader {
        match e {
            Ok(e) => {
                last = last.max(e.time);
                events += 1;
                b.push(&e);
            }
            Err(w) if w.is_truncation() => warning = Some(w),
            Err(e) => return Err(e),
        }
    }
    let spans = b.finish();
    let pairs = pairs(&spans);
    Ok(Folded {
        header,
        spans,
        pairs,
        last,
        events,
        warning,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DType, ReduceOp};
    use crate::op::{Buf, Loc, SignalOp};
    use crate::sched::{Algorithm, Collective, Request};
    use crate::trace::Source;

    fn ev(time: u64, rank: u16, index: u32, kind: EventKind, op: Op) -> Event {
        Event {
            time,
            rank,
            channel: 0,
            index,
            kind,
            op,
            contents: None,
        }
    }

    fn header() -> Header {
        let request = Request::new(
            Collective::AllReduce,
            Algorithm::Ring,
            2,
            64,
            DType::F32,
            ReduceOp::Sum,
        );
        Header {
            world: 2,
            channels: 1,
            request,
            source: Source::Host { simulated: true },
            time_unit_ns: 1000,
            team: None,
        }
    }

    #[test]
    fn pairs_signals_with_the_waits_they_release() {
        let layout = header().request.layout();
        let slot = layout.index_unchecked(0, 0, crate::signal::SlotKind::Data, 0);
        let sig = Op::Signal {
            peer: 1,
            slot,
            op: SignalOp::Add,
            value: 1,
        };
        let copy = Op::Copy {
            src: Loc::new(0, Buf::Input, 0),
            dst: Loc::new(1, Buf::Scratch, 0),
            bytes: 64,
        };
        let events = [
            ev(0, 0, 0, EventKind::Begin, copy),
            ev(5, 0, 0, EventKind::End, copy),
            ev(5, 0, 1, EventKind::Begin, sig),
            ev(6, 0, 1, EventKind::End, sig),
            ev(6, 0, 2, EventKind::Begin, sig),
            ev(7, 0, 2, EventKind::End, sig),
            ev(0, 1, 0, EventKind::Begin, Op::Wait { slot, count: 2 }),
            ev(8, 1, 0, EventKind::End, Op::Wait { slot, count: 2 }),
            ev(8, 1, 1, EventKind::Begin, Op::Wait { slot, count: 1 }),
            ev(
                99,
                1,
                1,
                EventKind::Stall {
                    target: 3,
                    found: 2,
                },
                Op::Wait { slot, count: 1 },
            ),
        ];
        let sp = spans(&events);
        assert_eq!(sp.len(), 5);
        let p = pairs(&sp);
        assert_eq!(p, [Pair { signal: 2, wait: 3 }]);
        let json = to_json(&header(), &events);
        assert_eq!(json.matches("\"flow_out\":true").count(), 1);
        assert_eq!(json.matches("\"flow_in\":true").count(), 1);
        assert!(json.contains("\"name\":\"wait (stalled)\""));
        assert!(json.contains("\"expected\":3,\"found\":2"));
        assert!(json.contains("\"ts\":5.000,\"dur\":1.000"));
        assert_eq!(json.matches("\"process_name\"").count(), 2);
    }

    #[test]
    fn hostile_headers_and_indices_stay_bounded() {
        // An unvalidated header whose slot layout overflows u32, and a world nobody uses.
        let mut h = header();
        h.request.world = u16::MAX;
        h.request.channels = u16::MAX;
        h.world = u16::MAX;
        h.channels = u16::MAX;
        let wait = Op::Wait {
            slot: u32::MAX - 1,
            count: 1,
        };
        let mut events = alloc::vec::Vec::new();
        for i in 0..1000u32 {
            let index = i.wrapping_mul(1 << 16);
            events.push(ev(i as u64, 7, index, EventKind::Begin, wait));
        }
        let json = to_json(&h, &events);
        assert_eq!(json.matches("\"process_name\"").count(), 1);
        assert_eq!(json.matches("\"thread_name\"").count(), 1);
        assert!(json.len() < 300 * events.len(), "{}", json.len());
        // Op indices that skip ahead go to the sparse map, not into the dense table.
        let mut b = SpanBuilder::default();
        for e in &events {
            b.push(e);
        }
        let dense: usize = b.dense.iter().map(Vec::len).sum();
        assert!(dense <= 2 * (DENSE_GAP + 1), "{dense}");
        assert_eq!(b.finish().len(), 1000);
    }
}

//! A decoded trace, indexed for playback.
//!
//! Decoding uses core's [`trace::Reader`]; the events are sorted by time and folded into op spans
//! with core's [`perfetto::SpanBuilder`], so the viewer and the Perfetto export agree on what an
//! op and a Signal -> Wait pair are. The *playback position* is a count of applied events
//! (`0..=events.len()`): every view draws the state after the first `pos` events.
//!
//! A trace cut short by a crash opens with the events it holds and [`Trace::warning`]; any other
//! decoding problem is a [`LoadError`]. Every table is sized by the events present, so memory is
//! a small multiple of the file's size whatever the header or the events claim.

use crate::buffers::Cells;
use crate::edges::Graph;
use std::fmt;
use symm_core::op::Op;
use symm_core::perfetto::{self, Pair, Span};
use symm_core::trace::{self, Event, EventKind, Header, TraceError};

/// Why a trace could not be opened.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LoadError {
    /// The bytes are not a valid trace.
    Decode {
        /// What was opened.
        name: String,
        /// What the decoder found.
        error: TraceError,
    },
    /// The trace has a header but no events.
    Empty {
        /// What was opened.
        name: String,
        /// Why it stops there, when it was cut short.
        warning: Option<TraceError>,
    },
    /// The bytes could not be fetched or read.
    Io {
        /// What was opened.
        name: String,
        /// What went wrong.
        reason: String,
    },
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Decode { name, error } => write!(f, "cannot open {name}: {error}"),
            LoadError::Empty {
                name,
                warning: None,
            } => write!(f, "cannot open {name}: the trace has no events"),
            LoadError::Empty {
                name,
                warning: Some(w),
            } => write!(f, "cannot open {name}: the trace has no events ({w})"),
            LoadError::Io { name, reason } => write!(f, "cannot open {name}: {reason}"),
        }
    }
}

impl std::error::Error for LoadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LoadError::Decode { error, .. } => Some(error),
            LoadError::Empty {
                warning: Some(w), ..
            } => Some(w),
            _ => None,
        }
    }
}

/// One (rank, channel) stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lane {
    /// Rank.
    pub rank: u16,
    /// Channel.
    pub channel: u16,
    /// Its spans, by begin time (the ops of one stream never overlap).
    pub spans: Vec<u32>,
    /// Begin time of each span (contiguous, for fast search while drawing).
    pub begins: Vec<u64>,
    /// End time of each span, `u64::MAX` when it never finished.
    pub ends: Vec<u64>,
}

/// A decoded, indexed trace.
pub struct Trace {
    /// Where it came from (file name or URL).
    pub name: String,
    /// The header.
    pub header: Header,
    /// Events sorted by time (stable), reduced to what playback needs.
    pub events: Vec<Ev>,
    /// Op spans.
    pub spans: Vec<Span>,
    /// The trace as it was read (the Perfetto export decodes it again).
    pub bytes: Vec<u8>,
    /// Lanes sorted by (rank, channel).
    pub lanes: Vec<Lane>,
    /// Signal -> Wait pairs.
    pub pairs: Vec<Pair>,
    /// For every span: the pair it is part of (`u32::MAX`: none).
    pub pair_of: Vec<u32>,
    /// For every wait span: the slot value it waited for (cumulative count); 0 otherwise.
    pub wait_target: Vec<u64>,
    /// First and last event time.
    pub start: u64,
    /// Last event time.
    pub end: u64,
    /// Positions just after the begin of every stall (long or unfinished wait), ascending.
    pub stall_marks: Vec<u32>,
    /// A finished wait that lasted at least this long counts as a stall.
    pub stall_threshold: u64,
    /// Longest finished wait.
    pub wait_max: u64,
    /// Output buffer contents over time.
    pub cells: Cells,
    /// Scratch (staging) buffer contents over time.
    pub scratch: Cells,
    /// Number of waits that never finished (`Stall` events).
    pub stalled: usize,
    /// Who sends data to whom, from the signals and puts (the topology view's edges).
    pub graph: Graph,
    /// Set when the trace was cut short: it holds the events before the offset named.
    pub warning: Option<TraceError>,
}

/// What an event marks, in a byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// An op began.
    Begin,
    /// An op ended.
    End,
    /// A wait gave up (the run timed out).
    Stall,
}

/// An event as playback needs it: 16 bytes instead of a whole [`Event`], so a million-event
/// trace stays small in the page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ev {
    /// Time.
    pub time: u64,
    /// Its span.
    pub span: u32,
    /// Begin, end or stall.
    pub mark: Mark,
}

fn fold(events: impl Iterator<Item = Event>, capacity: usize) -> (Vec<Span>, Vec<Ev>, bool) {
    let mut b = perfetto::SpanBuilder::with_capacity(capacity / 2 + 1);
    let mut evs = Vec::with_capacity(capacity);
    let mut sorted = true;
    let mut last = 0;
    for e in events {
        sorted &= e.time >= last;
        last = e.time;
        let mark = match e.kind {
            EventKind::Begin => Mark::Begin,
            EventKind::End => Mark::End,
            EventKind::Stall { .. } => Mark::Stall,
        };
        evs.push(Ev {
            time: e.time,
            span: b.push(&e),
            mark,
        });
    }
    (b.finish(), evs, sorted)
}

impl Trace {
    /// Decodes and indexes a trace. A trace cut short opens with [`Trace::warning`] set.
    pub fn decode(name: &str, bytes: Vec<u8>) -> Result<Trace, LoadError> {
        let decode_err = |error| LoadError::Decode {
            name: name.to_string(),
            error,
        };
        let reader = trace::Reader::new(&bytes).map_err(decode_err)?;
        let header = reader.header().clone();
        // Events take 10 bytes or more; most take 17 or more.
        let capacity = bytes.len() / 16 + 16;
        let mut failed = None;
        let (mut spans, mut events, sorted) = fold(
            reader.map_while(|e| e.map_err(|err| failed = Some(err)).ok()),
            capacity,
        );
        let warning = match failed {
            Some(e) if e.is_truncation() => Some(e),
            Some(e) => return Err(decode_err(e)),
            None => None,
        };
        if events.is_empty() {
            return Err(LoadError::Empty {
                name: name.to_string(),
                warning,
            });
        }
        if !sorted {
            // Spans are numbered in order of first appearance: fold the events again in time
            // order.
            drop((spans, events));
            let mut full = trace::decode(&bytes).map_err(decode_err)?.events;
            full.sort_by_key(|e| e.time);
            (spans, events, _) = fold(full.into_iter(), capacity);
        }
        let mut t = Trace::index(name, header, spans, events, bytes);
        t.warning = warning;
        Ok(t)
    }

    /// The trace as Chrome trace JSON for Perfetto, from the spans already indexed (the same
    /// JSON as [`perfetto::to_json`] of [`Trace::full_events`]).
    pub fn to_json(&self) -> String {
        perfetto::spans_to_json(&self.header, &self.spans, &self.pairs, self.end)
    }

    /// Every event of the trace in time order.
    pub fn full_events(&self) -> Vec<Event> {
        let mut v = Vec::with_capacity(self.events.len());
        if let Ok(r) = trace::Reader::new(&self.bytes) {
            v.extend(r.map_while(Result::ok));
        }
        v.sort_by_key(|e| e.time);
        v
    }

    /// The warning to show next to the trace, naming the byte offset where it was cut short.
    pub fn warning_text(&self) -> Option<String> {
        self.warning.map(|w| {
            format!(
                "{}: {w}; showing the {} events before it (unverified)",
                self.name,
                self.events.len()
            )
        })
    }

    /// Indexes folded events.
    fn index(
        name: &str,
        header: Header,
        spans: Vec<Span>,
        events: Vec<Ev>,
        bytes: Vec<u8>,
    ) -> Trace {
        let pairs = perfetto::pairs(&spans);
        let mut pair_of = vec![u32::MAX; spans.len()];
        for (k, p) in pairs.iter().enumerate() {
            pair_of[p.signal] = k as u32;
            pair_of[p.wait] = k as u32;
        }
        let lanes = lanes(&spans);
        let wait_target = wait_targets(&spans);
        let start = events.first().map_or(0, |e| e.time);
        let end = events.last().map_or(0, |e| e.time);
        let (stall_threshold, wait_max) = stall_threshold(&spans);
        let mut stall_marks = Vec::new();
        let mut seen = vec![false; spans.len()];
        // Position just after each span's end event (0: it never ended).
        let mut end_pos = vec![0u32; spans.len()];
        for (i, e) in events.iter().enumerate() {
            let s = e.span as usize;
            let after = u32::try_from(i + 1).unwrap_or(u32::MAX);
            if e.mark == Mark::End {
                end_pos[s] = after;
            }
            let sp = &spans[s];
            let long = matches!(sp.op, Op::Wait { .. })
                && (sp.stall.is_some()
                    || sp.end.is_none()
                    || sp.end.unwrap_or(0).saturating_sub(sp.begin) >= stall_threshold);
            if long && !seen[s] {
                seen[s] = true;
                stall_marks.push(after);
            }
        }
        let cells = Cells::build(&header, &spans, &end_pos, symm_core::op::Buf::Output);
        let scratch = Cells::build(&header, &spans, &end_pos, symm_core::op::Buf::Scratch);
        let stalled = spans.iter().filter(|s| s.stall.is_some()).count();
        let graph = Graph::derive(&header, &spans);
        Trace {
            name: name.to_string(),
            header,
            events,
            spans,
            bytes,
            lanes,
            pairs,
            pair_of,
            wait_target,
            start,
            end,
            stall_marks,
            stall_threshold,
            wait_max,
            cells,
            scratch,
            stalled,
            graph,
            warning: None,
        }
    }

    /// Time after the first `pos` events.
    pub fn time_at(&self, pos: usize) -> u64 {
        match pos.min(self.events.len()) {
            0 => self.start,
            p => self.events[p - 1].time,
        }
    }

    /// The largest position whose time is at most `t`.
    pub fn pos_at(&self, t: u64) -> usize {
        self.events.partition_point(|e| e.time <= t)
    }

    /// The span the `pos`-th event belongs to (the op just applied), if any.
    pub fn current_span(&self, pos: usize) -> Option<usize> {
        pos.checked_sub(1)
            .and_then(|i| self.events.get(i))
            .map(|e| e.span as usize)
    }

    /// Duration in nanoseconds.
    pub fn duration_ns(&self) -> f64 {
        (self.end - self.start) as f64 * self.header.time_unit_ns.max(1) as f64
    }

    /// Whether a span counts as a stall.
    pub fn is_stall(&self, s: &Span) -> bool {
        matches!(s.op, Op::Wait { .. })
            && (s.stall.is_some()
                || s.end
                    .is_some_and(|e| e.saturating_sub(s.begin) >= self.stall_threshold))
    }

    /// In a lane, the span in progress or last finished at time `t`.
    pub fn lane_span_at(&self, lane: &Lane, t: u64) -> Option<usize> {
        let i = lane.begins.partition_point(|b| *b <= t);
        i.checked_sub(1).map(|i| lane.spans[i] as usize)
    }

    /// Index of the first span of a lane that ends at or after `t`.
    pub fn lane_first_ending_after(&self, lane: &Lane, t: u64) -> usize {
        lane.ends.partition_point(|e| *e < t)
    }

    /// Number of Begin, End and Stall events.
    pub fn event_count(&self) -> usize {
        self.events.len()
    }

    /// Number of events of a kind (for summaries).
    pub fn stalls(&self) -> impl Iterator<Item = (usize, &Span)> {
        self.spans
            .iter()
            .enumerate()
            .filter(|(_, s)| s.stall.is_some())
    }

    /// Whether an event ends its op.
    pub fn is_end(&self, i: usize) -> bool {
        matches!(self.events.get(i).map(|e| e.mark), Some(Mark::End))
    }
}

fn lanes(spans: &[Span]) -> Vec<Lane> {
    let mut map: std::collections::HashMap<(u16, u16), usize> = std::collections::HashMap::new();
    let mut lanes: Vec<Lane> = Vec::new();
    let mut last: Option<((u16, u16), usize)> = None;
    for (i, s) in spans.iter().enumerate() {
        let key = (s.rank, s.channel);
        let l = match last {
            Some((k, l)) if k == key => l,
            _ => {
                let next = lanes.len();
                let l = *map.entry(key).or_insert(next);
                if l == next {
                    lanes.push(Lane {
                        rank: s.rank,
                        channel: s.channel,
                        spans: Vec::new(),
                        begins: Vec::new(),
                        ends: Vec::new(),
                    });
                }
                last = Some((key, l));
                l
            }
        };
        lanes[l].spans.push(i as u32);
    }
    let begin = |s: &u32| (spans[*s as usize].begin, spans[*s as usize].index);
    for l in &mut lanes {
        if !l.spans.windows(2).all(|w| begin(&w[0]) <= begin(&w[1])) {
            l.spans.sort_by_key(begin);
        }
        l.begins = l.spans.iter().map(|s| spans[*s as usize].begin).collect();
        l.ends = l
            .spans
            .iter()
            .map(|s| spans[*s as usize].end.unwrap_or(u64::MAX))
            .collect();
    }
    lanes.sort_by_key(|l| (l.rank, l.channel));
    lanes
}

fn wait_targets(spans: &[Span]) -> Vec<u64> {
    // Spans come in order of first appearance, so the waits on one slot (all on one stream)
    // come in program order.
    let mut acc: std::collections::HashMap<(u16, u32), u64> = std::collections::HashMap::new();
    let mut out = vec![0u64; spans.len()];
    for (i, s) in spans.iter().enumerate() {
        if let Op::Wait { slot, count } = s.op {
            let a = acc.entry((s.rank, slot)).or_default();
            *a = a.saturating_add(count);
            out[i] = *a;
        }
    }
    out
}

/// A wait is a stall when it lasted at least 4x the median op duration (and at least 1 unit).
fn stall_threshold(spans: &[Span]) -> (u64, u64) {
    let mut d: Vec<u64> = spans
        .iter()
        .filter_map(|s| s.end.map(|e| e.saturating_sub(s.begin)))
        .collect();
    let wait_max = spans
        .iter()
        .filter(|s| matches!(s.op, Op::Wait { .. }))
        .filter_map(|s| s.end.map(|e| e.saturating_sub(s.begin)))
        .max()
        .unwrap_or(0);
    if d.is_empty() {
        return (u64::MAX, wait_max);
    }
    let mid = d.len() / 2;
    let (_, m, _) = d.select_nth_unstable(mid);
    ((*m).max(1).saturating_mul(4), wait_max)
}

#[cfg(test)]
pub(crate) mod tests;

//! The JSON writer of the export (see the parent module's docs for the mapping).

use super::{pairs, spans, Pair, Span};
use crate::op::{Loc, McLoc, Op};
use crate::signal::SlotLayout;
use crate::trace::{Event, Header};
use alloc::collections::BTreeSet;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::{Result, Write};

fn ts(out: &mut dyn Write, time: u64, unit_ns: u32) -> Result {
    let ns = (time as u128) * (unit_ns.max(1) as u128);
    write!(out, "{}.{:03}", ns / 1000, ns % 1000)
}

fn loc(out: &mut dyn Write, key: &str, l: &Loc) -> Result {
    write!(
        out,
        "\"{key}\":\"r{}.{}+{}\"",
        l.rank,
        l.buf.name(),
        l.offset
    )
}

fn mcloc(out: &mut dyn Write, key: &str, l: &McLoc) -> Result {
    write!(out, "\"{key}\":\"all.{}+{}\"", l.buf.name(), l.offset)
}

/// The protocol name of a line format.
fn protocol(f: crate::ll::Format) -> &'static str {
    match f {
        crate::ll::Format::Ll => "ll",
        crate::ll::Format::Ll128 => "ll128",
    }
}

fn op_args(out: &mut dyn Write, op: &Op, layout: Option<&SlotLayout>) -> Result {
    match op {
        Op::Copy { src, dst, bytes } => {
            loc(out, "src", src)?;
            out.write_char(',')?;
            loc(out, "dst", dst)?;
            write!(out, ",\"bytes\":{bytes}")
        }
        Op::Reduce {
            a, b, dst, elems, ..
        } => {
            loc(out, "a", a)?;
            out.write_char(',')?;
            loc(out, "b", b)?;
            out.write_char(',')?;
            loc(out, "dst", dst)?;
            write!(out, ",\"elems\":{elems},\"bytes\":{}", op.bytes())
        }
        Op::Signal {
            peer, slot, value, ..
        } => {
            write!(out, "\"peer\":{peer},\"slot\":{slot},\"value\":{value}")?;
            slot_key(out, layout, *slot)
        }
        Op::Wait { slot, count } => {
            write!(out, "\"slot\":{slot},\"count\":{count}")?;
            slot_key(out, layout, *slot)
        }
        Op::ReduceN {
            buf,
            offset,
            ranks,
            dst,
            elems,
            ..
        } => {
            write!(out, "\"src\":\"")?;
            for (i, r) in ranks.as_slice().iter().enumerate() {
                write!(out, "{}r{r}", if i == 0 { "" } else { "," })?;
            }
            write!(out, ".{}+{offset}\",", buf.name())?;
            loc(out, "dst", dst)?;
            write!(out, ",\"elems\":{elems},\"bytes\":{}", op.bytes())
        }
        Op::LlPut {
            format,
            src,
            dst,
            bytes,
            ..
        } => {
            loc(out, "src", src)?;
            out.write_char(',')?;
            loc(out, "dst", dst)?;
            write!(
                out,
                ",\"bytes\":{bytes},\"protocol\":\"{}\"",
                protocol(*format)
            )
        }
        Op::LlReduce {
            format,
            src,
            sources,
            dst,
            elems,
            ..
        } => {
            loc(out, "src", src)?;
            out.write_char(',')?;
            loc(out, "dst", dst)?;
            write!(
                out,
                ",\"sources\":{sources},\"elems\":{elems},\"bytes\":{},\"protocol\":\"{}\"",
                op.bytes(),
                protocol(*format)
            )
        }
        Op::McReduce {
            src, dst, elems, ..
        } => {
            mcloc(out, "src", src)?;
            out.write_char(',')?;
            loc(out, "dst", dst)?;
            write!(out, ",\"elems\":{elems},\"bytes\":{}", op.bytes())
        }
        Op::McStore { src, dst, bytes } => {
            loc(out, "src", src)?;
            out.write_char(',')?;
            mcloc(out, "dst", dst)?;
            write!(out, ",\"bytes\":{bytes}")
        }
    }
}

fn slot_key(out: &mut dyn Write, layout: Option<&SlotLayout>, slot: u32) -> Result {
    match layout.and_then(|l| l.key(slot)) {
        Some(k) => write!(
            out,
            ",\"slot_kind\":\"{}\",\"slot_channel\":{},\"slot_from\":{}",
            k.kind.name(),
            k.channel,
            k.peer
        ),
        None => Ok(()),
    }
}

/// The trace as Chrome trace JSON (see the module docs).
pub fn to_json(header: &Header, events: &[Event]) -> String {
    let spans = spans(events);
    let pairs = pairs(&spans);
    let last = events.iter().map(|e| e.time).max().unwrap_or(0);
    spans_to_json(header, &spans, &pairs, last)
}

/// Chrome trace JSON of spans already folded ([`spans`]) and paired ([`pairs`]); `last` is the
/// latest event time (where unfinished slices end). The viewer exports its own spans this way.
pub fn spans_to_json(header: &Header, spans: &[Span], pairs: &[Pair], last: u64) -> String {
    // A slice takes about 170 to 250 bytes, the rows of a stream about 300.
    let mut out = String::with_capacity(256 + spans.len() * 256);
    // Writing to a String cannot fail.
    let _ = write_json(&mut out, header, spans, pairs, last);
    out
}

/// Writes the JSON of [`spans_to_json`] to `out`, as it goes.
pub fn write_json(
    out: &mut dyn Write,
    header: &Header,
    spans: &[Span],
    pairs: &[Pair],
    last: u64,
) -> Result {
    let mut flow: Vec<(u32, bool)> = alloc::vec![(0, false); spans.len()];
    for (k, p) in pairs.iter().enumerate() {
        let Ok(id) = u32::try_from(k + 1) else { break };
        if p.signal < flow.len() && p.wait < flow.len() {
            flow[p.signal] = (id, true);
            flow[p.wait] = (id, false);
        }
    }
    let unit = header.time_unit_ns;
    let layout = SlotLayout::new(1, header.request.channels, header.request.world).ok();
    // Rows for the streams that have events, whatever the header's world and channel counts.
    let lanes: BTreeSet<(u16, u16)> = spans.iter().map(|s| (s.rank, s.channel)).collect();
    write!(
        out,
        "{{\"displayTimeUnit\":\"ns\",\"otherData\":{{\"collective\":\"{}\",\"algorithm\":\"{}\",\"world\":{},\"channels\":{},\"bytes\":{}}},\"traceEvents\":[",
        header.request.collective.name(),
        header.request.algorithm.name(),
        header.world,
        header.channels,
        header.request.bytes
    )?;
    let mut first = true;
    let mut sep = |out: &mut dyn Write| {
        let s = if first { "\n" } else { ",\n" };
        first = false;
        out.write_str(s)
    };
    let mut rank = None;
    for &(r, c) in &lanes {
        if rank != Some(r) {
            rank = Some(r);
            sep(out)?;
            write!(
                out,
                "{{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":{r},\"tid\":0,\"args\":{{\"name\":\"rank {r}\"}}}}"
            )?;
            sep(out)?;
            write!(
                out,
                "{{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":{r},\"tid\":0,\"args\":{{\"sort_index\":{r}}}}}"
            )?;
        }
        sep(out)?;
        write!(
            out,
            "{{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":{r},\"tid\":{c},\"args\":{{\"name\":\"channel {c}\"}}}}"
        )?;
    }
    for (s, &(id, is_out)) in spans.iter().zip(&flow) {
        sep(out)?;
        let name = if s.stall.is_some() {
            "wait (stalled)"
        } else if s.end.is_none() {
            "unfinished"
        } else {
            s.op.kind_name()
        };
        let end = s.end.unwrap_or(last).max(s.begin);
        write!(
            out,
            "{{\"ph\":\"X\",\"cat\":\"{}\",\"name\":\"{name}\",\"pid\":{},\"tid\":{},\"ts\":",
            s.op.kind_name(),
            s.rank,
            s.channel
        )?;
        ts(out, s.begin, unit)?;
        out.write_str(",\"dur\":")?;
        ts(out, end - s.begin, unit)?;
        if id != 0 {
            let dir = if is_out { "flow_out" } else { "flow_in" };
            write!(out, ",\"bind_id\":{id},\"{dir}\":true")?;
        }
        write!(out, ",\"args\":{{\"index\":{},", s.index)?;
        op_args(out, &s.op, layout.as_ref())?;
        if let Some((target, found)) = s.stall {
            write!(out, ",\"expected\":{target},\"found\":{found}")?;
        }
        if let Some(c) = s.contents {
            write!(out, ",\"contents\":\"{c:#x}\"")?;
        }
        out.write_str("}}")?;
    }
    out.write_str("\n]}\n")
}

//! Ops in words, for the details panel.
//!
//! A location is named by its rank, buffer and chunk (the offset divided by the request's
//! pipelining chunk), a slot by its channel, kind and signalling rank, e.g. "rank 2 adds chunk 3
//! of rank 1's scratch into its output, 64 KiB" or "rank 1 waits for slot (c0, data from r0) to
//! reach 5".

use crate::model::Trace;
use symm_core::ll::Format;
use symm_core::op::{Loc, McLoc, Op};

/// A byte count in binary units.
pub fn size(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes & ((1 << 20) - 1) == 0 {
        format!("{} MiB", bytes >> 20)
    } else if bytes >= 1 << 10 && bytes & ((1 << 10) - 1) == 0 {
        format!("{} KiB", bytes >> 10)
    } else {
        format!("{bytes} B")
    }
}

/// The ranks a trace ran on: the world size, or for a team collective the team's size, id and
/// members ("3: team 1 of world 7, ranks 6 0 3"; events use the team's local ranks).
pub fn world(h: &symm_core::trace::Header) -> String {
    match &h.team {
        None => h.world.to_string(),
        Some(t) => {
            let ranks: Vec<String> = t.members.iter().map(u16::to_string).collect();
            format!(
                "{}: team {} of world {}, ranks {}",
                h.world,
                t.id,
                t.world,
                ranks.join(" ")
            )
        }
    }
}

/// A duration in the trace's units, in ns, us or ms.
pub fn duration(t: &Trace, units: u64) -> String {
    let ns = units as f64 * t.header.time_unit_ns.max(1) as f64;
    if ns < 1e3 {
        format!("{ns:.0} ns")
    } else if ns < 1e6 {
        format!("{:.2} us", ns / 1e3)
    } else {
        format!("{:.3} ms", ns / 1e6)
    }
}

fn chunk_bytes(t: &Trace) -> u64 {
    let r = &t.header.request;
    (r.chunk_elems() * r.dtype.size()).max(1)
}

fn place(t: &Trace, me: u16, l: &Loc) -> String {
    let owner = if l.rank == me {
        "its".to_string()
    } else {
        format!("rank {}'s", l.rank)
    };
    format!(
        "chunk {} of {owner} {}",
        l.offset / chunk_bytes(t),
        l.buf.name()
    )
}

fn mc_place(t: &Trace, l: &McLoc) -> String {
    format!(
        "chunk {} of every rank's {}",
        l.offset / chunk_bytes(t),
        l.buf.name()
    )
}

fn slot_name(t: &Trace, slot: u32) -> String {
    match t.header.request.layout().key(slot) {
        Some(k) => format!("(c{}, {} from r{})", k.channel, k.kind.name(), k.peer),
        None => format!("#{slot}"),
    }
}

/// The op of a span in words.
pub fn op(t: &Trace, span: usize) -> String {
    let Some(s) = t.spans.get(span) else {
        return String::new();
    };
    let r = s.rank;
    let mut text = match &s.op {
        Op::Copy { src, dst, bytes } => {
            let verb = if dst.rank != r {
                "puts"
            } else if src.rank != r {
                "gets"
            } else {
                "copies"
            };
            format!(
                "rank {r} {verb} {} into {}, {}",
                place(t, r, src),
                place(t, r, dst),
                size(*bytes)
            )
        }
        Op::Reduce {
            a,
            b,
            dst,
            dtype,
            op,
            ..
        } => format!(
            "rank {r} combines {} with {} into {}, {} ({op:?}, {dtype:?})",
            place(t, r, a),
            place(t, r, b),
            place(t, r, dst),
            size(s.op.bytes())
        ),
        Op::Signal {
            peer, slot, value, ..
        } => {
            let mut w = format!(
                "rank {r} signals rank {peer}'s slot {} (+{value})",
                slot_name(t, *slot)
            );
            if let Some(p) = t.pairs.get(t.pair_of[span] as usize) {
                let ws = &t.spans[p.wait];
                w.push_str(&format!(
                    "; this releases rank {}'s wait #{}",
                    ws.rank, ws.index
                ));
            }
            w
        }
        Op::Wait { slot, count } => {
            let mut w = format!(
                "rank {r} waits for slot {} to reach {} ({count} more signal{})",
                slot_name(t, *slot),
                t.wait_target[span],
                if *count == 1 { "" } else { "s" }
            );
            if let Some(p) = t.pairs.get(t.pair_of[span] as usize) {
                let ss = &t.spans[p.signal];
                w.push_str(&format!(
                    "; released by rank {}'s signal #{}",
                    ss.rank, ss.index
                ));
            }
            w
        }
        Op::ReduceN {
            buf,
            offset,
            ranks,
            dst,
            elems,
            dtype,
            op,
            ..
        } => {
            let list = ranks.as_slice();
            let from: Vec<String> = list
                .iter()
                .map(|&q| place(t, r, &Loc::new(q, *buf, *offset)))
                .collect();
            format!(
                "rank {r} reads {} in one pass and combines {} into {} ({op:?}, {dtype:?}, one rounding), {} each",
                if list.len() == 1 { "one source" } else { "every source" },
                from.join(", "),
                place(t, r, dst),
                size(elems.saturating_mul(dtype.size()))
            )
        }
        Op::LlPut {
            format: Format::Ll,
            src,
            dst,
            bytes,
            ..
        } => format!(
            "rank {r} writes {} into {} as low-latency lines (data and flag together, no signal), {}",
            place(t, r, src),
            place(t, r, dst),
            size(*bytes)
        ),
        Op::LlPut {
            format: Format::Ll128,
            src,
            dst,
            bytes,
            ..
        } => format!(
            "rank {r} writes {} into {} as 128-byte low-latency lines (120 data bytes, then the flag word with release), {}",
            place(t, r, src),
            place(t, r, dst),
            size(*bytes)
        ),
        Op::LlReduce {
            format: Format::Ll128,
            src,
            sources,
            dst,
            elems,
            dtype,
            op,
            ..
        } => format!(
            "rank {r} waits for the flag words of {sources} regions of 128-byte lines from {} on and combines them into {} ({op:?}, {dtype:?}, one rounding), {} each",
            place(t, r, src),
            place(t, r, dst),
            size(elems.saturating_mul(dtype.size()))
        ),
        Op::LlReduce {
            format: Format::Ll,
            src,
            sources,
            dst,
            elems,
            dtype,
            op,
            ..
        } => format!(
            "rank {r} waits for the flags of {sources} low-latency regions from {} on and combines them into {} ({op:?}, {dtype:?}, one rounding), {} each",
            place(t, r, src),
            place(t, r, dst),
            size(elems.saturating_mul(dtype.size()))
        ),
        Op::McReduce { src, dst, op, .. } => format!(
            "rank {r} load-reduces {} through the switch into {}, {} ({op:?})",
            mc_place(t, src),
            place(t, r, dst),
            size(s.op.bytes())
        ),
        Op::McStore { src, dst, bytes } => format!(
            "rank {r} multicasts {} to {}, {}",
            place(t, r, src),
            mc_place(t, dst),
            size(*bytes)
        ),
    };
    text.push_str(&format!(" [op #{} on channel {}; ", s.index, s.channel));
    match (s.end, s.stall) {
        (_, Some((target, found))) => text.push_str(&format!(
            "NEVER FINISHED: expected the slot to reach {target}, found {found}]"
        )),
        (Some(e), None) => text.push_str(&format!(
            "{} from {}]",
            duration(t, e.saturating_sub(s.begin)),
            duration(t, s.begin.saturating_sub(t.start))
        )),
        (None, None) => text.push_str("unfinished]"),
    }
    if let Some(c) = s.contents {
        let ranks: Vec<String> = (0..64)
            .filter(|b| c & (1u64 << b) != 0)
            .map(|b| b.to_string())
            .collect();
        text.push_str(&format!(
            "; destination then holds ranks {{{}}}",
            ranks.join(",")
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::tests::small;

    #[test]
    fn a_team_trace_names_its_team() {
        let mut h = crate::model::tests::header(3);
        assert_eq!(world(&h), "3");
        h.team = Some(symm_core::trace::TeamTag {
            id: 1,
            world: 7,
            members: [6, 0, 3].into_iter().collect(),
        });
        assert_eq!(world(&h), "3: team 1 of world 7, ranks 6 0 3");
    }

    #[test]
    fn words() {
        let t = Trace::decode("small", small(false)).unwrap();
        let texts: Vec<String> = (0..t.spans.len()).map(|s| op(&t, s)).collect();
        assert!(
            texts[0].starts_with(
                "rank 0 puts chunk 0 of its in into chunk 0 of rank 1's scratch, 128 B"
            ),
            "{}",
            texts[0]
        );
        assert!(
            texts
                .iter()
                .any(|x| x.contains("waits for slot (c0, data from r0) to reach 1")),
            "{texts:?}"
        );
        assert!(
            texts
                .iter()
                .any(|x| x.contains("releases rank 1's wait #0")),
            "{texts:?}"
        );
    }
}

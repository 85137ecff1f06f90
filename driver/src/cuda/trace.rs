//! GPU traces in symm-core's trace format.
//!
//! The traced interpreter variant appends (globaltimer ns, op index, kind) per op begin and end
//! to a per-(rank, channel) device buffer. Here those records become [`Event`]s: the op comes
//! from the host copy of the plan (the GPU never writes ops back), and the header says the source
//! is the GPUs by name.
//!
//! The test harness's one-process `World` (symm-harness) reads every rank and makes times relative to the earliest event. A
//! [`Comm`](super::Comm) traces its own rank only, keeping the GPU's absolute timer values, so
//! that [`merge`] can put every process's part on one time axis (the GPUs of one host share the
//! global timer's epoch closely enough for a replay, not for sub-microsecond comparisons).

use core::mem::offset_of;

use symm_core::sched::Request;
use symm_core::trace::{Event, EventKind, Header, Source, TraceError, MAX_DEVICES};
use symm_kernels::abi::{self, TraceEvent};

use super::device::DevBuf;
use super::error::{CudaError, Result};
use super::launch::EVENT_BYTES;
use super::plan::RankPlan;

/// One raw GPU event: (globaltimer ns, op index, kind 0 begin / 1 end / 2 stall).
pub type RawEvent = (u64, u32, u32);

/// One rank's raw events per channel, read from its trace buffer (`cap` events per channel) and
/// per-channel lengths; `true` when a channel overflowed its buffer.
pub fn read_rank(
    trace: &DevBuf,
    lens: &DevBuf,
    cap: usize,
    channels: usize,
) -> Result<(Vec<Vec<RawEvent>>, bool)> {
    let lens = lens.read_at(0, channels * 4)?;
    let mut overflow = false;
    let mut per = Vec::with_capacity(channels);
    for (c, l) in lens.chunks_exact(4).enumerate() {
        let n = u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize;
        overflow |= n > cap;
        let raw = trace.read_at(c * cap * EVENT_BYTES, n.min(cap) * EVENT_BYTES)?;
        per.push(
            raw.chunks_exact(EVENT_BYTES)
                .map(|e| {
                    // Field offsets of `symm_trace_event` (symm_kernels::abi).
                    let u32_at =
                        |o: usize| u32::from_le_bytes([e[o], e[o + 1], e[o + 2], e[o + 3]]);
                    let mut t = [0u8; 8];
                    let at = offset_of!(TraceEvent, time);
                    t.copy_from_slice(&e[at..at + 8]);
                    (
                        u64::from_le_bytes(t),
                        u32_at(offset_of!(TraceEvent, index)),
                        u32_at(offset_of!(TraceEvent, kind)),
                    )
                })
                .collect(),
        );
    }
    Ok((per, overflow))
}

/// Rank `rank`'s raw events as trace events (absolute times), appended to `all`. Records that
/// name no op of their channel are skipped.
pub fn to_events(rank: u16, plan: &RankPlan, per: &[Vec<RawEvent>], all: &mut Vec<Event>) {
    for (c, evs) in per.iter().enumerate() {
        let (Some(&start), Some(&end)) = (plan.chan_start.get(c), plan.chan_start.get(c + 1))
        else {
            continue;
        };
        let (start, end) = (start as usize, end as usize);
        for &(t, i, k) in evs {
            let Some(p) = plan
                .ops
                .get(start + i as usize)
                .filter(|_| start + (i as usize) < end)
            else {
                continue;
            };
            let Ok(op) = p.decode() else { continue };
            let kind = match k {
                abi::EV_BEGIN => EventKind::Begin,
                abi::EV_END => EventKind::End,
                _ => EventKind::Stall {
                    target: 0,
                    found: 0,
                },
            };
            all.push(Event {
                time: t,
                rank,
                channel: c as u16,
                index: i,
                kind,
                op,
                contents: None,
            });
        }
    }
}

/// The header of a GPU trace of `req` on the named devices (names cut to 64 bytes, at most
/// [`MAX_DEVICES`] of them).
pub fn header(req: &Request, names: &[String]) -> Header {
    let mut devices = heapless::Vec::<heapless::String<64>, MAX_DEVICES>::new();
    for n in names {
        let mut s = heapless::String::<64>::new();
        for ch in n.chars() {
            if s.push(ch).is_err() {
                break;
            }
        }
        let _ = devices.push(s);
    }
    Header {
        world: req.world,
        channels: req.channels,
        request: *req,
        source: Source::Gpu { devices },
        time_unit_ns: 1,
        team: None,
    }
}

/// Encodes `events` under `header` as a symm-core trace.
pub fn encode(header: &Header, events: &mut [Event]) -> Result<Vec<u8>> {
    symm_core::trace::encode(header, events).map_err(CudaError::Trace)
}

/// One trace from the per-rank traces of one collective (one per process, as
/// [`Tracer::run`](super::Tracer::run) writes them, in any order): the events of all,
/// on one time axis starting at the earliest, the devices in rank order.
pub fn merge(parts: &[Vec<u8>]) -> Result<Vec<u8>> {
    let bad = |part: Option<usize>, why: &'static str, error: Option<TraceError>| {
        CudaError::TraceMerge { part, why, error }
    };
    let mut decoded = Vec::with_capacity(parts.len());
    for (i, p) in parts.iter().enumerate() {
        let d =
            symm_core::trace::decode(p).map_err(|e| bad(Some(i), "does not decode", Some(e)))?;
        if let Some(w) = d.warning {
            return Err(bad(Some(i), "is cut short", Some(w)));
        }
        decoded.push(d);
    }
    let Some(first) = decoded.first() else {
        return Err(bad(None, "no parts", None));
    };
    let req = first.header.request;
    let mut names = vec![String::new(); req.world as usize];
    let mut all = Vec::new();
    let mut seen = vec![false; req.world as usize];
    for (i, d) in decoded.iter().enumerate() {
        if d.header.request != req {
            return Err(bad(Some(i), "traces another request", None));
        }
        let mut ranks = d.events.iter().map(|e| e.rank);
        let Some(rank) = ranks.next() else { continue };
        if ranks.any(|r| r != rank) {
            return Err(bad(Some(i), "holds several ranks", None));
        }
        let slot = seen.get_mut(rank as usize).ok_or(bad(
            Some(i),
            "names a rank outside the world",
            None,
        ))?;
        if std::mem::replace(slot, true) {
            return Err(bad(Some(i), "repeats a rank of an earlier part", None));
        }
        if let Source::Gpu { devices } = &d.header.source {
            if let Some(n) = devices.first() {
                names[rank as usize] = n.to_string();
            }
        }
        all.extend(d.events.iter().cloned());
    }
    let t0 = all.iter().map(|e| e.time).min().unwrap_or(0);
    for e in &mut all {
        e.time -= t0;
    }
    encode(&header(&req, &names), &mut all)
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_core::dtype::{DType, ReduceOp};
    use symm_core::op::{Buf, Loc, Op};
    use symm_core::sched::{Algorithm, Collective};

    fn part(req: &Request, rank: u16, time: u64) -> Vec<u8> {
        let op = Op::Copy {
            src: Loc::new(rank, Buf::Input, 0),
            dst: Loc::new(rank, Buf::Output, 0),
            bytes: 4,
        };
        let mut ev = vec![Event {
            time,
            rank,
            channel: 0,
            index: 0,
            kind: EventKind::Begin,
            op,
            contents: None,
        }];
        encode(&header(req, &[format!("gpu{rank}")]), &mut ev).unwrap()
    }

    /// Parts from other processes are untrusted: garbage, a part cut short, a part of another
    /// request and a rank sent twice are refused; good parts merge on one time axis.
    #[test]
    fn merge_refuses_hostile_parts() {
        let req = Request::new(
            Collective::AllReduce,
            Algorithm::Ring,
            2,
            64,
            DType::F32,
            ReduceOp::Sum,
        );
        let (a, b) = (part(&req, 0, 1000), part(&req, 1, 1500));
        let merged = symm_core::trace::decode(&merge(&[b.clone(), a.clone()]).unwrap()).unwrap();
        assert_eq!(merged.events.len(), 2);
        assert_eq!(merged.events[0].time, 0);
        assert_eq!(merged.events[1].time, 500);
        let other = Request { bytes: 128, ..req };
        for bad in [
            vec![a.clone(), vec![0u8; 40]],
            vec![a.clone(), b[..b.len() - 3].to_vec()],
            vec![a.clone(), part(&other, 1, 0)],
            vec![a.clone(), a.clone()],
            vec![],
        ] {
            assert!(
                matches!(merge(&bad), Err(CudaError::TraceMerge { .. })),
                "{} parts",
                bad.len()
            );
        }
    }
}

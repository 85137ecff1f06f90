//! GPU traces in symm-core's trace format.
//!
//! The traced interpreter variant appends (globaltimer ns, op index, kind) per op begin and end
//! to a per-(rank, channel) device buffer. Here those records become [`Event`]s: the op comes
//! from the host copy of the plan (the GPU never writes ops back), times are made relative to the
//! earliest event, and the header says the source is the GPUs by name.

use symm_core::sched::Request;
use symm_core::trace::{Event, EventKind, Header, Source, Writer, MAX_DEVICES};

use super::error::{CudaError, Result};
use super::world::{DevicePlan, World};

/// Reads the last traced launch of `plans` and encodes it (format v1).
pub fn read(world: &World, req: &Request, plans: &[DevicePlan]) -> Result<Vec<u8>> {
    let (events, overflow) = world.trace_events(plans)?;
    if overflow {
        return Err(CudaError::Invalid(
            "trace buffer overflowed: raise Options::trace_cap".into(),
        ));
    }
    let mut all = Vec::new();
    for (r, per) in events.iter().enumerate() {
        for (c, evs) in per.iter().enumerate() {
            let plan = &plans[r].host;
            let start = plan.chan_start[c] as usize;
            let end = plan.chan_start[c + 1] as usize;
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
                    0 => EventKind::Begin,
                    1 => EventKind::End,
                    _ => EventKind::Stall {
                        target: 0,
                        found: 0,
                    },
                };
                all.push(Event {
                    time: t,
                    rank: r as u16,
                    channel: c as u16,
                    index: i,
                    kind,
                    op,
                    contents: None,
                });
            }
        }
    }
    let t0 = all.iter().map(|e| e.time).min().unwrap_or(0);
    for e in &mut all {
        e.time -= t0;
    }
    all.sort_by_key(|e| (e.time, e.rank, e.channel, e.index));
    let mut devices = heapless::Vec::<heapless::String<64>, MAX_DEVICES>::new();
    for n in world.device_names() {
        let mut s = heapless::String::<64>::new();
        for ch in n.chars() {
            if s.push(ch).is_err() {
                break;
            }
        }
        let _ = devices.push(s);
    }
    let header = Header {
        world: req.world,
        channels: req.channels,
        request: *req,
        source: Source::Gpu { devices },
        time_unit_ns: 1,
    };
    let enc = |e: symm_core::trace::TraceError| CudaError::Invalid(format!("trace: {e}"));
    let mut w = Writer::new(Vec::new(), &header).map_err(enc)?;
    for e in &all {
        w.event(e).map_err(enc)?;
    }
    Ok(w.finish())
}

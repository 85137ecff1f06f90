//! GPU traces in symm-core's trace format.
//!
//! The traced interpreter variant appends (globaltimer ns, op index, kind) per op begin and end
//! to a per-(rank, channel) device buffer. Here those records become [`Event`]s: the op comes
//! from the host copy of the plan (the GPU never writes ops back), times are made relative to the
//! earliest event, and the header says the source is the GPUs by name.

use symm_core::sched::Request;
use symm_core::trace::{Event, EventKind, Header, Source, MAX_DEVICES};

use super::device;
use super::error::{CudaError, Result};
use super::launch::EVENT_BYTES;
use super::world::{DevicePlan, World};

/// One raw GPU event: (globaltimer ns, op index, kind 0 begin / 1 end / 2 stall).
pub type RawEvent = (u64, u32, u32);

/// Raw events per rank, per channel, and whether any buffer overflowed.
pub fn events(world: &World, plans: &[DevicePlan]) -> Result<(Vec<Vec<Vec<RawEvent>>>, bool)> {
    let cap = world.options().trace_cap as usize;
    let mut out = Vec::with_capacity(plans.len());
    let mut overflow = false;
    for (r, p) in plans.iter().enumerate() {
        let (trace, lens_ptr) = world.trace_buffers(r as u16)?;
        let ch = p.host.channels();
        let mut lens = vec![0u8; ch * 4];
        device::dtoh(&mut lens, lens_ptr)?;
        let mut per = Vec::with_capacity(ch);
        for (c, l) in lens.chunks_exact(4).enumerate() {
            let n = u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize;
            overflow |= n > cap;
            let mut raw = vec![0u8; n.min(cap) * EVENT_BYTES];
            device::dtoh(&mut raw, trace + (c * cap * EVENT_BYTES) as u64)?;
            per.push(
                raw.chunks_exact(EVENT_BYTES)
                    .map(|e| {
                        let mut t = [0u8; 8];
                        t.copy_from_slice(&e[0..8]);
                        let i = u32::from_le_bytes([e[8], e[9], e[10], e[11]]);
                        let k = u32::from_le_bytes([e[12], e[13], e[14], e[15]]);
                        (u64::from_le_bytes(t), i, k)
                    })
                    .collect(),
            );
        }
        out.push(per);
    }
    Ok((out, overflow))
}

/// Reads the last traced launch of `plans` and encodes it (with the end record).
pub fn read(world: &World, req: &Request, plans: &[DevicePlan]) -> Result<Vec<u8>> {
    let (events, overflow) = events(world, plans)?;
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
    symm_core::trace::encode(&header, &mut all)
        .map_err(|e| CudaError::Invalid(format!("trace: {e}")))
}

//! GPU traces of a [`World`]: every rank's events read back, on one time axis starting at the
//! earliest (the runtime's `cuda::trace` turns each rank's records into events).

use symm_core::sched::Request;
use symm_driver::cuda::trace::{encode, header, read_rank, to_events, RawEvent};

use super::error::{CudaError, Result};
use super::world::{DevicePlan, World};

/// Raw events per rank, per channel, and whether any buffer overflowed.
pub fn events(world: &World, plans: &[DevicePlan]) -> Result<(Vec<Vec<Vec<RawEvent>>>, bool)> {
    let cap = world.options().trace_cap as usize;
    let mut out = Vec::with_capacity(plans.len());
    let mut overflow = false;
    for (r, p) in plans.iter().enumerate() {
        let (trace, lens) = world.trace_buffers(r as u16)?;
        let (per, o) = read_rank(trace, lens, cap, p.host().channels())?;
        overflow |= o;
        out.push(per);
    }
    Ok((out, overflow))
}

/// Reads the last traced launch of `plans` and encodes it (with the end record).
pub fn read(world: &World, req: &Request, plans: &[DevicePlan]) -> Result<Vec<u8>> {
    let (events, overflow) = events(world, plans)?;
    if overflow {
        return Err(CudaError::TraceOverflow);
    }
    let mut all = Vec::new();
    for (r, per) in events.iter().enumerate() {
        to_events(r as u16, plans[r].host(), per, &mut all);
    }
    let t0 = all.iter().map(|e| e.time).min().unwrap_or(0);
    for e in &mut all {
        e.time -= t0;
    }
    encode(&header(req, &world.device_names()), &mut all)
}

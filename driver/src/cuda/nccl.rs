//! NCCL in the same process, on the same streams and buffers, for side-by-side timing.

use super::device::Event;
use super::error::{CudaError, Result};
use super::ffi::nccl::{self as ffi, Comm};
use super::world::World;

/// One communicator per rank of a [`World`] (ncclCommInitAll).
pub struct Nccl {
    comms: Vec<Comm>,
    /// NCCL version code (e.g. 22803).
    pub version: i32,
}

fn check(call: &'static str, code: i32) -> Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(CudaError::Nccl { call, code })
    }
}

impl Nccl {
    /// Communicators over the devices of `world`, rank for rank.
    pub fn new(world: &World) -> Result<Nccl> {
        let api = ffi::api().map_err(|s| CudaError::Unavailable(s.into()))?;
        let devs: Vec<i32> = (0..world.world())
            .map(|r| world.device(r).map(|d| d.ordinal))
            .collect::<Result<_>>()?;
        let mut comms = vec![core::ptr::null_mut(); devs.len()];
        let mut version = 0;
        // SAFETY: valid out-pointer.
        check("ncclGetVersion", unsafe { (api.get_version)(&mut version) })?;
        // SAFETY: `comms` has room for one communicator per device listed.
        check("ncclCommInitAll", unsafe {
            (api.comm_init_all)(comms.as_mut_ptr(), devs.len() as i32, devs.as_ptr())
        })?;
        Ok(Nccl { comms, version })
    }

    /// Mean microseconds of an out-of-place all-reduce of `count` elements from heap offset
    /// `input` to `output` on every rank, after `warmup`, over `iters` back-to-back calls.
    #[allow(clippy::too_many_arguments)]
    pub fn time_all_reduce(
        &self,
        world: &World,
        input: u64,
        output: u64,
        count: usize,
        dtype: i32,
        op: i32,
        warmup: u32,
        iters: u32,
    ) -> Result<f64> {
        let api = ffi::api().map_err(|s| CudaError::Unavailable(s.into()))?;
        let ptrs: Vec<(u64, u64)> = (0..world.world())
            .map(|r| Ok((world.ptr(r, input)?, world.ptr(r, output)?)))
            .collect::<Result<_>>()?;
        let round = || -> Result<()> {
            // SAFETY: group calls bracket one all-reduce per communicator; buffers are device
            // addresses of `count` elements in each rank's heap; streams belong to the ranks.
            unsafe {
                check("ncclGroupStart", (api.group_start)())?;
                for (r, c) in self.comms.iter().enumerate() {
                    world.device(r as u16)?.bind()?;
                    let (i, o) = ptrs[r];
                    check(
                        "ncclAllReduce",
                        (api.all_reduce)(
                            i as *const _,
                            o as *mut _,
                            count,
                            dtype,
                            op,
                            *c,
                            world.stream(r as u16)?.raw,
                        ),
                    )?;
                }
                check("ncclGroupEnd", (api.group_end)())
            }
        };
        for _ in 0..warmup.max(1) {
            round()?;
        }
        let mut ev = Vec::new();
        for r in 0..world.world() {
            let d = world.device(r)?;
            let (s, e) = (Event::new(d)?, Event::new(d)?);
            s.record(world.stream(r)?)?;
            ev.push((s, e));
        }
        for _ in 0..iters.max(1) {
            round()?;
        }
        let mut worst = 0f64;
        for (r, (_, e)) in ev.iter().enumerate() {
            e.record(world.stream(r as u16)?)?;
        }
        for (s, e) in &ev {
            worst = worst.max(s.elapsed_ms(e)? as f64);
        }
        Ok(worst * 1000.0 / iters.max(1) as f64)
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        if let Ok(api) = ffi::api() {
            for c in &self.comms {
                // SAFETY: each communicator was created by ncclCommInitAll and is destroyed once.
                unsafe { (api.comm_destroy)(*c) };
            }
        }
    }
}

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

/// This process's NCCL communicator beside a [`Comm`](super::Comm) (ncclCommInitRank, the
/// unique id moved through the comm's bootstrap), for timing on the same buffers and stream.
pub struct NcclRank {
    comm: Comm,
    /// NCCL version code.
    pub version: i32,
}

impl NcclRank {
    /// Collective over the ranks of `symm`.
    pub fn new(symm: &super::Comm) -> Result<NcclRank> {
        let api = ffi::api().map_err(|s| CudaError::Unavailable(s.into()))?;
        let mut version = 0;
        // SAFETY: valid out-pointer.
        check("ncclGetVersion", unsafe { (api.get_version)(&mut version) })?;
        let mut id = ffi::UniqueId { internal: [0; 128] };
        if symm.rank() == 0 {
            // SAFETY: valid out-pointer to a 128-byte id.
            check("ncclGetUniqueId", unsafe { (api.get_unique_id)(&mut id) })?;
        }
        let all = symm.exchange(&id.internal)?;
        let root: [u8; 128] = all
            .first()
            .and_then(|v| v.as_slice().try_into().ok())
            .ok_or_else(|| CudaError::Rendezvous("rank 0 sent no NCCL id".into()))?;
        id.internal = root;
        symm.device().bind()?;
        let mut comm = core::ptr::null_mut();
        // SAFETY: valid out-pointer; every rank passes the same id, its rank and the world.
        check("ncclCommInitRank", unsafe {
            (api.comm_init_rank)(&mut comm, symm.world() as i32, id, symm.rank() as i32)
        })?;
        Ok(NcclRank { comm, version })
    }
}

/// A collective NCCL runs beside symm (bf16 and the other element types by NCCL code).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NcclOp {
    /// `ncclAllReduce` of `count` elements.
    AllReduce,
    /// `ncclAllGather`: `count` elements from each rank.
    AllGather,
    /// `ncclReduceScatter`: `count` elements to each rank.
    ReduceScatter,
    /// Grouped `ncclSend`/`ncclRecv`: `count` elements to and from every rank.
    AllToAll,
    /// `ncclBroadcast` of `count` elements from rank 0.
    Broadcast,
}

impl NcclRank {
    /// Enqueues one out-of-place `op` from heap offset `input` to `output` of this rank on
    /// `stream` (capturable in a CUDA graph). The buffers must hold what the op reads and writes
    /// (`count` elements per block; `world` blocks on the gathered or scattered side), which
    /// [`NcclRank::check_sizes`] checks against the symm buffers.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue(
        &self,
        symm: &super::Comm,
        op: NcclOp,
        b: &super::Buffers,
        count: usize,
        (dtype, elem): (i32, u64),
        redop: i32,
        stream: &super::device::Stream,
    ) -> Result<()> {
        Self::check_sizes(op, b, count as u64 * elem, symm.world() as u64)?;
        let api = ffi::api().map_err(|s| CudaError::Unavailable(s.into()))?;
        let (i, o) = (
            symm.ptr(symm.rank(), b.input)?,
            symm.ptr(symm.rank(), b.output)?,
        );
        let (ip, op_) = (i as *const core::ffi::c_void, o as *mut core::ffi::c_void);
        let (c, s) = (self.comm, stream.raw);
        let _ctx = super::device::keep_current()?;
        symm.device().bind()?;
        // Every call below: `ip` and `op_` are device addresses in this rank's heap whose buffers
        // hold what the call reads and writes (checked above); the stream belongs to this rank's
        // device, whose context is bound.
        match op {
            // SAFETY: as stated above the match.
            NcclOp::AllReduce => check("ncclAllReduce", unsafe {
                (api.all_reduce)(ip, op_, count, dtype, redop, c, s)
            }),
            // SAFETY: as stated above the match.
            NcclOp::AllGather => check("ncclAllGather", unsafe {
                (api.all_gather)(ip, op_, count, dtype, c, s)
            }),
            // SAFETY: as stated above the match.
            NcclOp::ReduceScatter => check("ncclReduceScatter", unsafe {
                (api.reduce_scatter)(ip, op_, count, dtype, redop, c, s)
            }),
            // SAFETY: as stated above the match.
            NcclOp::Broadcast => check("ncclBroadcast", unsafe {
                (api.broadcast)(ip, op_, count, dtype, 0, c, s)
            }),
            NcclOp::AllToAll => {
                let block = count as u64 * elem;
                // SAFETY: group calls have no arguments.
                check("ncclGroupStart", unsafe { (api.group_start)() })?;
                for peer in 0..symm.world() as u64 {
                    let (si, ro) = (i + peer * block, o + peer * block);
                    // SAFETY: block `peer` of the input and of the output lies inside them.
                    check("ncclSend", unsafe {
                        (api.send)(si as *const _, count, dtype, peer as i32, c, s)
                    })?;
                    // SAFETY: as above.
                    check("ncclRecv", unsafe {
                        (api.recv)(ro as *mut _, count, dtype, peer as i32, c, s)
                    })?;
                }
                // SAFETY: closes the group opened above.
                check("ncclGroupEnd", unsafe { (api.group_end)() })
            }
        }
    }

    /// Fails unless `b` holds what `op` reads and writes with `block` bytes per block.
    pub fn check_sizes(op: NcclOp, b: &super::Buffers, block: u64, world: u64) -> Result<()> {
        let all = block.saturating_mul(world);
        let (inp, out) = match op {
            NcclOp::AllReduce | NcclOp::Broadcast => (block, block),
            NcclOp::AllGather => (block, all),
            NcclOp::ReduceScatter => (all, block),
            NcclOp::AllToAll => (all, all),
        };
        if b.sizes.input < inp || b.sizes.output < out {
            return Err(CudaError::Invalid(format!(
                "NCCL {op:?} needs {inp} B in, {out} B out; the buffers hold {} and {}",
                b.sizes.input, b.sizes.output
            )));
        }
        Ok(())
    }
}

impl Drop for NcclRank {
    fn drop(&mut self) {
        if let Ok(api) = ffi::api() {
            // SAFETY: created by ncclCommInitRank, destroyed once.
            unsafe { (api.comm_destroy)(self.comm) };
        }
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

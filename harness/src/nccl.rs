//! NCCL in the same process, on the same streams and buffers, for side-by-side timing.
//!
//! NCCL is loaded only with the multicast-off variables set ([`symm_driver::safety_env`]); every call
//! here checks its buffers the way symm checks its own before anything is enqueued: the element
//! type is symm-core's [`DType`] (its size is never the caller's word), and the bytes the call
//! reads and writes must lie inside the buffers, which must lie inside the heap's buffer area.

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::BufferSizes;

use super::bounds::{self as guard, Buffers};
use super::device::Event;
use super::error::{CudaError, Result};
use super::ffi::nccl::{self as ffi, Comm};
use super::world::World;

/// NCCL's code for an element type (`ncclDataType_t`).
fn type_code(t: DType) -> Result<i32> {
    ffi::type_code(t).ok_or_else(|| CudaError::Unsupported(format!("NCCL has no {t:?}")))
}

/// NCCL's code for a reduction (`ncclRedOp_t`).
fn op_code(op: ReduceOp) -> Result<i32> {
    ffi::op_code(op).ok_or_else(|| CudaError::Unsupported(format!("NCCL has no {op:?}")))
}

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
    /// Communicators over the devices of `world`, rank for rank. Refused unless the
    /// multicast-off variables are set in this process.
    pub fn new(world: &World) -> Result<Nccl> {
        let api = ffi::api()?;
        let devs: Vec<i32> = (0..world.world())
            .map(|r| world.device(r).map(|d| d.ordinal()))
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

    /// Mean microseconds of an out-of-place all-reduce of `count` elements of `dtype` from
    /// `b.input` to `b.output` on every rank, after `warmup`, over `iters` back-to-back calls.
    /// The buffers must hold `count` elements each inside the world's buffer area.
    #[allow(clippy::too_many_arguments)]
    pub fn time_all_reduce(
        &self,
        world: &World,
        b: &Buffers,
        count: usize,
        dtype: DType,
        op: ReduceOp,
        warmup: u32,
        iters: u32,
    ) -> Result<f64> {
        let (ty, red) = (type_code(dtype)?, op_code(op)?);
        let bytes = (count as u64)
            .checked_mul(dtype.size())
            .ok_or(CudaError::Overflow {
                what: "element count",
            })?;
        let need = BufferSizes {
            input: bytes,
            output: bytes,
            scratch: 0,
        };
        let (lo, hi) = world.buffer_area();
        guard::check_buffers(b, &need, lo, hi)?;
        if self.comms.len() != world.world() as usize {
            return Err(CudaError::SizeMismatch {
                what: "NCCL communicators",
                have: self.comms.len() as u64,
                want: world.world() as u64,
            });
        }
        let api = ffi::api()?;
        let ptrs: Vec<(u64, u64)> = (0..world.world())
            .map(|r| Ok((world.ptr(r, b.input)?, world.ptr(r, b.output)?)))
            .collect::<Result<_>>()?;
        let round = || -> Result<()> {
            // SAFETY: group calls bracket one all-reduce per communicator; the buffers are
            // device addresses of `count` elements of `dtype` inside each rank's buffer area
            // (checked above); the streams belong to the ranks, whose contexts are bound.
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
                            ty,
                            red,
                            *c,
                            world.stream(r as u16)?.raw(),
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
    /// Collective over the ranks of `symm`. Refused unless the multicast-off variables are set
    /// in this process.
    pub fn new(symm: &super::Comm) -> Result<NcclRank> {
        let api = ffi::api()?;
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
            .ok_or(CudaError::Malformed {
                rank: 0,
                what: "NCCL id",
            })?;
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

/// A collective NCCL runs beside symm.
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
    /// Enqueues one out-of-place `op` of `count` elements of `dtype` per block from heap offset
    /// `b.input` to `b.output` of this rank on `stream` (capturable in a CUDA graph). Refused
    /// before anything is enqueued unless the buffers hold what the op reads and writes
    /// ([`NcclRank::check_sizes`]) inside the Comm's buffer area.
    #[allow(clippy::too_many_arguments)]
    pub fn enqueue(
        &self,
        symm: &super::Comm,
        op: NcclOp,
        b: &Buffers,
        count: usize,
        dtype: DType,
        redop: ReduceOp,
        stream: &super::device::Stream,
    ) -> Result<()> {
        let (ty, red) = (type_code(dtype)?, op_code(redop)?);
        let block = (count as u64)
            .checked_mul(dtype.size())
            .ok_or(CudaError::Overflow {
                what: "element count",
            })?;
        let need = Self::check_sizes(op, b, block, symm.world() as u64)?;
        let (lo, hi) = symm.buffer_area();
        guard::check_buffers(b, &need, lo, hi)?;
        if stream.context() != symm.device().context() {
            return Err(CudaError::WrongOwner { what: "the stream" });
        }
        let api = ffi::api()?;
        let (i, o) = (
            symm.memory().ptr(symm.rank(), b.input)?,
            symm.memory().ptr(symm.rank(), b.output)?,
        );
        let (ip, op_) = (i as *const core::ffi::c_void, o as *mut core::ffi::c_void);
        let (c, s) = (self.comm, stream.raw());
        let _ctx = super::device::keep_current()?;
        symm.device().bind()?;
        // Every call below: `ip` and `op_` are device addresses in this rank's heap whose buffers
        // hold what the call reads and writes inside the buffer area (checked above); the
        // stream belongs to this rank's device, whose context is bound.
        match op {
            // SAFETY: as stated above the match.
            NcclOp::AllReduce => check("ncclAllReduce", unsafe {
                (api.all_reduce)(ip, op_, count, ty, red, c, s)
            }),
            // SAFETY: as stated above the match.
            NcclOp::AllGather => check("ncclAllGather", unsafe {
                (api.all_gather)(ip, op_, count, ty, c, s)
            }),
            // SAFETY: as stated above the match.
            NcclOp::ReduceScatter => check("ncclReduceScatter", unsafe {
                (api.reduce_scatter)(ip, op_, count, ty, red, c, s)
            }),
            // SAFETY: as stated above the match.
            NcclOp::Broadcast => check("ncclBroadcast", unsafe {
                (api.broadcast)(ip, op_, count, ty, 0, c, s)
            }),
            NcclOp::AllToAll => {
                // SAFETY: group calls have no arguments.
                check("ncclGroupStart", unsafe { (api.group_start)() })?;
                for peer in 0..symm.world() as u64 {
                    let (si, ro) = (i + peer * block, o + peer * block);
                    // SAFETY: block `peer` of the input and of the output lies inside them.
                    check("ncclSend", unsafe {
                        (api.send)(si as *const _, count, ty, peer as i32, c, s)
                    })?;
                    // SAFETY: as above.
                    check("ncclRecv", unsafe {
                        (api.recv)(ro as *mut _, count, ty, peer as i32, c, s)
                    })?;
                }
                // SAFETY: closes the group opened above.
                check("ncclGroupEnd", unsafe { (api.group_end)() })
            }
        }
    }

    /// What `op` reads and writes with `block` bytes per block over `world` ranks; fails
    /// unless `b`'s sizes hold it.
    pub fn check_sizes(op: NcclOp, b: &Buffers, block: u64, world: u64) -> Result<BufferSizes> {
        let all = block.checked_mul(world).ok_or(CudaError::Overflow {
            what: "block size times ranks",
        })?;
        let (input, output) = match op {
            NcclOp::AllReduce | NcclOp::Broadcast => (block, block),
            NcclOp::AllGather => (block, all),
            NcclOp::ReduceScatter => (all, block),
            NcclOp::AllToAll => (all, all),
        };
        if b.sizes.input < input {
            return Err(CudaError::TooSmall {
                what: "input",
                have: b.sizes.input,
                need: input,
            });
        }
        if b.sizes.output < output {
            return Err(CudaError::TooSmall {
                what: "output",
                have: b.sizes.output,
                need: output,
            });
        }
        Ok(BufferSizes {
            input,
            output,
            scratch: 0,
        })
    }
}

impl Drop for NcclRank {
    fn drop(&mut self) {
        if let Some(api) = ffi::loaded() {
            // SAFETY: created by ncclCommInitRank, destroyed once.
            unsafe { (api.comm_destroy)(self.comm) };
        }
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        if let Some(api) = ffi::loaded() {
            for c in &self.comms {
                // SAFETY: each communicator was created by ncclCommInitAll and is destroyed once.
                unsafe { (api.comm_destroy)(*c) };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bufs(input: u64, output: u64) -> Buffers {
        Buffers {
            input: 4096,
            output: 8192,
            scratch: 0,
            sizes: BufferSizes {
                input,
                output,
                scratch: 0,
            },
        }
    }

    #[test]
    fn nccl_buffers_must_hold_what_the_op_touches() {
        // 100 bf16 elements per block over 4 ranks.
        let block = 100 * DType::Bf16.size();
        let ok = NcclRank::check_sizes(NcclOp::AllGather, &bufs(block, 4 * block), block, 4);
        assert_eq!(ok.unwrap().output, 4 * block);
        for (op, b) in [
            (NcclOp::AllReduce, bufs(block - 1, block)),
            (NcclOp::AllGather, bufs(block, 4 * block - 1)),
            (NcclOp::ReduceScatter, bufs(4 * block - 2, block)),
            (NcclOp::AllToAll, bufs(4 * block, block)),
        ] {
            assert!(NcclRank::check_sizes(op, &b, block, 4).is_err(), "{op:?}");
        }
        // Sizes whose product wraps are refused, not wrapped.
        assert!(NcclRank::check_sizes(NcclOp::AllGather, &bufs(0, 0), u64::MAX / 2, 4).is_err());
        // Every symm element type has an NCCL code; the size comes from the type.
        for t in DType::ALL {
            assert!(type_code(t).is_ok(), "{t:?}");
        }
    }
}

//! Plans as the GPU runs them: a rank's plan, validated for one `World` or `Comm` and rank,
//! uploaded to its device, and tied to that owner so that no other may launch it.

use symm_core::sched::BufferSizes;

use super::device::{DevBuf, Device};
use super::error::{CudaError, Result};
use super::plan::RankPlan;

/// A plan validated for one rank of one `World` or `Comm` and uploaded to its device.
///
/// Its fields are private: what was validated is what runs. A launch refuses a plan that
/// another `World` or `Comm` validated, or that was validated for another rank
/// ([`CudaError::ForeignPlan`]).
pub struct DevicePlan {
    pub(crate) host: RankPlan,
    /// The buffer sizes the plan was validated against (a launch needs at least these).
    pub(crate) sizes: BufferSizes,
    pub(crate) ops: DevBuf,
    pub(crate) chan: DevBuf,
    /// The `World` or `Comm` that validated it ([`next_owner`]) and the rank it is for.
    owner: u64,
    rank: u16,
    /// The plan compiled to its own kernel ([`super::compiled`]), plain and traced, when the
    /// owner chose to; else the interpreter runs it. Compiled from `host`, which was validated.
    compiled: [std::sync::OnceLock<super::launch::Kernel>; 2],
    /// The plan's flag form, when the owner runs it on copy engines ([`super::copy_engine`]).
    flags: Option<super::copy_engine::FlagPlan>,
    /// Ops its compiled kernel holds ([`super::compiled::compiled_ops`]).
    compiled_ops: usize,
}

/// A number no other `World` or `Comm` of this process has: what ties a plan to its owner.
pub fn next_owner() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl DevicePlan {
    /// `DevicePlan::upload` for an owner outside this crate (the test harness's `World`).
    ///
    /// # Safety
    ///
    /// `plan` must have passed [`RankPlan::validate`] for `rank` of the owner's world, against
    /// `sizes` and the owner's pad, and `owner` must come from [`next_owner`] for the caller's
    /// own world: a launch trusts what a `DevicePlan` holds.
    pub unsafe fn upload_validated(
        dev: &Device,
        plan: RankPlan,
        sizes: BufferSizes,
        owner: (u64, u16),
    ) -> Result<DevicePlan> {
        Self::upload(dev, plan, sizes, owner)
    }

    /// Uploads `plan`, validated against `sizes` for `rank` of the owner `owner`, to `dev`.
    pub(crate) fn upload(
        dev: &Device,
        plan: RankPlan,
        sizes: BufferSizes,
        (owner, rank): (u64, u16),
    ) -> Result<DevicePlan> {
        let bytes = plan.op_bytes();
        let ops = DevBuf::zeroed(dev, bytes.len().max(1))?;
        ops.upload(&bytes)?;
        let cs: Vec<u8> = plan
            .chan_start
            .iter()
            .flat_map(|c| c.to_le_bytes())
            .collect();
        let chan = DevBuf::zeroed(dev, cs.len().max(1))?;
        chan.upload(&cs)?;
        let compiled_ops = super::compiled::compiled_ops(&plan);
        Ok(DevicePlan {
            compiled_ops,
            host: plan,
            sizes,
            ops,
            chan,
            owner,
            rank,
            compiled: [std::sync::OnceLock::new(), std::sync::OnceLock::new()],
            flags: None,
        })
    }

    /// This plan, to run on copy engines: its flag form (typed error if it has none).
    pub(crate) fn on_copy_engines(mut self) -> Result<DevicePlan> {
        self.flags = Some(super::copy_engine::FlagPlan::new(&self.host)?);
        Ok(self)
    }

    /// The flag form, when the plan runs on copy engines.
    pub(crate) fn flags(&self) -> Option<&super::copy_engine::FlagPlan> {
        self.flags.as_ref()
    }

    /// Compiles this (validated) plan to its own kernel, traced or not, unless it has it.
    pub(crate) fn compile(
        &self,
        compiler: &super::compile::Compiler,
        dev: &Device,
        trace: bool,
    ) -> Result<()> {
        let slot = &self.compiled[usize::from(trace)];
        if slot.get().is_none() {
            // Two threads may both compile; one kernel is kept, the other unloaded.
            let _ = slot.set(super::compiled::load(compiler, dev, &self.host, trace)?);
        }
        Ok(())
    }

    /// Ops its compiled kernel holds: one channel of each shape
    /// ([`super::compiled::compiled_ops`]).
    pub(crate) fn compiled_ops(&self) -> usize {
        self.compiled_ops
    }

    /// The compiled kernel of this plan (traced or not), when it was compiled.
    pub(crate) fn compiled(&self, trace: bool) -> Option<&super::launch::Kernel> {
        self.compiled[usize::from(trace)].get()
    }

    /// The plan as validated (for traces and checks).
    pub fn host(&self) -> &RankPlan {
        &self.host
    }

    /// The device addresses of the encoded ops and of the channel starts, as the interpreter's
    /// parameter block takes them (`plan`, `chan_start`).
    pub fn device_ops(&self) -> (u64, u64) {
        (self.ops.ptr, self.chan.ptr)
    }

    /// The buffer sizes the plan was validated against.
    pub fn sizes(&self) -> BufferSizes {
        self.sizes
    }

    /// Fails unless the plan was validated by `owner` for `rank`.
    pub fn check_owner(&self, owner: u64, rank: u16) -> Result<()> {
        if self.owner != owner {
            return Err(CudaError::ForeignPlan(
                "the plan was validated by another World or Comm".into(),
            ));
        }
        if self.rank != rank {
            return Err(CudaError::ForeignPlan(format!(
                "the plan was validated for rank {}, not rank {rank}",
                self.rank
            )));
        }
        Ok(())
    }
}

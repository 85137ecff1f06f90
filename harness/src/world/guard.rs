//! What a launch may touch, and what a failed collective leaves behind.
//!
//! * **Bounds.** `Buffers` are plain offsets a caller can build by hand, so every launch checks
//!   them against what the plans were validated for (each plan's ops stay inside its
//!   `BufferSizes`) and against the heap's buffer area (never the signal pad, never past the
//!   rank's heap): a safe call cannot make the GPU write outside the caller's buffers.
//! * **Poison.** After a device timeout or a failed launch the pads and `expected` counters may
//!   hold an aborted collective's signals, and the next collective could pass a wait early. The
//!   world is then poisoned: every launch fails fast with [`CudaError::Poisoned`] until
//!   [`World::reset`] zeroes pads and counters on every rank.
//! * **Order.** Launches from several threads are serialised by one lock, so every rank receives
//!   collectives in the same order.
//! * **Graphs.** A [`Captured`] graph borrows its world (it cannot outlive it) and registers its
//!   buffers: `free` refuses them while a capture that names them is alive, and waits for launches
//!   in flight before returning memory.

use std::sync::MutexGuard;

use super::*;
use crate::cuda::bounds::check_buffers;
use crate::cuda::comm::epoch;

/// Graphs of one request captured on every rank; replay with [`World::replay`].
pub struct Captured<'w> {
    pub(super) world: &'w World,
    pub(super) graphs: Vec<Graph>,
    pub(super) buffers: Buffers,
}

impl Drop for Captured<'_> {
    fn drop(&mut self) {
        if let Ok(mut m) = self.world.captured.lock() {
            if let Some(n) = m.get_mut(&self.buffers.input) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    m.remove(&self.buffers.input);
                }
            }
        }
    }
}

impl World {
    /// Fails when the world is poisoned, else takes the launch lock.
    pub(super) fn launch_lock(&self) -> Result<MutexGuard<'_, ()>> {
        let g = self
            .launching
            .lock()
            .map_err(|_| CudaError::LockPoisoned { what: "launch" })?;
        if let Some(why) = self.poisoned.lock().ok().and_then(|p| p.clone()) {
            return Err(CudaError::Poisoned(why));
        }
        Ok(g)
    }

    /// Records why the world can no longer be trusted (the first reason wins).
    pub(super) fn poison(&self, e: &CudaError) {
        if let Ok(mut p) = self.poisoned.lock() {
            p.get_or_insert_with(|| e.to_string());
        }
    }

    /// Why the world is poisoned, if it is.
    pub fn poisoned(&self) -> Option<String> {
        self.poisoned.lock().ok().and_then(|p| p.clone())
    }

    /// Checks `b` against every plan's validated sizes and the heap.
    pub(super) fn check_plans(&self, plans: &[DevicePlan], b: &Buffers) -> Result<()> {
        if plans.len() != self.world as usize {
            return Err(CudaError::SizeMismatch {
                what: "plans",
                have: plans.len() as u64,
                want: self.world as u64,
            });
        }
        for (r, p) in plans.iter().enumerate() {
            p.check_owner(self.id, r as u16)?;
            check_buffers(b, &p.sizes(), self.data_off, self.stride())?;
        }
        Ok(())
    }

    /// After a timeout or a failed launch: waits for every stream, zeroes every rank's signal
    /// pad and `expected` counters and the timeout records, and lifts the poison. The world's
    /// collectives start from a clean protocol state again. Fails (and stays poisoned) when a
    /// stream cannot be synchronised, as after a sticky driver error.
    pub fn reset(&self) -> Result<()> {
        let _ctx = device::keep_current()?;
        let _g = self
            .launching
            .lock()
            .map_err(|_| CudaError::LockPoisoned { what: "launch" })?;
        for k in &self.ranks {
            k.stream.synchronize()?;
        }
        // Low-latency epochs resume past the highest any rank reached, so no later call's flag
        // is one a line left in a scratch buffer still carries (`comm/epoch.rs`).
        let world = self.ranks.len() as u16;
        let mut top = Vec::new();
        for (r, k) in self.ranks.iter().enumerate() {
            let counters = k.expected.download()?;
            let slots = epoch::slots(1, world, r as u16)?;
            top.resize(slots.len(), 0u64);
            for (t, &s) in top.iter_mut().zip(&slots) {
                *t = (*t).max(epoch::counter(&counters, s));
            }
        }
        for (r, k) in self.ranks.iter().enumerate() {
            self.heap_fill(r as u16, 0, self.data_off, 0)?;
            k.expected.fill(0)?;
            for (&t, &s) in top.iter().zip(&epoch::slots(1, world, r as u16)?) {
                if t > 0 {
                    let v = (t + 1).to_le_bytes();
                    if s as u64 * 8 + 8 > self.data_off {
                        return Err(CudaError::OutOfBounds {
                            what: "epoch slot",
                            offset: s as u64 * 8,
                            len: 8,
                            lo: 0,
                            hi: self.data_off,
                        });
                    }
                    self.heap_write(r as u16, s as u64 * 8, &v)?;
                    k.expected.write_at(s as usize * 8, &v)?;
                }
            }
            k.stream.synchronize()?;
        }
        self.reset_records();
        if let Ok(mut p) = self.poisoned.lock() {
            *p = None;
        }
        Ok(())
    }

    /// Waits for launches in flight on every rank (before memory they may touch is reused).
    pub(super) fn drain(&self) -> Result<()> {
        for k in &self.ranks {
            k.stream.synchronize()?;
        }
        Ok(())
    }
}

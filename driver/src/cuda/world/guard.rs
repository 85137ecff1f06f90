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
use std::time::Duration;

use super::*;
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

/// Checks buffers of the given sizes at the given offsets against what a plan needs and the
/// buffer area `[lo, hi)` of the heap.
pub(crate) fn check_buffers(b: &Buffers, need: &BufferSizes, lo: u64, hi: u64) -> Result<()> {
    for (name, off, have, need) in [
        ("input", b.input, b.sizes.input, need.input),
        ("output", b.output, b.sizes.output, need.output),
        ("scratch", b.scratch, b.sizes.scratch, need.scratch),
    ] {
        if have < need {
            return Err(CudaError::Invalid(format!(
                "the {name} buffer has {have} bytes; the plan needs {need}"
            )));
        }
        if need > 0 && !off.is_multiple_of(16) {
            return Err(CudaError::Invalid(format!(
                "the {name} buffer at {off} is not 16-byte aligned"
            )));
        }
        if need > 0 && (off < lo || off.checked_add(need).is_none_or(|e| e > hi)) {
            return Err(CudaError::Invalid(format!(
                "the {name} buffer at {off}..+{need} is outside the heap's buffer area {lo}..{hi}"
            )));
        }
    }
    Ok(())
}

/// Places input, output and scratch of `sizes` with `heap` (offsets relative to the buffer area,
/// which starts at `data_off`): the same offsets on every rank that makes the same calls.
pub(crate) fn place(heap: &mut Heap, sizes: BufferSizes, data_off: u64) -> Result<Buffers> {
    let mut one = |n: u64| {
        heap.alloc(n.max(16), 4096)
            .map(|o| o + data_off)
            .map_err(|e| CudaError::Invalid(format!("heap: {e:?}")))
    };
    Ok(Buffers {
        input: one(sizes.input)?,
        output: one(sizes.output)?,
        scratch: one(sizes.scratch)?,
        sizes,
    })
}

/// The longest deadline any wait may have, on the device or on the host: a peer that is stuck
/// but alive ends every wait within it (`SYMM_WAIT_MAX_NS` in `symm/device.cuh`).
pub const MAX_WAIT: Duration = Duration::from_secs(3600);

/// The most buffer bytes a heap may ask for per rank (256 TiB): sizes past it are refused before
/// any arithmetic on them (the pad is added and the sum rounded up to the granularity).
pub const MAX_HEAP_BYTES: u64 = 1 << 48;

/// Fails unless the heap size `what` is at most [`MAX_HEAP_BYTES`].
pub(crate) fn check_heap(what: &str, bytes: u64) -> Result<()> {
    if bytes > MAX_HEAP_BYTES {
        return Err(CudaError::BadOption(format!(
            "{what} is {bytes}; it must be at most {MAX_HEAP_BYTES}"
        )));
    }
    Ok(())
}

/// Fails unless the deadline `what` lies in `(0, MAX_WAIT]`.
pub(crate) fn check_wait(what: &str, d: Duration) -> Result<()> {
    if d.is_zero() || d > MAX_WAIT {
        return Err(CudaError::BadOption(format!(
            "{what} is {d:?}; it must be more than 0 and at most {MAX_WAIT:?}"
        )));
    }
    Ok(())
}

/// Fails unless bytes `off .. off + len` lie in the buffer area `[lo, hi)`.
pub(crate) fn check_range(off: u64, len: u64, lo: u64, hi: u64) -> Result<()> {
    if off < lo || off.checked_add(len).is_none_or(|e| e > hi) {
        return Err(CudaError::Invalid(format!(
            "bytes {off}..+{len} are outside the buffer area"
        )));
    }
    Ok(())
}

impl World {
    /// Fails when the world is poisoned, else takes the launch lock.
    pub(super) fn launch_lock(&self) -> Result<MutexGuard<'_, ()>> {
        let g = self
            .launching
            .lock()
            .map_err(|_| CudaError::Invalid("launch lock poisoned".into()))?;
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
            return Err(CudaError::Invalid(format!(
                "{} plans for {} ranks",
                plans.len(),
                self.world
            )));
        }
        for (r, p) in plans.iter().enumerate() {
            p.check_owner(self.id, r as u16)?;
            check_buffers(b, &p.sizes, self.data_off, self.stride())?;
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
            .map_err(|_| CudaError::Invalid("launch lock poisoned".into()))?;
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
                        return Err(CudaError::Invalid(format!("epoch slot {s} past the pad")));
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

#[cfg(test)]
mod tests {
    use super::*;

    fn bufs(input: u64, output: u64, scratch: u64, n: u64) -> Buffers {
        Buffers {
            input,
            output,
            scratch,
            sizes: BufferSizes {
                input: n,
                output: n,
                scratch: n,
            },
        }
    }

    #[test]
    fn buffers_are_checked_against_the_plan_and_the_heap() {
        let need = BufferSizes {
            input: 100,
            output: 100,
            scratch: 0,
        };
        let (lo, hi) = (4096, 1 << 20);
        assert!(check_buffers(&bufs(4096, 8192, 12288, 100), &need, lo, hi).is_ok());
        // Smaller than the plan needs.
        assert!(check_buffers(&bufs(4096, 8192, 12288, 99), &need, lo, hi).is_err());
        // In the signal pad.
        assert!(check_buffers(&bufs(0, 8192, 12288, 100), &need, lo, hi).is_err());
        // Inside the heap but not 16-byte aligned (a misaligned vector access would fault).
        let r = check_buffers(&bufs(4096 + 8, 8192, 12288, 100), &need, lo, hi);
        assert!(
            matches!(&r, Err(CudaError::Invalid(m)) if m.contains("aligned")),
            "{r:?}"
        );
        // Past the heap, or wrapping.
        assert!(check_buffers(&bufs(4096, hi - 50, 12288, 100), &need, lo, hi).is_err());
        assert!(check_buffers(&bufs(4096, u64::MAX - 10, 0, 100), &need, lo, hi).is_err());
        // A buffer the plan does not use may be anywhere (it is never touched).
        assert!(check_buffers(&bufs(4096, 8192, 0, 100), &need, lo, hi).is_ok());
    }

    #[test]
    fn every_deadline_is_bounded() {
        for bad in [
            Duration::ZERO,
            MAX_WAIT + Duration::from_nanos(1),
            Duration::MAX,
        ] {
            let r = check_wait("timeout", bad);
            assert!(matches!(r, Err(CudaError::BadOption(_))), "{bad:?}: {r:?}");
        }
        for good in [Duration::from_nanos(1), Duration::from_secs(10), MAX_WAIT] {
            assert!(check_wait("timeout", good).is_ok(), "{good:?}");
        }
        let comm = crate::cuda::CommOptions {
            timeout: Duration::MAX,
            ..Default::default()
        };
        assert!(matches!(comm.validate(), Err(CudaError::BadOption(m)) if m.contains("timeout")));
        let comm = crate::cuda::CommOptions {
            bootstrap_timeout: Duration::ZERO,
            ..Default::default()
        };
        assert!(comm.validate().is_err());
        assert!(crate::cuda::CommOptions::default().validate().is_ok());
        let world = Options {
            rendezvous: Duration::MAX,
            ..Default::default()
        };
        assert!(world.validate().is_err());
        assert!(Options::default().validate().is_ok());
    }

    /// A heap size near `u64::MAX` is refused by validation (`World::open` added the pad to it
    /// unchecked, and overflowed).
    #[test]
    fn heap_sizes_are_bounded() {
        for bad in [MAX_HEAP_BYTES + 1, u64::MAX] {
            let world = Options {
                heap_bytes: bad,
                ..Default::default()
            };
            let r = world.validate();
            assert!(
                matches!(&r, Err(CudaError::BadOption(m)) if m.contains("heap_bytes")),
                "{r:?}"
            );
            let comm = crate::cuda::CommOptions {
                heap_bytes: bad,
                ..Default::default()
            };
            assert!(matches!(comm.validate(), Err(CudaError::BadOption(_))));
        }
        let world = Options {
            heap_bytes: MAX_HEAP_BYTES,
            ..Default::default()
        };
        assert!(world.validate().is_ok());
    }
}

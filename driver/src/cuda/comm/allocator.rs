//! Symmetric allocation: buffers placed at the same offsets on every rank, and what else holds
//! heap memory (graph pins, team regions, team ids), under one lock.
//!
//! Allocation is collective: every rank calls [`Comm::alloc`] / [`Comm::free`] in the same
//! order, and the ranks compare their allocators after each call (`agree.rs`).

use std::collections::HashMap;

use symm_core::heap::Heap;
use symm_core::sched::{BufferSizes, Request};

use super::Comm;
use crate::cuda::bounds::{self as guard, Buffers};
use crate::cuda::error::{CudaError, Result};

/// The heap's allocator and what holds heap memory beyond it: the buffer offsets live graphs
/// name ([`super::CommGraph`]) with their counts, the regions splits reserved (never freed by
/// `free`), and the team ids splits took with their teams.
pub(crate) struct Alloc {
    pub(super) heap: Heap,
    pub(super) pins: HashMap<u64, usize>,
    pub(super) regions: Vec<u64>,
    /// The id the next split's teams take (0 is the world).
    pub(super) next_team: u16,
    /// This rank's teams by id (to name a team wait's peer by its job rank).
    pub(super) teams: HashMap<u16, symm_core::team::Team>,
}

impl Alloc {
    pub(super) fn new(heap: Heap) -> Alloc {
        Alloc {
            heap,
            pins: HashMap::new(),
            regions: Vec::new(),
            next_team: 1,
            teams: HashMap::new(),
        }
    }
}

/// What [`Comm::alloc`] places buffers for: a request (its buffer sizes) or the sizes.
pub trait AllocSizes {
    /// Input, output and scratch bytes.
    fn alloc_sizes(&self) -> BufferSizes;
}

impl AllocSizes for Request {
    fn alloc_sizes(&self) -> BufferSizes {
        self.buffer_sizes()
    }
}

impl AllocSizes for BufferSizes {
    fn alloc_sizes(&self) -> BufferSizes {
        *self
    }
}

impl Comm {
    /// Collective: places buffers for `of` (a request, or buffer sizes) in the heap, at the
    /// same offsets on every rank.
    pub fn alloc(&self, of: &impl AllocSizes) -> Result<Buffers> {
        let sizes = of.alloc_sizes();
        let _g = self.enter()?;
        let b = guard::place(&mut self.alloc_lock()?.heap, sizes, self.data_off)?;
        // Scratch starts zeroed, before the agreement (so before any peer can write into it):
        // low-latency lines a dropped team left in this memory carry that team's epochs, which
        // the job's may repeat, and no flag is 0 (symm_core::ll).
        if b.sizes.scratch > 0 {
            self.heap_fill(b.scratch, b.sizes.scratch, 0)?;
        }
        self.agree()?;
        Ok(b)
    }

    /// Collective: returns buffers to the heap after this rank's work on its device finished.
    /// Every offset is checked first (a live allocation of this heap, not a team's region, not
    /// named by a live graph, not named twice), so a bad set frees nothing.
    pub fn free(&self, b: &Buffers) -> Result<()> {
        let _g = self.enter_any()?;
        self.check_unpinned(b)?;
        self.sync_device()?;
        {
            // Held until the buffers are back in the heap: no capture pins them meanwhile.
            let mut a = self.alloc_lock()?;
            super::capture::check_unpinned_in(&a.pins, b)?;
            let a = &mut *a;
            guard::unplace(&mut a.heap, b, self.data_off, &a.regions)?;
        }
        self.agree()
    }

    /// The allocator's lock (a poisoned lock is an error: the heap may be half changed).
    pub(super) fn alloc_lock(&self) -> Result<std::sync::MutexGuard<'_, Alloc>> {
        self.alloc
            .lock()
            .map_err(|_| CudaError::LockPoisoned { what: "heap" })
    }
}

//! Blocks: symmetric memory a framework hands out as tensors, returned when every rank let go.
//!
//! A framework (the Python package) allocates one block per tensor with [`Tensors::alloc_block`],
//! a collective like [`Comm::alloc`]: every rank makes the same calls in the same order, and
//! the ranks compare their allocators after each (`agree`). Its garbage collector drops tensors
//! at different moments on different ranks, so giving a block back cannot be collective:
//! [`Tensors::release_block`] only marks the block, locally, and never blocks or fails on a peer.
//!
//! The next collective allocation ([`Tensors::alloc_block`], or [`Tensors::collect_blocks`]) first
//! waits for this rank's device (an allocation during a graph capture cannot, and offers
//! nothing), then the ranks exchange the blocks each has released that no
//! live CUDA graph names, and every rank frees the blocks found in every set. Every rank frees
//! the same blocks, so the heaps stay identical; a block is reused only after every rank
//! released it and every rank's device finished the work enqueued before the exchange.
//!
//! **Graph pins.** A collective captured into a graph the framework owns (`torch.cuda.graph`)
//! names blocks for as long as that graph lives, which the Comm cannot see. The capture
//! attaches a CUDA user object to the graph being captured ([`Tensors::pin_to_capture`]); the
//! driver runs its destructor once the graph and every executable instantiated from it are
//! destroyed, and the destructor takes the pins back. A pinned block is not offered to the
//! exchange, so it stays allocated on every rank while any rank's graph may replay over it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::c_void;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use super::Comm;
use crate::cuda::device::Stream;
use crate::cuda::error::{check, CudaError, Result};
use crate::cuda::ffi::driver as ffi;
use crate::cuda::rendezvous::Bootstrap;

/// Alignment of a block (heap offsets; every rank's heap base is granularity aligned).
pub const BLOCK_ALIGN: u64 = 256;
/// Most released blocks one exchange carries (8-byte offsets within the bootstrap's 64 KiB
/// message); the rest wait for the next exchange.
const MAX_OFFERED: usize = 8000;

/// The blocks of a Comm: live ones by offset with their length, and those released locally.
#[derive(Default)]
pub(crate) struct Blocks {
    live: BTreeMap<u64, u64>,
    released: BTreeSet<u64>,
}

/// Graph pins by block offset, shared with the destructors of the graphs' user objects.
pub(crate) type GraphPins = Arc<Mutex<HashMap<u64, usize>>>;

/// What a graph's user object holds: the pins to take back when the graph is destroyed.
struct PinDrop {
    pins: GraphPins,
    blocks: Vec<u64>,
}

/// The user object's destructor (called by the driver on its own thread; no CUDA calls here).
///
/// # Safety
/// `p` is the `Box<PinDrop>` leaked by [`Tensors::pin_to_capture`], passed once.
unsafe extern "C" fn drop_pins(p: *mut c_void) {
    // SAFETY: the caller's contract: `p` came from `Box::into_raw` and is dropped once.
    let d = unsafe { Box::from_raw(p.cast::<PinDrop>()) };
    let mut pins = d.pins.lock().unwrap_or_else(|e| e.into_inner());
    for b in &d.blocks {
        if let Some(n) = pins.get_mut(b) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                pins.remove(b);
            }
        }
    }
}

/// The offsets present in every set of `theirs` and in `mine` (ascending).
pub(crate) fn common(mine: &[u64], theirs: &[Vec<u64>]) -> Vec<u64> {
    mine.iter()
        .copied()
        .filter(|o| theirs.iter().all(|t| t.binary_search(o).is_ok()))
        .collect()
}

/// Little-endian offsets of a gathered message (a trailing partial word is ignored), sorted.
pub(crate) fn decode_offsets(bytes: &[u8]) -> Vec<u64> {
    let mut v: Vec<u64> = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    v.sort_unstable();
    v
}

impl Blocks {
    /// The live block holding `[off, off + len)`, as (start, length).
    pub(crate) fn containing(&self, off: u64, len: u64) -> Option<(u64, u64)> {
        let (&start, &blen) = self.live.range(..=off).next_back()?;
        let end = off.checked_add(len)?;
        (end <= start + blen).then_some((start, blen))
    }
}

/// Framework tensors over one Comm's heap: the blocks handed out as tensors, the graph pins of
/// captures that name them, and the agreed argument sets and workspaces of collectives over
/// device addresses ([`Tensors::enqueue`]). Made from the Comm ([`Tensors::new`]); every call takes
/// that Comm.
pub struct Tensors {
    /// The Comm it was made from (`device_plan::next_owner`).
    owner: u64,
    blocks: Mutex<Blocks>,
    /// Blocks named by graphs a framework captured, with their counts.
    graph_pins: GraphPins,
    /// Agreed argument sets and workspaces of [`Tensors::enqueue`].
    pub(super) spans: Mutex<super::spans::Spans>,
    /// Calls [`Tensors::enqueue`] launched since the job began or was last reset, which the
    /// ranks compare on each first use (`calls`).
    pub(super) calls: AtomicU64,
}

impl Tensors {
    /// No blocks yet, for `comm`.
    pub fn new(comm: &Comm) -> Tensors {
        Tensors {
            owner: comm.job.id,
            blocks: Mutex::default(),
            graph_pins: GraphPins::default(),
            spans: Mutex::default(),
            calls: AtomicU64::new(0),
        }
    }

    /// Fails unless `comm` is the Comm these tensors were made from.
    pub(super) fn own(&self, comm: &Comm) -> Result<()> {
        if self.owner != comm.job.id {
            return Err(CudaError::WrongOwner {
                what: "the tensors",
            });
        }
        Ok(())
    }

    fn blocks_lock(&self) -> Result<std::sync::MutexGuard<'_, Blocks>> {
        self.blocks
            .lock()
            .map_err(|_| CudaError::LockPoisoned { what: "blocks" })
    }

    /// Collective: a block of `len` bytes of symmetric memory (its heap offset, the same on
    /// every rank), after returning to the heap what every rank released
    /// ([`Tensors::collect_blocks`]). Its contents are undefined. While `stream` (the caller's
    /// current stream) captures a graph the device cannot be waited for, so this rank offers
    /// no released block to that exchange and none returns: the allocation itself goes on.
    /// When the ranks' heaps differ after it ([`CudaError::Diverged`]), each rank puts its
    /// allocator back as it was before the call (history included), so they agree again.
    pub fn alloc_block(&self, comm: &Comm, len: u64, stream: &Stream) -> Result<u64> {
        self.own(comm)?;
        let _g = comm.enter()?;
        self.collect_inner(comm, !stream.is_capturing()?)?;
        let (got, before) = {
            let mut a = comm.alloc_lock()?;
            let before = a.heap.clone();
            let got = a.heap.alloc(len.max(16), BLOCK_ALIGN);
            (got, before)
        };
        // The agreement runs whether or not this rank's allocation succeeded, so the ranks'
        // exchanges stay in step: where only some ranks failed, the others see their heaps
        // differ ([`CudaError::Diverged`]) and every rank puts its allocator back.
        let agreed = comm.agree();
        let err = match (got, agreed) {
            (Ok(off), Ok(())) => {
                let off = off + comm.data_off;
                self.blocks_lock()?.live.insert(off, len.max(16));
                return Ok(off);
            }
            (Err(e), _) => CudaError::Heap(e),
            (Ok(_), Err(e)) => e,
        };
        // The allocator as it was, its history too: the ranks' heaps agreed before the call,
        // so they agree again.
        if let Ok(mut a) = comm.alloc_lock() {
            a.heap = before;
        }
        Err(err)
    }

    /// Local and non-blocking: gives block `off` back. It returns to the heap at a later
    /// collective allocation, once every rank released it and no graph names it.
    pub fn release_block(&self, off: u64) -> Result<()> {
        let mut b = self.blocks_lock()?;
        if !b.live.contains_key(&off) {
            return Err(CudaError::NotLive { offset: off });
        }
        b.released.insert(off);
        Ok(())
    }

    /// Fails unless `off` starts a live block this rank has not released (a layer's block must
    /// be, or peers would write into memory the heap may hand out again).
    pub(crate) fn block_in_use(&self, off: u64) -> Result<()> {
        let b = self.blocks_lock()?;
        if !b.live.contains_key(&off) || b.released.contains(&off) {
            return Err(CudaError::NotLive { offset: off });
        }
        Ok(())
    }

    /// Collective: waits for this rank's device, then frees every block that every rank
    /// released and no live graph pins. Returns how many blocks went back to the heap.
    pub fn collect_blocks(&self, comm: &Comm) -> Result<usize> {
        self.own(comm)?;
        let _g = comm.enter()?;
        let n = self.collect_inner(comm, true)?;
        comm.agree()?;
        Ok(n)
    }

    /// Live blocks and bytes (what a leak check reads).
    pub fn block_usage(&self) -> Result<(usize, u64)> {
        let b = self.blocks_lock()?;
        Ok((b.live.len(), b.live.values().sum()))
    }

    /// The exchange of released blocks (collective). With `wait` this rank's device is waited
    /// for and its released blocks that no graph pins are offered; without (during a capture)
    /// it offers none, so none returns to the heap.
    fn collect_inner(&self, comm: &Comm, wait: bool) -> Result<usize> {
        if wait {
            comm.sync_device()?;
        }
        let offered: Vec<u64> = if !wait {
            Vec::new()
        } else {
            let b = self.blocks_lock()?;
            let pins = self.graph_pins.lock().unwrap_or_else(|e| e.into_inner());
            b.released
                .iter()
                .copied()
                .filter(|o| !pins.contains_key(o))
                .take(MAX_OFFERED)
                .collect()
        };
        let bytes: Vec<u8> = offered.iter().flat_map(|o| o.to_le_bytes()).collect();
        let all = comm.job.boot.all_gather(comm.job.rank, &bytes)?;
        let theirs: Vec<Vec<u64>> = all.iter().map(|m| decode_offsets(m)).collect();
        let free = common(&offered, &theirs);
        let mut b = self.blocks_lock()?;
        let mut a = comm.alloc_lock()?;
        for off in &free {
            a.heap.free(off - comm.data_off).map_err(CudaError::Heap)?;
            b.live.remove(off);
            b.released.remove(off);
        }
        Ok(free.len())
    }

    /// Pins the blocks holding the heap ranges `ranges` (offset, length) to the graph `stream`
    /// is capturing, until the driver destroys that graph and its executables. Ranges outside
    /// every block (workspaces, which live as long as the Comm) need no pin.
    pub(crate) fn pin_to_capture(&self, stream: &Stream, ranges: &[(u64, u64)]) -> Result<()> {
        let blocks: Vec<u64> = {
            let b = self.blocks_lock()?;
            ranges
                .iter()
                .filter_map(|&(o, l)| b.containing(o, l).map(|(s, _)| s))
                .collect()
        };
        if blocks.is_empty() {
            return Ok(());
        }
        let api = ffi::graph_api().map_err(|s| CudaError::Unavailable(s.into()))?;
        let (mut status, mut id, mut graph) = (0, 0u64, std::ptr::null_mut());
        let (mut deps, mut ndeps) = (std::ptr::null(), 0usize);
        // SAFETY: a valid stream of this rank's context (checked by the caller); valid
        // out-pointers.
        check("cuStreamGetCaptureInfo", unsafe {
            (api.stream_get_capture_info)(
                stream.raw(),
                &mut status,
                &mut id,
                &mut graph,
                &mut deps,
                &mut ndeps,
            )
        })?;
        if status != ffi::CAPTURE_STATUS_ACTIVE || graph.is_null() {
            return Err(CudaError::Capturing {
                what: "pinning to a capture that is not active",
            });
        }
        {
            let mut pins = self.graph_pins.lock().unwrap_or_else(|e| e.into_inner());
            for b in &blocks {
                *pins.entry(*b).or_insert(0) += 1;
            }
        }
        let holder = Box::into_raw(Box::new(PinDrop {
            pins: self.graph_pins.clone(),
            blocks,
        }));
        let mut obj = std::ptr::null_mut();
        // SAFETY: `holder` is a leaked box that `drop_pins` frees once, when the object's last
        // reference goes; the flag is the one the driver requires.
        let r = check("cuUserObjectCreate", unsafe {
            (api.user_object_create)(
                &mut obj,
                holder.cast(),
                drop_pins,
                1,
                ffi::USER_OBJECT_NO_DESTRUCTOR_SYNC,
            )
        });
        if let Err(e) = r {
            // SAFETY: the object was not created, so nothing else will free `holder`.
            unsafe { drop_pins(holder.cast()) };
            return Err(e);
        }
        // SAFETY: `graph` is the graph being captured on `stream`; the move hands our one
        // reference to the graph.
        let r = check("cuGraphRetainUserObject", unsafe {
            (api.graph_retain_user_object)(graph, obj, 1, ffi::GRAPH_USER_OBJECT_MOVE)
        });
        if r.is_err() {
            // SAFETY: the graph did not take the reference: release ours (runs `drop_pins`).
            let _ = unsafe { (api.user_object_release)(obj, 1) };
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_blocks_every_rank_released_are_freed() {
        let mine = vec![256, 512, 1024];
        let theirs = vec![vec![256, 512, 1024], vec![512, 1024, 4096], vec![0, 512]];
        assert_eq!(common(&mine, &theirs), vec![512]);
        assert!(common(&mine, &[vec![]]).is_empty());
    }

    #[test]
    fn offsets_round_trip_and_ignore_a_torn_tail() {
        let bytes: Vec<u8> = [4096u64, 256]
            .iter()
            .flat_map(|o| o.to_le_bytes())
            .chain([1, 2, 3])
            .collect();
        assert_eq!(decode_offsets(&bytes), vec![256, 4096]);
    }

    #[test]
    fn a_range_belongs_to_the_block_that_holds_all_of_it() {
        let mut b = Blocks::default();
        b.live.insert(1000, 100);
        b.live.insert(2000, 50);
        assert_eq!(b.containing(1000, 100), Some((1000, 100)));
        assert_eq!(b.containing(1050, 10), Some((1000, 100)));
        assert_eq!(b.containing(1050, 60), None);
        assert_eq!(b.containing(999, 1), None);
        assert_eq!(b.containing(2049, 1), Some((2000, 50)));
        assert_eq!(b.containing(u64::MAX, 2), None);
    }
}

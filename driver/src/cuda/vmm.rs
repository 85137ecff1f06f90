//! The symmetric heap on CUDA virtual memory management.
//!
//! Each rank creates one physical allocation (`cuMemCreate`, pinned device memory, shareable as a
//! POSIX file descriptor) of `stride` bytes, a multiple of the allocation granularity. Ranks
//! exchange descriptors through a [`Bootstrap`], and every rank reserves one virtual range of
//! `world * stride` bytes in which peer r's memory is mapped at `base + r * stride`: a peer
//! pointer is arithmetic (`symm_core::heap::Layout`). The rank's own allocation is mapped
//! directly; a peer's is imported from its descriptor. Access is granted to the rank's device
//! over the whole range.
//!
//! Teardown runs in the reverse order of setup and leaves nothing behind: unmap every peer,
//! release every handle (the memory is freed when its last handle goes), free the range. The
//! live counts in [`live`] let tests check that.
//!
//! The process keeps the reserved range of every live heap ([`in_a_heap`]): memory there is
//! symmetric memory of some communicator, which another communicator must not take for plain
//! device memory of its own (a framework's tensor from an earlier job's pool, say).

use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Mutex;

use super::device::{Ctx, Device};
use super::error::{check, driver, CudaError, Result};
use super::ffi::driver::{self as ffi, DevPtr, MemHandle};
use super::rendezvous::Bootstrap;

static LIVE_HANDLES: AtomicI64 = AtomicI64::new(0);
static LIVE_MAPS: AtomicI64 = AtomicI64::new(0);
static LIVE_RANGES: AtomicI64 = AtomicI64::new(0);
/// The reserved range (base, bytes) of every live heap of this process.
static HEAP_RANGES: Mutex<Vec<(DevPtr, u64)>> = Mutex::new(Vec::new());

fn heap_ranges() -> std::sync::MutexGuard<'static, Vec<(DevPtr, u64)>> {
    HEAP_RANGES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether device address `ptr` lies in the reserved range of a live symmetric heap of this
/// process (any rank's part of it).
pub fn in_a_heap(ptr: DevPtr) -> bool {
    heap_ranges().iter().any(|&(b, n)| ptr >= b && ptr - b < n)
}

/// Live (handles, mappings, reserved ranges) in this process.
pub fn live() -> (i64, i64, i64) {
    (
        LIVE_HANDLES.load(Ordering::Relaxed),
        LIVE_MAPS.load(Ordering::Relaxed),
        LIVE_RANGES.load(Ordering::Relaxed),
    )
}

fn prop(dev: &Device) -> ffi::MemAllocationProp {
    ffi::MemAllocationProp {
        kind: 1, // CU_MEM_ALLOCATION_TYPE_PINNED
        handle_types: ffi::HANDLE_POSIX_FD,
        location: ffi::MemLocation {
            kind: 1,
            id: dev.ordinal,
        },
        win32_meta: core::ptr::null_mut(),
        alloc_flags: [0; 8],
    }
}

/// The recommended allocation granularity of `dev` for shareable pinned memory.
pub fn granularity(dev: &Device) -> Result<usize> {
    dev.bind()?;
    let api = driver()?;
    let p = prop(dev);
    let mut g = 0usize;
    // SAFETY: valid out-pointer and property struct.
    check("cuMemGetAllocationGranularity", unsafe {
        (api.mem_get_allocation_granularity)(&mut g, &p, ffi::GRANULARITY_RECOMMENDED)
    })?;
    Ok(g.max(1))
}

/// `bytes` (at least 1) rounded up to a multiple of the granularity `g`; refused when that
/// overflows.
fn stride_of(bytes: u64, g: u64) -> Result<u64> {
    bytes
        .max(1)
        .div_ceil(g.max(1))
        .checked_mul(g.max(1))
        .ok_or(CudaError::Overflow { what: "heap size" })
}

/// One generic allocation handle (own or imported), released on drop.
struct Physical {
    handle: MemHandle,
}

impl Physical {
    fn create(dev: &Device, size: usize) -> Result<Physical> {
        let api = driver()?;
        let p = prop(dev);
        let mut handle = 0;
        // SAFETY: context bound by the caller; valid out-pointer and property struct.
        check("cuMemCreate", unsafe {
            (api.mem_create)(&mut handle, size, &p, 0)
        })?;
        LIVE_HANDLES.fetch_add(1, Ordering::Relaxed);
        Ok(Physical { handle })
    }

    fn export(&self) -> Result<OwnedFd> {
        let api = driver()?;
        let mut fd: i32 = -1;
        // SAFETY: for POSIX-fd handles the driver writes an int descriptor to the out-pointer.
        check("cuMemExportToShareableHandle", unsafe {
            (api.mem_export)(
                (&mut fd as *mut i32).cast(),
                self.handle,
                ffi::HANDLE_POSIX_FD,
                0,
            )
        })?;
        if fd < 0 {
            return Err(CudaError::Unsupported(
                "export returned no descriptor".into(),
            ));
        }
        // SAFETY: the driver handed us a fresh descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn import(fd: i32) -> Result<Physical> {
        let api = driver()?;
        let mut handle = 0;
        // SAFETY: for POSIX-fd handles the "pointer" argument carries the descriptor value.
        check("cuMemImportFromShareableHandle", unsafe {
            (api.mem_import)(
                &mut handle,
                fd as isize as *mut core::ffi::c_void,
                ffi::HANDLE_POSIX_FD,
            )
        })?;
        LIVE_HANDLES.fetch_add(1, Ordering::Relaxed);
        Ok(Physical { handle })
    }
}

impl Drop for Physical {
    fn drop(&mut self) {
        if let Ok(api) = driver() {
            // SAFETY: the handle came from create/import and is released once, after its mapping.
            unsafe { (api.mem_release)(self.handle) };
            LIVE_HANDLES.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A reserved virtual range, freed on drop.
struct Range {
    base: DevPtr,
    size: usize,
}

impl Drop for Range {
    fn drop(&mut self) {
        if let Ok(api) = driver() {
            // SAFETY: reserved by cuMemAddressReserve with this size; every mapping in it is gone
            // (SymmetricHeap drops its mappings first).
            unsafe { (api.mem_address_free)(self.base, self.size) };
            LIVE_RANGES.fetch_sub(1, Ordering::Relaxed);
        }
        let mut r = heap_ranges();
        if let Some(i) = r.iter().position(|&(b, _)| b == self.base) {
            r.swap_remove(i);
        }
    }
}

/// One mapping in a range, unmapped on drop.
struct Mapping {
    ptr: DevPtr,
    size: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Ok(api) = driver() {
            // SAFETY: mapped by cuMemMap at exactly this address and size, unmapped once.
            unsafe { (api.mem_unmap)(self.ptr, self.size) };
            LIVE_MAPS.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// One rank's view of a world's symmetric heap.
///
/// Field order is teardown order: mappings, then handles, then the range.
pub struct SymmetricHeap {
    maps: Vec<Mapping>,
    handles: Vec<Physical>,
    range: Range,
    /// This rank.
    pub rank: u16,
    /// Ranks.
    pub world: u16,
    /// Bytes of each rank's heap (and the distance between two peers' heaps).
    pub stride: u64,
    /// Declared last: released after the mappings are gone.
    ctx: Ctx,
}

// SAFETY: handles and addresses are plain data; drop binds the owning context first.
unsafe impl Send for SymmetricHeap {}
// SAFETY: as above.
unsafe impl Sync for SymmetricHeap {}

impl SymmetricHeap {
    /// Collective: every rank of `boot` calls this with the same `bytes`; returns when every
    /// rank has mapped every peer. `bytes` is rounded up to the granularity.
    pub fn create(
        dev: &Device,
        rank: u16,
        bytes: u64,
        boot: &dyn Bootstrap,
    ) -> Result<SymmetricHeap> {
        let r = Self::create_inner(dev, rank, bytes, boot);
        if let Err(e) = &r {
            boot.abort(rank, &e.to_string());
        }
        r
    }

    fn create_inner(
        dev: &Device,
        rank: u16,
        bytes: u64,
        boot: &dyn Bootstrap,
    ) -> Result<SymmetricHeap> {
        let world = boot.world();
        let api = driver()?;
        let g = granularity(dev)? as u64;
        let stride = stride_of(bytes, g)?;
        let span = stride
            .checked_mul(world as u64)
            .ok_or(CudaError::Overflow { what: "heap span" })?;
        let ctx = dev.retain()?;
        ctx.bind()?;
        let own = Physical::create(dev, stride as usize)?;
        let fd = own.export()?;
        // Every rank's descriptor, as one of this process's own (SCM_RIGHTS between processes,
        // a duplicate within one).
        let fds = boot.all_gather_fds(rank, std::os::fd::AsFd::as_fd(&fd))?;
        if fds.len() != world as usize {
            return Err(CudaError::LengthMismatch {
                rank: None,
                what: "descriptors",
                sent: fds.len() as u64,
                expected: world as u64,
            });
        }

        let mut base = 0;
        // SAFETY: valid out-pointer; alignment is the granularity, no fixed address.
        check("cuMemAddressReserve", unsafe {
            (api.mem_address_reserve)(&mut base, span as usize, g as usize, 0, 0)
        })?;
        LIVE_RANGES.fetch_add(1, Ordering::Relaxed);
        heap_ranges().push((base, span));
        let mut heap = SymmetricHeap {
            maps: Vec::with_capacity(world as usize),
            handles: Vec::with_capacity(world as usize),
            range: Range {
                base,
                size: span as usize,
            },
            rank,
            world,
            stride,
            ctx,
        };
        let mut own = Some(own);
        for (p, peer_fd) in fds.iter().enumerate() {
            let phys = if p == rank as usize {
                own.take()
                    // The loop meets its own rank once: a second take is a bug here, not
                    // something a caller can act on.
                    .ok_or_else(|| CudaError::Invalid("own handle used twice".into()))?
            } else {
                Physical::import(std::os::fd::AsRawFd::as_raw_fd(peer_fd))?
            };
            let at = base + p as u64 * stride;
            // SAFETY: `at .. at + stride` lies inside the range reserved above and is unmapped;
            // the handle has exactly `stride` bytes.
            check("cuMemMap", unsafe {
                (api.mem_map)(at, stride as usize, 0, phys.handle, 0)
            })?;
            LIVE_MAPS.fetch_add(1, Ordering::Relaxed);
            heap.handles.push(phys);
            heap.maps.push(Mapping {
                ptr: at,
                size: stride as usize,
            });
        }
        let access = ffi::MemAccessDesc {
            location: ffi::MemLocation {
                kind: 1,
                id: dev.ordinal,
            },
            flags: 3, // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        };
        // SAFETY: the whole range is mapped; one access descriptor.
        check("cuMemSetAccess", unsafe {
            (api.mem_set_access)(base, span as usize, &access, 1)
        })?;
        // SAFETY: the own heap is mapped and accessible; zero it (signal pads start at 0).
        check("cuMemsetD8", unsafe {
            (api.memset_d8)(base + rank as u64 * stride, 0, stride as usize)
        })?;
        check("cuCtxSynchronize", unsafe { (api.ctx_synchronize)() })?;
        // Every peer has imported (and zeroed) before any rank goes on.
        boot.barrier(rank)?;
        drop(fds);
        drop(fd);
        Ok(heap)
    }

    /// Base of this rank's range (peer r at `base + r * stride`).
    pub fn base(&self) -> DevPtr {
        self.range.base
    }

    /// Address of `offset` in `peer`'s heap, through this rank's range.
    pub fn ptr(&self, peer: u16, offset: u64) -> Option<DevPtr> {
        if peer >= self.world || offset >= self.stride {
            return None;
        }
        Some(self.range.base + peer as u64 * self.stride + offset)
    }
}

impl Drop for SymmetricHeap {
    fn drop(&mut self) {
        // Unmapped and released with the heap's context bound (retained by `self.ctx`), the
        // caller's binding restored after.
        match driver() {
            Ok(api) => self.ctx.with(api, || {
                self.maps.clear();
                self.handles.clear();
            }),
            Err(_) => {
                self.maps.clear();
                self.handles.clear();
            }
        }
        // `range` drops after this body, once everything in it is unmapped (address-range calls
        // need no context).
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A caller's heap size near `u64::MAX` is refused, not rounded past the end.
    #[test]
    fn heap_sizes_round_without_overflow() {
        assert_eq!(stride_of(0, 1 << 21).ok(), Some(1 << 21));
        assert_eq!(stride_of((1 << 21) + 1, 1 << 21).ok(), Some(2 << 21));
        assert!(matches!(
            stride_of(u64::MAX - 5, 1 << 21),
            Err(CudaError::Overflow { what: "heap size" })
        ));
    }
}

//! Page-locked host memory mapped into every device (timeout records, the abort word).

use core::ffi::c_void;
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use super::ctx::{keep_current, Ctx};
use super::device::Device;
use super::error::{check, driver, CudaError, Result};
use super::ffi::driver::{self as ffi, DevPtr};

/// Page-locked host memory mapped into every device's address space (portable), zeroed.
///
/// Devices and host threads use it at once (timeout records, the abort word), so every access
/// is an atomic word access at an aligned offset inside the mapping; an access out of bounds or
/// misaligned reads 0 and writes nothing.
pub struct HostMapped {
    host: *mut c_void,
    pub(crate) dev: DevPtr,
    pub(crate) len: usize,
    /// The context the memory was allocated in (its destruction would free the memory).
    ctx: Ctx,
}

// SAFETY: the memory is plain words shared with devices; every access is atomic.
unsafe impl Send for HostMapped {}
// SAFETY: as above.
unsafe impl Sync for HostMapped {}

impl HostMapped {
    /// The device address of the memory.
    pub fn dev(&self) -> DevPtr {
        self.dev
    }

    /// Allocates `len` bytes (rounded up to 8) with a context of `dev` bound.
    pub fn new(dev: &Device, len: usize) -> Result<HostMapped> {
        let len = len
            .max(8)
            .checked_next_multiple_of(8)
            .ok_or(CudaError::Overflow {
                what: "host-mapped size",
            })?;
        let _ctx = keep_current()?;
        let ctx = dev.retain()?;
        ctx.bind()?;
        let api = driver()?;
        let mut host = core::ptr::null_mut();
        // SAFETY: valid out-pointer; flags request portable, device-mapped memory.
        check("cuMemHostAlloc", unsafe {
            (api.mem_host_alloc)(&mut host, len, ffi::HOSTALLOC_PORTABLE_DEVICEMAP)
        })?;
        let mut d = 0;
        // SAFETY: `host` was just allocated with DEVICEMAP.
        let rc = unsafe { (api.mem_host_get_device_pointer)(&mut d, host, 0) };
        if rc != 0 {
            // SAFETY: freeing what was just allocated.
            unsafe { (api.mem_free_host)(host) };
            return Err(CudaError::Driver {
                call: "cuMemHostGetDevicePointer",
                code: rc,
                name: super::error::error_name(rc),
            });
        }
        // SAFETY: `host` points to `len` writable bytes, not yet shared.
        unsafe { core::ptr::write_bytes(host.cast::<u8>(), 0, len) };
        Ok(HostMapped {
            host,
            dev: d,
            len,
            ctx,
        })
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: at least 8 bytes are allocated).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address of byte `off`, when it lies in the mapping.
    pub fn device_ptr(&self, off: usize) -> Option<DevPtr> {
        (off < self.len).then(|| self.dev + off as u64)
    }

    /// The word at byte `off` when `off .. off + size` lies in the mapping and is aligned.
    fn word<T>(&self, off: usize) -> Option<*mut T> {
        let size = core::mem::size_of::<T>();
        let end = off.checked_add(size)?;
        (end <= self.len && off.is_multiple_of(size))
            // SAFETY: in bounds of the allocation (checked above).
            .then(|| unsafe { self.host.cast::<u8>().add(off) }.cast::<T>())
    }

    /// Reads a `u32` at byte `off` (acquire: devices write it); 0 out of bounds or misaligned.
    pub fn read_u32(&self, off: usize) -> u32 {
        self.word::<u32>(off).map_or(0, |p| {
            // SAFETY: `p` is in bounds and aligned (`word`), valid for the life of `self`, and
            // every access to this memory from the host is atomic.
            unsafe { AtomicU32::from_ptr(p) }.load(Ordering::Acquire)
        })
    }

    /// Reads a `u64` at byte `off`; 0 out of bounds or misaligned.
    pub fn read_u64(&self, off: usize) -> u64 {
        self.word::<u64>(off).map_or(0, |p| {
            // SAFETY: as in `read_u32`.
            unsafe { AtomicU64::from_ptr(p) }.load(Ordering::Acquire)
        })
    }

    /// Writes a `u32` at byte `off` (release: devices read it while running); nothing out of
    /// bounds or misaligned.
    pub fn write_u32(&self, off: usize, value: u32) {
        if let Some(p) = self.word::<u32>(off) {
            // SAFETY: as in `read_u32`.
            unsafe { AtomicU32::from_ptr(p) }.store(value, Ordering::Release);
        }
    }

    /// Zeroes the words that lie in bytes `off .. off + len` (rounded out to 4-byte words).
    pub fn zero(&self, off: usize, len: usize) {
        let end = off.saturating_add(len).min(self.len);
        let mut at = off - off % 4;
        while at < end {
            self.write_u32(at, 0);
            at += 4;
        }
    }

    /// Zeroes the whole mapping.
    pub fn zero_all(&self) {
        self.zero(0, self.len);
    }
}

impl crate::abort::Raise for HostMapped {
    /// Raises the abort word (word 0), which every device wait polls.
    fn raise(&self) {
        self.write_u32(0, 1);
    }
}

impl Drop for HostMapped {
    fn drop(&mut self) {
        if let Ok(api) = driver() {
            // SAFETY: allocated by cuMemHostAlloc in the context `self.ctx` retains (released
            // after this body), freed once with it bound.
            self.ctx.with(api, || unsafe {
                (api.mem_free_host)(self.host);
            });
        }
    }
}

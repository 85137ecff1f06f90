//! Devices and their primary contexts, streams, events and device memory.
//!
//! Every driver call that touches a device needs that device's context current on the calling
//! thread; [`Device::bind`] makes it so and is called at the top of each per-rank operation, so
//! any thread may drive any rank.

use core::ffi::c_char;

pub use super::ctx::{current_context, keep_current, Ctx, KeepCurrent};
use super::error::{check, driver, CudaError, Result};
use super::ffi::driver::{self as ffi, DevPtr, Handle};
pub use super::hostmap::HostMapped;
pub use super::stream::{Stream, StreamRef};

/// A GPU with a retain of its primary context (released on drop). Every object made from it
/// holds a retain of its own ([`Ctx`]), so the Device may be dropped before them.
pub struct Device {
    pub(crate) ordinal: i32,
    pub(crate) dev: ffi::Device,
    pub(crate) ctx: Ctx,
    /// `ctx`'s handle, read on every launch (`Device::context`).
    context: Handle,
    pub(crate) name: String,
    pub(crate) arch: u32,
}

// SAFETY: a CUDA context handle may be used from any thread (the driver API is thread safe);
// Device only hands it to cuCtxSetCurrent.
unsafe impl Send for Device {}
// SAFETY: as above; no interior mutability on the Rust side.
unsafe impl Sync for Device {}

impl Device {
    /// Opens device `ordinal` and retains its primary context.
    pub fn open(ordinal: i32) -> Result<Device> {
        let api = driver()?;
        let mut dev = 0;
        // SAFETY: valid out-pointer; the ordinal is checked by the driver.
        check("cuDeviceGet", unsafe {
            (api.device_get)(&mut dev, ordinal)
        })?;
        let mut name = [0 as c_char; 128];
        // SAFETY: the buffer holds the 128 bytes passed.
        check("cuDeviceGetName", unsafe {
            (api.device_get_name)(name.as_mut_ptr(), 128, dev)
        })?;
        // SAFETY: the driver NUL-terminates within the buffer.
        let name = unsafe { core::ffi::CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let major = attribute(dev, ffi::ATTR_CC_MAJOR)?;
        let minor = attribute(dev, ffi::ATTR_CC_MINOR)?;
        let ctx = Ctx::retain(dev)?;
        Ok(Device {
            ordinal,
            dev,
            context: ctx.raw(),
            ctx,
            name,
            arch: (major * 10 + minor) as u32,
        })
    }

    /// Device ordinal.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// Device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Compute capability as major * 10 + minor (90 for Hopper).
    pub fn arch(&self) -> u32 {
        self.arch
    }

    /// The primary context (retained as long as `self`), for a caller's own driver calls.
    pub fn context(&self) -> Handle {
        self.context
    }

    /// Another retain of the primary context, for an object made from this device to hold.
    pub fn retain(&self) -> Result<Ctx> {
        self.ctx.try_clone()
    }

    /// Makes this device's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        self.ctx.bind()
    }

    /// Integer attribute of the device.
    pub fn attribute(&self, attr: i32) -> Result<i32> {
        attribute(self.dev, attr)
    }

    /// Whether this device can map `other`'s memory.
    pub fn can_access_peer(&self, other: &Device) -> Result<bool> {
        let api = driver()?;
        let mut v = 0;
        // SAFETY: valid out-pointer and device handles.
        check("cuDeviceCanAccessPeer", unsafe {
            (api.device_can_access_peer)(&mut v, self.dev, other.dev)
        })?;
        Ok(v != 0)
    }

    /// (free, total) device memory in bytes.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        let _ctx = keep_current()?;
        self.bind()?;
        let api = driver()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: context bound above; valid out-pointers.
        check("cuMemGetInfo", unsafe {
            (api.mem_get_info)(&mut free, &mut total)
        })?;
        Ok((free, total))
    }

    /// Waits for all work on the device.
    pub fn synchronize(&self) -> Result<()> {
        let _ctx = keep_current()?;
        self.bind()?;
        let api = driver()?;
        // SAFETY: context bound above.
        check("cuCtxSynchronize", unsafe { (api.ctx_synchronize)() })
    }
}

fn attribute(dev: ffi::Device, attr: i32) -> Result<i32> {
    let api = driver()?;
    let mut v = 0;
    // SAFETY: valid out-pointer; unknown attributes are reported as an error code.
    check("cuDeviceGetAttribute", unsafe {
        (api.device_get_attribute)(&mut v, attr, dev)
    })?;
    Ok(v)
}

/// The driver's CUDA version (e.g. 13000).
pub fn driver_version() -> Result<i32> {
    let api = driver()?;
    let mut v = 0;
    // SAFETY: valid out-pointer.
    check("cuDriverGetVersion", unsafe {
        (api.driver_get_version)(&mut v)
    })?;
    Ok(v)
}

/// Number of visible devices.
pub fn device_count() -> Result<i32> {
    let api = driver()?;
    let mut n = 0;
    // SAFETY: valid out-pointer.
    check("cuDeviceGetCount", unsafe {
        (api.device_get_count)(&mut n)
    })?;
    Ok(n)
}

/// Device memory from cuMemAlloc (the caller binds the context first), freed on drop.
pub struct DevBuf {
    /// Device address.
    pub(crate) ptr: DevPtr,
    /// Size in bytes.
    pub(crate) len: usize,
    ctx: Ctx,
}

// SAFETY: a device address is plain data; freeing binds the owning context first.
unsafe impl Send for DevBuf {}
// SAFETY: as above.
unsafe impl Sync for DevBuf {}

impl DevBuf {
    /// The buffer's device address.
    pub fn ptr(&self) -> DevPtr {
        self.ptr
    }

    /// Allocates `len` bytes (at least 1) on `dev`, zeroed.
    pub fn zeroed(dev: &Device, len: usize) -> Result<DevBuf> {
        let _ctx = keep_current()?;
        let ctx = dev.retain()?;
        ctx.bind()?;
        let api = driver()?;
        let mut ptr = 0;
        // SAFETY: context bound; valid out-pointer.
        check("cuMemAlloc", unsafe {
            (api.mem_alloc)(&mut ptr, len.max(1))
        })?;
        let b = DevBuf {
            ptr,
            len: len.max(1),
            ctx,
        };
        // SAFETY: `ptr` points to `len` bytes just allocated.
        check("cuMemsetD8", unsafe { (api.memset_d8)(ptr, 0, b.len) })?;
        Ok(b)
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if let Ok(api) = driver() {
            // SAFETY: the context is retained by `self.ctx` (released after this body); the
            // pointer was returned by cuMemAlloc, freed once.
            self.ctx.with(api, || unsafe {
                (api.mem_free)(self.ptr);
            });
        }
    }
}

/// Copies host bytes to a device address (context bound by the caller).
///
/// # Safety
///
/// `dst .. dst + src.len()` must be device memory of the bound context (or mapped into it) that
/// nothing else owns for the duration of the copy.
pub unsafe fn htod(dst: DevPtr, src: &[u8]) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    let api = driver()?;
    // SAFETY: `src` is valid for its length; the caller guarantees `dst` has room.
    check("cuMemcpyHtoD", unsafe {
        (api.memcpy_htod)(dst, src.as_ptr().cast(), src.len())
    })?;
    legacy_sync(api)
}

/// Waits for the legacy default stream, where the driver's "synchronous" copies from pageable
/// memory and memsets run: they may return before the device memory holds the bytes, and a
/// kernel on a non-blocking stream does not wait for them. After this it does.
fn legacy_sync(api: &ffi::DriverApi) -> Result<()> {
    // SAFETY: a null stream handle names the bound context's legacy default stream.
    check("cuStreamSynchronize", unsafe {
        (api.stream_synchronize)(core::ptr::null_mut())
    })
}

/// Copies device bytes to host (context bound by the caller).
///
/// # Safety
///
/// `src .. src + dst.len()` must be readable device memory of the bound context (or mapped
/// into it).
pub unsafe fn dtoh(dst: &mut [u8], src: DevPtr) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    let api = driver()?;
    // SAFETY: `dst` is valid for its length; the caller guarantees `src` has as many bytes.
    check("cuMemcpyDtoH", unsafe {
        (api.memcpy_dtoh)(dst.as_mut_ptr().cast(), src, dst.len())
    })
}

/// Fills device bytes (context bound by the caller).
///
/// # Safety
///
/// `dst .. dst + len` must be device memory of the bound context (or mapped into it) that
/// nothing else owns for the duration of the fill.
pub unsafe fn memset(dst: DevPtr, value: u8, len: usize) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    let api = driver()?;
    // SAFETY: the caller guarantees `dst` has `len` bytes.
    check("cuMemsetD8", unsafe { (api.memset_d8)(dst, value, len) })?;
    legacy_sync(api)
}

impl DevBuf {
    /// Copies `bytes` to the start of the buffer.
    pub fn upload(&self, bytes: &[u8]) -> Result<()> {
        self.check(0, bytes.len())?;
        let _ctx = keep_current()?;
        self.ctx.bind()?;
        // SAFETY: the buffer owns `len` bytes of its context, bound above; checked to hold them.
        unsafe { htod(self.ptr, bytes) }
    }

    /// Reads the whole buffer.
    pub fn download(&self) -> Result<Vec<u8>> {
        self.read_at(0, self.len)
    }

    /// Reads `len` bytes at byte `off` of the buffer.
    pub fn read_at(&self, off: usize, len: usize) -> Result<Vec<u8>> {
        self.check(off, len)?;
        let mut v = vec![0u8; len];
        let _ctx = keep_current()?;
        self.ctx.bind()?;
        // SAFETY: bytes `off .. off + len` lie in the buffer (checked), of the bound context.
        unsafe { dtoh(&mut v, self.ptr + off as u64) }?;
        Ok(v)
    }

    /// Writes `bytes` at byte `off` of the buffer.
    pub fn write_at(&self, off: usize, bytes: &[u8]) -> Result<()> {
        self.check(off, bytes.len())?;
        let _ctx = keep_current()?;
        self.ctx.bind()?;
        // SAFETY: bytes `off .. off + len` lie in the buffer (checked), of the bound context.
        unsafe { htod(self.ptr + off as u64, bytes) }
    }

    /// Fills the whole buffer with `value`.
    pub fn fill(&self, value: u8) -> Result<()> {
        let _ctx = keep_current()?;
        self.ctx.bind()?;
        // SAFETY: the buffer owns `len` bytes of its context, bound above.
        unsafe { memset(self.ptr, value, self.len) }
    }

    fn check(&self, off: usize, len: usize) -> Result<()> {
        if off.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(CudaError::OutOfBounds {
                what: "device buffer range",
                offset: off as u64,
                len: len as u64,
                lo: 0,
                hi: self.len as u64,
            });
        }
        Ok(())
    }
}

/// A timing event.
pub struct Event {
    pub(crate) raw: Handle,
    ctx: Ctx,
}

// SAFETY: event handles may be used from any thread once their context is bound, which every
// method does first.
unsafe impl Send for Event {}
// SAFETY: as above; no interior mutability on the Rust side.
unsafe impl Sync for Event {}

impl Event {
    /// A new event on `dev`.
    pub fn new(dev: &Device) -> Result<Event> {
        Event::with_flags(dev, ffi::EVENT_DEFAULT)
    }

    /// An event without timing, for ordering streams.
    pub(crate) fn untimed(dev: &Device) -> Result<Event> {
        Event::with_flags(dev, ffi::EVENT_DISABLE_TIMING)
    }

    fn with_flags(dev: &Device, flags: core::ffi::c_uint) -> Result<Event> {
        let _ctx = keep_current()?;
        let ctx = dev.retain()?;
        ctx.bind()?;
        let api = driver()?;
        let mut raw = core::ptr::null_mut();
        // SAFETY: context bound; valid out-pointer; `flags` are event-creation flags.
        check("cuEventCreate", unsafe {
            (api.event_create)(&mut raw, flags)
        })?;
        Ok(Event { raw, ctx })
    }

    /// Records the event on a stream of the same device.
    pub fn record(&self, s: &Stream) -> Result<()> {
        let _ctx = keep_current()?;
        let api = driver()?;
        // SAFETY: event and stream belong to the bound context.
        check("cuEventRecord", unsafe {
            (api.ctx_set_current)(self.ctx.raw());
            (api.event_record)(self.raw, s.raw)
        })
    }

    /// [`Event::record`] when the caller has the context bound already (a Comm's launch: its
    /// guard bound it): one driver call.
    pub(crate) fn record_bound(&self, s: &Stream) -> Result<()> {
        let api = driver()?;
        // SAFETY: event and stream belong to the bound context (the caller's guard bound it).
        check("cuEventRecord", unsafe {
            (api.event_record)(self.raw, s.raw)
        })
    }

    /// Milliseconds from `self` to `end` (waits for `end`).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        let _ctx = keep_current()?;
        let api = driver()?;
        let mut ms = 0f32;
        // SAFETY: both events were recorded; valid out-pointer.
        check("cuEventSynchronize", unsafe {
            (api.ctx_set_current)(self.ctx.raw());
            (api.event_synchronize)(end.raw)
        })?;
        // SAFETY: as above.
        check("cuEventElapsedTime", unsafe {
            (api.event_elapsed_time)(&mut ms, self.raw, end.raw)
        })?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(api) = driver() {
            // SAFETY: destroyed once, with its context (retained by `self.ctx`) bound.
            self.ctx.with(api, || unsafe {
                (api.event_destroy)(self.raw);
            });
        }
    }
}

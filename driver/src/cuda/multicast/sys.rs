//! The driver calls the multicast binding makes, behind a trait so that tests substitute a fake
//! driver that records them. Production uses [`Real`], the loaded driver tables of
//! [`crate::cuda::ffi::driver`].
//!
//! Each method is one driver entry point; results stay raw codes (`Err(code)`) until the binding
//! names the call in a [`crate::cuda::CudaError::Driver`].

use core::ffi::c_int;

use crate::cuda::ffi::driver::{
    self as ffi, DevPtr, Device, DriverApi, MemAccessDesc, MemHandle, MulticastApi,
    MulticastObjectProp,
};

/// A raw driver result: the value, or the failing code.
pub(crate) type Raw<T> = core::result::Result<T, i32>;

/// The driver entry points of the multicast binding.
///
/// # Safety
/// Every method forwards to the driver; a caller passes only handles and ranges it acquired
/// through this trait and still owns (released at most once, after everything that uses them).
pub(crate) trait McDriver: Send + Sync {
    /// `cuDeviceGetAttribute`.
    unsafe fn device_attribute(&self, attr: c_int, dev: Device) -> Raw<c_int>;
    /// The multicast granularity query.
    unsafe fn granularity(&self, prop: &MulticastObjectProp, option: c_int) -> Raw<usize>;
    /// Multicast object creation.
    unsafe fn create(&self, prop: &MulticastObjectProp) -> Raw<MemHandle>;
    /// Adds a device to the object's team.
    unsafe fn add_device(&self, mc: MemHandle, dev: Device) -> Raw<()>;
    /// Binds `size` bytes of `mem` from `mem_offset` at `mc_offset` of the object.
    unsafe fn bind_mem(
        &self,
        mc: MemHandle,
        mc_offset: usize,
        mem: MemHandle,
        mem_offset: usize,
        size: usize,
    ) -> Raw<()>;
    /// Unbinds what `dev` bound at `mc_offset` (same offset and size as the bind).
    unsafe fn unbind(&self, mc: MemHandle, dev: Device, mc_offset: usize, size: usize) -> Raw<()>;
    /// `cuMemRelease` of the object's handle.
    unsafe fn release(&self, handle: MemHandle) -> Raw<()>;
    /// `cuMemAddressReserve` of `size` bytes aligned to `align`, no hint, no flags.
    unsafe fn address_reserve(&self, size: usize, align: usize) -> Raw<DevPtr>;
    /// `cuMemAddressFree`.
    unsafe fn address_free(&self, ptr: DevPtr, size: usize) -> Raw<()>;
    /// `cuMemMap` of `handle` from offset 0 at `ptr`, no flags.
    unsafe fn map(&self, ptr: DevPtr, size: usize, handle: MemHandle) -> Raw<()>;
    /// `cuMemUnmap`.
    unsafe fn unmap(&self, ptr: DevPtr, size: usize) -> Raw<()>;
    /// `cuMemSetAccess` for every descriptor.
    unsafe fn set_access(&self, ptr: DevPtr, size: usize, access: &[MemAccessDesc]) -> Raw<()>;
    /// The driver's name of a result code.
    fn error_name(&self, code: i32) -> String;
}

fn raw(code: i32) -> Raw<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(code)
    }
}

/// The loaded driver.
pub(crate) struct Real {
    api: &'static DriverApi,
    mc: &'static MulticastApi,
}

impl Real {
    /// Loads the driver and its multicast entry points.
    pub(crate) fn load() -> crate::cuda::Result<Real> {
        let api = crate::cuda::error::driver()?;
        let mc = ffi::multicast_api().map_err(|s| crate::cuda::CudaError::Unavailable(s.into()))?;
        Ok(Real { api, mc })
    }
}

// Each call below passes its arguments through unchanged; out-values are written by the driver
// into locals owned here. What the handles and ranges may be is the trait's contract.
impl McDriver for Real {
    unsafe fn device_attribute(&self, attr: c_int, dev: Device) -> Raw<c_int> {
        let mut v = 0;
        // SAFETY: valid out-pointer; the driver checks the attribute and device.
        raw(unsafe { (self.api.device_get_attribute)(&mut v, attr, dev) }).map(|()| v)
    }

    unsafe fn granularity(&self, prop: &MulticastObjectProp, option: c_int) -> Raw<usize> {
        let mut g = 0usize;
        // SAFETY: valid out-pointer and property struct (layout checked in ffi::driver).
        raw(unsafe { (self.mc.get_granularity)(&mut g, prop, option) }).map(|()| g)
    }

    unsafe fn create(&self, prop: &MulticastObjectProp) -> Raw<MemHandle> {
        let mut h = 0;
        // SAFETY: valid out-pointer and property struct (layout checked in ffi::driver).
        raw(unsafe { (self.mc.create)(&mut h, prop) }).map(|()| h)
    }

    unsafe fn add_device(&self, mc: MemHandle, dev: Device) -> Raw<()> {
        // SAFETY: `mc` is a live object of the caller (trait contract).
        raw(unsafe { (self.mc.add_device)(mc, dev) })
    }

    unsafe fn bind_mem(
        &self,
        mc: MemHandle,
        mc_offset: usize,
        mem: MemHandle,
        mem_offset: usize,
        size: usize,
    ) -> Raw<()> {
        // SAFETY: live handles of the caller (trait contract); flags must be 0.
        raw(unsafe { (self.mc.bind_mem)(mc, mc_offset, mem, mem_offset, size, 0) })
    }

    unsafe fn unbind(&self, mc: MemHandle, dev: Device, mc_offset: usize, size: usize) -> Raw<()> {
        // SAFETY: a binding the caller made and owns, with its offset and size.
        raw(unsafe { (self.mc.unbind)(mc, dev, mc_offset, size) })
    }

    unsafe fn release(&self, handle: MemHandle) -> Raw<()> {
        // SAFETY: a handle the caller owns, released once.
        raw(unsafe { (self.api.mem_release)(handle) })
    }

    unsafe fn address_reserve(&self, size: usize, align: usize) -> Raw<DevPtr> {
        let mut p = 0;
        // SAFETY: valid out-pointer; no address hint, flags 0.
        raw(unsafe { (self.api.mem_address_reserve)(&mut p, size, align, 0, 0) }).map(|()| p)
    }

    unsafe fn address_free(&self, ptr: DevPtr, size: usize) -> Raw<()> {
        // SAFETY: a range the caller reserved and owns, freed once after its mapping.
        raw(unsafe { (self.api.mem_address_free)(ptr, size) })
    }

    unsafe fn map(&self, ptr: DevPtr, size: usize, handle: MemHandle) -> Raw<()> {
        // SAFETY: the caller's own reserved range and live handle; offset and flags 0.
        raw(unsafe { (self.api.mem_map)(ptr, size, 0, handle, 0) })
    }

    unsafe fn unmap(&self, ptr: DevPtr, size: usize) -> Raw<()> {
        // SAFETY: a mapping the caller made and owns, unmapped once.
        raw(unsafe { (self.api.mem_unmap)(ptr, size) })
    }

    unsafe fn set_access(&self, ptr: DevPtr, size: usize, access: &[MemAccessDesc]) -> Raw<()> {
        // SAFETY: the caller's own mapping; the descriptor array holds `access.len()` entries.
        raw(unsafe { (self.api.mem_set_access)(ptr, size, access.as_ptr(), access.len()) })
    }

    fn error_name(&self, code: i32) -> String {
        crate::cuda::error::error_name(code)
    }
}

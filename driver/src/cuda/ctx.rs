//! Retains of a device's primary context, and the calling thread's binding.
//!
//! Every object that needs its context to work or to be freed (devices, streams, events, device
//! and host-mapped memory, modules, graphs, heaps) holds a [`Ctx`] of its own: the primary
//! context stays alive until the last of them is dropped, so they may be dropped in any order.
//! A retain is taken when an object is made, never per call.

use super::error::{check, driver, Result};
use super::ffi::driver::{self as ffi, Handle};

/// One retain of a device's primary context, released on drop.
pub struct Ctx {
    raw: Handle,
    dev: ffi::Device,
}

// SAFETY: a context handle may be used from any thread (the driver API is thread safe); `Ctx`
// only binds it and releases its own retain, once.
unsafe impl Send for Ctx {}
// SAFETY: as above; no interior mutability.
unsafe impl Sync for Ctx {}

impl Ctx {
    /// Retains the primary context of device `dev`.
    pub(crate) fn retain(dev: ffi::Device) -> Result<Ctx> {
        let api = driver()?;
        let mut raw: Handle = core::ptr::null_mut();
        // SAFETY: valid out-pointer; the driver checks the device handle.
        check("cuDevicePrimaryCtxRetain", unsafe {
            (api.primary_ctx_retain)(&mut raw, dev)
        })?;
        Ok(Ctx { raw, dev })
    }

    /// Another retain of the same context (for an object made from the holder of `self`).
    pub(crate) fn try_clone(&self) -> Result<Ctx> {
        Ctx::retain(self.dev)
    }

    /// The context handle, alive as long as `self`.
    pub(crate) fn raw(&self) -> Handle {
        self.raw
    }

    /// Makes the context current on the calling thread.
    pub(crate) fn bind(&self) -> Result<()> {
        let api = driver()?;
        // SAFETY: `raw` is retained by `self`, so alive.
        check("cuCtxSetCurrent", unsafe {
            (api.ctx_set_current)(self.raw)
        })
    }

    /// Runs `f` with the context current, then makes the calling thread's previous binding
    /// current again: what every drop that needs its context does, so dropping a symm object
    /// never changes the caller's binding.
    pub(crate) fn with(&self, api: &ffi::DriverApi, f: impl FnOnce()) {
        let mut prev = core::ptr::null_mut();
        // SAFETY: valid out-pointer; reads the binding (null when none, also on error).
        unsafe { (api.ctx_get_current)(&mut prev) };
        // SAFETY: `raw` is retained by `self`, so alive.
        unsafe { (api.ctx_set_current)(self.raw) };
        f();
        // SAFETY: restores a binding the thread had (a live context, or null).
        unsafe { (api.ctx_set_current)(prev) };
    }
}

impl Drop for Ctx {
    fn drop(&mut self) {
        if let Ok(api) = driver() {
            // SAFETY: releases the retain taken in `retain`, exactly once; the holder's own
            // driver calls on the context came before (its fields drop after its Drop body).
            unsafe { (api.primary_ctx_release)(self.dev) };
        }
    }
}

/// The calling thread's current context, made current again on drop: symm binds its devices'
/// contexts as it works, and every public call leaves the caller's binding as it found it.
pub struct KeepCurrent {
    prev: Handle,
}

/// Remembers the calling thread's current context (restored when the guard drops).
pub fn keep_current() -> Result<KeepCurrent> {
    let api = driver()?;
    let mut prev = core::ptr::null_mut();
    // SAFETY: valid out-pointer; reads the calling thread's binding (null when none).
    check("cuCtxGetCurrent", unsafe {
        (api.ctx_get_current)(&mut prev)
    })?;
    Ok(KeepCurrent { prev })
}

/// The calling thread's current context (null when none).
pub fn current_context() -> Result<Handle> {
    keep_current().map(|k| k.prev)
}

/// The ordinal of the calling thread's current context's device (`None` when no context is
/// current): the GPU a library that binds to "the current device" binds to.
pub fn current_device() -> Result<Option<i32>> {
    if current_context()?.is_null() {
        return Ok(None);
    }
    let api = driver()?;
    let mut dev = 0;
    // SAFETY: valid out-pointer; a context is current on this thread.
    check("cuCtxGetDevice", unsafe { (api.ctx_get_device)(&mut dev) })?;
    Ok(Some(dev))
}

impl Drop for KeepCurrent {
    fn drop(&mut self) {
        if let Ok(api) = driver() {
            // SAFETY: restores a binding the thread had (a live context, or null).
            unsafe { (api.ctx_set_current)(self.prev) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a driver no retain is taken (and none is released on drop).
    #[test]
    fn no_retain_without_a_driver() {
        if driver().is_ok() {
            return;
        }
        assert!(matches!(
            Ctx::retain(0),
            Err(crate::cuda::CudaError::Unavailable(_))
        ));
    }
}

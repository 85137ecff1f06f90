//! What crosses from Python into the runtime on every call: torch's stream handles, lent for
//! the call, tensors' (address, bytes) pairs, and small integers checked for range.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use symm_driver::cuda::{Comm, Span, Stream, StreamRef};

/// The stream handle `raw` of torch, lent to the runtime for one call: no driver call to wrap
/// it or to drop the wrapper (the Comm's device keeps the context alive meanwhile).
pub(super) fn stream(comm: &Comm, raw: u64) -> StreamRef<'_> {
    // SAFETY: `raw` is the handle of a live CUDA stream of the device's primary context (what
    // torch's current stream of the rank's GPU gives; the Python layer passes nothing else), or
    // 0 for the legacy default stream; it outlives this call and the work enqueued on it.
    unsafe { Stream::lent(raw as usize as *mut std::ffi::c_void, comm.device()) }
}

/// A span from the Python layer's (address, bytes) pair.
pub(super) fn span(ptr: u64, len: u64) -> Span {
    Span { ptr, len }
}

/// `v` as a u16, else a `ValueError` naming `what`.
pub(super) fn u16_arg(what: &str, v: i64) -> PyResult<u16> {
    u16::try_from(v)
        .map_err(|_| PyValueError::new_err(format!("{what} must be in 0..=65535, got {v}")))
}

//! Streams: made here and destroyed on drop, or a caller's, borrowed.
//!
//! A caller's stream (a framework's current stream, a C caller's `CUstream`) is wrapped without
//! taking it over. [`Stream::borrowed`] holds a retain of the device's context, for a wrapper
//! that lives on its own; [`Stream::lent`] takes none and borrows the [`Device`] instead
//! ([`StreamRef`]), so wrapping a stream for one call costs no driver call.

use core::sync::atomic::{AtomicU64, Ordering};

use super::device::{keep_current, Ctx, Device, Event};
use super::error::{check, driver, Result};
use super::ffi::driver::{self as ffi, Handle};

/// A stream of one device, destroyed on drop unless borrowed from its owner.
pub struct Stream {
    pub(crate) raw: Handle,
    /// Its context, alive as long as `self` (retained by `retain`, or by the device a lent
    /// stream borrows).
    ctx: Handle,
    /// Its retain of the context: a stream made here or [`Stream::borrowed`] holds one; a
    /// [`Stream::lent`] one does not (the device it borrows keeps the context alive).
    retain: Option<Ctx>,
    /// Made here ([`Stream::new`]): destroyed on drop. A caller's never is.
    owned: bool,
    /// What tells streams apart ([`Stream::key`]).
    key: u64,
}

/// A caller's stream lent for as long as `'a`, the life of a borrow of the [`Device`] whose
/// retain keeps its context alive ([`Stream::lent`]): what a binding wraps a framework's
/// stream in for one call, without a driver call to make or drop it.
pub struct StreamRef<'a> {
    stream: Stream,
    _dev: core::marker::PhantomData<&'a Device>,
}

impl core::ops::Deref for StreamRef<'_> {
    type Target = Stream;

    fn deref(&self) -> &Stream {
        &self.stream
    }
}

/// A number no other stream this process made has.
fn next_stream_key() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

// SAFETY: streams may be used from any thread once their context is bound.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    /// A non-blocking stream on `dev`.
    pub fn new(dev: &Device) -> Result<Stream> {
        let _ctx = keep_current()?;
        let ctx = dev.retain()?;
        ctx.bind()?;
        let api = driver()?;
        let mut raw = core::ptr::null_mut();
        // SAFETY: context bound; valid out-pointer.
        check("cuStreamCreate", unsafe {
            (api.stream_create)(&mut raw, ffi::STREAM_NON_BLOCKING)
        })?;
        Ok(Stream {
            raw,
            ctx: ctx.raw(),
            retain: Some(ctx),
            owned: true,
            key: next_stream_key(),
        })
    }

    /// A caller's stream of `dev`'s primary context, used without taking ownership (never
    /// destroyed here).
    ///
    /// # Safety
    ///
    /// `raw` must be a valid stream (or null, the legacy default stream) of `dev`'s primary
    /// context, and stay valid for as long as the returned value and any work enqueued
    /// through it.
    pub unsafe fn borrowed(raw: Handle, dev: &Device) -> Result<Stream> {
        let ctx = dev.retain()?;
        Ok(Stream {
            raw,
            ctx: ctx.raw(),
            retain: Some(ctx),
            owned: false,
            key: borrowed_key(raw),
        })
    }

    /// A caller's stream of `dev`'s primary context, lent for as long as the borrow of `dev`:
    /// [`Stream::borrowed`] without its retain of the context (and the release on drop), so
    /// making and dropping it costs no driver call. What a binding wraps a framework's current
    /// stream in for each call.
    ///
    /// # Safety
    ///
    /// As [`Stream::borrowed`]: `raw` must be a valid stream (or null, the legacy default
    /// stream) of `dev`'s primary context, and stay valid for as long as the returned value and
    /// any work enqueued through it. (The context itself stays alive: `dev` holds a retain of
    /// it for at least as long as the returned value, which borrows `dev`.)
    pub unsafe fn lent(raw: Handle, dev: &Device) -> StreamRef<'_> {
        StreamRef {
            stream: Stream {
                raw,
                ctx: dev.context(),
                retain: None,
                owned: false,
                key: borrowed_key(raw),
            },
            _dev: core::marker::PhantomData,
        }
    }

    /// The handle (for a caller's own launches on this stream; it stays owned by `self`).
    pub fn raw(&self) -> Handle {
        self.raw
    }

    /// What tells this stream apart from others: a number of its own for a stream made here
    /// (never reused, even after it is destroyed), the handle for a caller's stream.
    pub(crate) fn key(&self) -> u64 {
        self.key
    }

    /// The context the stream belongs to.
    pub fn context(&self) -> Handle {
        self.ctx
    }

    /// Makes the stream's context current on the calling thread.
    fn bind(&self) -> Result<()> {
        let api = driver()?;
        // SAFETY: the context is alive: retained by `self`, or by the device a lent stream
        // borrows.
        check("cuCtxSetCurrent", unsafe {
            (api.ctx_set_current)(self.context())
        })
    }

    /// Whether the stream is capturing work into a graph (the work does not run now).
    pub fn is_capturing(&self) -> Result<bool> {
        let _ctx = keep_current()?;
        self.bind()?;
        self.capturing_bound()
    }

    /// [`Stream::is_capturing`] when the caller has the stream's context bound already (a
    /// Comm's launch: its guard bound it), without binding it again.
    pub(crate) fn capturing_bound(&self) -> Result<bool> {
        let api = driver()?;
        let mut status = ffi::CAPTURE_STATUS_NONE;
        // SAFETY: valid stream of the bound context; valid out-pointer.
        check("cuStreamIsCapturing", unsafe {
            (api.stream_is_capturing)(self.raw, &mut status)
        })?;
        Ok(status != ffi::CAPTURE_STATUS_NONE)
    }

    /// Makes later work on this stream wait for `event`'s last record (on any stream), the
    /// caller having the stream's context bound already (a Comm's launch: its guard bound it):
    /// one driver call.
    pub(crate) fn wait_event_bound(&self, event: &Event) -> Result<()> {
        let api = driver()?;
        // SAFETY: valid stream and event of the bound context (the caller's guard bound it).
        check("cuStreamWaitEvent", unsafe {
            (api.stream_wait_event)(self.raw, event.raw, 0)
        })
    }

    /// Waits for the stream's work.
    pub fn synchronize(&self) -> Result<()> {
        let _ctx = keep_current()?;
        self.bind()?;
        let api = driver()?;
        // SAFETY: valid stream of the context bound above.
        check("cuStreamSynchronize", unsafe {
            (api.stream_synchronize)(self.raw)
        })
    }
}

/// A caller's stream is known by its handle (every wrapper of it is the same stream); the top
/// bit keeps these apart from the streams made here.
fn borrowed_key(raw: Handle) -> u64 {
    (raw as usize as u64) | 1 << 63
}

impl Drop for Stream {
    fn drop(&mut self) {
        let Some(ctx) = self.retain.as_ref().filter(|_| self.owned) else {
            return;
        };
        if let Ok(api) = driver() {
            // SAFETY: destroyed once, with its context (retained by `ctx`) bound.
            ctx.with(api, || unsafe {
                (api.stream_destroy)(self.raw);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_callers_stream_is_known_by_its_handle_apart_from_streams_made_here() {
        let (a, b) = (0x1000usize as Handle, 0x2000usize as Handle);
        assert_eq!(borrowed_key(a), borrowed_key(a));
        assert_ne!(borrowed_key(a), borrowed_key(b));
        // The legacy default stream (null) too; no key made here has the top bit.
        assert_ne!(borrowed_key(core::ptr::null_mut()) & 1 << 63, 0);
        assert_eq!(next_stream_key() & 1 << 63, 0);
    }
}

//! The prologue of every call into a [`Comm`]: one guard instead of the same three lines in
//! every method.
//!
//! [`Comm::enter`] (and its variants) does what each call needs before it touches the GPU:
//!
//! * **The context.** It remembers the calling thread's current context and makes this Comm's
//!   current; on drop it restores the caller's binding. When the caller already has this
//!   Comm's context bound (a framework that works on the same GPU) nothing is rebound and
//!   nothing restored: two driver calls saved on every launch.
//! * **Liveness.** A lost peer poisons the Comm and is returned as [`CudaError::PeerLost`];
//!   a poisoned Comm fails fast with [`CudaError::Poisoned`] until [`Comm::reset`].
//! * **The stream** ([`Comm::enter_on`]): work on another device's stream would run where the
//!   heap is not mapped, so such a stream is refused ([`CudaError::WrongOwner`]).
//!
//! [`Poison`] is the Comm's poison: an atomic flag read on every call (no lock while the Comm
//! is healthy) and the first error's text.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use super::Comm;
use crate::cuda::device::Stream;
use crate::cuda::error::{check, driver, CudaError, Result};
use crate::cuda::ffi::driver::Handle;

/// A call inside a [`Comm`]: its context bound until the guard drops (see the module doc).
pub(crate) struct Entered {
    /// The caller's binding, restored on drop when `rebound`.
    prev: Handle,
    rebound: bool,
}

impl Drop for Entered {
    fn drop(&mut self) {
        if !self.rebound {
            return;
        }
        if let Ok(api) = driver() {
            // SAFETY: restores a binding the thread had (a live context, or null).
            unsafe { (api.ctx_set_current)(self.prev) };
        }
    }
}

/// Whether a thread whose current context is `prev` must bind `ours` (and restore `prev`).
fn must_bind(prev: Handle, ours: Handle) -> bool {
    prev != ours
}

impl Comm {
    /// Binds this Comm's context for the call, restoring the caller's on drop; checks nothing
    /// else (what `check`, `free`, `reset` and the other calls that must work on a poisoned
    /// Comm use).
    pub(crate) fn enter_any(&self) -> Result<Entered> {
        let api = driver()?;
        let mut prev = core::ptr::null_mut();
        // SAFETY: valid out-pointer; reads the calling thread's binding (null when none).
        check("cuCtxGetCurrent", unsafe {
            (api.ctx_get_current)(&mut prev)
        })?;
        let ours = self.dev.context();
        let rebound = must_bind(prev, ours);
        let guard = Entered { prev, rebound };
        if rebound {
            self.dev.bind()?;
        }
        Ok(guard)
    }

    /// [`Comm::enter_any`], then fails unless the Comm is live (no lost peer, not poisoned).
    pub(crate) fn enter(&self) -> Result<Entered> {
        let g = self.enter_any()?;
        self.live()?;
        Ok(g)
    }

    /// [`Comm::enter`], then fails unless `stream` belongs to this Comm's context.
    pub(crate) fn enter_on(&self, stream: &Stream) -> Result<Entered> {
        let g = self.enter()?;
        self.own_stream(stream)?;
        Ok(g)
    }

    /// Fails fast when the communicator is poisoned or a peer was lost (which poisons it).
    pub(crate) fn live(&self) -> Result<()> {
        if let Some(rank) = self.lost() {
            let e = CudaError::PeerLost { rank };
            self.poison.raise(&e);
            return Err(e);
        }
        self.poison.check()
    }

    /// The rank the bootstrap lost, if any (its watcher's lost word: no lock, no call).
    pub(crate) fn lost(&self) -> Option<u16> {
        match self.job.lost.load(Ordering::Acquire) {
            crate::bootstrap::NOT_LOST => None,
            r => u16::try_from(r).ok(),
        }
    }

    /// Fails unless `stream` belongs to this rank's context: work on another device's stream
    /// would run where the heap is not mapped (or the kernel not loaded).
    pub(crate) fn own_stream(&self, stream: &Stream) -> Result<()> {
        if stream.context() != self.dev.context() {
            return Err(CudaError::WrongOwner { what: "the stream" });
        }
        Ok(())
    }
}

/// A Comm's poison: set by the first asynchronous error (a timeout, a lost peer, a failed
/// launch), lifted only by [`Comm::reset`].
#[derive(Default)]
pub(crate) struct Poison {
    /// Raised with `why`: what every call reads first (no lock while it is down).
    set: AtomicBool,
    why: Mutex<Option<String>>,
    /// How many times it was lifted: state made before a lift (a layer's epochs) may differ
    /// across ranks after it.
    lifts: AtomicU64,
}

impl Poison {
    /// Fails with [`CudaError::Poisoned`] (the first error's text) when raised.
    pub(crate) fn check(&self) -> Result<()> {
        if !self.set.load(Ordering::Acquire) {
            return Ok(());
        }
        match self.why.lock() {
            Ok(p) => p
                .clone()
                .map_or(Ok(()), |why| Err(CudaError::Poisoned(why))),
            Err(_) => Err(CudaError::LockPoisoned { what: "poison" }),
        }
    }

    /// Raises the poison with `e` unless it is raised already (the first error is kept).
    pub(crate) fn raise(&self, e: &CudaError) {
        self.raise_with(|| e.to_string());
    }

    /// [`Poison::raise`] with the text `why` makes.
    pub(crate) fn raise_with(&self, why: impl FnOnce() -> String) {
        if let Ok(mut p) = self.why.lock() {
            p.get_or_insert_with(why);
            self.set.store(true, Ordering::Release);
        }
    }

    /// Lifts the poison.
    pub(crate) fn lift(&self) {
        if let Ok(mut p) = self.why.lock() {
            *p = None;
            self.lifts.fetch_add(1, Ordering::AcqRel);
            self.set.store(false, Ordering::Release);
        }
    }

    /// How many times it was lifted (what state made before a reset remembers).
    pub(crate) fn lifts(&self) -> u64 {
        self.lifts.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_error_poisons_until_lifted() {
        let p = Poison::default();
        assert!(p.check().is_ok());
        p.raise(&CudaError::PeerLost { rank: 3 });
        p.raise_with(|| "a later error".into());
        match p.check() {
            Err(CudaError::Poisoned(why)) => assert!(why.contains('3'), "{why}"),
            r => panic!("{r:?}"),
        }
        assert_eq!(p.lifts(), 0);
        p.lift();
        assert!(p.check().is_ok());
        assert_eq!(p.lifts(), 1);
        p.raise_with(|| "again".into());
        assert!(matches!(p.check(), Err(CudaError::Poisoned(w)) if w == "again"));
    }

    #[test]
    fn a_call_rebinds_only_when_another_context_is_current() {
        let (a, b) = (8usize as Handle, 16usize as Handle);
        assert!(!must_bind(a, a));
        assert!(must_bind(a, b));
        assert!(must_bind(core::ptr::null_mut(), a));
    }
}

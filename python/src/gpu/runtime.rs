//! The runtime one rank of the Python layer holds: its [`Comm`] and the features made from it
//! that the layer uses, torn down in order.
//!
//! The binding calls the runtime's types directly ([`Tensors`] for the blocks tensors live in
//! and collectives over addresses, [`Signals`] for stream signals, the Comm for the rest); it
//! only holds them. Tensors, heap blocks and layers keep the runtime alive through an `Arc`,
//! so the heap stays mapped while any tensor over it lives, even after `symm.finalize`.

use std::sync::{Mutex, OnceLock};

use symm_core::sched::Request;
use symm_driver::cuda::{Comm, CudaError, LaunchFloor, Result, Signals, Span, Stream, Tensors};

/// One rank's runtime (see the module doc).
///
/// Field order is teardown order: the features before the Comm they were made from (their
/// workspaces, admitted launches and kernels belong to it), as the Comm drops its plans before
/// its heap. A block a captured graph names stays pinned by the graph itself
/// ([`Tensors`]'s graph pins), not by this order.
pub(crate) struct Runtime {
    /// Framework tensors: heap blocks, graph pins, the agreed arguments, workspaces and
    /// admitted launches of collectives over addresses.
    pub(crate) tensors: Tensors,
    /// The stream signals kernel, loaded on first use.
    signals: OnceLock<Signals>,
    /// Serialises the signals kernel's and the launch floor's first load.
    loading: Mutex<()>,
    /// The empty kernel that times the bare launch, loaded on first use.
    floor: OnceLock<LaunchFloor>,
    /// The Comm everything above was made from: it goes last.
    pub(crate) comm: Comm,
}

impl Runtime {
    /// The runtime over a Comm just opened.
    pub(crate) fn new(comm: Comm) -> Runtime {
        Runtime {
            tensors: Tensors::new(&comm),
            signals: OnceLock::new(),
            loading: Mutex::new(()),
            floor: OnceLock::new(),
            comm,
        }
    }

    /// The signals kernel, loaded (compiled or found in the kernel cache) on first use.
    pub(crate) fn load_signals(&self) -> Result<&Signals> {
        if let Some(s) = self.signals.get() {
            return Ok(s);
        }
        let _one = self.loading.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = self.signals.get() {
            return Ok(s);
        }
        let s = Signals::load(&self.comm)?;
        Ok(self.signals.get_or_init(|| s))
    }

    /// The signals kernel for a put or wait on `stream`; [`CudaError::NotPrepared`] when it is
    /// not loaded yet and `stream` captures (loading compiles and allocates: `symm.rendezvous`
    /// loads it before any capture can use it).
    pub(crate) fn signals(&self, stream: &Stream) -> Result<&Signals> {
        if let Some(s) = self.signals.get() {
            return Ok(s);
        }
        if stream.is_capturing()? {
            return Err(CudaError::NotPrepared);
        }
        self.load_signals()
    }

    /// Host microseconds per call of `iters` enqueues of `req` over `(input, output)` on
    /// `stream` (a Rust loop, the stream not waited for). Collective.
    ///
    /// # Safety
    /// As [`Tensors::enqueue`]: the spans are live device memory until the work has run.
    pub(crate) unsafe fn host_loop_us(
        &self,
        req: &Request,
        (input, output): (Span, Span),
        stream: &Stream,
        iters: u32,
    ) -> Result<f64> {
        let iters = iters.max(1);
        let t0 = std::time::Instant::now();
        for _ in 0..iters {
            // SAFETY: the caller's contract is this one.
            unsafe { self.tensors.enqueue(&self.comm, req, input, output, stream) }?;
        }
        Ok(t0.elapsed().as_secs_f64() * 1e6 / f64::from(iters))
    }

    /// Host microseconds per bare launch with `req`'s grid ([`LaunchFloor::time`]), the empty
    /// kernel loaded on first use. Local (the admission of `req` is found, or made here).
    pub(crate) fn launch_floor_us(
        &self,
        req: &Request,
        stream: &Stream,
        calls: u32,
    ) -> Result<f64> {
        let a = self.comm.admit(req)?;
        let floor = match self.floor.get() {
            Some(f) => f,
            None => {
                let _one = self.loading.lock().unwrap_or_else(|e| e.into_inner());
                match self.floor.get() {
                    Some(f) => f,
                    None => {
                        let f = LaunchFloor::load(&self.comm)?;
                        self.floor.get_or_init(|| f)
                    }
                }
            }
        };
        floor.time(&self.comm, &a, stream, calls)
    }

    /// Local and non-blocking: gives heap block `offset` back (what a dropped tensor or layer
    /// does; a closed or poisoned Comm still takes the mark).
    pub(crate) fn release(&self, offset: u64) {
        let _ = self.tensors.release_block(offset);
    }
}

//! Signals between ranks on the caller's stream, for users' own kernels (`symm/signals.cu`).
//!
//! A signal pad is a block of the symmetric heap (`slots * world` 8-byte words per rank, word
//! `slot * world + src` written by rank `src`), allocated collectively by the framework like
//! any tensor and zeroed. [`Comm::put_signal`] sets word (slot, this rank) of `peer`'s pad after
//! this rank's earlier work on the stream; [`Comm::wait_signal`] holds the stream until word
//! (slot, `peer`) of this rank's pad is set, then clears it. Both are one-thread kernels, so a
//! capture records them; a wait past the Comm's deadline writes a timeout record (reported by
//! [`Comm::check`]) instead of hanging the stream. The kernel is compiled on first use:
//! [`Comm::load_signals`] does it ahead of a capture.

use symm_core::sched::MAX_CHANNELS;

use super::{Comm, ABORT_BYTES};
use crate::cuda::compile::{self, Compiler};
use crate::cuda::device::{self, Stream};
use crate::cuda::error::{CudaError, Result};
use crate::cuda::launch::{Kernel, RECORD_BYTES};

impl Comm {
    /// Compiles and loads the signals kernel unless it is loaded (not while capturing).
    pub fn load_signals(&self) -> Result<()> {
        let _ctx = device::keep_current()?;
        let mut k = self
            .signals
            .lock()
            .map_err(|_| CudaError::LockPoisoned { what: "signals" })?;
        if k.is_none() {
            let compiler = Compiler::load(self.opts.nvrtc.as_deref())?;
            let drv = device::driver_version()?;
            let (cubin, _) = compile::cubin(&compiler, &symm_kernels::SIGNALS, self.dev.arch, drv)?;
            *k = Some(Kernel::load(&self.dev, &cubin, symm_kernels::SIGNAL_ENTRY)?);
        }
        Ok(())
    }

    /// Enqueues a put of signal `slot` into `peer`'s pad (heap offset `pad`, `pad_len` bytes).
    pub fn put_signal(
        &self,
        pad: u64,
        pad_len: u64,
        peer: u16,
        slot: u32,
        stream: &Stream,
    ) -> Result<()> {
        self.signal(pad, pad_len, peer, slot, false, stream)
    }

    /// Enqueues a wait for signal `slot` from `peer` in this rank's pad, which clears it.
    pub fn wait_signal(
        &self,
        pad: u64,
        pad_len: u64,
        peer: u16,
        slot: u32,
        stream: &Stream,
    ) -> Result<()> {
        self.signal(pad, pad_len, peer, slot, true, stream)
    }

    fn signal(
        &self,
        pad: u64,
        pad_len: u64,
        peer: u16,
        slot: u32,
        wait: bool,
        stream: &Stream,
    ) -> Result<()> {
        let _ctx = device::keep_current()?;
        self.live()?;
        self.own_stream(stream)?;
        if peer >= self.world {
            return Err(CudaError::BadRank {
                rank: peer,
                world: self.world,
            });
        }
        self.check_range(pad, pad_len)?;
        let words = u64::from(slot + 1).saturating_mul(u64::from(self.world));
        if words.saturating_mul(8) > pad_len {
            return Err(CudaError::OutOfBounds {
                what: "signal slot",
                offset: u64::from(slot),
                len: 1,
                lo: 0,
                hi: pad_len / 8 / u64::from(self.world),
            });
        }
        if stream.is_capturing()? && self.signals.lock().map_or(true, |k| k.is_none()) {
            return Err(CudaError::NotPrepared);
        }
        self.load_signals()?;
        let k = self
            .signals
            .lock()
            .map_err(|_| CudaError::LockPoisoned { what: "signals" })?;
        let Some(kernel) = k.as_ref() else {
            return Err(CudaError::Invalid("signals kernel not loaded".into()));
        };
        let mut w = self.symm_world();
        let (mut pad, mut peer, mut slot, mut wait) = (pad, u32::from(peer), slot, u32::from(wait));
        let mut deadline = self
            .sharing
            .deadline(self.opts.timeout)
            .as_nanos()
            .min(u64::MAX as u128) as u64;
        let mut record =
            self.host.dev + (ABORT_BYTES + (MAX_CHANNELS as usize - 1) * RECORD_BYTES) as u64;
        let mut args = [
            (&mut w as *mut symm_kernels::abi::SymmWorld).cast(),
            (&mut pad as *mut u64).cast(),
            (&mut peer as *mut u32).cast(),
            (&mut slot as *mut u32).cast(),
            (&mut wait as *mut u32).cast(),
            (&mut deadline as *mut u64).cast(),
            (&mut record as *mut u64).cast(),
        ];
        self.dev.bind()?;
        let _order = self.launch_lock()?;
        // SAFETY: the arguments match `symm_user_signal`'s list in order and type; the pad
        // range was checked to lie in the buffer area and to hold word (slot, every rank); the
        // heap, the abort word and the record (the last channel's, in host-mapped memory) live
        // as long as `self`.
        let r = unsafe { kernel.launch_args(stream, 1, 32, &mut args) };
        if let Err(e) = &r {
            self.poison(e);
        }
        r
    }
}

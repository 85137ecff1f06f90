//! Signals between ranks on the caller's stream, for users' own kernels (`symm/signals.cu`).
//!
//! A signal pad is a block of the symmetric heap (`slots * world` 8-byte words per rank, word
//! `slot * world + src` written by rank `src`), allocated collectively by the framework like
//! any tensor and zeroed. [`Signals::put`] sets word (slot, this rank) of `peer`'s pad after
//! this rank's earlier work on the stream; [`Signals::wait`] holds the stream until word
//! (slot, `peer`) of this rank's pad is set, then clears it. Both are one-thread kernels, so a
//! capture records them; a wait past the Comm's deadline writes a timeout record (reported by
//! [`Comm::check`]) instead of hanging the stream. [`Signals::load`] compiles and loads the
//! kernel: do it before capturing.

use super::Comm;
use crate::cuda::compile::{self, Compiler};
use crate::cuda::device::{self, Stream};
use crate::cuda::error::{CudaError, Result};
use crate::cuda::launch::Kernel;

/// The stream signals kernel of one Comm (see the module doc).
pub struct Signals {
    /// The Comm it was loaded for (`device_plan::next_owner`).
    owner: u64,
    kernel: Kernel,
}

impl Signals {
    /// Compiles (or finds in the kernel cache) and loads the signals kernel on `comm`'s device
    /// (not while capturing).
    pub fn load(comm: &Comm) -> Result<Signals> {
        let _g = comm.enter_any()?;
        let compiler = Compiler::load(comm.opts.nvrtc.as_deref())?;
        let drv = device::driver_version()?;
        let (cubin, _) = compile::cubin(&compiler, &symm_kernels::SIGNALS, comm.dev.arch, drv)?;
        Ok(Signals {
            owner: comm.job.id,
            kernel: Kernel::load(&comm.dev, &cubin, symm_kernels::SIGNAL_ENTRY)?,
        })
    }

    /// Enqueues a put of signal `slot` into `peer`'s pad (heap offset `pad`, `pad_len` bytes).
    pub fn put(
        &self,
        comm: &Comm,
        pad: (u64, u64),
        peer: u16,
        slot: u32,
        stream: &Stream,
    ) -> Result<()> {
        self.signal(comm, pad, peer, slot, false, stream)
    }

    /// Enqueues a wait for signal `slot` from `peer` in this rank's pad (heap offset `pad`,
    /// `pad_len` bytes), which clears it.
    pub fn wait(
        &self,
        comm: &Comm,
        pad: (u64, u64),
        peer: u16,
        slot: u32,
        stream: &Stream,
    ) -> Result<()> {
        self.signal(comm, pad, peer, slot, true, stream)
    }

    fn signal(
        &self,
        comm: &Comm,
        (pad, pad_len): (u64, u64),
        peer: u16,
        slot: u32,
        wait: bool,
        stream: &Stream,
    ) -> Result<()> {
        if self.owner != comm.job.id {
            return Err(CudaError::WrongOwner {
                what: "the signals kernel",
            });
        }
        let _g = comm.enter_on(stream)?;
        let world = comm.job.world;
        if peer >= world {
            return Err(CudaError::BadRank { rank: peer, world });
        }
        comm.check_range(pad, pad_len)?;
        let words = (u64::from(slot) + 1).saturating_mul(u64::from(world));
        if words.saturating_mul(8) > pad_len {
            return Err(CudaError::OutOfBounds {
                what: "signal slot",
                offset: u64::from(slot),
                len: 1,
                lo: 0,
                hi: pad_len / 8 / u64::from(world),
            });
        }
        let mut w = comm.symm_world();
        let (mut pad, mut peer, mut slot, mut wait) = (pad, u32::from(peer), slot, u32::from(wait));
        let mut deadline = comm.deadline_ns();
        let mut record = comm.record_addr();
        let mut args = [
            (&mut w as *mut symm_kernels::abi::SymmWorld).cast(),
            (&mut pad as *mut u64).cast(),
            (&mut peer as *mut u32).cast(),
            (&mut slot as *mut u32).cast(),
            (&mut wait as *mut u32).cast(),
            (&mut deadline as *mut u64).cast(),
            (&mut record as *mut u64).cast(),
        ];
        let _order = comm.launch_lock()?;
        // SAFETY: the arguments match `symm_user_signal`'s list in order and type; the pad
        // range was checked to lie in the buffer area and to hold word (slot, every rank); the
        // heap, the abort word and the record (the last channel's, in host-mapped memory) live
        // as long as `comm`; the context is bound by the guard.
        let r = unsafe { self.kernel.launch_args(stream, 1, 32, &mut args) };
        if let Err(e) = &r {
            comm.poison.raise(e);
        }
        r
    }
}

//! A Comm's health: asynchronous errors reported ([`Comm::check`], [`Comm::synchronize`]), the
//! poison they leave, [`Comm::reset`] that lifts it, and the orderly end of a rank
//! ([`Comm::finish`], [`Comm::close`]).

use symm_core::sched::MAX_CHANNELS;

use super::{epoch, Comm, ABORT_BYTES};
use crate::cuda::device::Stream;
use crate::cuda::error::{check, driver, CudaError, Result};
use crate::cuda::launch::RECORD_BYTES;
use crate::cuda::records::first_failure;
use crate::cuda::rendezvous::Bootstrap;

impl Comm {
    /// Reports asynchronous errors of collectives enqueued so far without waiting for them: a
    /// device timeout (rank, peer, slot, expected, found), a lost peer, an op the interpreter
    /// refused. After an error the communicator is poisoned until [`Comm::reset`].
    pub fn check(&self) -> Result<()> {
        let _g = self.enter_any()?;
        if let Some(rank) = self.lost() {
            let e = CudaError::PeerLost { rank };
            self.poison.raise(&e);
            return Err(e);
        }
        let ats = (0..MAX_CHANNELS as usize).map(|c| ABORT_BYTES + c * RECORD_BYTES);
        let found = first_failure(&self.host, ats).map(|e| self.team_peer(e));
        if let Some(e) = found {
            self.poison.raise(&e);
            return Err(e);
        }
        self.live()
    }

    /// Waits for the caller's `stream`, then [`Comm::check`]s.
    pub fn synchronize(&self, stream: &Stream) -> Result<()> {
        let _g = self.enter_any()?;
        let r = stream.synchronize();
        if let Err(e) = &r {
            self.poison.raise(e);
        }
        self.check()?;
        r
    }

    /// Waits for every stream of this rank's context.
    pub(super) fn sync_device(&self) -> Result<()> {
        self.dev.bind()?;
        let api = driver()?;
        // SAFETY: this rank's context is bound; waits for every stream of it.
        check("cuCtxSynchronize", unsafe { (api.ctx_synchronize)() })
    }

    /// Collective: after a failure, waits for this rank's device, brings the bootstrap back
    /// ([`SocketRendezvous::recover`](crate::cuda::rendezvous::SocketRendezvous::recover)),
    /// zeroes its signal pad, its `expected` counters, the records and the abort word between
    /// two barriers of every rank, and lifts the poison. Fails (and stays poisoned) when a peer was lost or the device
    /// cannot be synchronised.
    pub fn reset(&self) -> Result<()> {
        let _g = self.enter_any()?;
        if let Some(rank) = self.lost() {
            return Err(CudaError::PeerLost { rank });
        }
        let _l = self.launch_lock()?;
        self.sync_device()?;
        // The bootstrap first: a failed exchange may have left ranks in different ones.
        self.job.boot.recover()?;
        // No rank zeroes before every rank stopped using the protocol.
        self.job.boot.barrier(self.job.rank)?;
        let epochs = epoch::highest(self)?;
        self.heap_fill(0, self.data_off, 0)?;
        self.expected.fill(0)?;
        epoch::resume(self, &epochs)?;
        self.sync_device()?;
        self.host.zero_all();
        // No rank signals before every rank zeroed.
        self.job.boot.barrier(self.job.rank)?;
        self.poison.lift();
        Ok(())
    }

    /// Ends this rank's part in the job in order: waits for its device, then the bootstrap's
    /// last barrier, after which no rank counts another's exit as a loss. Dropping a `Comm`
    /// without it is seen by the other ranks as this rank's loss.
    pub fn finish(self) -> Result<()> {
        self.close()
    }

    /// [`Comm::finish`] for a Comm that others still hold (a framework's tensors over its heap):
    /// ends this rank's part in the job in order, then refuses new work; the memory stays
    /// mapped until the Comm is dropped.
    ///
    /// A device that fails to synchronise (a kernel stopped by a fault) does not skip the
    /// bootstrap's end: the rank still leaves the job in order, and the first error is returned.
    pub fn close(&self) -> Result<()> {
        let _g = self.enter_any()?;
        let synced = self.sync_device();
        let r = self
            .job
            .boot
            .bootstrap()
            .finish(self.opts.bootstrap_timeout)
            .map_err(CudaError::Bootstrap);
        self.poison
            .raise_with(|| "the communicator was finished".to_string());
        synced.and(r)
    }
}

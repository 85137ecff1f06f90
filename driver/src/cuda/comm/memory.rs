//! A rank's access to the symmetric heap from the host ([`Comm::memory`]): copies into and out
//! of its own heap, reads of a peer's heap through the mapping, and the copy engine's
//! stream-ordered put. Every range is checked before the driver sees it: the public calls
//! against the buffer area (never the signal pad), the crate's own against the heap.

use super::Comm;
use crate::cuda::bounds as guard;
use crate::cuda::device::{self, Stream};
use crate::cuda::error::{check, driver, CudaError, Result};

/// Host access to a Comm's heap (see the module doc).
pub struct Memory<'c> {
    comm: &'c Comm,
}

impl Comm {
    /// Host access to this rank's heap: copies in and out, fills, the stream-ordered put to a
    /// peer, device addresses.
    pub fn memory(&self) -> Memory<'_> {
        Memory { comm: self }
    }

    /// Fails unless bytes `off .. off + len` lie in this rank's heap (pad included).
    pub(super) fn own_heap(&self, off: u64, len: u64) -> Result<()> {
        guard::check_range(off, len, 0, self.heap.stride)
    }

    /// Copies `bytes` to heap offset `off` of this rank (pad included: the caller decides).
    pub(crate) fn heap_write(&self, off: u64, bytes: &[u8]) -> Result<()> {
        self.own_heap(off, bytes.len() as u64)?;
        self.dev.bind()?;
        // SAFETY: bytes `off .. off + len` lie in this rank's heap (`own_heap`), mapped into its
        // context, bound above.
        unsafe { device::htod(self.heap_ptr(self.job.rank, off)?, bytes) }
    }

    /// Reads `len` bytes at heap offset `off` of `peer`'s heap through this rank's mapping.
    pub(crate) fn peer_read(&self, peer: u16, off: u64, len: u64) -> Result<Vec<u8>> {
        self.own_heap(off, len)?;
        if peer >= self.job.world {
            return Err(CudaError::BadRank {
                rank: peer,
                world: self.job.world,
            });
        }
        let mut v = vec![0u8; len as usize];
        self.dev.bind()?;
        // SAFETY: bytes `off .. off + len` lie inside a heap (`own_heap`) and `peer` is a rank
        // of the job, so the range is inside `peer`'s heap as mapped into this rank's context,
        // bound above.
        unsafe { device::dtoh(&mut v, self.heap_ptr(peer, off)?) }?;
        Ok(v)
    }

    /// Sets `len` bytes at heap offset `off` of this rank to `value` (pad included).
    pub(crate) fn heap_fill(&self, off: u64, len: u64, value: u8) -> Result<()> {
        self.own_heap(off, len)?;
        let len = usize::try_from(len).map_err(|_| CudaError::TooLarge {
            what: "fill",
            size: len,
            limit: usize::MAX as u64,
        })?;
        self.dev.bind()?;
        // SAFETY: bytes `off .. off + len` lie in this rank's heap (`own_heap`), mapped into its
        // context, bound above.
        unsafe { device::memset(self.heap_ptr(self.job.rank, off)?, value, len) }
    }

    /// Device address of heap offset `off` of `peer` (see [`Memory::ptr`]).
    pub(crate) fn heap_ptr(&self, peer: u16, off: u64) -> Result<u64> {
        self.heap.ptr(peer, off).ok_or(if peer >= self.job.world {
            CudaError::BadRank {
                rank: peer,
                world: self.job.world,
            }
        } else {
            CudaError::OutOfBounds {
                what: "heap offset",
                offset: off,
                len: 0,
                lo: 0,
                hi: self.heap.stride,
            }
        })
    }

    pub(super) fn check_range(&self, off: u64, len: u64) -> Result<()> {
        guard::check_range(off, len, self.data_off, self.heap.stride)
    }
}

impl Memory<'_> {
    /// Device address of heap offset `off` of `peer`, through this rank's mapping (what
    /// `symm_ptr` computes in device code).
    pub fn ptr(&self, peer: u16, off: u64) -> Result<u64> {
        self.comm.heap_ptr(peer, off)
    }

    /// Copies bytes into this rank's heap at `off` (host to device, synchronous).
    pub fn write(&self, off: u64, bytes: &[u8]) -> Result<()> {
        let _g = self.comm.enter_any()?;
        self.comm.check_range(off, bytes.len() as u64)?;
        self.comm.heap_write(off, bytes)
    }

    /// Reads `len` bytes of this rank's heap at `off`.
    pub fn read(&self, off: u64, len: u64) -> Result<Vec<u8>> {
        let _g = self.comm.enter_any()?;
        self.comm.check_range(off, len)?;
        let len = usize::try_from(len).map_err(|_| CudaError::TooLarge {
            what: "read",
            size: len,
            limit: usize::MAX as u64,
        })?;
        let mut v = vec![0u8; len];
        self.comm.own_heap(off, len as u64)?;
        self.comm.dev.bind()?;
        // SAFETY: bytes `off .. off + len` lie in this rank's heap (`own_heap`), mapped into its
        // context, bound above.
        unsafe { device::dtoh(&mut v, self.ptr(self.comm.job.rank, off)?) }?;
        Ok(v)
    }

    /// Enqueues a copy of `bytes` from this rank's heap offset `src` into `peer`'s heap offset
    /// `dst` on `stream`, done by the copy engine (no kernel, no signal): the stream-ordered put
    /// of the symmetric heap. Both ranges are checked against the buffer area first.
    pub fn put_on_stream(
        &self,
        peer: u16,
        dst: u64,
        src: u64,
        bytes: u64,
        stream: &Stream,
    ) -> Result<()> {
        let _g = self.comm.enter_on(stream)?;
        if peer >= self.comm.job.world {
            return Err(CudaError::BadRank {
                rank: peer,
                world: self.comm.job.world,
            });
        }
        self.comm.check_range(src, bytes)?;
        self.comm.check_range(dst, bytes)?;
        let (s, d) = (self.ptr(self.comm.job.rank, src)?, self.ptr(peer, dst)?);
        let len = usize::try_from(bytes).map_err(|_| CudaError::TooLarge {
            what: "put",
            size: bytes,
            limit: usize::MAX as u64,
        })?;
        self.comm.dev.bind()?;
        let api = driver()?;
        // SAFETY: `s` and `d` address `bytes` bytes inside this rank's and `peer`'s buffer areas
        // of the heap (checked above), both mapped into this rank's context; the stream belongs
        // to this rank's device, whose context is bound.
        check("cuMemcpyDtoDAsync", unsafe {
            (api.memcpy_dtod_async)(d, s, len, stream.raw)
        })
    }

    /// Sets `len` bytes of this rank's heap at `off` to `value`.
    pub fn fill(&self, off: u64, len: u64, value: u8) -> Result<()> {
        let _g = self.comm.enter_any()?;
        self.comm.check_range(off, len)?;
        self.comm.heap_fill(off, len, value)
    }
}

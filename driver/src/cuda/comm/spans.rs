//! Collectives over device addresses: what a tensor library passes.
//!
//! A framework hands a collective its tensors by address ([`Span`]): a symmetric tensor (a
//! block of this rank's heap, [`super::blocks`]) or any other device memory of the rank's GPU.
//! [`Tensors::enqueue`] runs the request over them on the caller's stream:
//!
//! * **Where the data sits.** A span that lies in this rank's buffer area, 16-byte aligned, is
//!   used in place. Any other span is checked to lie in one device allocation of this rank's
//!   context. It runs where it lies too when the request owns that side (`Request::owns`: no
//!   peer's op names it, as in the low-latency algorithms, a ring's input or one-shot's output),
//!   a kernel runs the request and the span is 16-byte aligned: the kernel addresses it from
//!   this rank's heap base. Otherwise it is staged: copied into the request's workspace before
//!   the collective and out of it after (where the collective defines this rank's output,
//!   `Collective::delivers_to`), by the copy engine on the same stream. An output that overlaps the input is staged too (most
//!   schedules read peers' inputs while writing outputs), except an output that is the input of
//!   a request that runs in place (`Request::runs_in_place`: two-shot and the one-shot
//!   low-latency all-reduces), which runs on the symmetric tensor itself.
//! * **Workspaces.** Each distinct request gets buffers of its own, allocated collectively on
//!   its first use (so no low-latency line of one request lies in another's scratch). When the
//!   heap has no room for a new one (bytes or blocks), the least recently used workspace that
//!   no capture named is freed, collectively, and the allocation tried again: every rank makes
//!   the same calls in the same order, so every rank frees the same one. A workspace a captured
//!   graph names is kept as long as the Comm.
//! * **The ranks agree.** The first time a set of arguments (the request, and for each side the
//!   heap offset or "staged") is used, the ranks exchange it through the bootstrap, with the
//!   count of calls before it (`super::calls`), and every rank fails with
//!   [`CudaError::RanksDiffer`] when any differs: peers read each other's buffers at the
//!   offsets they compute for themselves. Later uses of the same arguments cost nothing here;
//!   a rank that changes them alone is named by the call's signature on the device.
//! * **Graphs.** Nothing here synchronises with the host after the first use, so a stream
//!   capture (`torch.cuda.graph`) records the copies and the kernel. During a capture the plan
//!   and workspace must exist already ([`CudaError::NotPrepared`] / [`CudaError::Capturing`]
//!   otherwise: run the call once before capturing), and the blocks a capture names are pinned
//!   to the captured graph ([`Tensors::pin_to_capture`]).

use std::collections::{HashMap, HashSet};

use symm_core::sched::Request;

use super::admit::{Admitted, FastHash};
use super::{Comm, Tensors};
use crate::cuda::bounds::Buffers;
use crate::cuda::copy_engine::CopyEngine;
use crate::cuda::device::Stream;
use crate::cuda::error::{check, driver, CudaError, ErrorKind, Result};
use crate::cuda::ffi::driver as ffi;

/// Distinct argument sets remembered as agreed before the memory starts over (every rank
/// forgets at the same call: they agree on the same sequence).
const MAX_AGREED: usize = 4096;

/// Device memory by address: `len` bytes from `ptr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The device address.
    pub ptr: u64,
    /// Bytes.
    pub len: u64,
}

/// The state of [`Tensors::enqueue`]: agreed argument sets, workspaces, and the admitted
/// launches of argument sets ready to run.
#[derive(Default)]
pub(crate) struct Spans {
    pub(super) agreed: HashSet<Args>,
    work: HashMap<Request, Work>,
    /// Calls so far: the clock of least recent use.
    tick: u64,
    /// Argument sets agreed, with a workspace and an admitted request: a repeated call is one
    /// lookup here.
    ready: HashMap<Args, Ready, FastHash>,
}

/// A request's workspace.
#[derive(Clone, Copy)]
struct Work {
    buffers: Buffers,
    /// The tick it was made at, or of its last use by an argument set since forgotten.
    last: u64,
    /// Whether a capture named it (then it is never freed).
    captured: bool,
}

impl Spans {
    /// Remembers `key` as agreed by every rank (the memory starts over past [`MAX_AGREED`],
    /// on every rank at the same call).
    pub(super) fn remember_agreed(&mut self, key: Args) {
        if self.agreed.len() >= MAX_AGREED {
            self.agreed.clear();
            self.forget_ready();
        }
        self.agreed.insert(key);
    }

    /// Forgets every ready argument set, keeping each workspace's last use.
    fn forget_ready(&mut self) {
        for (a, r) in self.ready.drain() {
            if let Some(w) = self.work.get_mut(&a.0) {
                w.last = w.last.max(r.last);
            }
        }
    }
}

/// An argument set: the request, and for each side its heap offset or `None` (staged).
pub(super) type Args = (Request, Option<u64>, Option<u64>);

/// What a ready argument set launches: its workspace and its admitted request, admitted under
/// the copy-engine option `engines` (another option admits it again).
#[derive(Clone)]
struct Ready {
    work: Buffers,
    /// The tick of its last use.
    last: u64,
    admitted: Admitted,
    engines: CopyEngine,
}

/// The offset of `s` from `base` when all of it lies in `[data_off, stride)` of the part
/// that starts at `base`.
fn place(base: u64, data_off: u64, stride: u64, s: Span) -> Option<u64> {
    let off = s.ptr.checked_sub(base)?;
    let end = off.checked_add(s.len)?;
    (off >= data_off && end <= stride).then_some(off)
}

impl Comm {
    /// The heap offset of `s` when all of it lies in this rank's buffer area, 16-byte aligned
    /// (what the kernels' vector accesses need; other spans are staged).
    pub(crate) fn heap_offset(&self, s: Span) -> Option<u64> {
        self.heap_place(s).filter(|off| off.is_multiple_of(16))
    }

    /// The heap offset of `s` when all of it lies in this rank's buffer area, aligned or not:
    /// a misaligned span there is staged, but it is this rank's own memory, not another's.
    fn heap_place(&self, s: Span) -> Option<u64> {
        place(
            self.heap.ptr(self.job.rank, 0)?,
            self.data_off,
            self.heap.stride,
            s,
        )
    }

    /// Where each side runs: its heap offset when used in place, `None` when staged (outside
    /// the heap or misaligned). An output that overlaps the input is staged, unless it is the
    /// input itself and the request runs in place ([`Request::runs_in_place`]: the schedule
    /// reads each place of the input before it writes that place of the output).
    fn sides(&self, req: &Request, input: Span, output: Span) -> (Option<u64>, Option<u64>) {
        let (overlaps, aliased) = overlap(req, input, output);
        (
            self.heap_offset(input),
            self.heap_offset(output).filter(|_| !overlaps || aliased),
        )
    }
}

impl Tensors {
    pub(super) fn spans_lock(&self) -> Result<std::sync::MutexGuard<'_, Spans>> {
        self.spans
            .lock()
            .map_err(|_| CudaError::LockPoisoned { what: "spans" })
    }

    /// Enqueues `req` reading `input` and writing `output` (exactly the request's input and
    /// output bytes) on `stream` and returns at once; see the module doc for staging, the
    /// ranks' agreement and graph capture. Collective: every rank enqueues the same requests in
    /// the same order. Errors of the run itself surface in [`Comm::check`].
    ///
    /// # Safety
    /// A span outside the heap must stay allocated (and not be written by other work) until
    /// the enqueued work has finished, as for any copy the caller enqueues on `stream`; it is
    /// checked to lie inside one device allocation of this rank's context.
    pub unsafe fn enqueue(
        &self,
        comm: &Comm,
        req: &Request,
        input: Span,
        output: Span,
        stream: &Stream,
    ) -> Result<()> {
        // SAFETY: the caller's contract is this one.
        unsafe { self.enqueue_with(comm, req, (input, output), stream, true) }.map(drop)
    }

    /// [`Tensors::enqueue`] when it returns without waiting on the host: the ranks agreed on
    /// these arguments before, and the request's workspace and plan exist (a repeated call).
    /// Otherwise returns `false` having enqueued nothing, and the caller calls
    /// [`Tensors::enqueue`], which may wait (a binding keeps its interpreter lock for the
    /// first and releases it for the second). One lookup either way.
    ///
    /// # Safety
    /// As [`Tensors::enqueue`].
    pub unsafe fn try_enqueue(
        &self,
        comm: &Comm,
        req: &Request,
        input: Span,
        output: Span,
        stream: &Stream,
    ) -> Result<bool> {
        // SAFETY: the caller's contract is this one.
        unsafe { self.enqueue_with(comm, req, (input, output), stream, false) }
    }

    /// [`Tensors::enqueue`]; when the arguments are not ready and `may_wait` is false, returns
    /// `false` before anything that may wait.
    ///
    /// # Safety
    /// As [`Tensors::enqueue`].
    unsafe fn enqueue_with(
        &self,
        comm: &Comm,
        req: &Request,
        (input, output): (Span, Span),
        stream: &Stream,
        may_wait: bool,
    ) -> Result<bool> {
        self.own(comm)?;
        let _g = comm.enter_on(stream)?;
        let (in_heap, out_heap) = comm.sides(req, input, output);
        let args = (*req, in_heap, out_heap);
        let found = {
            let mut s = self.spans_lock()?;
            s.tick += 1;
            let now = s.tick;
            s.ready.get_mut(&args).map(|r| {
                r.last = now;
                r.clone()
            })
        };
        let found = found.filter(|r| r.engines == comm.copy_engine());
        // A ready argument set was admitted: its sizes are the admission's, its request checked.
        let need = match &found {
            Some(r) => r.admitted.sizes(),
            None if !may_wait => return Ok(false),
            None => {
                comm.check_shape(req, comm.job.world)?;
                req.buffer_sizes()
            }
        };
        for (what, s, want) in [
            ("input bytes", input, need.input),
            ("output bytes", output, need.output),
        ] {
            if s.len != want {
                return Err(CudaError::SizeMismatch {
                    what,
                    have: s.len,
                    want,
                });
            }
        }
        // A staged span inside this rank's buffer area (an output over its own input, a view
        // off the 16-byte grid) is this rank's heap memory: only a span from elsewhere costs
        // the driver's pointer query, which refuses another heap's memory.
        for (s, heap) in [(input, in_heap), (output, out_heap)] {
            if heap.is_none() && s.len > 0 && comm.heap_place(s).is_none() {
                comm.check_device_span(s)?;
            }
        }
        let (ws, a, capturing) = match found {
            Some(r) => (r.work, r.admitted, stream.capturing_bound()?),
            None => self.first_use(comm, args, stream)?,
        };
        let owned = owned_sides(&a, (input, in_heap), (output, out_heap));
        let me = comm.heap_ptr(comm.job.rank, 0)?;
        // An owned side is addressed from this rank's heap base (the kernel's sum wraps).
        let at = |s: Span, heap: Option<u64>, owned: bool, work: u64| match heap {
            Some(o) => o,
            None if owned => s.ptr.wrapping_sub(me),
            None => work,
        };
        let b = Buffers {
            input: at(input, in_heap, owned[0], ws.input),
            output: at(output, out_heap, owned[1], ws.output),
            scratch: ws.scratch,
            sizes: need,
        };
        if capturing {
            let heap = [
                (in_heap.is_some() || !owned[0], (b.input, need.input)),
                (out_heap.is_some() || !owned[1], (b.output, need.output)),
            ];
            let ranges: Vec<(u64, u64)> = heap.iter().filter(|h| h.0).map(|h| h.1).collect();
            self.pin_to_capture(stream, &ranges)?;
            if let Some(w) = self.spans_lock()?.work.get_mut(req) {
                w.captured = true;
            }
        }
        if in_heap.is_none() && !owned[0] {
            copy(comm.heap_ptr(comm.job.rank, ws.input)?, input, stream)?;
        }
        // Whether the stream captures was asked once, above: the launch's order reuses it.
        comm.launch_entered(&a, (&b, owned), stream, Some(capturing), None)?;
        // A staged output comes back only where the collective defines it (a rooted reduce's
        // other ranks keep their buffer).
        if out_heap.is_none() && !owned[1] && req.collective.delivers_to(comm.job.rank) {
            let from = Span {
                ptr: comm.heap_ptr(comm.job.rank, ws.output)?,
                len: output.len,
            };
            copy(output.ptr, from, stream)?;
        }
        self.calls.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Ok(true)
    }

    /// The first use of an argument set (or its first since the agreed sets started over, or
    /// since the copy-engine option changed), its request checked by the caller: agrees on the
    /// arguments with every rank (once), makes the workspace and admits the request; returns
    /// the workspace, the admitted request and whether `stream` is capturing.
    fn first_use(
        &self,
        comm: &Comm,
        args: Args,
        stream: &Stream,
    ) -> Result<(Buffers, Admitted, bool)> {
        let (req, in_heap, out_heap) = args;
        self.agree_args(comm, &req, in_heap, out_heap)?;
        let capturing = stream.capturing_bound()?;
        let ws = self.workspace(comm, &req, capturing)?;
        let engines = comm.copy_engine();
        let a = if capturing {
            // Said in the caller's terms: run the call once before capturing it.
            comm.admit_prepared((0, req), comm.buffer_area(), comm.job.world)
                .map_err(|_| CudaError::Capturing {
                    what: "a collective's first use (its plan)",
                })?
        } else {
            comm.admit(&req)?
        };
        let mut s = self.spans_lock()?;
        if s.agreed.contains(&args) {
            let last = s.tick;
            s.ready.insert(
                args,
                Ready {
                    last,
                    work: ws,
                    admitted: a.clone(),
                    engines,
                },
            );
        }
        Ok((ws, a, capturing))
    }
}

/// Which sides outside the heap (`None` offsets) run where they lie, unstaged: those the
/// request owns (`Request::owns`: only this rank's ops name them) when a kernel runs it,
/// 16-byte aligned and not empty. An owned output that overlaps the input runs unstaged
/// only when the input is staged (the kernel reads the copy) or the output is the input
/// and the request runs in place; otherwise it is staged, as `sides` does in the heap.
fn owned_sides(
    a: &Admitted,
    (input, in_heap): (Span, Option<u64>),
    (output, out_heap): (Span, Option<u64>),
) -> [bool; 2] {
    let req = a.request();
    let owns = req.owns();
    let kernel = a.executor() != crate::cuda::comm::Executor::CopyEngines;
    let ok = |s: Span, heap: Option<u64>, own: bool| {
        heap.is_none() && own && kernel && s.len > 0 && s.ptr.is_multiple_of(16)
    };
    let i = ok(input, in_heap, owns[0]);
    let o = ok(output, out_heap, owns[1]);
    let (overlaps, aliased) = overlap(req, input, output);
    // Over the input, an output may be written where it lies only when the kernel reads
    // the input elsewhere (staged into the workspace) or the request runs in place on it.
    let staged_in = in_heap.is_none() && !i;
    [i, o && (!overlaps || aliased || staged_in)]
}

/// Whether `output` overlaps `input`, and whether it is the input itself of a request that runs
/// in place ([`Request::runs_in_place`]).
fn overlap(req: &Request, input: Span, output: Span) -> (bool, bool) {
    let overlaps = output.ptr < input.ptr.saturating_add(input.len)
        && input.ptr < output.ptr.saturating_add(output.len);
    (overlaps, output == input && req.runs_in_place())
}

/// Enqueues a device-to-device copy of `src` to `dst` on `stream` (context bound).
fn copy(dst: u64, src: Span, stream: &Stream) -> Result<()> {
    if src.len == 0 {
        return Ok(());
    }
    let len = usize::try_from(src.len).map_err(|_| CudaError::TooLarge {
        what: "staged copy",
        size: src.len,
        limit: usize::MAX as u64,
    })?;
    let api = driver()?;
    // SAFETY: both ranges were checked: one lies in this rank's buffer area (a workspace of
    // the request's sizes), the other in one device allocation of this context
    // (`check_device_span`), which the caller keeps alive until the copy ran.
    check("cuMemcpyDtoDAsync", unsafe {
        (api.memcpy_dtod_async)(dst, src.ptr, len, stream.raw())
    })
}

impl Comm {
    /// Fails unless `s` lies inside one device allocation of this rank's context.
    pub(super) fn check_device_span(&self, s: Span) -> Result<()> {
        let bad = CudaError::NotDeviceMemory {
            ptr: s.ptr,
            len: s.len,
        };
        let api = ffi::graph_api().map_err(|e| CudaError::Unavailable(e.into()))?;
        let mut attrs = [
            ffi::POINTER_CONTEXT,
            ffi::POINTER_RANGE_START,
            ffi::POINTER_RANGE_SIZE,
            ffi::POINTER_DEVICE_ORDINAL,
        ];
        let (mut ctx, mut start, mut size, mut ordinal) = (
            std::ptr::null_mut::<std::ffi::c_void>(),
            0u64,
            0usize,
            -1i32,
        );
        let mut data = [
            (&mut ctx as *mut *mut std::ffi::c_void).cast(),
            (&mut start as *mut u64).cast(),
            (&mut size as *mut usize).cast(),
            (&mut ordinal as *mut i32).cast(),
        ];
        // SAFETY: four attributes with out-pointers of their types (a context handle, a device
        // address, a size, an int); the driver only reads the address `s.ptr`.
        let rc = unsafe {
            (api.pointer_get_attributes)(4, attrs.as_mut_ptr(), data.as_mut_ptr(), s.ptr)
        };
        if rc != 0 || start == 0 {
            return Err(bad);
        }
        let end = s
            .ptr
            .checked_add(s.len)
            .ok_or(CudaError::Overflow { what: "span end" })?;
        let inside = s.ptr >= start && end <= start.saturating_add(size as u64);
        // Memory of the driver's virtual memory API has no context: its device says whose
        // it is (a peer's memory mapped here is not this rank's).
        let ours = (ctx.is_null() || ctx == self.dev.context()) && ordinal == self.dev.ordinal();
        if !(inside && ours) {
            return Err(bad);
        }
        // Symmetric memory, but not of this rank's part of this heap (the caller looked there
        // first): another communicator's, or a peer's.
        if crate::cuda::vmm::in_a_heap(s.ptr) {
            return Err(CudaError::WrongOwner {
                what: "memory of another communicator's symmetric heap (or of a peer)",
            });
        }
        Ok(())
    }
}

impl Tensors {
    /// Collective: [`Comm::reset`], having forgotten which argument sets the ranks agreed on
    /// (a failed call may have left one rank agreed and the others not), so each is agreed
    /// again at its next use. Workspaces stay.
    pub fn reset(&self, comm: &Comm) -> Result<()> {
        {
            let mut s = self.spans_lock()?;
            s.agreed.clear();
            s.forget_ready();
        }
        // Every rank counts its calls from zero again (the fault may have parted them).
        self.calls.store(0, std::sync::atomic::Ordering::Release);
        comm.reset()
    }

    /// The request's workspace, allocated (collectively) on its first use.
    fn workspace(&self, comm: &Comm, req: &Request, capturing: bool) -> Result<Buffers> {
        if let Some(w) = self.spans_lock()?.work.get(req) {
            return Ok(w.buffers);
        }
        if capturing {
            return Err(CudaError::Capturing {
                what: "a collective's first use (its workspace and plan)",
            });
        }
        // A request larger than the whole buffer area never fits: evicting would not help.
        let (start, end) = comm.buffer_area();
        let area = end.saturating_sub(start);
        let sizes = req.buffer_sizes();
        let round = |n: u64| n.max(16).div_ceil(4096).saturating_mul(4096);
        let need = [sizes.input, sizes.output, sizes.scratch]
            .map(round)
            .iter()
            .fold(0u64, |a, &n| a.saturating_add(n));
        let b = loop {
            match comm.alloc(req) {
                Ok(b) => break b,
                // The heap's state is the same on every rank, so every rank lands here at the
                // same call and frees the same workspace.
                Err(e) if e.kind() == ErrorKind::OutOfMemory && need <= area => {
                    if !self.evict_one(comm)? {
                        return Err(e);
                    }
                }
                Err(e) => return Err(e),
            }
        };
        comm.prepare(&[*req])?;
        let mut s = self.spans_lock()?;
        let last = s.tick;
        s.work.insert(
            *req,
            Work {
                buffers: b,
                last,
                captured: false,
            },
        );
        Ok(b)
    }

    /// Collective: frees the least recently used workspace that no capture named (ticks are
    /// unique, so every rank picks the same one); `false` when there is none.
    fn evict_one(&self, comm: &Comm) -> Result<bool> {
        let victim = {
            let s = self.spans_lock()?;
            let last_use = |r: &Request, w: &Work| {
                let used = s
                    .ready
                    .iter()
                    .filter(|(a, _)| a.0 == *r)
                    .map(|(_, x)| x.last);
                used.max().unwrap_or(0).max(w.last)
            };
            // Ties (two threads' calls) fall to the lower offset: the same on every rank.
            s.work
                .iter()
                .filter(|(_, w)| !w.captured)
                .min_by_key(|(r, w)| (last_use(r, w), w.buffers.input))
                .map(|(r, w)| (*r, w.buffers))
        };
        let Some((req, b)) = victim else {
            return Ok(false);
        };
        comm.free(&b)?;
        let mut s = self.spans_lock()?;
        s.work.remove(&req);
        s.ready.retain(|a, _| a.0 != req);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_off_the_grid_inside_the_buffer_area_is_this_ranks_own_memory() {
        let (base, data_off, stride) = (1 << 40, 4096, 1 << 20);
        let at = |off: u64, len: u64| {
            place(
                base,
                data_off,
                stride,
                Span {
                    ptr: base + off,
                    len,
                },
            )
        };
        // A view one f32 into a block: staged (not on the grid), but placed in the heap.
        assert_eq!(at(data_off + 4, 256), Some(data_off + 4));
        assert_eq!(at(data_off, 256), Some(data_off));
        assert_eq!(at(stride - 256, 256), Some(stride - 256));
        // Outside the buffer area: the header, past the part, below the base, wrapping.
        assert_eq!(at(0, 16), None);
        assert_eq!(at(stride - 255, 256), None);
        assert_eq!(
            place(
                base,
                data_off,
                stride,
                Span {
                    ptr: base - 16,
                    len: 16
                }
            ),
            None
        );
        assert_eq!(at(data_off, u64::MAX), None);
    }
}

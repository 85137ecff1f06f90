//! Every exported function: the only module that touches raw pointers.
//!
//! Each function checks its pointers for null before anything else, reads and writes through
//! them unaligned (so a packed C struct is no undefined behaviour), bounds every length it is
//! given, and runs its body under `guard`: a panic never crosses the boundary, it returns
//! `SYMM_ERR_INTERNAL`. Every call records its outcome for `symm_last_error` on the calling
//! thread (cleared on success).

use std::any::Any;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};

use symm_core::plan::OP_BYTES;

use crate::api::{self, TraceWriter};
use crate::error::{self, Error, SYMM_OK};
use crate::types::{
    symm_buffer_sizes, symm_buffers, symm_comm, symm_comm_options, symm_event, symm_link, symm_op,
    symm_request, symm_schedule, symm_trace_writer,
};
use symm_driver::cuda::device::{Stream, StreamRef};
use symm_driver::cuda::Comm;

/// Runs `body`, records the outcome for `symm_last_error` and returns the status (or the body's
/// non-negative result). Everything runs under `catch_unwind`, recording included (formatting
/// the message, storing it): any panic is `SYMM_ERR_INTERNAL`, never an unwind into C.
fn guard(body: impl FnOnce() -> Result<c_int, Error>) -> c_int {
    guard_with(body, error::set_last)
}

/// [`guard`] with the recording step given.
fn guard_with(
    body: impl FnOnce() -> Result<c_int, Error>,
    record: impl FnOnce(Option<&Error>),
) -> c_int {
    let run = catch_unwind(AssertUnwindSafe(|| {
        let outcome = body();
        record(outcome.as_ref().err());
        match outcome {
            Ok(v) => v,
            Err(e) => e.status(),
        }
    }));
    match run {
        Ok(status) => status,
        Err(payload) => {
            discard(payload);
            contain(error::set_last_internal, ());
            Error::Internal.status()
        }
    }
}

/// Runs `f`, or returns `fallback` when it panics; no panic leaves this function.
fn contain<R>(f: impl FnOnce() -> R, fallback: R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(payload) => {
            discard(payload);
            fallback
        }
    }
}

/// Drops a panic's payload; when its destructor panics too, that payload is leaked instead of
/// unwinding further.
fn discard(payload: Box<dyn Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(again);
    }
}

/// `p`, or `Error::Null` naming `arg`.
fn nonnull<P: Ptr>(p: P, arg: &'static str) -> Result<P, Error> {
    if p.null() {
        Err(Error::Null { arg })
    } else {
        Ok(p)
    }
}

/// Raw pointers of either mutability.
trait Ptr: Copy {
    fn null(self) -> bool;
}

impl<T> Ptr for *const T {
    fn null(self) -> bool {
        self.is_null()
    }
}

impl<T> Ptr for *mut T {
    fn null(self) -> bool {
        self.is_null()
    }
}

/// Reads a `T` from a pointer the caller vouches for.
///
/// # Safety
/// `p` is null or valid for reads of a `T` (any alignment).
unsafe fn read<T: Copy>(p: *const T, arg: &'static str) -> Result<T, Error> {
    let p = nonnull(p, arg)?;
    // SAFETY: `p` is not null and the caller guarantees it is valid for reads of a `T`;
    // `read_unaligned` needs no alignment.
    Ok(unsafe { p.read_unaligned() })
}

/// Writes a `T` through a pointer checked non-null beforehand.
///
/// # Safety
/// `p` is non-null and valid for writes of a `T` (any alignment).
unsafe fn write<T>(p: *mut T, v: T) {
    // SAFETY: the caller guarantees `p` is non-null and valid for writes of a `T`.
    unsafe { p.write_unaligned(v) }
}

/// Copies the message of the last failed call on this thread into `buf` (at most `len - 1`
/// bytes and a NUL) and returns the message's full length (0 when the last call succeeded).
///
/// # Safety
/// `buf` is null or valid for writes of `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn symm_last_error(buf: *mut c_char, len: usize) -> usize {
    contain(
        || {
            error::with_last(|msg| {
                if !buf.is_null() && len > 0 {
                    let n = msg.len().min(len - 1);
                    // SAFETY: `buf` is non-null and valid for `len` bytes; `n + 1 <= len`, and `msg`
                    // is a live Rust string that cannot overlap the caller's buffer.
                    unsafe {
                        std::ptr::copy_nonoverlapping(msg.as_ptr(), buf.cast::<u8>(), n);
                        buf.add(n).write(0);
                    }
                }
                msg.len()
            })
        },
        0,
    )
}

/// The name of a status (`"SYMM_OK"`, `"SYMM_ERR_NULL"`, ...), or `"SYMM_UNKNOWN_STATUS"`:
/// a static, NUL-terminated string the caller must not free.
#[no_mangle]
pub extern "C" fn symm_status_name(status: c_int) -> *const c_char {
    const UNKNOWN: &CStr = c"SYMM_UNKNOWN_STATUS";
    contain(|| error::status_name(status).unwrap_or(UNKNOWN), UNKNOWN).as_ptr()
}

/// The ABI version this library implements; compare with `SYMM_ABI_VERSION` of the header.
#[no_mangle]
pub extern "C" fn symm_abi_version() -> u32 {
    api::ABI_VERSION
}

/// Checks a request: `SYMM_OK`, or `SYMM_ERR_INVALID` with the reason in `symm_last_error`.
///
/// # Safety
/// `req` is null or points to a readable `symm_request`.
#[no_mangle]
pub unsafe extern "C" fn symm_request_validate(req: *const symm_request) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract on `req`.
        unsafe { read(req, "req") }?.validated()?;
        Ok(SYMM_OK)
    })
}

/// Writes the input, output and scratch bytes each rank needs for a valid request to `out`.
///
/// # Safety
/// `req` is null or readable; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn symm_request_buffer_sizes(
    req: *const symm_request,
    out: *mut symm_buffer_sizes,
) -> c_int {
    guard(|| {
        let out = nonnull(out, "out")?;
        // SAFETY: the caller's contract on `req`.
        let sizes = api::buffer_sizes(&unsafe { read(req, "req") }?)?;
        // SAFETY: `out` is non-null and, by the caller's contract, writable.
        unsafe { write(out, sizes) };
        Ok(SYMM_OK)
    })
}

/// Starts iterating the ops of (`rank`, `channel`) of a valid request; `*out` receives a
/// schedule to free with [`symm_schedule_free`]. All-to-allv needs per-pair counts and is
/// refused.
///
/// # Safety
/// `req` is null or readable; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn symm_schedule_new(
    req: *const symm_request,
    rank: u16,
    channel: u16,
    out: *mut *mut symm_schedule,
) -> c_int {
    guard(|| {
        let out = nonnull(out, "out")?;
        // SAFETY: the caller's contract on `req`.
        let s = api::schedule(&unsafe { read(req, "req") }?, rank, channel)?;
        let handle = Box::into_raw(Box::new(symm_schedule(s)));
        // SAFETY: `out` is non-null and, by the caller's contract, writable.
        unsafe { write(out, handle) };
        Ok(SYMM_OK)
    })
}

/// Writes the schedule's next op to `out` and returns 1, or returns 0 at the end (`out`
/// untouched), or a negative status.
///
/// # Safety
/// `s` is null or a live schedule of [`symm_schedule_new`] not used by another thread at the
/// same time; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn symm_schedule_next(s: *mut symm_schedule, out: *mut symm_op) -> c_int {
    guard(|| {
        let s = nonnull(s, "schedule")?;
        let out = nonnull(out, "out")?;
        // SAFETY: `s` is a live, unshared schedule by the caller's contract.
        let sched = unsafe { &mut (*s).0 };
        match sched.next() {
            Some(op) => {
                // SAFETY: `out` is non-null and, by the caller's contract, writable.
                unsafe { write(out, symm_op::of(&op)) };
                Ok(1)
            }
            None => Ok(0),
        }
    })
}

/// Writes the schedule's total number of ops (from its start, whatever was iterated) to
/// `out`; it walks a copy, so it costs time linear in the count and no memory.
///
/// # Safety
/// `s` is null or a live schedule; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn symm_schedule_count(s: *const symm_schedule, out: *mut u64) -> c_int {
    guard(|| {
        let s = nonnull(s, "schedule")?;
        let out = nonnull(out, "out")?;
        // SAFETY: `s` is a live schedule by the caller's contract; only read here.
        let n = unsafe { &(*s).0 }.count();
        // SAFETY: `out` is non-null and, by the caller's contract, writable.
        unsafe { write(out, n) };
        Ok(SYMM_OK)
    })
}

/// Frees a schedule; null is ignored.
///
/// # Safety
/// `s` is null or a schedule of [`symm_schedule_new`] not freed before and not used after.
#[no_mangle]
pub unsafe extern "C" fn symm_schedule_free(s: *mut symm_schedule) {
    if !s.is_null() {
        // SAFETY: `s` came from `Box::into_raw` in `symm_schedule_new` and is freed once.
        let b = unsafe { Box::from_raw(s) };
        contain(move || drop(b), ());
    }
}

/// Writes the 64-byte plan encoding of an op (what the GPU interpreter reads) to `out`, which
/// holds `len` bytes (`SYMM_ERR_TOO_SMALL` below `SYMM_PLAN_OP_BYTES`).
///
/// # Safety
/// `op` is null or readable; `out` is null or writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn symm_op_encode(op: *const symm_op, out: *mut u8, len: usize) -> c_int {
    guard(|| {
        let out = nonnull(out, "out")?;
        // SAFETY: the caller's contract on `op`.
        let bytes = api::encode(&unsafe { read(op, "op") }?)?;
        if len < OP_BYTES {
            return Err(Error::TooSmall {
                need: OP_BYTES,
                have: len,
            });
        }
        // SAFETY: `out` is non-null and writable for `len >= OP_BYTES` bytes by the caller's
        // contract; `bytes` is a local array.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), out, OP_BYTES) };
        Ok(SYMM_OK)
    })
}

/// Reads an op from its 64-byte plan encoding (`len` bytes at `bytes`; only the first 64 are
/// read) into `out`.
///
/// # Safety
/// `bytes` is null or readable for `len` bytes; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn symm_op_decode(bytes: *const u8, len: usize, out: *mut symm_op) -> c_int {
    guard(|| {
        let bytes = nonnull(bytes, "bytes")?;
        let out = nonnull(out, "out")?;
        // SAFETY: `bytes` is non-null and readable for `len` bytes by the caller's contract;
        // at most `OP_BYTES` of them are viewed.
        let slice = unsafe { std::slice::from_raw_parts(bytes, len.min(OP_BYTES)) };
        let op = api::decode(slice)?;
        // SAFETY: `out` is non-null and, by the caller's contract, writable.
        unsafe { write(out, op) };
        Ok(SYMM_OK)
    })
}

/// Fills `out` with a named link (`SYMM_LINK_*`).
///
/// # Safety
/// `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn symm_link_preset(preset: u32, out: *mut symm_link) -> c_int {
    guard(|| {
        let out = nonnull(out, "out")?;
        let link = symm_link::preset(preset)?;
        // SAFETY: `out` is non-null and, by the caller's contract, writable.
        unsafe { write(out, link) };
        Ok(SYMM_OK)
    })
}

/// Writes the cost model's prediction for a valid request on `link` to `us_out`, in
/// microseconds, launch included.
///
/// # Safety
/// `req` and `link` are null or readable; `us_out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn symm_cost_predict(
    req: *const symm_request,
    link: *const symm_link,
    us_out: *mut f64,
) -> c_int {
    guard(|| {
        let us_out = nonnull(us_out, "us_out")?;
        // SAFETY: the caller's contract on `req` and `link`.
        let (req, link) = unsafe { (read(req, "req")?, read(link, "link")?) };
        let us = api::predict(&req, &link)?;
        // SAFETY: `us_out` is non-null and, by the caller's contract, writable.
        unsafe { write(us_out, us) };
        Ok(SYMM_OK)
    })
}

/// Writes the algorithm (`SYMM_ALG_*`) the cost model predicts fastest for the request on
/// `link` to `algorithm_out`; the request's own algorithm is ignored, multicast is considered
/// only when `multicast` is nonzero; with `SYMM_REQUEST_DETERMINISTIC`, only algorithms that
/// honour deterministic mode.
///
/// # Safety
/// `req` and `link` are null or readable; `algorithm_out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn symm_cost_select(
    req: *const symm_request,
    link: *const symm_link,
    multicast: c_int,
    algorithm_out: *mut u32,
) -> c_int {
    guard(|| {
        let algorithm_out = nonnull(algorithm_out, "algorithm_out")?;
        // SAFETY: the caller's contract on `req` and `link`.
        let (req, link) = unsafe { (read(req, "req")?, read(link, "link")?) };
        let alg = api::select(&req, &link, multicast != 0)?;
        // SAFETY: `algorithm_out` is non-null and, by the caller's contract, writable.
        unsafe { write(algorithm_out, alg) };
        Ok(SYMM_OK)
    })
}

/// Starts a trace of a valid request recorded on `source` (`SYMM_SOURCE_*`) with
/// `time_unit_ns` nanoseconds per time unit, holding at most `max_events` events
/// (1..=`SYMM_TRACE_MAX_EVENTS`); `*out` receives the writer.
///
/// # Safety
/// `req` is null or readable; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn symm_trace_writer_new(
    req: *const symm_request,
    source: u32,
    time_unit_ns: u32,
    max_events: u64,
    out: *mut *mut symm_trace_writer,
) -> c_int {
    guard(|| {
        let out = nonnull(out, "out")?;
        // SAFETY: the caller's contract on `req`.
        let req = unsafe { read(req, "req") }?;
        let w = TraceWriter::new(&req, source, time_unit_ns, max_events)?;
        let handle = Box::into_raw(Box::new(symm_trace_writer(w)));
        // SAFETY: `out` is non-null and, by the caller's contract, writable.
        unsafe { write(out, handle) };
        Ok(SYMM_OK)
    })
}

/// Adds an event (in any order: the trace is sorted when finished); `SYMM_ERR_LIMIT` once the
/// writer holds `max_events`.
///
/// # Safety
/// `w` is null or a live writer not used by another thread at the same time; `event` is null
/// or readable.
#[no_mangle]
pub unsafe extern "C" fn symm_trace_writer_event(
    w: *mut symm_trace_writer,
    event: *const symm_event,
) -> c_int {
    guard(|| {
        let w = nonnull(w, "writer")?;
        // SAFETY: the caller's contract on `event`.
        let e = unsafe { read(event, "event") }?;
        // SAFETY: `w` is a live, unshared writer by the caller's contract.
        unsafe { &mut (*w).0 }.event(&e)?;
        Ok(SYMM_OK)
    })
}

/// Ends a trace: frees the writer (whatever the outcome, unless it is null) and on success
/// stores the trace's bytes in `*bytes` and their count in `*len`; free them with
/// [`symm_bytes_free`].
///
/// # Safety
/// `w` is null or a live writer not used after; `bytes` and `len` are null or writable.
#[no_mangle]
pub unsafe extern "C" fn symm_trace_writer_finish(
    w: *mut symm_trace_writer,
    bytes: *mut *mut u8,
    len: *mut usize,
) -> c_int {
    guard(|| {
        let w = nonnull(w, "writer")?;
        // SAFETY: `w` came from `Box::into_raw` in `symm_trace_writer_new`; the caller does not
        // use it after this call, which frees it on every path.
        let w = unsafe { Box::from_raw(w) };
        let bytes = nonnull(bytes, "bytes")?;
        let len = nonnull(len, "len")?;
        let trace = w.0.finish()?.into_boxed_slice();
        let n = trace.len();
        let ptr = Box::into_raw(trace).cast::<u8>();
        // SAFETY: `bytes` and `len` are non-null and, by the caller's contract, writable.
        unsafe {
            write(bytes, ptr);
            write(len, n);
        }
        Ok(SYMM_OK)
    })
}

/// Frees a writer without finishing its trace; null is ignored.
///
/// # Safety
/// `w` is null or a writer of [`symm_trace_writer_new`] not freed or finished before and not
/// used after.
#[no_mangle]
pub unsafe extern "C" fn symm_trace_writer_free(w: *mut symm_trace_writer) {
    if !w.is_null() {
        // SAFETY: `w` came from `Box::into_raw` in `symm_trace_writer_new` and is freed once.
        let b = unsafe { Box::from_raw(w) };
        contain(move || drop(b), ());
    }
}

/// Frees bytes returned by [`symm_trace_writer_finish`]; null is ignored.
///
/// # Safety
/// `bytes` and `len` are exactly what one `symm_trace_writer_finish` returned, freed once.
#[no_mangle]
pub unsafe extern "C" fn symm_bytes_free(bytes: *mut u8, len: usize) {
    if !bytes.is_null() {
        let slice = std::ptr::slice_from_raw_parts_mut(bytes, len);
        // SAFETY: `bytes` and `len` are a boxed slice's pointer and length leaked by
        // `symm_trace_writer_finish`, freed once by the caller's contract.
        drop(unsafe { Box::from_raw(slice) });
    }
}

/// Joins the job its environment describes (`WORLD_SIZE`, `RANK`, `SYMM_JOB`, `LOCAL_RANK`)
/// as one rank on its GPU; `*out` receives the communicator. `opts` null takes the defaults.
/// Collective: every rank of the job calls it. Without the job's environment it returns
/// `SYMM_ERR_UNAVAILABLE` naming the missing variable, and so it does when the CUDA libraries
/// cannot be loaded.
///
/// # Safety
/// `opts` is null or readable; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn symm_comm_from_env(
    opts: *const symm_comm_options,
    out: *mut *mut symm_comm,
) -> c_int {
    guard(|| {
        let out = nonnull(out, "out")?;
        let opts = if opts.is_null() {
            symm_comm_options::default()
        } else {
            // SAFETY: `opts` is non-null and, by the caller's contract, readable.
            unsafe { read(opts, "opts") }?
        };
        let comm = Comm::from_env(opts.to_options()?)?;
        let handle = Box::into_raw(Box::new(symm_comm(comm)));
        // SAFETY: `out` is non-null and, by the caller's contract, writable.
        unsafe { write(out, handle) };
        Ok(SYMM_OK)
    })
}

/// A live communicator behind a pointer the caller vouches for.
///
/// # Safety
/// `comm` is null or a live communicator of [`symm_comm_from_env`], not freed during the
/// returned borrow.
unsafe fn comm_ref<'a>(comm: *mut symm_comm) -> Result<&'a Comm, Error> {
    let comm = nonnull(comm, "comm")?;
    // SAFETY: `comm` is non-null and, by the caller's contract, a live communicator that
    // outlives the borrow; only shared access is taken (every `Comm` call takes `&self`).
    Ok(unsafe { &(*comm).0 })
}

/// Ends this rank's part in the job in order (waits for its device, then for every rank) and
/// frees the communicator whatever the outcome (unless it is null).
///
/// # Safety
/// `comm` is null or a live communicator not used after, and no other thread uses it during
/// the call.
#[no_mangle]
pub unsafe extern "C" fn symm_comm_finish(comm: *mut symm_comm) -> c_int {
    guard(|| {
        let comm = nonnull(comm, "comm")?;
        // SAFETY: `comm` came from `Box::into_raw` in `symm_comm_from_env`; the caller does not
        // use it after this call, which frees it on every path.
        let comm = unsafe { Box::from_raw(comm) };
        comm.0.finish()?;
        Ok(SYMM_OK)
    })
}

/// Frees a communicator without finishing (the job's other ranks see this rank as lost);
/// null is ignored.
///
/// # Safety
/// `comm` is null or a communicator of [`symm_comm_from_env`] not freed or finished before,
/// not used after, and not in use by another thread.
#[no_mangle]
pub unsafe extern "C" fn symm_comm_free(comm: *mut symm_comm) {
    if !comm.is_null() {
        // SAFETY: `comm` came from `Box::into_raw` in `symm_comm_from_env` and is freed once.
        let b = unsafe { Box::from_raw(comm) };
        contain(move || drop(b), ());
    }
}

/// Writes this rank to `out`.
///
/// # Safety
/// `comm` is null or live; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn symm_comm_rank(comm: *mut symm_comm, out: *mut u16) -> c_int {
    guard(|| {
        let out = nonnull(out, "out")?;
        // SAFETY: the caller's contract on `comm`.
        let rank = unsafe { comm_ref(comm) }?.rank();
        // SAFETY: `out` is non-null and, by the caller's contract, writable.
        unsafe { write(out, rank) };
        Ok(SYMM_OK)
    })
}

/// Writes the number of ranks in the job to `out`.
///
/// # Safety
/// `comm` is null or live; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn symm_comm_world(comm: *mut symm_comm, out: *mut u16) -> c_int {
    guard(|| {
        let out = nonnull(out, "out")?;
        // SAFETY: the caller's contract on `comm`.
        let world = unsafe { comm_ref(comm) }?.world();
        // SAFETY: `out` is non-null and, by the caller's contract, writable.
        unsafe { write(out, world) };
        Ok(SYMM_OK)
    })
}

/// Collective: places buffers for a valid request in the symmetric heap, at the same offsets
/// on every rank, and writes them to `out`.
///
/// # Safety
/// `comm` is null or live; `req` is null or readable; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn symm_comm_alloc(
    comm: *mut symm_comm,
    req: *const symm_request,
    out: *mut symm_buffers,
) -> c_int {
    guard(|| {
        let out = nonnull(out, "out")?;
        // SAFETY: the caller's contract on `req`.
        let req = unsafe { read(req, "req") }?.validated()?;
        // SAFETY: the caller's contract on `comm`.
        let b = unsafe { comm_ref(comm) }?.alloc(&req)?;
        // SAFETY: `out` is non-null and, by the caller's contract, writable.
        unsafe { write(out, symm_buffers::of(&b)) };
        Ok(SYMM_OK)
    })
}

/// Collective: returns buffers of [`symm_comm_alloc`] to the heap after this rank's device
/// finished its work; every offset is checked first, so a bad set frees nothing.
///
/// # Safety
/// `comm` is null or live; `buffers` is null or readable.
#[no_mangle]
pub unsafe extern "C" fn symm_comm_free_buffers(
    comm: *mut symm_comm,
    buffers: *const symm_buffers,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract on `buffers`.
        let b = unsafe { read(buffers, "buffers") }?.to_buffers();
        // SAFETY: the caller's contract on `comm`.
        unsafe { comm_ref(comm) }?.free(&b)?;
        Ok(SYMM_OK)
    })
}

/// Writes the device address of heap offset `offset` of rank `peer`, through this rank's
/// mapping, to `out`.
///
/// # Safety
/// `comm` is null or live; `out` is null or writable.
#[no_mangle]
pub unsafe extern "C" fn symm_comm_ptr(
    comm: *mut symm_comm,
    peer: u16,
    offset: u64,
    out: *mut u64,
) -> c_int {
    guard(|| {
        let out = nonnull(out, "out")?;
        // SAFETY: the caller's contract on `comm`.
        let p = unsafe { comm_ref(comm) }?.memory().ptr(peer, offset)?;
        // SAFETY: `out` is non-null and, by the caller's contract, writable.
        unsafe { write(out, p) };
        Ok(SYMM_OK)
    })
}

/// Wraps the caller's `CUstream` without taking it over, lent for the call (`Stream::lent`:
/// no retain of the context, which `comm`'s device holds).
///
/// # Safety
/// `stream` is null (the legacy default stream) or a valid stream of `comm`'s device context
/// that outlives the wrapper and every piece of work enqueued through it.
unsafe fn borrow_stream(comm: &Comm, stream: *mut ()) -> Result<StreamRef<'_>, Error> {
    // SAFETY: the caller's contract is `Stream::lent`'s: a valid stream (or null) of the
    // device's primary context, valid as long as the wrapper and the work enqueued through it.
    Ok(unsafe { Stream::lent(stream.cast(), comm.device()) })
}

/// Enqueues a valid request's collective on buffers of [`symm_comm_alloc`] on the caller's
/// `CUstream` (NULL: the legacy default stream) and returns without waiting; errors of the
/// work itself surface in [`symm_comm_check`] or [`symm_comm_synchronize`].
///
/// # Safety
/// `comm` is null or live; `req` and `buffers` are null or readable; `stream` is NULL or a
/// valid `CUstream` of the communicator's device context (its primary context) that stays
/// valid until the enqueued work has finished.
#[no_mangle]
pub unsafe extern "C" fn symm_comm_enqueue(
    comm: *mut symm_comm,
    req: *const symm_request,
    buffers: *const symm_buffers,
    stream: *mut (),
) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract on `req` and `buffers`.
        let (req, b) = unsafe { (read(req, "req")?, read(buffers, "buffers")?) };
        let req = req.validated()?;
        // SAFETY: the caller's contract on `comm`.
        let comm = unsafe { comm_ref(comm) }?;
        // SAFETY: the caller's contract on `stream`, which is `borrow_stream`'s.
        let stream = unsafe { borrow_stream(comm, stream) }?;
        comm.enqueue(&req, &b.to_buffers(), &stream)?;
        Ok(SYMM_OK)
    })
}

/// Reports asynchronous errors of the collectives enqueued so far without waiting: a device
/// timeout (`SYMM_ERR_TIMEOUT`), a lost peer (`SYMM_ERR_PEER_LOST`), and after an error
/// `SYMM_ERR_POISONED` until [`symm_comm_reset`].
///
/// # Safety
/// `comm` is null or live.
#[no_mangle]
pub unsafe extern "C" fn symm_comm_check(comm: *mut symm_comm) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract on `comm`.
        unsafe { comm_ref(comm) }?.check()?;
        Ok(SYMM_OK)
    })
}

/// Waits for the caller's `CUstream` (NULL: the legacy default stream), then checks as
/// [`symm_comm_check`] does.
///
/// # Safety
/// `comm` is null or live; `stream` is NULL or a valid `CUstream` of the communicator's device
/// context for the duration of the call.
#[no_mangle]
pub unsafe extern "C" fn symm_comm_synchronize(comm: *mut symm_comm, stream: *mut ()) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract on `comm`.
        let comm = unsafe { comm_ref(comm) }?;
        // SAFETY: the caller's contract on `stream`; the wrapper lives only for this call, and
        // the wait leaves no work enqueued through it.
        let stream = unsafe { borrow_stream(comm, stream) }?;
        comm.synchronize(&stream)?;
        Ok(SYMM_OK)
    })
}

/// Collective: after a failure, waits for this rank's device, brings the bootstrap back (ranks
/// left in different exchanges meet again), clears the signal state between two barriers of
/// every rank and lifts the poison. Fails (and stays poisoned) when a peer was lost.
///
/// # Safety
/// `comm` is null or live.
#[no_mangle]
pub unsafe extern "C" fn symm_comm_reset(comm: *mut symm_comm) -> c_int {
    guard(|| {
        // SAFETY: the caller's contract on `comm`.
        unsafe { comm_ref(comm) }?.reset()?;
        Ok(SYMM_OK)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::SYMM_ERR_INTERNAL;

    /// A panic payload whose destructor panics too.
    struct PanicsWhenDropped;

    impl Drop for PanicsWhenDropped {
        fn drop(&mut self) {
            panic!("the payload's destructor panics");
        }
    }

    fn last() -> String {
        error::with_last(str::to_string)
    }

    /// Recording the outcome (formatting and storing the message) runs inside the catch: a
    /// panic there is `SYMM_ERR_INTERNAL` with the internal message, not an unwind into C.
    #[test]
    fn a_panic_while_recording_the_outcome_does_not_unwind() {
        let failing = || Err(Error::Null { arg: "req" });
        assert_eq!(
            guard_with(failing, |_| panic!("formatting the error")),
            SYMM_ERR_INTERNAL
        );
        assert_eq!(last(), "internal error (a panic was caught)");
        assert_eq!(
            guard_with(|| Ok(7), |_| panic!("storing")),
            SYMM_ERR_INTERNAL
        );
        assert_eq!(last(), "internal error (a panic was caught)");
        // The real recording: the message, then cleared on success.
        assert_eq!(guard(failing), crate::error::SYMM_ERR_NULL);
        assert_eq!(last(), "req is null");
        assert_eq!(guard(|| Ok(SYMM_OK)), SYMM_OK);
        assert_eq!(last(), "");
    }

    /// A panic whose payload panics again when dropped stops at the boundary too.
    #[test]
    fn a_payload_that_panics_when_dropped_does_not_unwind() {
        let status = guard(|| std::panic::panic_any(PanicsWhenDropped));
        assert_eq!(status, SYMM_ERR_INTERNAL);
        assert_eq!(last(), "internal error (a panic was caught)");
        let v = contain(|| -> u8 { std::panic::panic_any(PanicsWhenDropped) }, 3);
        assert_eq!(v, 3);
        assert_eq!(contain(|| 5u8, 3), 5);
    }
}

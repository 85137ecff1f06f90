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
    symm_buffer_sizes, symm_event, symm_link, symm_op, symm_request, symm_schedule,
    symm_trace_writer,
};

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

mod comm;

pub use comm::*;

#[cfg(test)]
mod tests;

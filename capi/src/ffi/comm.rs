//! The exports of the CUDA runtime: a communicator joined from the job's environment, its
//! buffers and its collectives. The same rules as the rest of [`super`]: null checks first,
//! unaligned reads and writes, every body under `guard`.

use std::os::raw::c_int;

use super::{contain, guard, nonnull, read, write};
use crate::error::{Error, SYMM_OK};
use crate::types::{symm_buffers, symm_comm, symm_comm_options, symm_request};
use symm_driver::cuda::device::{Stream, StreamRef};
use symm_driver::cuda::Comm;

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

//! The NCCL entry points the shim exports (the C ABI of `nccl.h`, NCCL 2.28): ids,
//! communicators and queries here; the calls in [`crate::calls`], splits in [`crate::split`].
//!
//! Each one either serves the call on symm ([`crate::state`]) or hands it, arguments untouched,
//! to the real library's entry point of the same name. Every body runs under
//! [`std::panic::catch_unwind`]: a panic becomes `ncclInternalError`, never an unwind into C.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use symm_driver::cuda::device::{DevBuf, Device};
use symm_driver::cuda::ffi::nccl::{self as real, Comm, NcclApi, UniqueId};
use symm_driver::cuda::{ErrorKind, Stream};
use symm_driver::safety_env;

use crate::id::{IdError, Job, ID_BYTES};
use crate::route::Mode;
use crate::state::{self, Entry, Real};

/// `ncclResult_t`.
pub type NcclResult = c_int;
/// `ncclSuccess`.
pub const SUCCESS: NcclResult = 0;
/// `ncclUnhandledCudaError`.
pub const UNHANDLED_CUDA_ERROR: NcclResult = 1;
/// `ncclSystemError`.
pub const SYSTEM_ERROR: NcclResult = 2;
/// `ncclInternalError`.
pub const INTERNAL_ERROR: NcclResult = 3;
/// `ncclInvalidArgument`.
pub const INVALID_ARGUMENT: NcclResult = 4;
/// `ncclInvalidUsage`.
pub const INVALID_USAGE: NcclResult = 5;
/// `ncclRemoteError`.
pub const REMOTE_ERROR: NcclResult = 6;
/// The NCCL version whose API the shim speaks, reported when there is no real library.
pub const VERSION: c_int = 22809;

/// NCCL's code for a failure of `kind`.
pub fn code_of(kind: ErrorKind) -> NcclResult {
    match kind {
        ErrorKind::InvalidArgument => INVALID_ARGUMENT,
        ErrorKind::InvalidState | ErrorKind::RanksDiffer => INVALID_USAGE,
        ErrorKind::Timeout | ErrorKind::PeerLost | ErrorKind::Poisoned => REMOTE_ERROR,
        ErrorKind::OutOfMemory | ErrorKind::Unavailable => SYSTEM_ERROR,
        _ => UNHANDLED_CUDA_ERROR,
    }
}

/// NCCL's text for its codes, when there is no real library to ask.
fn error_string(code: NcclResult) -> &'static CStr {
    match code {
        SUCCESS => c"no error",
        UNHANDLED_CUDA_ERROR => c"unhandled cuda error",
        SYSTEM_ERROR => c"unhandled system error",
        INTERNAL_ERROR => c"internal error",
        INVALID_ARGUMENT => c"invalid argument",
        INVALID_USAGE => c"invalid usage",
        REMOTE_ERROR => c"remote process exited or there was a network error",
        _ => c"unknown result code",
    }
}

/// `code`, with `msg` kept as this thread's last error.
pub(crate) fn fail(code: NcclResult, msg: &str) -> NcclResult {
    state::set_last(&format!("symm: {msg}"));
    code
}

/// Runs `f` with this thread's last error cleared, turning a panic into `ncclInternalError`.
pub(crate) fn guarded(f: impl FnOnce() -> NcclResult) -> NcclResult {
    state::set_last("");
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|payload| {
        // A payload's destructor may panic too: it is never run.
        std::mem::forget(payload);
        fail(INTERNAL_ERROR, "internal panic")
    })
}

/// The real library, refused without the multicast-off variables, and never the shim itself
/// (a `SYMM_NCCL` naming this library would forward every call to itself).
pub(crate) fn real_api() -> Result<&'static NcclApi, NcclResult> {
    if Mode::from_vars(|k| std::env::var_os(k)) == Ok(Mode::Alone) {
        return Err(fail(
            INVALID_USAGE,
            "not a communicator of symm's, and SYMM_NCCL_SHIM=alone has no real NCCL",
        ));
    }
    let api = real::api().map_err(|e| fail(SYSTEM_ERROR, &e.to_string()))?;
    let ours = crate::calls::ncclAllReduce as *const c_void as usize;
    if api.all_reduce as *const c_void as usize == ours {
        return Err(fail(
            INVALID_USAGE,
            "the real NCCL resolves to symm's shim itself: point SYMM_NCCL at libnccl.so.2",
        ));
    }
    Ok(api)
}

/// The mode, with the multicast-off variables checked (a communicator is never made without
/// them, on symm or on NCCL).
fn mode() -> Result<Mode, NcclResult> {
    safety_env::check().map_err(|e| fail(INVALID_USAGE, &e.to_string()))?;
    Mode::from_vars(|k| std::env::var_os(k)).map_err(|e| fail(INVALID_USAGE, &e))
}

/// Reads `*p` when `p` is not null.
///
/// # Safety
/// A non-null `p` must point to a valid `T`.
pub(crate) unsafe fn out<'a, T>(p: *mut T) -> Result<&'a mut T, NcclResult> {
    // SAFETY: the caller's contract.
    unsafe { p.as_mut() }.ok_or_else(|| fail(INVALID_ARGUMENT, "a null out-pointer"))
}

/// `ncclGetVersion`.
///
/// # Safety
/// `version` must be null or point to a writable `int`.
#[no_mangle]
pub unsafe extern "C" fn ncclGetVersion(version: *mut c_int) -> NcclResult {
    guarded(|| {
        // SAFETY: the caller's contract.
        let v = match unsafe { out(version) } {
            Ok(v) => v,
            Err(rc) => return rc,
        };
        if Mode::from_vars(|k| std::env::var_os(k)) == Ok(Mode::Alone) {
            *v = VERSION;
            return SUCCESS;
        }
        // SAFETY: a valid out-pointer.
        real_api().map_or_else(|rc| rc, |api| unsafe { (api.get_version)(v) })
    })
}

/// `ncclGetUniqueId`: the real id with a symm job in its tail ([`crate::id`]).
///
/// # Safety
/// `id` must be null or point to a writable `ncclUniqueId`.
#[no_mangle]
pub unsafe extern "C" fn ncclGetUniqueId(id: *mut UniqueId) -> NcclResult {
    guarded(|| {
        // SAFETY: the caller's contract.
        let (id, mode) = match (unsafe { out(id) }, mode()) {
            (Ok(id), Ok(m)) => (id, m),
            (Err(rc), _) | (_, Err(rc)) => return rc,
        };
        match mode {
            Mode::Off => {
                // SAFETY: a valid out-pointer.
                return real_api().map_or_else(|rc| rc, |api| unsafe { (api.get_unique_id)(id) });
            }
            Mode::On => {
                let api = match real_api() {
                    Ok(a) => a,
                    Err(rc) => return rc,
                };
                // SAFETY: a valid out-pointer.
                let rc = unsafe { (api.get_unique_id)(id) };
                if rc != SUCCESS {
                    return rc;
                }
            }
            Mode::Alone => id.internal = [0; ID_BYTES],
        }
        match Job::fresh().map(|job| job.write(&mut id.internal)) {
            // NoRoom: the real library's id fills the tail; that communicator runs on NCCL alone.
            Ok(Ok(()) | Err(IdError::NoRoom)) => SUCCESS,
            Ok(Err(e)) => fail(INTERNAL_ERROR, &e.to_string()),
            Err(e) => fail(SYSTEM_ERROR, &format!("no random bytes for the job: {e}")),
        }
    })
}

/// `ncclCommInitRank`.
///
/// # Safety
/// `comm` must be null or point to a writable `ncclComm_t`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRank(
    comm: *mut Comm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
) -> NcclResult {
    // SAFETY: the caller's contract.
    guarded(|| unsafe { init(comm, nranks, id, rank, None) })
}

/// `ncclCommInitRankConfig`: as [`ncclCommInitRank`], the configuration passed to the real
/// library untouched.
///
/// # Safety
/// `comm` as for [`ncclCommInitRank`]; `config` null or a valid `ncclConfig_t`.
#[no_mangle]
pub unsafe extern "C" fn ncclCommInitRankConfig(
    comm: *mut Comm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    config: *mut c_void,
) -> NcclResult {
    // SAFETY: the caller's contract.
    guarded(|| unsafe { init(comm, nranks, id, rank, Some(config)) })
}

/// Makes the communicator: the real one with the real id, then symm's job (see the crate doc).
///
/// # Safety
/// As [`ncclCommInitRankConfig`].
unsafe fn init(
    comm: *mut Comm,
    nranks: c_int,
    id: UniqueId,
    rank: c_int,
    config: Option<*mut c_void>,
) -> NcclResult {
    // SAFETY: the caller's contract.
    let (handle, mode) = match (unsafe { out(comm) }, mode()) {
        (Ok(h), Ok(m)) => (h, m),
        (Err(rc), _) | (_, Err(rc)) => return rc,
    };
    let (job, real_id) = if mode == Mode::Off {
        (Err(IdError::NotOurs), id.internal)
    } else {
        Job::read(&id.internal)
    };
    let ranks = u16::try_from(nranks)
        .ok()
        .filter(|&n| n > 0)
        .zip(u16::try_from(rank).ok().filter(|&r| (r as c_int) < nranks));
    if mode == Mode::Alone {
        let Some((world, me)) = ranks else {
            return fail(INVALID_ARGUMENT, &format!("rank {rank} of {nranks} ranks"));
        };
        let job = match job {
            Ok(j) => j,
            Err(e) => return fail(INVALID_USAGE, &e.to_string()),
        };
        return match state::join(job, world, me, None) {
            Ok(entry) => {
                // A handle of the shim's, freed by destroy or abort.
                *handle = state::insert_own(entry);
                SUCCESS
            }
            Err(e) => fail(code_of(e.kind()), &e.to_string()),
        };
    }
    let api = match real_api() {
        Ok(a) => a,
        Err(rc) => return rc,
    };
    let real_id = UniqueId { internal: real_id };
    // SAFETY: a valid out-pointer and the caller's configuration, passed through.
    let rc = unsafe {
        match config {
            Some(c) => (api.comm_init_rank_config)(handle, nranks, real_id, rank, c),
            None => (api.comm_init_rank)(handle, nranks, real_id, rank),
        }
    };
    // A non-blocking communicator is still being made when init returns: no collective of
    // the shim's may run on it yet, so it stays NCCL's.
    // SAFETY: the caller's configuration, null or a valid `ncclConfig_t`.
    let blocking = config.is_none_or(|c| unsafe { blocking(c) });
    let served = (job, ranks, rc, state::in_group(), blocking);
    let (Ok(job), Some((world, me)), SUCCESS, false, true) = served else {
        return rc;
    };
    let real = Real(*handle);
    let joined = state::join(job, world, me, Some(real));
    if let Err(e) = &joined {
        eprintln!("symm-nccl: rank {rank}: this communicator runs on NCCL alone: {e}");
    }
    match every_rank_joined(api, real, joined.is_ok()) {
        Ok(true) => state::insert(*handle as usize, joined.unwrap_or_else(|_| unreachable!())),
        Ok(false) => {}
        Err(e) => eprintln!("symm-nccl: rank {rank}: the ranks could not agree to use symm: {e}"),
    }
    SUCCESS
}

/// Whether a communicator made with `config` is blocking: `ncclConfig_t` starts with its
/// `size`, `magic` and `version`, then `blocking` (NCCL's default, unset, is blocking unless
/// `NCCL_COMM_BLOCKING=0`).
///
/// # Safety
/// `config` is null or the caller's `ncclConfig_t` of at least the size it declares.
pub(crate) unsafe fn blocking(config: *mut c_void) -> bool {
    let env = std::env::var("NCCL_COMM_BLOCKING").map_or(true, |v| v.trim() != "0");
    if config.is_null() {
        return env;
    }
    let c = config.cast::<u8>();
    // SAFETY: the struct's first field is its size in bytes (a `size_t`), readable in any
    // config the real library accepts.
    let size = unsafe { c.cast::<usize>().read_unaligned() };
    if size < 20 {
        return env;
    }
    // SAFETY: `blocking` is the int at byte 16 of a config of at least 20 bytes.
    match unsafe { c.add(16).cast::<c_int>().read_unaligned() } {
        c_int::MIN => env,
        b => b != 0,
    }
}

/// Whether every rank of `real` joined symm's job: one NCCL all-reduce (min) of `mine`.
pub(crate) fn every_rank_joined(api: &NcclApi, real: Real, mine: bool) -> Result<bool, String> {
    let dev = symm_driver::cuda::ctx::current_device()
        .map_err(|e| e.to_string())?
        .unwrap_or(0);
    let dev = Device::open(dev).map_err(|e| e.to_string())?;
    let flag = DevBuf::zeroed(&dev, 4).map_err(|e| e.to_string())?;
    flag.upload(&i32::from(mine).to_ne_bytes())
        .map_err(|e| e.to_string())?;
    let stream = Stream::new(&dev).map_err(|e| e.to_string())?;
    let p = flag.ptr() as usize as *mut c_void;
    // SAFETY: one int32 in a live allocation of this GPU, on a live stream of it; the
    // communicator was just made by the real library.
    let rc = unsafe { (api.all_reduce)(p, p, 1, 2, 3, real.0, stream.raw()) };
    if rc != SUCCESS {
        return Err(format!("ncclAllReduce returned {rc}"));
    }
    stream.synchronize().map_err(|e| e.to_string())?;
    let b = flag.download().map_err(|e| e.to_string())?;
    Ok(b.get(..4)
        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        == Some(1))
}

/// Ends `comm`: symm's job first (in order with `close` unless `abort`), then the real one.
fn end(comm: Comm, abort: bool, forward: fn(&NcclApi, Comm) -> NcclResult) -> NcclResult {
    if comm.is_null() {
        return SUCCESS;
    }
    let mut rc = SUCCESS;
    if let Some(e) = state::remove(comm as usize) {
        if !abort {
            if let Err(err) = e.comm.close() {
                rc = fail(code_of(err.kind()), &err.to_string());
            }
        }
        if e.real.is_none() {
            drop(e);
            // SAFETY: a communicator without a real one has a handle of `insert_own`'s (made
            // by init or split), which left the table here, once.
            unsafe { state::free_own(comm) };
            return rc;
        }
    }
    match real_api() {
        Ok(api) => match forward(api, comm) {
            SUCCESS => rc,
            other => other,
        },
        Err(e) => e,
    }
}

/// `ncclCommDestroy`.
///
/// # Safety
/// `comm` must be a communicator of this library or the real one.
#[no_mangle]
pub unsafe extern "C" fn ncclCommDestroy(comm: Comm) -> NcclResult {
    // SAFETY: the caller passes a live communicator.
    guarded(|| end(comm, false, |api, c| unsafe { (api.comm_destroy)(c) }))
}

/// `ncclCommAbort`.
///
/// # Safety
/// As [`ncclCommDestroy`].
#[no_mangle]
pub unsafe extern "C" fn ncclCommAbort(comm: Comm) -> NcclResult {
    // SAFETY: the caller passes a live communicator.
    guarded(|| end(comm, true, |api, c| unsafe { (api.comm_abort)(c) }))
}

/// `ncclCommFinalize`.
///
/// # Safety
/// As [`ncclCommDestroy`].
#[no_mangle]
pub unsafe extern "C" fn ncclCommFinalize(comm: Comm) -> NcclResult {
    guarded(|| match state::get(comm as usize) {
        Some(e) if e.real.is_none() => SUCCESS,
        // SAFETY: the caller passes a live communicator.
        _ => real_api().map_or_else(|rc| rc, |api| unsafe { (api.comm_finalize)(comm) }),
    })
}

/// Answers a query from the entry of a communicator without a real one, else forwards it.
fn query(
    comm: Comm,
    v: *mut c_int,
    ours: fn(&Entry) -> c_int,
    forward: unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
) -> NcclResult {
    match state::get(comm as usize) {
        Some(e) if e.real.is_none() => {
            // SAFETY: the caller's out-pointer, null or writable.
            match unsafe { out(v) } {
                Ok(v) => {
                    *v = ours(&e);
                    SUCCESS
                }
                Err(rc) => rc,
            }
        }
        // SAFETY: the caller's arguments, passed through.
        _ => unsafe { forward(comm, v) },
    }
}

/// The real entry point `pick` names, or the failure to load the real library.
fn forwarded(
    pick: fn(&NcclApi) -> unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
) -> Result<unsafe extern "C" fn(Comm, *mut c_int) -> c_int, NcclResult> {
    real_api().map(pick)
}

macro_rules! queries {
    ($( $(#[$m:meta])* $name:ident => $field:ident, $ours:expr; )*) => {$(
        $(#[$m])*
        ///
        /// # Safety
        /// `comm` must be a communicator of this library or the real one; the out-pointer null
        /// or writable.
        #[no_mangle]
        pub unsafe extern "C" fn $name(comm: Comm, v: *mut c_int) -> NcclResult {
            guarded(|| {
                let ours = state::get(comm as usize).is_some_and(|e| e.real.is_none());
                let forward = if ours {
                    stub
                } else {
                    match forwarded(|a| a.$field) {
                        Ok(f) => f,
                        Err(rc) => return rc,
                    }
                };
                query(comm, v, $ours, forward)
            })
        }
    )*};
}

/// Never called: the entry a query of the shim's own communicator stands on.
unsafe extern "C" fn stub(_: Comm, _: *mut c_int) -> c_int {
    INTERNAL_ERROR
}

queries! {
    /// `ncclCommCount`.
    ncclCommCount => comm_count, |e| c_int::from(e.comm.world());
    /// `ncclCommUserRank`.
    ncclCommUserRank => comm_user_rank, |e| c_int::from(e.comm.rank());
    /// `ncclCommCuDevice`.
    ncclCommCuDevice => comm_cu_device, |e| e.comm.device().ordinal();
}

/// `ncclCommGetAsyncError`: symm's failure on a served communicator (an error found on the
/// device, a lost peer), then the real communicator's.
///
/// # Safety
/// As the queries.
#[no_mangle]
pub unsafe extern "C" fn ncclCommGetAsyncError(comm: Comm, result: *mut c_int) -> NcclResult {
    guarded(|| {
        // SAFETY: the caller's contract.
        let r = match unsafe { out(result) } {
            Ok(r) => r,
            Err(rc) => return rc,
        };
        let e = state::get(comm as usize);
        if let Some(e) = &e {
            if let Err(err) = e.comm.check() {
                *r = fail(code_of(err.kind()), &err.to_string());
                return SUCCESS;
            }
            if e.real.is_none() {
                *r = SUCCESS;
                return SUCCESS;
            }
        }
        // SAFETY: a valid out-pointer; the caller's communicator.
        real_api().map_or_else(
            |rc| rc,
            |api| unsafe { (api.comm_get_async_error)(comm, r) },
        )
    })
}

/// `ncclGetErrorString`.
#[no_mangle]
pub extern "C" fn ncclGetErrorString(code: NcclResult) -> *const c_char {
    match real::loaded() {
        // SAFETY: the real library's own function, any code accepted.
        Some(api) => unsafe { (api.get_error_string)(code) },
        None => error_string(code).as_ptr(),
    }
}

/// `ncclGetLastError`: the shim's last error on this thread, else the real library's.
///
/// # Safety
/// `comm` null or a communicator of this library or the real one.
#[no_mangle]
pub unsafe extern "C" fn ncclGetLastError(comm: Comm) -> *const c_char {
    match (state::last(), real::loaded()) {
        (Some(p), _) => p,
        (None, Some(api)) if state::get(comm as usize).is_none_or(|e| e.real.is_some()) => {
            // SAFETY: the caller's communicator, passed through.
            unsafe { (api.get_last_error)(comm) }
        }
        _ => c"".as_ptr(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The head of NCCL 2.28's `ncclConfig_t`.
    #[repr(C)]
    struct ConfigHead {
        size: usize,
        magic: u32,
        version: u32,
        blocking: c_int,
        rest: [c_int; 8],
    }

    #[test]
    fn a_config_says_whether_the_communicator_blocks() {
        let mut c = ConfigHead {
            size: std::mem::size_of::<ConfigHead>(),
            magic: 0xcafebeef,
            version: 22809,
            blocking: 0,
            rest: [0; 8],
        };
        let p = (&mut c as *mut ConfigHead).cast::<c_void>();
        // SAFETY: a config of the size it declares.
        assert!(!unsafe { blocking(p) });
        c.blocking = 1;
        // SAFETY: as above.
        assert!(unsafe { blocking(p) });
        let undeclared = ConfigHead {
            size: 8,
            blocking: 0,
            ..c
        };
        let q = (&undeclared as *const ConfigHead)
            .cast_mut()
            .cast::<c_void>();
        // SAFETY: as above; a size that does not reach `blocking` leaves it unread.
        let default = std::env::var("NCCL_COMM_BLOCKING").map_or(true, |v| v.trim() != "0");
        assert_eq!(unsafe { blocking(q) }, default);
    }
}

//! The NCCL calls the shim exports: collectives (served by symm where it can), point-to-point
//! calls and groups (the real library's). See [`crate::exports`] for the codes and the rules.

use std::ffi::{c_int, c_void};

use symm_driver::cuda::ffi::driver::Handle;
use symm_driver::cuda::ffi::nccl::{Comm, NcclApi};
use symm_driver::cuda::CudaError;

use crate::exports::{
    code_of, fail, guarded, real_api, NcclResult, INVALID_ARGUMENT, INVALID_USAGE, SUCCESS,
};
use crate::route::{Call, Mode, Refusal};
use crate::state::{self, Failure, Path};

/// A collective: served when symm has a request for it, else forwarded by `forward`.
///
/// # Safety
/// The NCCL call's contract: device buffers of the communicator's GPU, a live stream of it.
unsafe fn collective(
    call: Call,
    bufs: (*const c_void, *mut c_void),
    count: usize,
    dtype: c_int,
    comm: Comm,
    stream: Handle,
    forward: impl FnOnce(&NcclApi) -> NcclResult,
) -> NcclResult {
    if let Some(e) = state::get(comm as usize) {
        if !(state::in_group() && e.real.is_some()) {
            let ptrs = (bufs.0 as usize as u64, bufs.1 as usize as u64);
            // SAFETY: the caller's contract.
            match unsafe { state::serve(&e, call, ptrs, count, dtype, stream) } {
                Ok(()) => {
                    state::count(Path::Symm);
                    return SUCCESS;
                }
                // A shape's first use needs the host (its workspace, the ranks' agreement),
                // which a capture cannot wait for: the real library captures that call. Every
                // rank makes the same calls, so every rank forwards the same one.
                Err(Failure::Failed(CudaError::Capturing { .. })) if e.real.is_some() => {}
                Err(Failure::Failed(err)) => return fail(code_of(err.kind()), &err.to_string()),
                Err(Failure::Refused(Refusal::Empty)) if e.real.is_none() => return SUCCESS,
                Err(Failure::Refused(r)) if e.real.is_none() => {
                    return fail(INVALID_ARGUMENT, &r.to_string())
                }
                Err(Failure::Refused(_)) => {}
            }
        }
    }
    real_api().map_or_else(
        |rc| rc,
        |api| {
            state::count(Path::Nccl);
            forward(api)
        },
    )
}

/// `symmNcclCounts`: how many collectives of this process symm served (`*served`) and the
/// shim handed to the real library (`*forwarded`), over every communicator, so a caller can
/// see which path its calls took. Either pointer may be null.
///
/// # Safety
/// Each non-null pointer must point to a writable `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn symmNcclCounts(served: *mut u64, forwarded: *mut u64) -> NcclResult {
    guarded(|| {
        let (s, f) = state::counts();
        // SAFETY: the caller's contract: null or writable.
        unsafe {
            if let Some(p) = served.as_mut() {
                *p = s;
            }
            if let Some(p) = forwarded.as_mut() {
                *p = f;
            }
        }
        SUCCESS
    })
}

/// `ncclAllReduce`.
///
/// # Safety
/// NCCL's contract for the call.
#[no_mangle]
pub unsafe extern "C" fn ncclAllReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    comm: Comm,
    stream: Handle,
) -> NcclResult {
    guarded(|| {
        let call = Call::AllReduce { op };
        // SAFETY: the caller's contract, passed on.
        unsafe {
            collective(call, (send, recv), count, dtype, comm, stream, |api| {
                (api.all_reduce)(send, recv, count, dtype, op, comm, stream)
            })
        }
    })
}

/// `ncclAllGather`.
///
/// # Safety
/// NCCL's contract for the call.
#[no_mangle]
pub unsafe extern "C" fn ncclAllGather(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    comm: Comm,
    stream: Handle,
) -> NcclResult {
    guarded(|| {
        // SAFETY: the caller's contract, passed on.
        unsafe {
            collective(
                Call::AllGather,
                (send, recv),
                count,
                dtype,
                comm,
                stream,
                |api| (api.all_gather)(send, recv, count, dtype, comm, stream),
            )
        }
    })
}

/// `ncclReduceScatter`.
///
/// # Safety
/// NCCL's contract for the call.
#[no_mangle]
pub unsafe extern "C" fn ncclReduceScatter(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    comm: Comm,
    stream: Handle,
) -> NcclResult {
    guarded(|| {
        let call = Call::ReduceScatter { op };
        // SAFETY: the caller's contract, passed on.
        unsafe {
            collective(call, (send, recv), count, dtype, comm, stream, |api| {
                (api.reduce_scatter)(send, recv, count, dtype, op, comm, stream)
            })
        }
    })
}

/// `ncclBroadcast`.
///
/// # Safety
/// NCCL's contract for the call.
#[no_mangle]
pub unsafe extern "C" fn ncclBroadcast(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    root: c_int,
    comm: Comm,
    stream: Handle,
) -> NcclResult {
    guarded(|| {
        let call = Call::Broadcast { root };
        // SAFETY: the caller's contract, passed on.
        unsafe {
            collective(call, (send, recv), count, dtype, comm, stream, |api| {
                (api.broadcast)(send, recv, count, dtype, root, comm, stream)
            })
        }
    })
}

/// `ncclReduce`.
///
/// # Safety
/// NCCL's contract for the call.
#[no_mangle]
pub unsafe extern "C" fn ncclReduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    op: c_int,
    root: c_int,
    comm: Comm,
    stream: Handle,
) -> NcclResult {
    guarded(|| {
        let call = Call::Reduce { op, root };
        // SAFETY: the caller's contract, passed on.
        unsafe {
            collective(call, (send, recv), count, dtype, comm, stream, |api| {
                (api.reduce)(send, recv, count, dtype, op, root, comm, stream)
            })
        }
    })
}

/// A point-to-point call: the real library's, or refused on a communicator without one.
fn point_to_point(comm: Comm, forward: impl FnOnce(&NcclApi) -> NcclResult) -> NcclResult {
    match state::get(comm as usize) {
        Some(e) if e.real.is_none() => fail(
            INVALID_USAGE,
            "point-to-point calls need the real NCCL (SYMM_NCCL_SHIM=alone has none)",
        ),
        _ => real_api().map_or_else(|rc| rc, forward),
    }
}

/// `ncclSend`: always the real library's.
///
/// # Safety
/// NCCL's contract for the call.
#[no_mangle]
pub unsafe extern "C" fn ncclSend(
    send: *const c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    comm: Comm,
    stream: Handle,
) -> NcclResult {
    // SAFETY: the caller's arguments, passed through.
    guarded(|| {
        point_to_point(comm, |api| unsafe {
            (api.send)(send, count, dtype, peer, comm, stream)
        })
    })
}

/// `ncclRecv`: always the real library's.
///
/// # Safety
/// NCCL's contract for the call.
#[no_mangle]
pub unsafe extern "C" fn ncclRecv(
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    peer: c_int,
    comm: Comm,
    stream: Handle,
) -> NcclResult {
    // SAFETY: the caller's arguments, passed through.
    guarded(|| {
        point_to_point(comm, |api| unsafe {
            (api.recv)(recv, count, dtype, peer, comm, stream)
        })
    })
}

/// Opens or closes a group: counted here (calls inside a group go to the real library, which
/// runs them at its end), and forwarded unless the mode has no real library.
fn group_step(step: i32, forward: fn(&NcclApi) -> NcclResult) -> NcclResult {
    if step < 0 && !state::in_group() {
        return fail(INVALID_USAGE, "ncclGroupEnd without ncclGroupStart");
    }
    let rc = if Mode::from_vars(|k| std::env::var_os(k)) == Ok(Mode::Alone) {
        SUCCESS
    } else {
        real_api().map_or_else(|rc| rc, forward)
    };
    if rc == SUCCESS {
        state::group(step);
    }
    rc
}

/// `ncclGroupStart`.
#[no_mangle]
pub extern "C" fn ncclGroupStart() -> NcclResult {
    // SAFETY: no arguments.
    guarded(|| group_step(1, |api| unsafe { (api.group_start)() }))
}

/// `ncclGroupEnd`.
#[no_mangle]
pub extern "C" fn ncclGroupEnd() -> NcclResult {
    // SAFETY: no arguments.
    guarded(|| group_step(-1, |api| unsafe { (api.group_end)() }))
}

//! The shim's entry points as a C caller meets them on a machine without a GPU or libnccl:
//! every refusal is an NCCL code with symm's reason in `ncclGetLastError`, and nothing panics.
//! One test, because the cases change the process environment in turn.

use std::ffi::{c_int, c_void, CStr};
use std::ptr::null_mut;

use symm_driver::cuda::ffi::nccl::UniqueId;
use symm_driver::safety_env::SAFETY_ENV;
use symm_nccl::calls::*;
use symm_nccl::exports::*;
use symm_nccl::id::{Job, TAIL};

fn last() -> String {
    // SAFETY: any handle is accepted; the string is the shim's or a static.
    let p = unsafe { ncclGetLastError(null_mut()) };
    // SAFETY: a NUL-terminated string that lives until the next failing call on this thread.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn set(vars: &[(&str, Option<&str>)]) {
    for (k, v) in vars {
        match v {
            Some(v) => std::env::set_var(k, v),
            None => std::env::remove_var(k),
        }
    }
}

fn draw() -> (NcclResult, UniqueId) {
    let mut id = UniqueId {
        internal: [0xAA; 128],
    };
    // SAFETY: a writable id.
    let rc = unsafe { ncclGetUniqueId(&mut id) };
    (rc, id)
}

#[test]
fn a_c_caller_without_gpu_or_nccl_gets_nccl_codes_and_symms_reasons() {
    let on: Vec<(&str, Option<&str>)> = SAFETY_ENV.iter().map(|(k, v)| (*k, Some(*v))).collect();
    set(&[("SYMM_NCCL", Some("/nonexistent/libnccl.so.2"))]);

    // Without the multicast-off variables no id is drawn and no communicator is made.
    set(&[("NCCL_NVLS_ENABLE", None)]);
    set(&[("SYMM_NCCL_SHIM", Some("alone"))]);
    let (rc, _) = draw();
    assert_eq!(rc, INVALID_USAGE);
    assert!(last().contains("NCCL_NVLS_ENABLE"), "{}", last());
    let mut comm: *mut c_void = null_mut();
    let id = UniqueId { internal: [0; 128] };
    // SAFETY: a writable handle.
    assert_eq!(
        unsafe { ncclCommInitRank(&mut comm, 2, id, 0) },
        INVALID_USAGE
    );
    assert!(comm.is_null());
    set(&on);

    // A mode that is not one is refused, naming the variable.
    set(&[("SYMM_NCCL_SHIM", Some("sometimes"))]);
    assert_eq!(draw().0, INVALID_USAGE);
    assert!(
        last().contains("SYMM_NCCL_SHIM=\"sometimes\""),
        "{}",
        last()
    );

    // Alone: the id is symm's job in the tail, zeros before it.
    set(&[("SYMM_NCCL_SHIM", Some("alone"))]);
    let (rc, id) = draw();
    assert_eq!(rc, SUCCESS);
    assert!(id.internal[..TAIL.start].iter().all(|&b| b == 0));
    let (job, real) = Job::read(&id.internal);
    assert!(job.is_ok(), "{job:?}");
    assert_eq!(real, [0; 128]);
    assert_ne!(draw().1.internal, id.internal, "every draw is a new job");
    let mut v = 0;
    // SAFETY: a writable int.
    assert_eq!(unsafe { ncclGetVersion(&mut v) }, SUCCESS);
    assert_eq!(v, VERSION);
    // SAFETY: null is refused, not written.
    assert_eq!(unsafe { ncclGetVersion(null_mut()) }, INVALID_ARGUMENT);

    // Hostile ranks and ids are refused before anything is joined.
    for (n, r) in [(0, 0), (2, 2), (2, -1), (-3, 0), (1 << 20, 0)] {
        // SAFETY: a writable handle.
        let rc = unsafe { ncclCommInitRank(&mut comm, n, id, r) };
        assert_eq!(rc, INVALID_ARGUMENT, "rank {r} of {n}");
        assert!(last().contains(&format!("rank {r} of {n}")), "{}", last());
    }
    let foreign = UniqueId { internal: [3; 128] };
    // SAFETY: a writable handle.
    assert_eq!(
        unsafe { ncclCommInitRank(&mut comm, 2, foreign, 0) },
        INVALID_USAGE
    );
    assert!(last().contains("not drawn by symm"), "{}", last());
    // SAFETY: null out-pointer refused.
    assert_eq!(
        unsafe { ncclCommInitRank(null_mut(), 2, id, 0) },
        INVALID_ARGUMENT
    );
    // No GPU here: the join fails with symm's reason, as an NCCL code.
    // SAFETY: a writable handle.
    let rc = unsafe { ncclCommInitRank(&mut comm, 1, id, 0) };
    assert_ne!(rc, SUCCESS);
    assert!(last().starts_with("symm: "), "{}", last());
    assert!(comm.is_null());

    // Groups are counted per thread; an end without a start is refused.
    assert_eq!(ncclGroupEnd(), INVALID_USAGE);
    assert_eq!(ncclGroupStart(), SUCCESS);
    assert_eq!(ncclGroupEnd(), SUCCESS);

    // Alone, a communicator the shim did not make is refused: there is no real library.
    let stranger = 0x1000 as *mut c_void;
    let buf = 0x2000 as *mut c_void;
    // SAFETY: refused before any pointer is read.
    let rc = unsafe { ncclAllReduce(buf, buf, 4, 7, 0, stranger, null_mut()) };
    assert_eq!(rc, INVALID_USAGE);
    assert!(last().contains("SYMM_NCCL_SHIM=alone"), "{}", last());
    // A call that succeeds clears the thread's last error.
    assert_eq!(ncclGroupStart(), SUCCESS);
    assert_eq!(last(), "");
    assert_eq!(ncclGroupEnd(), SUCCESS);
    // SAFETY: NCCL's destroy of no communicator succeeds.
    assert_eq!(unsafe { ncclCommDestroy(null_mut()) }, SUCCESS);

    // On: a communicator the shim did not make goes to the real library, which is not here.
    set(&[("SYMM_NCCL_SHIM", Some("on"))]);
    // SAFETY: forwarded only; the missing library refuses before any pointer is read.
    let rc = unsafe { ncclAllReduce(buf, buf, 4, 7, 0, stranger, null_mut()) };
    assert_eq!(rc, SYSTEM_ERROR);
    assert!(
        last().contains("libnccl") || last().contains("NCCL"),
        "{}",
        last()
    );
    let mut n: c_int = 0;
    // SAFETY: as above.
    assert_eq!(unsafe { ncclCommCount(stranger, &mut n) }, SYSTEM_ERROR);
    // SAFETY: as above.
    assert_eq!(
        unsafe { ncclSend(buf, 4, 7, 1, stranger, null_mut()) },
        SYSTEM_ERROR
    );

    // Nothing ran anywhere: refused and failed calls count on neither path.
    let (mut served, mut forwarded) = (7u64, 7u64);
    // SAFETY: writable counters; null pointers are skipped.
    assert_eq!(
        unsafe { symmNcclCounts(&mut served, &mut forwarded) },
        SUCCESS
    );
    assert_eq!((served, forwarded), (0, 0));
    // SAFETY: as above.
    assert_eq!(unsafe { symmNcclCounts(null_mut(), null_mut()) }, SUCCESS);

    // Off: a pass-through, which needs the real library even for an id.
    set(&[("SYMM_NCCL_SHIM", Some("off"))]);
    assert_eq!(draw().0, SYSTEM_ERROR);

    // NCCL's strings without NCCL.
    for (code, text) in [
        (0, "no error"),
        (4, "invalid argument"),
        (99, "unknown result code"),
    ] {
        // SAFETY: a static string.
        let s = unsafe { CStr::from_ptr(ncclGetErrorString(code)) };
        assert_eq!(s.to_str(), Ok(text));
    }
}

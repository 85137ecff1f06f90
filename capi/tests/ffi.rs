//! The exported functions called as C would call them: null pointers, short buffers, the last
//! error message, and a trace written through the ABI read back by symm-core.

use std::ffi::CStr;
use std::ptr::{null, null_mut};

use symm::error::{SYMM_ERR_INVALID, SYMM_ERR_NULL, SYMM_ERR_TOO_SMALL, SYMM_OK};
use symm::ffi::*;
use symm::types::codes;
use symm::types::{symm_event, symm_link, symm_op, symm_request, symm_schedule, symm_trace_writer};
use symm_core::trace::decode;

fn ring(world: u16) -> symm_request {
    symm_request {
        world,
        channels: 1,
        bytes: 1 << 16,
        ..Default::default()
    }
}

fn last_error() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { symm_last_error(buf.as_mut_ptr().cast(), buf.len()) };
    let s = CStr::from_bytes_until_nul(&buf).unwrap().to_str().unwrap();
    assert_eq!(n, s.len());
    s.to_string()
}

#[test]
fn null_pointers_are_refused_with_a_message() {
    let req = ring(4);
    let mut op = symm_op::default();
    let mut link = symm_link::default();
    // SAFETY: every pointer is null or points to a live local.
    unsafe {
        assert_eq!(symm_request_validate(null()), SYMM_ERR_NULL);
        assert_eq!(last_error(), "req is null");
        assert_eq!(symm_request_buffer_sizes(&req, null_mut()), SYMM_ERR_NULL);
        assert_eq!(symm_schedule_new(&req, 0, 0, null_mut()), SYMM_ERR_NULL);
        assert_eq!(symm_schedule_next(null_mut(), &mut op), SYMM_ERR_NULL);
        assert_eq!(symm_link_preset(0, null_mut()), SYMM_ERR_NULL);
        assert_eq!(symm_link_preset(0, &mut link), SYMM_OK);
        assert_eq!(symm_cost_predict(&req, &link, null_mut()), SYMM_ERR_NULL);
        assert_eq!(symm_op_decode(null(), 64, &mut op), SYMM_ERR_NULL);
        assert_eq!(
            symm_trace_writer_finish(null_mut(), null_mut(), null_mut()),
            SYMM_ERR_NULL
        );
        symm_schedule_free(null_mut());
        symm_trace_writer_free(null_mut());
        symm_bytes_free(null_mut(), 0);
        assert_eq!(symm_request_validate(&req), SYMM_OK);
        assert_eq!(symm_last_error(null_mut(), 0), 0);
    }
}

/// A request flagged deterministic validates, sizes and schedules when its algorithm honours
/// the mode, and is refused with a message saying so when it does not; an unknown flag is
/// refused.
#[test]
fn deterministic_requests_are_refused_where_the_algorithm_cannot_honour_them() {
    let code = |a: symm_core::sched::Algorithm| {
        symm_core::sched::Algorithm::ALL
            .iter()
            .position(|&x| x == a)
            .unwrap() as u32
    };
    let bf16 = symm_core::dtype::DType::Bf16 as u32;
    let det = |algorithm| symm_request {
        algorithm,
        dtype: bf16,
        flags: codes::REQUEST_DETERMINISTIC,
        ..ring(4)
    };
    let two_shot = det(code(symm_core::sched::Algorithm::TwoShot));
    let ring_det = det(code(symm_core::sched::Algorithm::Ring));
    let mut sched: *mut symm_schedule = null_mut();
    // SAFETY: every pointer points to a live local; the schedule is freed once.
    unsafe {
        assert_eq!(symm_request_validate(&two_shot), SYMM_OK);
        assert_eq!(symm_request_validate(&ring_det), SYMM_ERR_INVALID);
        assert!(
            last_error().contains("deterministic mode"),
            "{}",
            last_error()
        );
        assert_eq!(
            symm_schedule_new(&ring_det, 0, 0, &mut sched),
            SYMM_ERR_INVALID
        );
        assert!(sched.is_null());
        // The same ring without the flag, and on integers with it, are fine.
        let plain = symm_request {
            flags: 0,
            ..ring_det
        };
        assert_eq!(symm_request_validate(&plain), SYMM_OK);
        let ints = symm_request {
            dtype: symm_core::dtype::DType::I32 as u32,
            ..ring_det
        };
        assert_eq!(symm_request_validate(&ints), SYMM_OK);
        let unknown = symm_request {
            flags: 4,
            ..two_shot
        };
        assert_eq!(symm_request_validate(&unknown), SYMM_ERR_INVALID);
        assert_eq!(last_error(), "flags 4 is not a known code");
        // The cost model's pick among the algorithms that honour the mode, at every size.
        let mut link = symm_link::default();
        assert_eq!(symm_link_preset(codes::LINK_NVLINK4, &mut link), SYMM_OK);
        let mut picks = std::collections::BTreeSet::new();
        for shift in 10..30 {
            let mut alg = u32::MAX;
            let req = symm_request {
                bytes: 1 << shift,
                ..ring_det
            };
            assert_eq!(symm_cost_select(&req, &link, 0, &mut alg), SYMM_OK);
            let picked = symm_request {
                algorithm: alg,
                ..req
            };
            assert_eq!(symm_request_validate(&picked), SYMM_OK, "{shift}");
            picks.insert(alg);
        }
        assert!(!picks.contains(&code(symm_core::sched::Algorithm::Ring)));
    }
}

#[test]
fn messages_are_cut_to_the_buffer_and_statuses_named() {
    let bad = ring(0);
    // SAFETY: `bad` and `buf` are live locals; the status name is a static C string.
    unsafe {
        assert_eq!(symm_request_validate(&bad), SYMM_ERR_INVALID);
        let full = symm_last_error(null_mut(), 0);
        let mut buf = [0xffu8; 8];
        assert_eq!(symm_last_error(buf.as_mut_ptr().cast(), buf.len()), full);
        assert_eq!(&buf, b"invalid\0");
        let name = CStr::from_ptr(symm_status_name(SYMM_ERR_TOO_SMALL));
        assert_eq!(name.to_str().unwrap(), "SYMM_ERR_TOO_SMALL");
        let name = CStr::from_ptr(symm_status_name(-99));
        assert_eq!(name.to_str().unwrap(), "SYMM_UNKNOWN_STATUS");
    }
    assert!(last_error().contains("world size 0"));
}

#[test]
fn a_trace_written_through_the_abi_decodes() {
    let req = ring(2);
    let mut s: *mut symm_schedule = null_mut();
    let mut w: *mut symm_trace_writer = null_mut();
    let (mut bytes, mut len) = (null_mut(), 0usize);
    // SAFETY: the handles come from the library and are freed once; every other pointer is a
    // live local.
    let trace = unsafe {
        assert_eq!(symm_schedule_new(&req, 1, 0, &mut s), SYMM_OK);
        assert_eq!(
            symm_trace_writer_new(&req, codes::SOURCE_HOST_THREADS, 1, 100, &mut w),
            SYMM_OK
        );
        let mut e = symm_event::default();
        let mut index = 0;
        while symm_schedule_next(s, &mut e.op) == 1 {
            let mut plan = [0u8; 64];
            assert_eq!(
                symm_op_encode(&e.op, plan.as_mut_ptr(), 63),
                SYMM_ERR_TOO_SMALL
            );
            assert_eq!(symm_op_encode(&e.op, plan.as_mut_ptr(), 64), SYMM_OK);
            e.rank = 1;
            e.index = index;
            e.time = index.into();
            e.kind = codes::EVENT_END;
            assert_eq!(symm_trace_writer_event(w, &e), SYMM_OK, "{}", last_error());
            index += 1;
        }
        symm_schedule_free(s);
        assert_eq!(symm_trace_writer_finish(w, &mut bytes, &mut len), SYMM_OK);
        let trace = std::slice::from_raw_parts(bytes, len).to_vec();
        symm_bytes_free(bytes, len);
        trace
    };
    let d = decode(&trace).unwrap();
    assert!(!d.events.is_empty());
    assert!(d.events.iter().all(|e| e.rank == 1));
    assert_eq!(d.header.team, None);
}

/// The runtime's functions refuse null handles, null outputs, null and invalid requests with a
/// status and a message; none reaches the device.
#[test]
fn runtime_calls_refuse_null_and_bad_arguments() {
    use symm::error::SYMM_ERR_INVALID as INVALID;
    use symm::types::{symm_buffers, symm_comm, symm_comm_options};
    let req = ring(4);
    let bad_code = symm_request {
        collective: 99,
        ..ring(4)
    };
    let bad_world = ring(0);
    let mut bufs = symm_buffers::default();
    let mut v16 = 0u16;
    let mut v64 = 0u64;
    let mut comm: *mut symm_comm = null_mut();
    let null_comm: *mut symm_comm = null_mut();
    // SAFETY: every pointer is null or points to a live local; no call reaches a communicator.
    unsafe {
        assert_eq!(symm_comm_from_env(null(), null_mut()), SYMM_ERR_NULL);
        assert_eq!(last_error(), "out is null");
        let opts = symm_comm_options::default();
        assert_eq!(symm_comm_from_env(&opts, null_mut()), SYMM_ERR_NULL);
        assert!(comm.is_null());

        assert_eq!(symm_comm_rank(null_comm, &mut v16), SYMM_ERR_NULL);
        assert_eq!(last_error(), "comm is null");
        assert_eq!(symm_comm_rank(null_comm, null_mut()), SYMM_ERR_NULL);
        assert_eq!(last_error(), "out is null");
        assert_eq!(symm_comm_world(null_comm, &mut v16), SYMM_ERR_NULL);
        assert_eq!(symm_comm_world(null_comm, null_mut()), SYMM_ERR_NULL);

        assert_eq!(symm_comm_alloc(null_comm, &req, &mut bufs), SYMM_ERR_NULL);
        assert_eq!(last_error(), "comm is null");
        assert_eq!(symm_comm_alloc(null_comm, null(), &mut bufs), SYMM_ERR_NULL);
        assert_eq!(last_error(), "req is null");
        assert_eq!(symm_comm_alloc(null_comm, &req, null_mut()), SYMM_ERR_NULL);
        assert_eq!(symm_comm_alloc(null_comm, &bad_code, &mut bufs), INVALID);
        assert_eq!(last_error(), "collective 99 is not a known code");
        assert_eq!(symm_comm_alloc(null_comm, &bad_world, &mut bufs), INVALID);
        assert!(last_error().contains("world"), "{}", last_error());

        assert_eq!(symm_comm_free_buffers(null_comm, &bufs), SYMM_ERR_NULL);
        assert_eq!(last_error(), "comm is null");
        assert_eq!(symm_comm_free_buffers(null_comm, null()), SYMM_ERR_NULL);
        assert_eq!(last_error(), "buffers is null");

        assert_eq!(symm_comm_ptr(null_comm, 0, 0, &mut v64), SYMM_ERR_NULL);
        assert_eq!(last_error(), "comm is null");
        assert_eq!(symm_comm_ptr(null_comm, 0, 0, null_mut()), SYMM_ERR_NULL);
        assert_eq!(last_error(), "out is null");

        let stream = null_mut();
        assert_eq!(
            symm_comm_enqueue(null_comm, &req, &bufs, stream),
            SYMM_ERR_NULL
        );
        assert_eq!(last_error(), "comm is null");
        assert_eq!(
            symm_comm_enqueue(null_comm, null(), &bufs, stream),
            SYMM_ERR_NULL
        );
        assert_eq!(last_error(), "req is null");
        assert_eq!(
            symm_comm_enqueue(null_comm, &req, null(), stream),
            SYMM_ERR_NULL
        );
        assert_eq!(last_error(), "buffers is null");
        assert_eq!(
            symm_comm_enqueue(null_comm, &bad_code, &bufs, stream),
            INVALID
        );
        assert_eq!(
            symm_comm_enqueue(null_comm, &bad_world, &bufs, stream),
            INVALID
        );

        assert_eq!(symm_comm_check(null_comm), SYMM_ERR_NULL);
        assert_eq!(symm_comm_synchronize(null_comm, stream), SYMM_ERR_NULL);
        assert_eq!(symm_comm_reset(null_comm), SYMM_ERR_NULL);
        assert_eq!(symm_comm_finish(null_comm), SYMM_ERR_NULL);
        assert_eq!(last_error(), "comm is null");
        symm_comm_free(null_comm);
        assert!(comm.is_null());
        comm = null_mut();
        symm_comm_free(comm);
    }
}

/// Options out of range are refused before the environment is read; the new statuses have
/// names.
#[test]
fn runtime_options_are_checked_and_statuses_named() {
    use symm::error::{
        SYMM_ERR_DEVICE, SYMM_ERR_INVALID, SYMM_ERR_PEER_LOST, SYMM_ERR_POISONED, SYMM_ERR_TIMEOUT,
        SYMM_ERR_UNAVAILABLE,
    };
    use symm::types::{symm_comm, symm_comm_options};
    let mut comm: *mut symm_comm = null_mut();
    let huge_heap = symm_comm_options {
        heap_bytes: u64::MAX,
        ..Default::default()
    };
    let huge_wait = symm_comm_options {
        timeout_ms: u64::MAX,
        ..Default::default()
    };
    let unknown_flag = symm_comm_options {
        flags: 2,
        ..Default::default()
    };
    // SAFETY: every pointer points to a live local.
    unsafe {
        assert_eq!(
            symm_comm_from_env(&unknown_flag, &mut comm),
            SYMM_ERR_INVALID
        );
        assert_eq!(last_error(), "flags 2 is not a known code");
        assert_eq!(symm_comm_from_env(&huge_heap, &mut comm), SYMM_ERR_INVALID);
        assert!(last_error().contains("heap_bytes"), "{}", last_error());
        assert_eq!(symm_comm_from_env(&huge_wait, &mut comm), SYMM_ERR_INVALID);
        assert!(last_error().contains("timeout"), "{}", last_error());
        assert!(comm.is_null());
    }
    for (status, name) in [
        (SYMM_ERR_UNAVAILABLE, "SYMM_ERR_UNAVAILABLE"),
        (SYMM_ERR_TIMEOUT, "SYMM_ERR_TIMEOUT"),
        (SYMM_ERR_PEER_LOST, "SYMM_ERR_PEER_LOST"),
        (SYMM_ERR_POISONED, "SYMM_ERR_POISONED"),
        (SYMM_ERR_DEVICE, "SYMM_ERR_DEVICE"),
    ] {
        // SAFETY: the name is a static NUL-terminated string.
        let got = unsafe { CStr::from_ptr(symm_status_name(status)) };
        assert_eq!(got.to_str().unwrap(), name);
    }
}

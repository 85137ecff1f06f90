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

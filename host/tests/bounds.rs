//! The host backend's memory is bounded by its input: a request whose run would take more than
//! `MAX_HOST_BYTES` (every rank's buffers, scratch, low-latency words and pad) gets a typed
//! error before anything is allocated, never an abort.

use std::time::Duration;

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_host::{self as host, HostError, SimOptions, ThreadOptions, MAX_HOST_BYTES};

fn too_large(r: Result<host::Run, HostError>, what: &str) {
    match r {
        Err(HostError::TooLarge { bytes, limit }) => {
            assert_eq!(limit, MAX_HOST_BYTES);
            assert!(bytes > limit, "{what}: {bytes}");
        }
        Err(e) => panic!("{what}: another error: {e}"),
        Ok(_) => panic!("{what}: ran"),
    }
}

/// Low-latency scratch is sized by the message: `req` runs in little memory and gives the
/// reference's result, in the simulator and on real threads.
fn runs_in_little_memory(req: Request) {
    let opts = ThreadOptions {
        deadline: Duration::from_secs(120),
        trace: false,
    };
    let what = format!("{} world {}", req.algorithm.name(), req.world);
    // Every rank's buffers, scratch, line words and pad: one line per region at world 1024
    // (under 1 GiB for all 1024 ranks' 128-byte lines), not the 2^38 bytes of regions sized by
    // the format's bound.
    let bytes = host::check_footprint(&req, true).expect(&what);
    assert!(bytes < 1 << 30, "{what}: {bytes} bytes");
    let inputs = host::random_inputs(&req, 1);
    let want = host::reference(&req, &inputs);
    let run = host::simulate(&req, &inputs, &SimOptions::default()).expect(&what);
    assert!(
        host::compare(&req, &run.outputs, &want).is_ok(),
        "{what}: simulator"
    );
    let run = host::run_threads(&req, &inputs, &opts).expect(&what);
    assert!(
        host::compare(&req, &run.outputs, &want).is_ok(),
        "{what}: threads"
    );
}

/// Four bytes over 1024 ranks.
fn tiny(c: Collective, a: Algorithm) -> Request {
    Request::new(c, a, 1024, 4, DType::F32, ReduceOp::Sum)
}

#[test]
fn four_bytes_over_1024_ranks_one_shot_ll() {
    runs_in_little_memory(tiny(Collective::AllReduce, Algorithm::OneShotLl));
}

#[test]
fn four_bytes_over_1024_ranks_one_shot_ll128() {
    runs_in_little_memory(tiny(Collective::AllReduce, Algorithm::OneShotLl128));
}

#[test]
fn four_bytes_over_1024_ranks_direct_ll() {
    runs_in_little_memory(tiny(Collective::AllGather, Algorithm::DirectLl));
}

#[test]
fn four_bytes_over_1024_ranks_direct_ll128() {
    runs_in_little_memory(tiny(Collective::ReduceScatter, Algorithm::DirectLl128));
}

#[test]
fn world_72_over_16_channels() {
    runs_in_little_memory(
        Request::new(
            Collective::AllReduce,
            Algorithm::OneShotLl,
            72,
            4096,
            DType::Bf16,
            ReduceOp::Sum,
        )
        .with_channels(16),
    );
}

/// A request whose memory is over the bound gets `TooLarge` before anything is allocated, from
/// the simulator and from real threads.
#[test]
fn a_request_over_the_bound_is_an_error_not_an_abort() {
    let opts = ThreadOptions {
        deadline: Duration::from_secs(5),
        trace: false,
    };
    // 16 channels of 64 KiB at world 1024: 4 GiB of regions per rank.
    for (c, a, bytes) in [
        (Collective::AllReduce, Algorithm::OneShotLl, 1u64 << 20),
        (Collective::AllReduce, Algorithm::Ring, 8 << 20),
        (Collective::AllGather, Algorithm::DirectLl128, 1 << 20),
    ] {
        let req = Request::new(c, a, 1024, bytes, DType::F32, ReduceOp::Sum).with_channels(16);
        let what = format!("{} world 1024, {bytes} bytes", a.name());
        // Inputs the size of the request are not even drawn: the bound is checked first.
        let inputs = vec![Vec::new(); 1024];
        too_large(host::simulate(&req, &inputs, &SimOptions::default()), &what);
        too_large(host::run_threads(&req, &inputs, &opts), &what);
    }
}

#[test]
fn the_bound_counts_every_part_of_the_memory() {
    // Inputs and outputs alone would fit; the low-latency scratch does not.
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::OneShotLl,
        1024,
        64 << 10,
        DType::F32,
        ReduceOp::Sum,
    );
    let sz = req.buffer_sizes();
    assert!((sz.input + sz.output) * 1024 < MAX_HOST_BYTES);
    assert!(host::check_footprint(&req, true).is_err());
    // Timing only holds the pads: the same request is timed.
    let timing = SimOptions {
        data: false,
        trace: false,
        ..SimOptions::default()
    };
    assert!(host::check_footprint(&req, false).is_ok());
    assert!(host::simulate(&req, &[], &timing).is_ok());
    // A small run is untouched.
    let small = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        4,
        4096,
        DType::F32,
        ReduceOp::Sum,
    );
    let inputs = host::random_inputs(&small, 3);
    let run = host::simulate(&small, &inputs, &SimOptions::default()).unwrap();
    assert_eq!(run.outputs, host::reference(&small, &inputs));
}

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

#[test]
fn a_few_bytes_over_a_thousand_ranks_is_an_error_not_an_abort() {
    let opts = ThreadOptions {
        deadline: Duration::from_secs(5),
        trace: false,
    };
    for (c, a) in [
        (Collective::AllReduce, Algorithm::OneShotLl),
        (Collective::AllReduce, Algorithm::OneShotLl128),
        (Collective::AllGather, Algorithm::DirectLl),
        (Collective::ReduceScatter, Algorithm::DirectLl128),
    ] {
        let req = Request::new(c, a, 1024, 4, DType::F32, ReduceOp::Sum);
        let inputs = host::random_inputs(&req, 1);
        let what = format!("{} world 1024, 4 bytes", a.name());
        too_large(host::simulate(&req, &inputs, &SimOptions::default()), &what);
        too_large(host::run_threads(&req, &inputs, &opts), &what);
    }
    // World 72 over 16 channels.
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::OneShotLl,
        72,
        4096,
        DType::Bf16,
        ReduceOp::Sum,
    )
    .with_channels(16);
    let inputs = host::random_inputs(&req, 2);
    too_large(
        host::simulate(&req, &inputs, &SimOptions::default()),
        "world 72, 16 channels",
    );
}

#[test]
fn the_bound_counts_every_part_of_the_memory() {
    // Inputs and outputs alone would fit; the low-latency scratch does not.
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::OneShotLl,
        1024,
        4,
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

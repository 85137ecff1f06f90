//! In-place collectives: where `Request::runs_in_place` says a rank's output may be its input,
//! running every schedule so, with a thread per (rank, channel), gives the reference's bits.

use std::time::Duration;

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{algorithms, Algorithm, Collective, Request};
use symm_host::{self as host, HostError, ThreadOptions};

fn opts() -> ThreadOptions {
    ThreadOptions {
        deadline: Duration::from_secs(20),
        trace: false,
    }
}

#[test]
fn the_in_place_algorithms_are_the_ones_that_read_before_they_write() {
    let all_reduce: Vec<Algorithm> = algorithms(Collective::AllReduce)
        .iter()
        .copied()
        .filter(|&a| {
            Request::new(Collective::AllReduce, a, 4, 4096, DType::F32, ReduceOp::Sum)
                .runs_in_place()
        })
        .collect();
    assert_eq!(
        all_reduce,
        [
            Algorithm::TwoShot,
            Algorithm::Multicast,
            Algorithm::OneShotLl,
            Algorithm::OneShotLl128
        ]
    );
    // The others read a peer's input while it writes its output, or their sizes differ.
    for c in [
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
        Collective::Broadcast { root: 0 },
    ] {
        for &a in algorithms(c) {
            let req = Request::new(c, a, 4, 4096, DType::F32, ReduceOp::Sum);
            assert!(!req.runs_in_place(), "{c:?} {a:?}");
        }
    }
}

#[test]
fn in_place_all_reduces_give_the_reference_bits() {
    let mut cases = 0;
    for world in [2u16, 3, 4] {
        for &alg in algorithms(Collective::AllReduce) {
            for (dtype, op) in [
                (DType::F32, ReduceOp::Sum),
                (DType::Bf16, ReduceOp::Sum),
                (DType::I32, ReduceOp::Max),
                (DType::F16, ReduceOp::Avg),
            ] {
                for bytes in [64u64, 4096, 40_000, 262_144] {
                    for channels in [1u16, 2, 4] {
                        let req = Request::new(Collective::AllReduce, alg, world, bytes, dtype, op)
                            .with_channels(channels);
                        if !req.runs_in_place() || req.validate().is_err() {
                            continue;
                        }
                        let inputs = host::random_inputs(&req, u64::from(world) * 31 + bytes);
                        let want = host::reference(&req, &inputs);
                        // Threads interleave differently each time.
                        for _ in 0..3 {
                            let run = host::run_threads_in_place(&req, &inputs, &opts())
                                .unwrap_or_else(|e| panic!("{req:?}: {e}"));
                            assert_eq!(run.outputs, want, "{req:?}");
                        }
                        cases += 1;
                    }
                }
            }
        }
    }
    assert!(cases > 100, "{cases} cases");
}

#[test]
fn an_algorithm_that_does_not_run_in_place_is_refused() {
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::OneShot,
        2,
        4096,
        DType::F32,
        ReduceOp::Sum,
    );
    let inputs = host::random_inputs(&req, 3);
    assert!(matches!(
        host::run_threads_in_place(&req, &inputs, &opts()),
        Err(HostError::NotInPlace {
            algorithm: "one_shot",
            ..
        })
    ));
    // Bad input is still refused first.
    assert!(matches!(
        host::run_threads_in_place(&req, &inputs[..1], &opts()),
        Err(HostError::BadWorld { .. })
    ));
}

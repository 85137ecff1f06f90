//! A job of back-to-back calls on host threads: agreeing calls give the reference's outputs with
//! no barrier between them, and a call that differs on one rank is named on every rank at once.

use std::time::{Duration, Instant};
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Differs, Request};
use symm_host::{
    random_inputs, reference, run_calls, CallsError, CallsMode, CallsOptions, HostError,
};

fn req(c: Collective, a: Algorithm, world: u16, bytes: u64) -> Request {
    Request::new(c, a, world, bytes, DType::F32, ReduceOp::Sum)
}

fn opts() -> CallsOptions {
    CallsOptions {
        mode: CallsMode::Threads(Duration::from_secs(20)),
        seed: 3,
    }
}

/// Both modes: threads, and the one-thread simulation.
fn modes() -> [CallsOptions; 2] {
    [
        opts(),
        CallsOptions {
            mode: CallsMode::Simulate,
            seed: 3,
        },
    ]
}

/// A mix of calls every rank makes: collectives, algorithms, sizes and channels that change
/// from one call to the next.
fn mix(world: u16) -> Vec<Request> {
    vec![
        req(Collective::AllReduce, Algorithm::OneShot, world, 256),
        req(Collective::AllReduce, Algorithm::TwoShot, world, 1024).with_channels(2),
        req(Collective::AllGather, Algorithm::Ring, world, 64),
        req(Collective::ReduceScatter, Algorithm::Ring, world, 128).with_channels(3),
        req(
            Collective::Broadcast { root: 1 },
            Algorithm::Tree,
            world,
            512,
        ),
        req(Collective::AllReduce, Algorithm::Ring, world, 96).with_pipeline(16, 2),
        req(Collective::AllToAll, Algorithm::Pairwise, world, 32),
        req(Collective::AllReduce, Algorithm::OneShot, world, 256),
    ]
}

#[test]
fn agreeing_calls_back_to_back_give_the_reference_on_every_rank() {
    for world in [2u16, 3, 4] {
        let calls = mix(world);
        for o in modes() {
            let runs = run_calls(&vec![calls.clone(); world as usize], &o);
            for (r, run) in runs.iter().enumerate() {
                let outs = run
                    .as_ref()
                    .unwrap_or_else(|e| panic!("world {world} rank {r}: {e}"));
                for (k, call) in calls.iter().enumerate() {
                    let want = reference(call, &random_inputs(call, 3 + k as u64));
                    assert_eq!(outs[k], want[r], "world {world} rank {r} call {k} {call:?}");
                }
            }
        }
    }
}

#[test]
fn a_call_that_differs_on_one_rank_is_named_on_every_rank_at_once() {
    let world = 4u16;
    let base = mix(world);
    let ar = base[0];
    let cases: Vec<(Request, Differs)> = vec![
        (Request { bytes: 512, ..ar }, Differs::SIZE),
        (
            Request {
                dtype: DType::I32,
                ..ar
            },
            Differs::DTYPE,
        ),
        (
            Request {
                op: ReduceOp::Max,
                ..ar
            },
            Differs::OP,
        ),
        (
            Request {
                collective: Collective::AllGather,
                algorithm: Algorithm::Ring,
                bytes: 64,
                ..ar
            },
            Differs::COLLECTIVE | Differs::ALGORITHM | Differs::SIZE,
        ),
        (ar.with_channels(2), Differs::SHAPE),
    ];
    for (other, differs) in cases {
        // Rank 2's call 3 differs; the calls before it agree and run.
        let mut calls = vec![base.clone(); world as usize];
        calls[2][3] = other;
        calls
            .iter_mut()
            .filter(|c| c[3] != other)
            .for_each(|c| c[3] = ar);
        for o in modes() {
            let t0 = Instant::now();
            let runs = run_calls(&calls, &o);
            let took = t0.elapsed();
            for (r, run) in runs.iter().enumerate() {
                match run {
                    Err(CallsError::RanksDiffer {
                        call: 3,
                        differs: d,
                        ..
                    }) => assert_eq!(*d, differs, "rank {r}"),
                    other => panic!("rank {r}: {other:?}"),
                }
            }
            // Named at once, not at the deadline.
            assert!(took < Duration::from_secs(5), "{took:?}");
        }
    }
}

#[test]
fn a_rank_that_skips_a_call_is_named_by_the_sequence() {
    let world = 3u16;
    let base = mix(world);
    let mut calls = vec![base.clone(); world as usize];
    calls[1].remove(2);
    for o in modes() {
        let runs = run_calls(&calls, &o);
        for (r, run) in runs.iter().enumerate() {
            match run {
                Err(CallsError::RanksDiffer { call: 2, .. }) => {}
                other => panic!("rank {r}: {other:?}"),
            }
        }
    }
}

#[test]
fn a_rank_with_a_call_less_at_the_end_is_a_deadlock_in_the_simulation_and_a_timeout_in_threads() {
    // The calls agree as far as they go; rank 0 stops one call early, so its peers wait for
    // it: no signature can name that, and both modes say where they wait.
    let world = 2u16;
    let base = mix(world);
    let mut calls = vec![base.clone(); world as usize];
    calls[0].pop();
    let sim = run_calls(&calls, &modes()[1]);
    assert!(sim[0].is_ok(), "{:?}", sim[0]);
    assert!(
        matches!(
            sim[1],
            Err(CallsError::Host(HostError::Deadlock { rank: 1, .. }))
        ),
        "{:?}",
        sim[1]
    );
    let quick = CallsOptions {
        mode: CallsMode::Threads(Duration::from_millis(300)),
        seed: 3,
    };
    let threads = run_calls(&calls, &quick);
    assert!(threads[0].is_ok(), "{:?}", threads[0]);
    assert!(
        matches!(
            threads[1],
            Err(CallsError::Host(HostError::Timeout { rank: 1, .. }))
        ),
        "{:?}",
        threads[1]
    );
}

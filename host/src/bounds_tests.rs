//! A host run's ops and threads are bounded: past the bound the run stops with a typed error,
//! never an allocation that grows with the schedule's length or a panic from the system.

use crate::mem::WorldMem;
use crate::{HostError, SimOptions, TeamJob, TeamMode, ThreadOptions, MAX_HOST_THREADS};
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request, Schedule};
use symm_core::team::Team;

/// A ring all-reduce of 4 KiB in 64-byte chunks: hundreds of ops per stream.
fn long() -> Request {
    Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        4,
        4096,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_pipeline(64, 0)
}

fn too_many_ops<T>(r: Result<T, HostError>, limit: u64) {
    match r {
        Err(HostError::TooManyOps { limit: l }) => assert_eq!(l, limit),
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("ran past {limit} ops"),
    }
}

#[test]
fn the_simulator_stops_at_its_op_bound() {
    let req = long();
    let inputs = crate::random_inputs(&req, 3);
    let opts = SimOptions::default();
    let schedule = |r, c| Schedule::new(req, r, c).map_err(HostError::Sched);
    too_many_ops(
        crate::sim::simulate_within(&req, &inputs, &opts, schedule, 100),
        100,
    );
    let run = crate::sim::simulate_within(&req, &inputs, &opts, schedule, 1 << 20).unwrap();
    assert!(run.ops > 100, "{} ops", run.ops);
    assert_eq!(run.outputs, crate::reference(&req, &inputs));
}

#[test]
fn traced_threads_stop_at_the_op_bound_and_untraced_ones_run_on() {
    let req = long();
    let inputs = crate::random_inputs(&req, 4);
    let schedule = |r, c| Schedule::new(req, r, c).map_err(HostError::Sched);
    let traced = ThreadOptions::default();
    let mem = WorldMem::new(&req, &inputs, crate::POISON).unwrap();
    too_many_ops(
        crate::threads::run_within(&req, &mem, &traced, schedule, 100),
        100,
    );
    let untraced = ThreadOptions {
        trace: false,
        ..traced
    };
    let mem = WorldMem::new(&req, &inputs, crate::POISON).unwrap();
    let run = crate::threads::run_within(&req, &mem, &untraced, schedule, 100).unwrap();
    assert!(run.ops > 100, "{} ops", run.ops);
    assert_eq!(run.outputs, crate::reference(&req, &inputs));
}

#[test]
fn a_run_needing_more_threads_than_the_bound_starts_none() {
    let bytes = 16 * 1024;
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::OneShot,
        1024,
        bytes,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_channels(16);
    let threads = 1024 * 16;
    assert!(threads > MAX_HOST_THREADS);
    let inputs = vec![vec![0u8; bytes as usize]; 1024];
    match crate::run_threads(&req, &inputs, &ThreadOptions::default()) {
        Err(HostError::TooManyThreads { threads: t, limit }) => {
            assert_eq!((t, limit), (threads, MAX_HOST_THREADS))
        }
        other => panic!("{:?}", other.map(|r| r.ops)),
    }
}

#[test]
fn team_runs_stop_at_the_op_bound() {
    let team = Team::new(1, 4, &[0, 2]).unwrap();
    let request = Request { world: 2, ..long() };
    let job = TeamJob {
        team,
        inputs: crate::random_inputs(&request, 5),
        request,
    };
    too_many_ops(
        crate::teams::run_teams_within(
            4,
            std::slice::from_ref(&job),
            TeamMode::Simulate,
            false,
            50,
        ),
        50,
    );
    crate::teams::run_teams_within(4, &[job], TeamMode::Simulate, false, 1 << 20).unwrap();
}

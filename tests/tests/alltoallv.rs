//! All-to-allv: random per-pair counts (zeros included) on worlds {1, 2, 3, 4, 5, 8}, every dtype,
//! one and two channels, on the simulator and on real threads, against the sequential reference;
//! bad counts are typed errors.

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{alltoallv, alltoallv_capacity, Algorithm, Collective, Request, SchedError};
use symm_core::symbolic::Rng;
use symm_driver::host::{
    alltoallv_reference, compare, random_inputs, run_streams, simulate_streams, HostError,
    SimOptions, ThreadOptions,
};

fn counts(world: u16, rng: &mut Rng) -> Vec<u64> {
    let w = world as usize;
    (0..w * w)
        .map(|_| if rng.below(4) == 0 { 0 } else { rng.below(300) })
        .collect()
}

#[test]
fn alltoallv_matches_the_reference() {
    let mut rng = Rng::new(9);
    let mut runs = 0;
    for world in [1u16, 2, 3, 4, 5, 8] {
        for dt in DType::ALL {
            for channels in [1u16, 2] {
                let c = counts(world, &mut rng);
                let cap = alltoallv_capacity(world, &c).unwrap_or(0);
                let req = Request::new(
                    Collective::AllToAllV,
                    Algorithm::Pairwise,
                    world,
                    cap * dt.size(),
                    dt,
                    ReduceOp::Sum,
                )
                .with_channels(channels);
                let inputs = random_inputs(&req, runs);
                let want = alltoallv_reference(&req, &inputs, &c);
                let make = |r, ch| alltoallv(req, r, ch, &c).map_err(HostError::Sched);
                let sim = simulate_streams(&req, &inputs, &SimOptions::default(), make).unwrap();
                compare(&req, &sim.outputs, &want)
                    .unwrap_or_else(|m| panic!("{req:?} {c:?}: {m:?}"));
                let opts = ThreadOptions {
                    trace: false,
                    ..Default::default()
                };
                let thr = run_streams(&req, &inputs, &opts, make).unwrap();
                compare(&req, &thr.outputs, &want)
                    .unwrap_or_else(|m| panic!("{req:?} {c:?}: {m:?}"));
                runs += 1;
            }
        }
    }
    println!("all_to_allv: {runs} configurations passed on the simulator and on threads");
}

#[test]
fn alltoallv_rejects_bad_counts() {
    let req = Request::new(
        Collective::AllToAllV,
        Algorithm::Pairwise,
        2,
        64,
        DType::F32,
        ReduceOp::Sum,
    );
    assert_eq!(
        alltoallv(req, 0, 0, &[1, 2, 3]).err(),
        Some(SchedError::BadCounts { len: 3 })
    );
    assert_eq!(
        alltoallv(req, 0, 0, &[10, 10, 0, 0]).err(),
        Some(SchedError::CountsExceedBuffer { rank: 0 })
    );
    assert_eq!(
        alltoallv(req, 0, 0, &[u64::MAX, 1, 0, 0]).err(),
        Some(SchedError::CountsExceedBuffer { rank: 0 })
    );
    assert_eq!(
        alltoallv(req, 2, 0, &[1, 1, 1, 1]).err(),
        Some(SchedError::BadRank { rank: 2 })
    );
    assert_eq!(
        symm_core::sched::Schedule::new(req, 0, 0).err(),
        Some(SchedError::NeedsCounts)
    );
}

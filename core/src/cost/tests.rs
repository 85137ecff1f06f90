use super::*;
use crate::dtype::{DType, ReduceOp};
use crate::sched::Collective;

fn req(alg: Algorithm, world: u16, bytes: u64) -> Request {
    Request::new(
        Collective::AllReduce,
        alg,
        world,
        bytes,
        DType::Bf16,
        ReduceOp::Sum,
    )
}

#[test]
fn selection_follows_the_size_regimes() {
    let l = Link::NVLINK4;
    // Small messages: one trip of LL lines; above its bound LL is never a candidate.
    assert_eq!(
        select(&req(Algorithm::Ring, 8, 4096), &l, false),
        Algorithm::OneShotLl
    );
    assert_ne!(
        select(
            &req(Algorithm::Ring, 8, crate::ll::MAX_BYTES + 2),
            &l,
            false
        ),
        Algorithm::OneShotLl
    );
    assert_eq!(
        select(&req(Algorithm::Ring, 8, 256 << 20), &l, false),
        Algorithm::TwoShot
    );
    let t1 = predict(&req(Algorithm::Ring, 8, 1 << 30), &l);
    let t2 = predict(&req(Algorithm::Ring, 8, 2 << 30), &l);
    assert!(
        t2 > 1.9 * t1 && t2 < 2.1 * t1,
        "bandwidth term dominates: {t1} {t2}"
    );
}

#[test]
fn no_all_reduce_beats_the_bandwidth_lower_bound() {
    // 2(p-1)/p * n * beta is the least any all-reduce moves through one port.
    let l = Link::NVLINK4;
    for p in [2u16, 3, 8, 16, 64, 72] {
        let n = 1u64 << 30;
        let bound = 2.0 * (p as f64 - 1.0) / p as f64 * n as f64 / l.beta_bytes_per_us;
        for &a in algorithms(Collective::AllReduce) {
            if a == Algorithm::Multicast {
                continue;
            }
            let t = predict(&req(a, p, n), &l);
            assert!(t >= bound, "{a:?} at p={p}: {t} < {bound}");
        }
    }
}

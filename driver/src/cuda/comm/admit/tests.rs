use super::*;
use std::hash::BuildHasher;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective};

fn req(bytes: u64) -> Request {
    Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        4,
        bytes,
        DType::F32,
        ReduceOp::Sum,
    )
}

#[test]
fn the_executor_is_fixed_by_the_option_and_the_plan() {
    // Copy engines win over any plan path.
    for path in [PlanPath::Auto, PlanPath::Compiled, PlanPath::Interpreted] {
        assert_eq!(Executor::choose(true, path, 8), Executor::CopyEngines);
    }
    assert_eq!(
        Executor::choose(false, PlanPath::Interpreted, 8),
        Executor::Interpreter
    );
    assert_eq!(
        Executor::choose(false, PlanPath::Compiled, 8),
        Executor::Compiled
    );
    // Auto compiles short kernels only.
    let short = crate::cuda::compiled::AUTO_COMPILED_OPS;
    assert_eq!(
        Executor::choose(false, PlanPath::Auto, short),
        Executor::Compiled
    );
    assert_eq!(
        Executor::choose(false, PlanPath::Auto, short + 1),
        Executor::Interpreter
    );
}

#[test]
fn the_cache_tells_teams_and_requests_apart() {
    let mut c = AdmitCache::<u32>::default();
    c.insert((0, req(64)), 1);
    c.insert((1, req(64)), 2);
    c.insert((0, req(128)), 3);
    assert_eq!(c.get(&(0, req(64))), Some(&1));
    assert_eq!(c.get(&(1, req(64))), Some(&2));
    assert_eq!(c.get(&(0, req(128))), Some(&3));
    assert_eq!(c.get(&(2, req(64))), None);
    let mut other = req(64);
    other.channels = 2;
    assert_eq!(c.get(&(0, other)), None);
    c.clear();
    assert_eq!(c.get(&(0, req(64))), None);
}

#[test]
fn the_hash_sees_every_field() {
    let h = |k: &AdmitKey| FastHash::default().hash_one(k);
    let base = (0u16, req(64));
    let mut variants = vec![(1u16, req(64)), (0, req(128))];
    let mut r = req(64);
    r.dtype = DType::F16;
    variants.push((0, r));
    let mut r = req(64);
    r.op = ReduceOp::Max;
    variants.push((0, r));
    let mut r = req(64);
    r.slots = 3;
    variants.push((0, r));
    let mut r = req(64);
    r.collective = Collective::Broadcast { root: 1 };
    variants.push((0, r));
    for v in &variants {
        assert_ne!(h(&base), h(v), "{v:?}");
    }
    assert_eq!(h(&base), h(&(0, req(64))));
}

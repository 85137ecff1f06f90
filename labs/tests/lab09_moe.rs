//! Lab 9's MoE placement part: the untouched skeleton fails with the intended words, each of its
//! two mistakes on its own is named, and the solution passes.

use symm_core::moe::sched::{MoePlan, RowFn};
use symm_core::moe::MoeConfig;
use symm_labs::grade::{Failure, Grader, Which};
use symm_labs::lab09::{moe, skeleton, solution};

fn grade(route: moe::RouteFn, rows: RowFn) -> Result<(), Box<Failure>> {
    moe::check(&mut Grader::new(Which::Student, None), route, rows)
}

fn words(f: &Failure) -> String {
    f.to_string()
}

#[test]
fn the_skeleton_sends_a_token_once_per_expert_and_is_told_so() {
    let f = grade(&skeleton::route, &skeleton::expert_row).expect_err("the skeleton must fail");
    let w = words(&f);
    assert!(f.case.ends_with(": route"), "{w}");
    assert!(
        w.contains("has slot") && w.contains("it should have slot"),
        "{w}"
    );
    assert!(
        w.contains("1 earlier token of rank 0 also goes to rank 0"),
        "{w}"
    );
    assert!(w.contains("a token goes to a rank once"), "{w}");
}

#[test]
fn a_row_without_the_experts_before_it_is_named() {
    let f = grade(&solution::route, &skeleton::expert_row).expect_err("the rows must fail");
    let w = words(&f);
    assert!(f.case.ends_with(": expert_row"), "{w}");
    assert!(w.contains("rows of local experts 0.."), "{w}");
    assert!(w.contains("expert-major"), "{w}");
}

#[test]
fn a_row_past_rows_max_must_be_dropped() {
    // The last batch has room for fewer rows than entries.
    let last = moe::batches().pop().unwrap();
    let lib = moe::routings(&last);
    let plan = MoePlan::new(last.cfg, &lib).unwrap();
    let dropped: u32 = (0..last.cfg.world).map(|q| plan.dropped(q)).sum();
    assert!(dropped > 0, "the batch drops no entry");
    let unbounded = |c: &MoeConfig, col: &[u32], p: u16, j: u32, e: u32| {
        let big = MoeConfig {
            rows_max: u32::MAX,
            ..*c
        };
        solution::expert_row(&big, col, p, j, e)
    };
    let f = grade(&solution::route, &unbounded).expect_err("must drop");
    let w = words(&f);
    assert!(
        w.contains("it should get no row (dropped: rows_max is 12)"),
        "{w}"
    );
}

#[test]
fn the_solution_passes() {
    grade(&solution::route, &solution::expert_row).unwrap_or_else(|f| panic!("{f}"));
}

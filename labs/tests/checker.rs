//! The checker on broken schedules: every mistake is a typed problem in words, never a crash.

use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::{Buf, Op, SignalOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_core::signal::SlotKind::{Data, Ready};
use symm_labs::kit::Kit;
use symm_labs::problem::Problem;
use symm_labs::run::{check_case, trace_of, Case};

fn case() -> Case {
    let req = Request::new(
        Collective::AllGather,
        Algorithm::Ring,
        3,
        16,
        DType::F32,
        ReduceOp::Sum,
    );
    Case::new("world 3", req)
}

fn problem(plan: &dyn Fn(&Kit) -> Vec<Op>) -> (Problem, String) {
    problem_in(case(), plan)
}

/// The problem of `plan` on `c`, with its words.
fn problem_in(c: Case, plan: &dyn Fn(&Kit) -> Vec<Op>) -> (Problem, String) {
    let p = check_case(&c, plan).err().expect("the check must fail");
    let words = p.words(&c.req).to_string();
    (p, words)
}

#[test]
fn a_panicking_schedule_is_reported_with_its_message() {
    #[allow(clippy::unnecessary_lazy_evaluations)]
    let plan = |k: &Kit| {
        let prev = k
            .rank()
            .checked_sub(1)
            .unwrap_or_else(|| panic!("rank 0 has no rank - 1"));
        vec![k.signal(prev, Ready)]
    };
    let (p, words) = problem(&plan);
    assert!(matches!(p, Problem::Panicked { rank: 0, .. }), "{p:?}");
    assert!(words.contains("panicked building rank 0's ops"), "{words}");
}

#[test]
fn a_rank_outside_the_world_is_named() {
    let plan = |k: &Kit| {
        vec![k.copy(
            k.at(k.rank(), Buf::Input, 0),
            k.at(k.rank() + 1, Buf::Output, 0),
            4,
        )]
    };
    let (p, words) = problem(&plan);
    assert!(
        matches!(
            p,
            Problem::RankOutside {
                rank: 2,
                named: 3,
                ..
            }
        ),
        "{p:?}"
    );
    assert!(
        words.contains("names rank 3, but the world is ranks 0..=2"),
        "{words}"
    );
    assert!(p.hint().unwrap().contains("% world"));
}

/// Sizes and offsets at the edge of u64 are refused in words (the report's arithmetic
/// saturates), and signal values that would overflow a sum do not crash the balance check.
#[test]
fn extreme_sizes_and_values_are_reported_not_crashed() {
    let huge = |k: &Kit| {
        vec![k.copy(
            k.at(k.rank(), Buf::Input, 0),
            k.at(k.rank(), Buf::Output, u64::MAX / 8),
            u64::MAX,
        )]
    };
    let (p, words) = problem(&huge);
    assert!(matches!(p, Problem::OutsideBuffer { .. }), "{p:?}");
    assert!(words.contains("rank 0's output"), "{words}");
    let loud = |k: &Kit| {
        let next = (k.rank() + 1) % 3;
        let slot = k.slot(Data, k.rank());
        vec![
            Op::Signal {
                peer: next,
                slot,
                op: SignalOp::Add,
                value: u64::MAX,
            },
            Op::Signal {
                peer: next,
                slot,
                op: SignalOp::Add,
                value: u64::MAX,
            },
        ]
    };
    let c = case();
    assert!(check_case(&c, &loud).is_err());
}

#[test]
fn a_copy_past_the_buffer_is_named() {
    let plan = |k: &Kit| {
        vec![k.copy(
            k.at(k.rank(), Buf::Input, 0),
            k.at(k.rank(), Buf::Output, 10),
            4,
        )]
    };
    let (p, words) = problem(&plan);
    assert!(matches!(p, Problem::OutsideBuffer { .. }), "{p:?}");
    assert!(
        words.contains("reaches bytes 40..56 of rank 0's output, which has 48 bytes"),
        "{words}"
    );
}

#[test]
fn a_signal_on_a_slot_named_for_another_writer_is_refused() {
    let plan = |k: &Kit| {
        vec![Op::Signal {
            peer: k.next(),
            slot: k.slot(Data, k.prev()),
            op: SignalOp::Add,
            value: 1,
        }]
    };
    let (p, words) = problem(&plan);
    assert!(matches!(p, Problem::ForeignSlot { .. }), "{p:?}");
    assert!(
        words.contains("a slot is written only by the rank it names"),
        "{words}"
    );
}

#[test]
fn a_wait_no_one_signals_is_a_deadlock_naming_the_missing_signal() {
    let plan = |k: &Kit| vec![k.wait(k.prev(), Data, 1)];
    let (p, words) = problem(&plan);
    let Problem::Deadlock { chain } = &p else {
        panic!("{p:?}")
    };
    assert_eq!(chain[0].sent_in_all, 0);
    assert!(
        words.contains("sends only 0 such signal(s) in its whole schedule"),
        "{words}"
    );
    // The trace still comes out, ending in stalls.
    let trace = trace_of(&case(), &plan).expect("a trace of the deadlock");
    let decoded = symm_core::trace::decode(&trace).unwrap();
    let stalls = decoded
        .events
        .iter()
        .filter(|e| matches!(e.kind, symm_core::trace::EventKind::Stall { .. }))
        .count();
    assert_eq!(stalls, 3);
    // The viz replays it and its hang analysis finds the stalled waits.
    let t = symm_viz::model::Trace::decode("yours", trace).unwrap();
    assert!(symm_viz::hang::analyse(&t).is_some());
}

#[test]
fn a_cycle_of_waits_is_followed_around_the_ring() {
    let plan = |k: &Kit| vec![k.wait(k.prev(), Data, 1), k.signal(k.next(), Data)];
    let (p, words) = problem(&plan);
    let Problem::Deadlock { chain } = &p else {
        panic!("{p:?}")
    };
    assert_eq!(chain.len(), 3, "{words}");
    assert!(words.contains("has not sent it yet"), "{words}");
}

#[test]
fn a_signal_never_waited_for_is_unbalanced() {
    let plan = |k: &Kit| {
        let me = k.rank() as u64;
        let n = k.elems();
        let own = k.at(k.rank(), Buf::Input, 0);
        let mut ops: Vec<Op> = (0..k.world())
            .map(|q| k.copy(own, k.at(q, Buf::Output, me * n), n))
            .collect();
        ops.push(k.signal(k.next(), Data));
        ops
    };
    // No handshake, on purpose: the unbalanced signal is what is looked for.
    let (p, words) = problem_in(case().without_handshake(), &plan);
    assert!(
        matches!(
            p,
            Problem::Unbalanced {
                pad: 1,
                expected: 0,
                ..
            }
        ),
        "{p:?}"
    );
    assert!(words.contains("received 1 signal but rank"), "{words}");
}

#[test]
fn a_block_in_the_wrong_place_is_described_by_origin() {
    // Every rank writes its block at block 0 of every output: a race and a wrong layout.
    let plan = |k: &Kit| {
        let own = k.at(k.rank(), Buf::Input, 0);
        (0..k.world())
            .map(|q| k.copy(own, k.at(q, Buf::Output, 0), k.elems()))
            .collect()
    };
    let (p, words) = problem_in(case().without_handshake(), &plan);
    assert!(matches!(p, Problem::Wrong { .. }), "{p:?}");
    assert!(words.contains("it should hold rank"), "{words}");
}

/// Lab 7's one-shot and lab 2's ring with their `Ready` handshake dropped (signals and waits):
/// the data still comes out right on these runs, and the rule the labs teach fails them by name.
#[test]
fn touching_a_peer_before_its_ready_breaks_the_rule_even_when_the_data_is_right() {
    let no_ready = |plan: &dyn Fn(&Kit) -> Vec<Op>, k: &Kit| -> Vec<Op> {
        let layout = k.request().layout();
        let ready = |s: u32| layout.key(s).is_some_and(|x| x.kind == Ready);
        plan(k)
            .into_iter()
            .filter(
                |op| !matches!(*op, Op::Wait { slot, .. } | Op::Signal { slot, .. } if ready(slot)),
            )
            .collect()
    };
    for (c, plan) in [
        (
            Request::new(
                Collective::AllReduce,
                Algorithm::OneShot,
                4,
                64,
                DType::F32,
                ReduceOp::Sum,
            ),
            &symm_labs::lab07::solution::one_shot as &dyn Fn(&Kit) -> Vec<Op>,
        ),
        (
            Request::new(
                Collective::ReduceScatter,
                Algorithm::Ring,
                3,
                32,
                DType::F32,
                ReduceOp::Sum,
            ),
            &symm_labs::lab02::solution::reduce_scatter,
        ),
    ] {
        let dropped = |k: &Kit| no_ready(plan, k);
        // Without the rule, every check passes: the race was not lost on these runs.
        assert!(check_case(&Case::new("w", c).without_handshake(), &dropped).is_ok());
        let (p, words) = problem_in(Case::new("w", c), &dropped);
        assert!(matches!(p, Problem::TouchBeforeReady { .. }), "{p:?}");
        assert!(words.contains("'Ready before touch'"), "{words}");
        // And the solution itself keeps the rule.
        assert!(check_case(&Case::new("w", c), plan).is_ok());
    }
}

#[test]
fn every_solution_writes_traces_the_viz_replays() {
    use symm_labs::grade::{Grader, Which};
    let dir = std::env::temp_dir().join(format!("symm-labs-traces-{}", std::process::id()));
    for lab in symm_labs::LABS {
        let out = dir.join(format!("{:02}", lab.number));
        let mut g = Grader::new(Which::Solution, Some(out.clone()));
        assert!((lab.check)(&mut g).is_ok(), "lab {}", lab.number);
        for name in ["yours.trace", "reference.trace"] {
            let bytes = std::fs::read(out.join(name)).unwrap();
            let t = symm_viz::model::Trace::decode(name, bytes);
            assert!(t.is_ok(), "lab {} {name}: {:?}", lab.number, t.err());
        }
    }
    // Lab 3's one-slot run deadlocks, and the viz's hang analysis explains it.
    let bytes = std::fs::read(dir.join("03/one-slot.trace")).unwrap();
    let header = symm_core::trace::decode(&bytes).unwrap().header;
    assert_eq!(header.request.slot_count(), 1, "{:?}", header.request);
    let t = symm_viz::model::Trace::decode("one-slot", bytes).unwrap();
    assert!(symm_viz::hang::analyse(&t).is_some());
    assert_eq!(t.scratch.cells(), 1, "the viz shows one slot per rank");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Where speed is the lesson (lab 5's two trees), the checker prints the student's simulated
/// time beside the reference's.
#[test]
fn lab_5_prints_its_time_beside_the_references() {
    use symm_labs::grade::{Grader, Which};
    let mut g = Grader::new(Which::Solution, None);
    assert!(symm_labs::lab05::check(&mut g).is_ok());
    let note = g
        .passed
        .iter()
        .find(|p| p.contains("simulated time at world 8"))
        .expect("a time note");
    assert!(
        note.contains("yours") && note.contains("the reference's"),
        "{note}"
    );
    assert!(
        !g.passed.iter().any(|p| p.starts_with("warn")),
        "{:?}",
        g.passed
    );
}

/// A failing case's own trace is written (not only the showcase case's), and the grader names
/// the case it belongs to.
#[test]
fn the_failing_case_is_traced_as_graded() {
    use symm_labs::grade::{Grader, Which, FAILED_TRACE};
    let dir = std::env::temp_dir().join(format!("symm-labs-failed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut g = Grader::new(Which::Student, Some(dir.clone()));
    let failure = symm_labs::lab02::check(&mut g).expect_err("the skeleton fails");
    let (label, path) = g.failed.clone().expect("the failing case is traced");
    assert_eq!(path, dir.join(FAILED_TRACE));
    assert!(failure.to_string().contains(&label), "{failure} / {label}");
    let bytes = std::fs::read(&path).unwrap();
    let header = symm_core::trace::decode(&bytes).unwrap().header;
    assert_eq!(header.request.collective, failure.req.collective);
    assert_eq!(header.request.bytes, failure.req.bytes);
    let _ = std::fs::remove_dir_all(&dir);
}

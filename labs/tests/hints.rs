//! The labs' hints name the fault in the schedule, not a nearby one, and give the answer only
//! after the same check failed before.

use std::sync::atomic::Ordering;
use symm_core::op::{Buf, Op};
use symm_core::signal::SlotKind::{Data, Ready};
use symm_labs::evidence::Cause;
use symm_labs::grade::{Failure, Grader, Which};
use symm_labs::kit::Kit;
use symm_labs::lab01::{self, Fault};
use symm_labs::problem::Problem;

/// A mistake made in an otherwise correct ring all-gather.
#[derive(Clone, Copy, PartialEq)]
enum Mistake {
    None,
    SignalFirst,
    Offset,
    Order,
    NoReadyWait,
    /// The Data waits name the next rank, which sends its Data to its own next.
    WaitNext,
    /// The Data waits name the rank itself.
    WaitSelf,
}

fn ring(k: &Kit, m: Mistake) -> Vec<Op> {
    let (me, w, n) = (k.rank() as u64, k.world() as u64, k.elems());
    let mut ops = vec![k.copy(
        k.at(k.rank(), Buf::Input, 0),
        k.at(k.rank(), Buf::Output, me * n),
        n,
    )];
    ops.push(k.signal(k.prev(), Ready));
    if m != Mistake::NoReadyWait {
        ops.push(k.wait(k.next(), Ready, 1));
    }
    for step in 0..w - 1 {
        let block = match m {
            Mistake::Order => (me + step) % w,
            _ => (me + w - step) % w,
        };
        if step > 0 {
            ops.push(k.wait(data_from(k, m), Data, 1));
        }
        let at = block * n;
        let to = if m == Mistake::Offset {
            (at + n) % (w * n)
        } else {
            at
        };
        let copy = k.copy(
            k.at(k.rank(), Buf::Output, at),
            k.at(k.next(), Buf::Output, to),
            n,
        );
        if m == Mistake::SignalFirst {
            ops.extend([k.signal(k.next(), Data), copy]);
        } else {
            ops.extend([copy, k.signal(k.next(), Data)]);
        }
    }
    ops.push(k.wait(data_from(k, m), Data, 1));
    ops
}

/// The rank a Data wait names: the previous one, unless the mistake names another.
fn data_from(k: &Kit, m: Mistake) -> u16 {
    match m {
        Mistake::WaitNext => k.next(),
        Mistake::WaitSelf => k.rank(),
        _ => k.prev(),
    }
}

fn grade(m: Mistake, out: Option<std::path::PathBuf>) -> Result<(), Box<Failure>> {
    let plan = move |k: &Kit| ring(k, m);
    lab01::check_plan(&mut Grader::new(Which::Student, out), &plan)
}

fn fail(m: Mistake) -> (Failure, String) {
    let f = *grade(m, None).expect_err("the mistake must fail");
    let hint = f.hint.clone().unwrap_or_default();
    (f, hint)
}

#[test]
fn the_correct_ring_passes_and_has_no_fault() {
    assert!(grade(Mistake::None, None).is_ok());
    let plan = |k: &Kit| ring(k, Mistake::None);
    assert_eq!(lab01::diagnose(&lab01::case(4, 8), &plan), None);
}

#[test]
fn data_signalled_before_the_copy_is_named() {
    let plan = |k: &Kit| ring(k, Mistake::SignalFirst);
    assert_eq!(
        lab01::diagnose(&lab01::case(4, 8), &plan),
        Some(Fault::SignalBeforeCopy)
    );
    let (f, hint) = fail(Mistake::SignalFirst);
    assert_eq!(f.cause, Some(Cause::SignalBeforeWrite), "{f}");
    assert!(hint.contains("write first, then signal"), "{f}");
    assert!(!hint.contains("% world"), "{f}");
}

#[test]
fn a_wrong_destination_offset_is_named() {
    let plan = |k: &Kit| ring(k, Mistake::Offset);
    assert_eq!(
        lab01::diagnose(&lab01::case(4, 8), &plan),
        Some(Fault::Destination)
    );
    let (f, hint) = fail(Mistake::Offset);
    assert_eq!(f.cause, Some(Cause::Offset), "{f}");
    // Both sides are named: the read, and the copy the awaited signal announces.
    assert!(hint.contains("reads rank 1's output [0..1)"), "{f}");
    assert!(hint.contains("writing rank 1's output [8..16)"), "{f}");
    assert!(!hint.contains("% world"), "{f}");
}

#[test]
fn a_missing_ready_wait_is_blamed_on_the_ready_rule() {
    // The copy into the peer comes before any wait for its Ready: the rule, by name.
    let (f, hint) = fail(Mistake::NoReadyWait);
    assert!(matches!(f.problem, Problem::TouchBeforeReady { .. }), "{f}");
    assert!(f.to_string().contains("'Ready before touch'"), "{f}");
    assert!(hint.contains("Ready"), "{f}");
    assert!(!hint.contains("Data"), "{f}");
}

#[test]
fn the_block_formula_comes_only_after_a_second_failure() {
    let plan = |k: &Kit| ring(k, Mistake::Order);
    assert_eq!(
        lab01::diagnose(&lab01::case(4, 8), &plan),
        Some(Fault::BlockOrder)
    );
    let dir = std::env::temp_dir().join(format!("symm-labs-hints-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let hints: Vec<String> = (0..3)
        .map(|_| {
            let f = grade(Mistake::Order, Some(dir.clone())).expect_err("must fail");
            f.hint.unwrap_or_default()
        })
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        !hints[0].contains("(rank + world - step) % world"),
        "{}",
        hints[0]
    );
    assert!(hints[0].contains("came from prev"), "{}", hints[0]);
    assert!(
        hints[1].contains("(rank + world - step) % world"),
        "{}",
        hints[1]
    );
    assert!(
        hints[2].contains("(rank + world - step) % world"),
        "{}",
        hints[2]
    );
    // Without a folder to keep the count in, every failure is a first one.
    let (_, hint) = fail(Mistake::Order);
    assert!(!hint.contains("% world"), "{hint}");
}

#[test]
fn lab_4_refuses_a_releasing_wait_without_blaming_the_barrier() {
    for wait in [Ordering::AcqRel, Ordering::Release] {
        let (message, hint) =
            symm_labs::lab04::refused_orderings(Ordering::Release, wait).expect("refused");
        assert!(message.contains("refused before loom runs"), "{message}");
        assert!(!message.contains("loom found"), "{message}");
        assert!(!hint.to_lowercase().contains("barrier"), "{hint}");
        assert!(hint.contains("Acquire"), "{hint}");
    }
    for wait in [Ordering::Relaxed, Ordering::Acquire, Ordering::SeqCst] {
        assert!(symm_labs::lab04::refused_orderings(Ordering::Release, wait).is_none());
    }
}

#[test]
fn lab_3_with_one_slot_shows_the_deadlock() {
    use symm_labs::lab03;
    let mut g = Grader::new(Which::Solution, None);
    let f = lab03::check_slots(&mut g, &lab03::solution::reduce_scatter, 1)
        .expect_err("one slot deadlocks from world 3 on");
    assert!(matches!(f.problem, Problem::Deadlock { .. }), "{f}");
    assert!(f.case.starts_with("world 3,"), "{f}");
    assert!(f.to_string().contains("credit from rank"), "{f}");
    let mut g = Grader::new(Which::Solution, None);
    assert!(lab03::check_slots(&mut g, &lab03::solution::reduce_scatter, 2).is_ok());
    // Set on the grader, the slot count replaces the grade.
    let mut g = Grader::new(Which::Solution, None);
    g.slots = Some(1);
    assert!(lab03::check(&mut g).is_err());
}

#[test]
fn lab_3_skeleton_imports_credit() {
    let text = include_str!("../03-pipelining-credits/skeleton.rs");
    let imports = text
        .lines()
        .find(|l| l.starts_with("use symm_core::signal::SlotKind::"))
        .unwrap_or("");
    assert!(imports.contains("Credit"), "{imports}");
}

#[test]
fn a_wait_naming_the_wrong_peer_is_named_from_the_signal_count() {
    let (f, hint) = fail(Mistake::WaitNext);
    assert!(matches!(f.problem, Problem::Deadlock { .. }), "{f}");
    assert!(hint.contains("names the wrong peer"), "{f}");
    assert!(hint.contains("only 0"), "{f}");
}

#[test]
fn a_rank_waiting_on_its_own_slot_is_named() {
    let (f, hint) = fail(Mistake::WaitSelf);
    assert!(hint.contains("waits on its own slot"), "{f}\nhint: {hint}");
}

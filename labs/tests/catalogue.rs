//! The bug catalogue: every planted bug fails its lab's check, every lab has at least four, and
//! at least 90% of the hints name the bug's cause.

use symm_labs::catalogue::{bugs, report, run};
use symm_labs::evidence::Cause;

#[test]
fn every_bug_fails_and_nine_hints_in_ten_name_the_cause() {
    let outcomes: Vec<_> = bugs().iter().map(run).collect();
    let (table, holds) = report(&outcomes);
    println!("{table}");
    assert!(holds, "{table}");
}

#[test]
fn the_solutions_themselves_are_not_bugs() {
    // With nothing planted, every lab's solution passes: the catalogue's failures are the bugs'.
    for l in symm_labs::LABS {
        let mut g = symm_labs::grade::Grader::new(symm_labs::grade::Which::Solution, None);
        assert!((l.check)(&mut g).is_ok(), "lab {}", l.number);
    }
}

#[test]
fn a_cause_the_evidence_does_not_support_is_not_claimed() {
    // The mapping rule needs the Ready handshake to disagree too: a ring whose Data waits name
    // the next rank is a wrong peer, not a wrong map.
    let outcomes: Vec<_> = bugs()
        .iter()
        .filter(|b| b.lab == 1 && b.cause == Cause::WrongPeer)
        .map(run)
        .collect();
    assert_eq!(outcomes.len(), 1);
    let f = outcomes[0].failure.as_ref().expect("fails");
    assert_eq!(f.cause, Some(Cause::WrongPeer), "{f}");
}

//! The evidence rules one by one: each names its cause from what the run and the ops show, and
//! a rule whose evidence is absent claims nothing.

use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::{Buf, Op};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_core::signal::SlotKind::{Data, Done, Ready};
use symm_labs::catalogue::{bugs, run};
use symm_labs::evidence::{evidence, Cause};
use symm_labs::kit::Kit;
use symm_labs::run::{build, check_case, Case};

fn one_shot_case() -> Case {
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::OneShot,
        4,
        64,
        DType::F32,
        ReduceOp::Sum,
    );
    Case::new("world 4", req)
}

/// A one-shot all-reduce whose k-way reduce reads the `ranks` given.
fn one_shot(k: &Kit, ranks: &[u16]) -> Vec<Op> {
    let (me, w, n) = (k.rank(), k.world(), k.elems());
    let peers = || (0..w).filter(move |&q| q != me);
    let mut ops: Vec<Op> = peers().map(|q| k.signal(q, Ready)).collect();
    ops.extend(peers().map(|q| k.wait(q, Ready, 1)));
    ops.extend(k.reduce_n(Buf::Input, 0, ranks, k.at(me, Buf::Output, 0), n));
    ops.extend(peers().map(|q| k.signal(q, Done)));
    ops.extend(peers().map(|q| k.wait(q, Done, 1)));
    ops
}

fn cause_of(c: &Case, plan: &dyn Fn(&Kit) -> Vec<Op>) -> (Option<Cause>, String) {
    let p = check_case(c, plan).err().expect("the check must fail");
    let streams = build(c, plan).expect("builds");
    let e = evidence(&p, &c.req, &streams);
    (
        e.as_ref().map(|e| e.cause),
        e.map(|e| e.words).unwrap_or_default(),
    )
}

#[test]
fn a_missing_contribution_names_the_op_that_wrote_the_element_as_the_suspect() {
    // Every rank leaves rank 3 out of its sum: the element holds the right position, with a
    // contribution missing; no wait precedes the op, so only the suspect can be named.
    let c = one_shot_case();
    let (cause, words) = cause_of(&c, &|k: &Kit| one_shot(k, &[0, 1, 2]));
    assert_eq!(cause, Some(Cause::Suspect), "{words}");
    assert!(
        words.contains("was last written by rank 0's op 6"),
        "{words}"
    );
    assert!(words.contains("k-way reduce of ranks [0, 1, 2]"), "{words}");
}

#[test]
fn a_correct_schedule_gives_no_evidence_to_act_on() {
    let c = one_shot_case();
    assert!(check_case(&c, &|k: &Kit| one_shot(k, &[0, 1, 2, 3])).is_ok());
}

#[test]
fn a_ring_whose_data_waits_name_the_next_rank_is_a_wrong_peer_not_a_wrong_map() {
    // The Ready handshake agrees, only the Data waits are off: one call, not the map.
    let req = Request::new(
        Collective::AllGather,
        Algorithm::Ring,
        4,
        16,
        DType::F32,
        ReduceOp::Sum,
    );
    let c = Case::new("world 4", req);
    let plan = |k: &Kit| {
        let (me, w, n) = (k.rank() as u64, k.world() as u64, k.elems());
        let mut ops = vec![k.copy(
            k.at(k.rank(), Buf::Input, 0),
            k.at(k.rank(), Buf::Output, me * n),
            n,
        )];
        ops.push(k.signal(k.prev(), Ready));
        ops.push(k.wait(k.next(), Ready, 1));
        for step in 0..w - 1 {
            if step > 0 {
                ops.push(k.wait(k.next(), Data, 1));
            }
            let at = ((me + w - step) % w) * n;
            ops.push(k.copy(
                k.at(k.rank(), Buf::Output, at),
                k.at(k.next(), Buf::Output, at),
                n,
            ));
            ops.push(k.signal(k.next(), Data));
        }
        ops.push(k.wait(k.next(), Data, 1));
        ops
    };
    let (cause, words) = cause_of(&c, &plan);
    assert_eq!(cause, Some(Cause::WrongPeer), "{words}");
    assert!(words.contains("not rank"), "{words}");
}

#[test]
fn every_cause_the_rules_name_is_named_by_some_bug_of_the_catalogue() {
    let named: Vec<Cause> = bugs()
        .iter()
        .map(run)
        .filter(|o| o.named())
        .map(|o| o.cause)
        .collect();
    for cause in [
        Cause::WaitsOnSelf,
        Cause::WrongPeer,
        Cause::Mapping,
        Cause::MissingSignal,
        Cause::MissingWait,
        Cause::SignalBeforeWrite,
        Cause::Offset,
    ] {
        let labs: std::collections::BTreeSet<u8> = bugs()
            .iter()
            .map(run)
            .filter(|o| o.named() && o.cause == cause)
            .map(|o| o.lab)
            .collect();
        assert!(named.contains(&cause), "no bug's hint names {cause:?}");
        // Every rule holds in more than one lab: it reads the evidence, not one lab's shape.
        assert!(labs.len() >= 2, "{cause:?}: {labs:?}");
    }
}

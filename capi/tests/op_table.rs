//! The ops table is complete: every row's op goes through every encoding and comes back, and the
//! generated headers list every row's plan code.

use symm::types::symm_op;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::{Op, OpKind};
use symm_core::plan::{PlanOp, KINDS};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_core::trace::{decode, encode, Event, EventKind, Header, Source};

fn read(rel: &str) -> String {
    let path = format!("{}/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every row's example op: the plan encoding, the trace format and the C struct each give it
/// back unchanged, and each row has its plan code in the C struct and the plan.
#[test]
fn every_row_round_trips_through_every_encoding() {
    let ops: Vec<Op> = OpKind::ALL.iter().map(|&k| Op::example(k)).collect();
    for (&k, op) in OpKind::ALL.iter().zip(&ops) {
        assert_eq!(op.kind(), k);
        let plan = PlanOp::encode(op);
        assert_eq!(plan.kind, k.code(), "{k:?}: plan code");
        let back = PlanOp::from_bytes(&plan.to_bytes()).and_then(|p| p.decode());
        assert_eq!(back.as_ref(), Ok(op), "{k:?}: plan encoding");
        let c = symm_op::of(op);
        assert_eq!(c.kind, u32::from(k.code()), "{k:?}: C kind");
        assert_eq!(c.to_core().as_ref().ok(), Some(op), "{k:?}: C conversion");
    }

    let request = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        2,
        64,
        DType::F32,
        ReduceOp::Sum,
    );
    let header = Header {
        world: 2,
        channels: 1,
        request,
        source: Source::Host { simulated: false },
        time_unit_ns: 1,
        team: None,
    };
    let mut events: Vec<Event> = ops
        .iter()
        .enumerate()
        .map(|(i, &op)| Event {
            time: i as u64,
            rank: 0,
            channel: 0,
            index: i as u32,
            kind: EventKind::End,
            op,
            contents: Some(i as u64),
        })
        .collect();
    let bytes = encode(&header, &mut events).expect("encode");
    let read_back = decode(&bytes).expect("decode");
    assert_eq!(read_back.warning, None);
    let got: Vec<Op> = read_back.events.iter().map(|e| e.op).collect();
    assert_eq!(got, ops, "trace format");
}

/// The committed headers list exactly the table's plan codes.
#[test]
fn the_generated_headers_list_every_row() {
    let cuh = read("../kernels/symm/plan.cuh");
    let h = read("include/symm.h");
    assert_eq!(KINDS.len(), OpKind::COUNT);
    for k in OpKind::ALL {
        let (name, code) = (k.code_name(), k.code());
        assert!(KINDS.contains(&(name, code)), "{k:?} not in plan::KINDS");
        assert!(
            cuh.lines()
                .any(|l| l == format!("#define SYMM_OP_{name} {code}")),
            "kernels/symm/plan.cuh lacks SYMM_OP_{name} {code}: run `cargo xtask codegen`"
        );
        assert!(
            h.lines()
                .any(|l| l.trim() == format!("SYMM_OP_{name} = {code},")),
            "capi/include/symm.h lacks SYMM_OP_{name} = {code}: run `{}`",
            symm::header::REGENERATE
        );
    }
    let count = |text: &str, needle: &str| text.matches(needle).count();
    assert_eq!(
        count(&cuh, "#define SYMM_OP_") - 1,
        OpKind::COUNT,
        "plan.cuh lists op codes the table lacks (SYMM_OP_BYTES aside)"
    );
    assert_eq!(
        h.lines()
            .filter(|l| l.trim_start().starts_with("SYMM_OP_") && l.contains(" = "))
            .count(),
        OpKind::COUNT,
        "symm.h lists op codes the table lacks"
    );
    assert_eq!(
        h,
        symm::header::generate(),
        "capi/include/symm.h is stale: run `{}`",
        symm::header::REGENERATE
    );
}

use super::*;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::op::{Buf, Loc, SignalOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_core::signal::SlotKind;
use symm_core::trace::{Source, Writer};

pub fn header(world: u16) -> Header {
    Header {
        world,
        channels: 1,
        request: Request::new(
            Collective::AllReduce,
            Algorithm::Ring,
            world,
            256,
            DType::F32,
            ReduceOp::Sum,
        ),
        source: Source::Host { simulated: true },
        time_unit_ns: 1,
        team: None,
    }
}

/// Rank 0 copies into rank 1 and signals; rank 1 waits then reduces. With `hang`, rank 0
/// never signals and rank 1's wait stalls.
pub fn small(hang: bool) -> Vec<u8> {
    let h = header(2);
    let slot = h.request.layout().index_unchecked(0, 0, SlotKind::Data, 0);
    let copy = Op::Copy {
        src: Loc::new(0, Buf::Input, 0),
        dst: Loc::new(1, Buf::Scratch, 0),
        bytes: 128,
    };
    let sig = Op::Signal {
        peer: 1,
        slot,
        op: SignalOp::Add,
        value: 1,
    };
    let wait = Op::Wait { slot, count: 1 };
    let red = Op::Reduce {
        a: Loc::new(1, Buf::Input, 0),
        b: Loc::new(1, Buf::Scratch, 0),
        dst: Loc::new(1, Buf::Output, 0),
        elems: 32,
        dtype: DType::F32,
        op: ReduceOp::Sum,
        div: 1,
    };
    let ev = |time, rank, index, kind, op, contents| Event {
        time,
        rank,
        channel: 0,
        index,
        kind,
        op,
        contents,
    };
    let mut w = Writer::new(Vec::new(), &h).unwrap();
    let mut evs = vec![
        ev(0, 0, 0, EventKind::Begin, copy, None),
        ev(10, 0, 0, EventKind::End, copy, Some(1)),
        ev(0, 1, 0, EventKind::Begin, wait, None),
    ];
    if hang {
        evs.push(ev(
            50,
            1,
            0,
            EventKind::Stall {
                target: 1,
                found: 0,
            },
            wait,
            None,
        ));
    } else {
        evs.extend([
            ev(10, 0, 1, EventKind::Begin, sig, None),
            ev(11, 0, 1, EventKind::End, sig, None),
            ev(12, 1, 0, EventKind::End, wait, None),
            ev(12, 1, 1, EventKind::Begin, red, None),
            ev(20, 1, 1, EventKind::End, red, Some(3)),
        ]);
    }
    for e in &evs {
        w.event(e).unwrap();
    }
    w.finish().unwrap()
}

#[test]
fn decodes_indexes_and_pairs() {
    let t = Trace::decode("small", small(false)).unwrap();
    assert_eq!(t.events.len(), 8);
    assert_eq!(t.spans.len(), 4);
    assert_eq!(t.lanes.len(), 2);
    assert_eq!(t.pairs.len(), 1);
    assert_eq!(t.time_at(0), 0);
    assert_eq!(t.time_at(8), 20);
    assert_eq!(t.pos_at(10), 4);
    assert!(t.stall_marks.is_empty());
    let hung = Trace::decode("hang", small(true)).unwrap();
    assert_eq!(hung.stall_marks, vec![2]);
}

#[test]
fn mangled_traces_never_panic() {
    let good = small(false);
    for i in 0..good.len() {
        for v in [0u8, 1, 0x7f, 0x80, 0xff] {
            let mut b = good.clone();
            b[i] = v;
            if let Ok(t) = Trace::decode("m", b) {
                for s in 0..t.spans.len() {
                    let _ = crate::describe::op(&t, s);
                }
                let _ = crate::hang::analyse(&t);
                for p in 0..=t.events.len() {
                    for r in 0..t.cells.world as usize {
                        let _ = t.cells.at(r, 0, p);
                    }
                }
            }
        }
    }
}

#[test]
fn bad_bytes_name_the_offset() {
    let good = small(false);
    let n = good.len();
    // Cut short: opens with a warning naming the offset of the incomplete end record.
    let t = Trace::decode("cut.trace", good[..n - 2].to_vec()).unwrap();
    assert_eq!(t.events.len(), 8);
    let w = t.warning_text().unwrap();
    assert!(w.contains(&format!("at byte {}", n - 17)), "{w}");
    // Cut inside the header: nothing to show.
    let e = Trace::decode("cut.trace", good[..20].to_vec())
        .err()
        .unwrap();
    assert!(e.to_string().contains("at byte 14"), "{e}");
    // Damaged: refused, naming the offset.
    let mut bad = good.clone();
    bad[n - 20] ^= 0x10;
    let e = Trace::decode("bad.trace", bad).err().unwrap();
    assert!(e.to_string().contains("at byte"), "{e}");
    let e = Trace::decode("x", b"garbage!garbage".to_vec())
        .err()
        .unwrap();
    assert!(e.to_string().contains("bad magic"), "{e}");
    assert!(Trace::decode("whole", good).unwrap().warning.is_none());
}

//! Golden bytes of version 4: a change to how any op, event or header encodes fails here. Such a
//! change needs a new format version (and its reader); appending an op to
//! [`OpKind`](crate::op::OpKind) only adds a row.

use super::super::wire::{self, OpLayout};
use super::super::*;
use crate::dtype::{DType, ReduceOp};
use crate::op::{Buf, Loc, McLoc, OpKind, Ranks, SignalOp};
use crate::sched::{Algorithm, Collective};

/// One op of every kind, with fields that are not all zero.
pub(super) fn sample(kind: OpKind) -> Op {
    let src = Loc::new(1, Buf::Input, 64);
    let dst = Loc::new(2, Buf::Output, 300);
    match kind {
        OpKind::Copy => Op::Copy {
            src,
            dst,
            bytes: 128,
        },
        OpKind::Reduce => Op::Reduce {
            a: src,
            b: Loc::new(3, Buf::Scratch, 8),
            dst,
            elems: 200,
            dtype: DType::Bf16,
            op: ReduceOp::Max,
            div: 0,
        },
        OpKind::Signal => Op::Signal {
            peer: 3,
            slot: 17,
            op: SignalOp::Add,
            value: 1,
        },
        OpKind::Wait => Op::Wait { slot: 5, count: 2 },
        OpKind::ReduceN => Op::ReduceN {
            buf: Buf::Input,
            offset: 16,
            ranks: Ranks::new(&[2, 0, 1]).unwrap(),
            dst,
            elems: 4,
            dtype: DType::F16,
            op: ReduceOp::Avg,
            div: 3,
        },
        OpKind::LlPut => Op::LlPut {
            format: crate::ll::Format::Ll,
            src,
            dst: Loc::new(0, Buf::Scratch, 4096),
            bytes: 24,
            slot: 9,
            flip: 2048,
        },
        OpKind::LlReduce => Op::LlReduce {
            format: crate::ll::Format::Ll,
            src: Loc::new(0, Buf::Scratch, 0),
            stride: 512,
            sources: 4,
            dst,
            elems: 6,
            dtype: DType::F32,
            op: ReduceOp::Sum,
            div: 1,
            slot: 9,
            flip: 2048,
        },
        OpKind::McReduce => Op::McReduce {
            src: McLoc {
                buf: Buf::Input,
                offset: 128,
            },
            dst,
            elems: 32,
            dtype: DType::F32,
            op: ReduceOp::Sum,
            div: 1,
        },
        OpKind::McStore => Op::McStore {
            src,
            dst: McLoc {
                buf: Buf::Output,
                offset: 128,
            },
            bytes: 128,
        },
    }
}

/// The sample of the op trace tag `tag` names (a 128-byte line form has the 16-byte one's
/// other fields).
fn sample_tag(tag: u8) -> Option<Op> {
    let (kind, format) = OpKind::from_trace_tag(tag)?;
    Some(sample(kind).with_line_format(format))
}

/// An event of `op` at time 300 on rank 1, channel 2, op index 7, ended, with contents 0b101.
pub(super) fn event_of(op: Op) -> Event {
    Event {
        time: 300,
        rank: 1,
        channel: 2,
        index: 7,
        kind: EventKind::End,
        op,
        contents: Some(0b101),
    }
}

/// The event prefix (time 300, rank 1, channel 2, index 7, End), then the op, then contents.
const PRE: [u8; 6] = [0xac, 0x02, 1, 2, 7, 1];
const POST: [u8; 2] = [1, 5];

/// Each trace tag's op bytes (tag first) in version 4: every kind, then the 128-byte line
/// forms of the low-latency ops.
const OPS: [(u8, &[u8]); 11] = [
    (0, &[0, 1, 0, 64, 2, 1, 0xac, 0x02, 0x80, 0x01]),
    (
        1,
        &[1, 1, 0, 64, 3, 2, 8, 2, 1, 0xac, 0x02, 0xc8, 0x01, 2, 3, 0],
    ),
    (2, &[2, 3, 17, 1, 1]),
    (3, &[3, 5, 2]),
    (
        4,
        &[
            4, 0, 16, 3, 2, 0, 1, 0, 0, 0, 0, 0, 2, 1, 0xac, 0x02, 4, 1, 4, 3,
        ],
    ),
    (5, &[5, 1, 0, 64, 0, 2, 0x80, 0x20, 24, 9, 0x80, 0x10]),
    (
        6,
        &[
            6, 0, 2, 0, 0x80, 0x04, 4, 2, 1, 0xac, 0x02, 6, 0, 0, 1, 9, 0x80, 0x10,
        ],
    ),
    (7, &[7, 0, 0x80, 0x01, 2, 1, 0xac, 0x02, 32, 0, 0, 1]),
    (8, &[8, 1, 0, 64, 1, 0x80, 0x01, 0x80, 0x01]),
    (9, &[9, 1, 0, 64, 0, 2, 0x80, 0x20, 24, 9, 0x80, 0x10]),
    (
        10,
        &[
            10, 0, 2, 0, 0x80, 0x04, 4, 2, 1, 0xac, 0x02, 6, 0, 0, 1, 9, 0x80, 0x10,
        ],
    ),
];

#[test]
fn every_op_encodes_to_its_golden_bytes() {
    assert_eq!(
        VERSION, 4,
        "the golden bytes are version 4's: a new version keeps them for its reader and adds its own"
    );
    let tags = (0..=u8::MAX).filter(|&t| OpKind::from_trace_tag(t).is_some());
    assert!(
        tags.eq(OPS.iter().map(|r| r.0)),
        "every trace tag has golden bytes, in tag order"
    );
    for (k, op) in OPS {
        let e = event_of(sample_tag(k).unwrap());
        assert_eq!(e.op.trace_tag(), k);
        let mut want = heapless::Vec::<u8, 64>::new();
        want.extend_from_slice(&PRE).unwrap();
        want.extend_from_slice(op).unwrap();
        want.extend_from_slice(&POST).unwrap();
        let mut buf = [0u8; MAX_EVENT];
        let n = wire::encode(&e, OpLayout::Stable, &mut buf).unwrap();
        assert_eq!(&buf[..n], &want[..], "{k:?} encodes differently");
        assert_eq!(
            wire::decode(&want, OpLayout::Stable),
            Ok((e, want.len())),
            "{k:?} decodes differently"
        );
    }
}

#[test]
fn event_kinds_and_contents_encode_to_their_golden_bytes() {
    let wait = sample(OpKind::Wait);
    let cases: [(EventKind, Option<u64>, &[u8]); 3] = [
        (
            EventKind::Begin,
            None,
            &[0xac, 0x02, 1, 2, 7, 0, 3, 5, 2, 0],
        ),
        (
            EventKind::End,
            Some(u64::MAX),
            &[
                0xac, 0x02, 1, 2, 7, 1, 3, 5, 2, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                0xff, 0x01,
            ],
        ),
        (
            EventKind::Stall {
                target: 4,
                found: 3,
            },
            None,
            &[0xac, 0x02, 1, 2, 7, 2, 4, 3, 3, 5, 2, 0],
        ),
    ];
    for (kind, contents, want) in cases {
        let e = Event {
            kind,
            contents,
            ..event_of(wait)
        };
        let mut buf = [0u8; MAX_EVENT];
        let n = wire::encode(&e, OpLayout::Stable, &mut buf).unwrap();
        assert_eq!(&buf[..n], want, "{kind:?}");
    }
}

/// A whole trace: preamble, a team header from a GPU, one event, the end record.
#[test]
fn a_whole_trace_encodes_to_its_golden_bytes() {
    let mut request = Request::new(
        Collective::Broadcast { root: 1 },
        Algorithm::Tree,
        2,
        256,
        DType::U8,
        ReduceOp::Sum,
    );
    request.chunk_bytes = 64;
    let header = Header {
        world: 2,
        channels: 1,
        request,
        source: Source::Gpu {
            devices: [heapless::String::try_from("H").unwrap()]
                .into_iter()
                .collect(),
        },
        time_unit_ns: 1000,
        team: Some(TeamTag {
            id: 1,
            world: 4,
            members: [3, 0].into_iter().collect(),
        }),
    };
    let e = Event {
        time: 1,
        rank: 1,
        channel: 0,
        index: 0,
        kind: EventKind::Begin,
        op: sample(OpKind::Wait),
        contents: None,
    };
    let mut w = Writer::new(heapless::Vec::<u8, 128>::new(), &header).unwrap();
    w.event(&e).unwrap();
    let bytes = w.finish().unwrap();
    #[rustfmt::skip]
    let want: &[u8] = &[
        b'S', b'Y', b'M', b'M', b'T', b'R', b'C', b'E', 4, 0, 25, 0, 0, 0,
        // header: world 2, channels 1, broadcast(root 1), tree, world 2, channels 1, 256 bytes, u8, sum, chunk 64,
        // slots 0, gpu ["H"], 1000 ns, team { id 1, world 4, members [3, 0] }
        2, 1, 3, 1, 1, 2, 1, 0x80, 0x02, 8, 0, 64, 0, 1, 1, 1, b'H', 0xe8, 0x07, 1, 1, 4, 2, 3, 0,
        // the event: time 1, rank 1, channel 0, index 0, begin, wait(5, 2), no contents
        b'E', 1, 1, 0, 0, 0, 3, 5, 2, 0,
        // the end record: one event, then the checksum
        b'Z', 1, 0, 0, 0, 0, 0, 0, 0,
    ];
    assert_eq!(&bytes[..bytes.len() - 8], want);
    let mut h = Fnv::new();
    h.update(want);
    assert_eq!(&bytes[bytes.len() - 8..], &h.0.to_le_bytes());
}

/// Enum positions in the header are part of the format: new variants go last.
#[test]
fn header_enum_positions_are_pinned() {
    let names = [
        "ring",
        "tree",
        "rhd",
        "one_shot",
        "two_shot",
        "multicast",
        "direct",
        "pairwise",
        "one_shot_ll",
    ];
    for (i, name) in names.iter().enumerate() {
        let a = Algorithm::ALL[i];
        assert_eq!(a.name(), *name, "algorithm {i}");
        let mut buf = [0u8; 4];
        assert_eq!(postcard::to_slice(&a, &mut buf).unwrap(), &[i as u8]);
    }
    let collectives = [
        (Collective::AllReduce, 0u8),
        (Collective::ReduceScatter, 1),
        (Collective::AllGather, 2),
        (Collective::Broadcast { root: 0 }, 3),
        (Collective::Reduce { root: 0 }, 4),
        (Collective::Scatter { root: 0 }, 5),
        (Collective::Gather { root: 0 }, 6),
        (Collective::AllToAll, 7),
        (Collective::AllToAllV, 8),
        (Collective::SendRecv { src: 0, dst: 0 }, 9),
    ];
    for (c, tag) in collectives {
        // Exhaustive: a new collective must be added above.
        match c {
            Collective::AllReduce
            | Collective::ReduceScatter
            | Collective::AllGather
            | Collective::Broadcast { .. }
            | Collective::Reduce { .. }
            | Collective::Scatter { .. }
            | Collective::Gather { .. }
            | Collective::AllToAll
            | Collective::AllToAllV
            | Collective::SendRecv { .. } => {}
        }
        let mut buf = [0u8; 8];
        assert_eq!(postcard::to_slice(&c, &mut buf).unwrap()[0], tag, "{c:?}");
    }
    let mut buf = [0u8; 8];
    for (i, d) in DType::ALL.iter().enumerate() {
        assert_eq!(
            postcard::to_slice(d, &mut buf).unwrap(),
            &[i as u8],
            "{d:?}"
        );
    }
}

/// Every op with every field at its largest, in a stall event with contents: the largest record
/// any writer (the C ABI's included) can be handed still fits [`MAX_EVENT`], so encoding never
/// fails on field values.
#[test]
fn the_largest_event_of_every_kind_fits() {
    let loc = Loc::new(u16::MAX, Buf::Scratch, u64::MAX);
    let mc = McLoc {
        buf: Buf::Scratch,
        offset: u64::MAX,
    };
    let (dtype, op, div) = (DType::U8, ReduceOp::Avg, u32::MAX);
    let mut most = 0;
    for kind in OpKind::ALL {
        let o = match kind {
            OpKind::Copy => Op::Copy {
                src: loc,
                dst: loc,
                bytes: u64::MAX,
            },
            OpKind::Reduce => Op::Reduce {
                a: loc,
                b: loc,
                dst: loc,
                elems: u64::MAX,
                dtype,
                op,
                div,
            },
            OpKind::Signal => Op::Signal {
                peer: u16::MAX,
                slot: u32::MAX,
                op: SignalOp::Add,
                value: u64::MAX,
            },
            OpKind::Wait => Op::Wait {
                slot: u32::MAX,
                count: u64::MAX,
            },
            OpKind::ReduceN => Op::ReduceN {
                buf: Buf::Scratch,
                offset: u64::MAX,
                ranks: Ranks::new(&[u16::MAX; crate::op::MAX_FANIN]).unwrap(),
                dst: loc,
                elems: u64::MAX,
                dtype,
                op,
                div,
            },
            OpKind::LlPut => Op::LlPut {
                format: crate::ll::Format::Ll128,
                src: loc,
                dst: loc,
                bytes: u64::MAX,
                slot: u32::MAX,
                flip: u64::MAX,
            },
            OpKind::LlReduce => Op::LlReduce {
                format: crate::ll::Format::Ll128,
                src: loc,
                stride: u64::MAX,
                sources: u16::MAX,
                dst: loc,
                elems: u64::MAX,
                dtype,
                op,
                div,
                slot: u32::MAX,
                flip: u64::MAX,
            },
            OpKind::McReduce => Op::McReduce {
                src: mc,
                dst: loc,
                elems: u64::MAX,
                dtype,
                op,
                div,
            },
            OpKind::McStore => Op::McStore {
                src: loc,
                dst: mc,
                bytes: u64::MAX,
            },
        };
        let e = Event {
            time: u64::MAX,
            rank: u16::MAX,
            channel: u16::MAX,
            index: u32::MAX,
            kind: EventKind::Stall {
                target: u64::MAX,
                found: u64::MAX,
            },
            op: o,
            contents: Some(u64::MAX),
        };
        let mut buf = [0u8; MAX_EVENT];
        let n = wire::encode(&e, OpLayout::Stable, &mut buf)
            .unwrap_or_else(|err| panic!("{kind:?}: {err}"));
        assert_eq!(wire::decode(&buf[..n], OpLayout::Stable), Ok((e, n)));
        most = most.max(n);
    }
    assert!(most <= MAX_EVENT, "{most}");
}

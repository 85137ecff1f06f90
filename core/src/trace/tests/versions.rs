//! Older versions: each op layout of versions 1 to 3 reads back as the ops it was written from.

use super::super::wire::{self, OpLayout};
use super::super::*;
use super::golden::{event_of, sample};
use super::{header, read_all, v2_header, Bytes};
use crate::op::OpKind;

/// A trace as version `version` wrote it, with `layout`'s op tags.
fn legacy(version: u16, layout: OpLayout, ops: &[Op]) -> Bytes {
    legacy_with(&header(), version, layout, ops)
}

/// [`legacy`] with a header.
fn legacy_with(h: &Header, version: u16, layout: OpLayout, ops: &[Op]) -> Bytes {
    let mut b = Bytes::new();
    let mut hb = [0u8; MAX_HEADER];
    let hdr = if version >= 3 {
        postcard::to_slice(h, &mut hb).unwrap()
    } else {
        postcard::to_slice(&v2_header(h), &mut hb).unwrap()
    };
    b.extend_from_slice(&MAGIC).unwrap();
    b.extend_from_slice(&version.to_le_bytes()).unwrap();
    b.extend_from_slice(&(hdr.len() as u32).to_le_bytes())
        .unwrap();
    b.extend_from_slice(hdr).unwrap();
    for (i, op) in ops.iter().enumerate() {
        let e = Event {
            rank: (i % 4) as u16,
            channel: 0,
            index: i as u32,
            ..event_of(*op)
        };
        let mut eb = [0u8; MAX_EVENT];
        let n = wire::encode(&e, layout, &mut eb).unwrap();
        if version >= 2 {
            b.push(TAG_EVENT).unwrap();
        }
        b.extend_from_slice(&eb[..n]).unwrap();
    }
    if version >= 2 {
        b.push(TAG_END).unwrap();
        b.extend_from_slice(&(ops.len() as u64).to_le_bytes())
            .unwrap();
        let mut h = Fnv::new();
        h.update(&b);
        b.extend_from_slice(&h.0.to_le_bytes()).unwrap();
    }
    b
}

fn ops(kinds: &[OpKind]) -> heapless::Vec<Op, 16> {
    kinds.iter().map(|&k| sample(k)).collect()
}

/// (version, layout, the kinds it has).
const WRITTEN: [(u16, OpLayout, &[OpKind]); 5] = {
    use OpKind::*;
    const ORIGINAL: &[OpKind] = &[Copy, Reduce, Signal, Wait, McReduce, McStore];
    [
        (1, OpLayout::Original, ORIGINAL),
        (2, OpLayout::Original, ORIGINAL),
        (3, OpLayout::Original, ORIGINAL),
        (
            3,
            OpLayout::KWay,
            &[Copy, Reduce, Signal, Wait, ReduceN, McReduce, McStore],
        ),
        (
            3,
            OpLayout::LowLatency,
            &[
                Copy, Reduce, Signal, Wait, ReduceN, LlPut, LlReduce, McReduce, McStore,
            ],
        ),
    ]
};

fn read_ops(bytes: &[u8]) -> (OpLayout, heapless::Vec<Op, 16>) {
    let r = Reader::new(bytes).unwrap();
    let layout = r.layout();
    (layout, r.map(|e| e.unwrap().op).collect())
}

#[test]
fn every_layout_reads_back_its_ops() {
    for (version, layout, kinds) in WRITTEN {
        let want = ops(kinds);
        // Every op on its own, all of them, and the multicast ops (the case that read as corrupt
        // when the op enum grew under version 3).
        let mc = ops(&[OpKind::Signal, OpKind::McReduce, OpKind::McStore]);
        let mut cases: heapless::Vec<heapless::Vec<Op, 16>, 16> = heapless::Vec::new();
        cases.push(want.clone()).unwrap();
        if kinds.contains(&OpKind::McStore) {
            cases.push(mc).unwrap();
        }
        for op in &want {
            cases.push([*op].into_iter().collect()).unwrap();
        }
        for case in cases {
            let bytes = legacy(version, layout, &case);
            let (got_layout, got) = read_ops(&bytes);
            assert_eq!(got, case, "v{version} {layout:?}");
            if case.iter().any(|o| o.kind().tag() >= 4) && case.len() > 1 {
                assert_eq!(got_layout, layout, "v{version} {case:?}");
            }
            let (n, err) = read_all(&bytes).unwrap();
            assert_eq!((n, err), (case.len(), None));
        }
    }
}

/// Every layout's record tags differ from 4 on: a trace with all of a layout's ops reads under
/// that layout only.
#[test]
fn whole_traces_read_under_their_layout_only() {
    for (version, layout, kinds) in WRITTEN.into_iter().filter(|w| w.0 == 3) {
        let bytes = legacy(version, layout, &ops(kinds));
        for other in OpLayout::V3 {
            let r = Reader::with_layout(&bytes, other).unwrap();
            let clean = r.map_while(Result::ok).count() == kinds.len();
            assert_eq!(clean, other == layout, "{layout:?} read as {other:?}");
        }
    }
}

/// A one-event trace can read under two version 3 layouts: a k-way multicast reduce at offset 0
/// has the shape of a low-latency put. In a multicast trace the layout whose ops fit the
/// algorithm wins; where neither fits, the low-latency layout, as documented, and
/// `with_layout` reads the other.
#[test]
fn an_ambiguous_version_3_trace_prefers_the_low_latency_layout() {
    let op = Op::McReduce {
        src: crate::op::McLoc {
            buf: crate::op::Buf::Input,
            offset: 0,
        },
        dst: crate::op::Loc::new(0, crate::op::Buf::Output, 0),
        elems: 32,
        dtype: crate::dtype::DType::F32,
        op: crate::dtype::ReduceOp::Sum,
        div: 1,
    };
    let bytes = legacy(3, OpLayout::KWay, &[op]);
    let (layout, got) = read_ops(&bytes);
    assert_eq!(layout, OpLayout::LowLatency);
    assert_eq!(got[0].kind(), OpKind::LlPut);
    let r = Reader::with_layout(&bytes, OpLayout::KWay).unwrap();
    assert_eq!(r.layout(), OpLayout::KWay);
    let back: heapless::Vec<Op, 2> = r.map(|e| e.unwrap().op).collect();
    assert_eq!(&back[..], &[op]);

    let mut h = header();
    h.request.algorithm = crate::sched::Algorithm::Multicast;
    let bytes = legacy_with(&h, 3, OpLayout::KWay, &[op]);
    assert_eq!(
        read_ops(&bytes),
        (OpLayout::KWay, [op].into_iter().collect())
    );
    // The same bytes in a low-latency trace are the put.
    h.request.algorithm = crate::sched::Algorithm::OneShotLl;
    let bytes = legacy_with(&h, 3, OpLayout::KWay, &[op]);
    assert_eq!(read_ops(&bytes).0, OpLayout::LowLatency);
}

#[test]
fn version_4_is_written_and_reads_with_stable_tags() {
    let all = ops(&OpKind::ALL);
    let mut w = Writer::new(Bytes::new(), &header()).unwrap();
    for (i, op) in all.iter().enumerate() {
        let e = Event {
            rank: (i % 4) as u16,
            channel: 0,
            ..event_of(*op)
        };
        w.event(&e).unwrap();
    }
    let bytes = w.finish().unwrap();
    assert_eq!(&bytes[8..10], &4u16.to_le_bytes());
    let (layout, got) = read_ops(&bytes);
    assert_eq!(layout, OpLayout::Stable);
    assert_eq!(got, all);
}

#[test]
fn unknown_op_tags_name_the_tag_and_version() {
    for version in [1u16, 2, 3, 4] {
        let layout = OpLayout::of_version(version).unwrap_or(OpLayout::LowLatency);
        let mut bytes = legacy(version, layout, &[sample(OpKind::Wait)]);
        // The op tag follows the record tag and the five-byte event prefix.
        let at = HEADER_OFFSET + bytes[10] as usize;
        let tag_at = at + usize::from(version >= 2) + 6;
        assert_eq!(bytes[tag_at], 3);
        // Far past the table (so a new row never makes it known), and one byte as a varint.
        bytes[tag_at] = 127;
        if version >= 2 {
            let end = bytes.len() - 8;
            let mut h = Fnv::new();
            h.update(&bytes[..end]);
            bytes[end..].copy_from_slice(&h.0.to_le_bytes());
        }
        let (n, err) = read_all(&bytes).unwrap();
        assert_eq!(n, 0);
        let want = TraceError::UnknownOp {
            offset: at,
            tag: 127,
            version,
        };
        assert_eq!(err, Some(want), "v{version}");
        let text = words(&want);
        let mut version_words = heapless::String::<32>::new();
        core::fmt::write(
            &mut version_words,
            format_args!("format version {version} "),
        )
        .unwrap();
        assert!(
            text.contains("op tag 127") && text.contains(&*version_words),
            "{text}"
        );
    }
}

/// The error's message, without allocating.
fn words(e: &TraceError) -> heapless::String<256> {
    let mut s = heapless::String::new();
    core::fmt::write(&mut s, format_args!("{e}")).unwrap();
    s
}

#[test]
fn a_newer_version_says_so() {
    let mut bytes = legacy(3, OpLayout::LowLatency, &[sample(OpKind::Copy)]);
    bytes[8..10].copy_from_slice(&(VERSION + 1).to_le_bytes());
    let err = Reader::new(&bytes).err().unwrap();
    assert_eq!(err, TraceError::NewerVersion { found: VERSION + 1 });
    let text = words(&err);
    assert!(text.contains("version 5 is newer"), "{text}");
    assert!(text.contains("newer symm"), "{text}");
}

/// Cuts and byte flips of a version 3 trace in the original layout: truncations at their
/// offsets, every flip detected, never a panic.
#[test]
fn hostile_version_3_traces() {
    let bytes = legacy(3, OpLayout::Original, &ops(WRITTEN[2].2));
    let mut starts: heapless::Vec<usize, 16> = heapless::Vec::new();
    let mut r = Reader::new(&bytes).unwrap();
    starts.push(r.offset()).unwrap();
    while let Some(e) = r.next() {
        e.unwrap();
        starts.push(r.offset()).unwrap();
    }
    for cut in starts[0]..bytes.len() {
        let (n, err) = read_all(&bytes[..cut]).unwrap();
        let at = starts.iter().rposition(|s| *s <= cut).unwrap();
        let want = if starts[at] == cut {
            TraceError::MissingEnd { offset: cut }
        } else {
            TraceError::Truncated { offset: starts[at] }
        };
        assert_eq!(err, Some(want), "cut {cut}");
        assert_eq!(n, at.min(6));
    }
    for i in 0..bytes.len() {
        for x in [0x01u8, 0x80, 0xff] {
            let mut b = bytes.clone();
            b[i] ^= x;
            let got = read_all(&b);
            assert!(
                !matches!(got, Ok((_, None))),
                "byte {i} ^ {x:#x} decodes silently"
            );
        }
    }
}

/// A version 1 trace as written before `AllToAllV` joined the collectives: its `SendRecv` (tag
/// 8 then) reads as a send/recv, and a later version 1 trace's `AllToAllV` (tag 8 now) as an
/// all-to-allv.
#[test]
fn early_version_1_headers_read() {
    use super::super::old::{CollectiveV1Early, HeaderV1Early};
    use crate::sched::{Algorithm, Collective, Request};
    let v1 = |hdr: &[u8]| {
        let mut b = Bytes::new();
        b.extend_from_slice(&MAGIC).unwrap();
        b.extend_from_slice(&1u16.to_le_bytes()).unwrap();
        b.extend_from_slice(&(hdr.len() as u32).to_le_bytes())
            .unwrap();
        b.extend_from_slice(hdr).unwrap();
        let mut eb = [0u8; MAX_EVENT];
        let e = Event {
            rank: 1,
            channel: 0,
            ..event_of(sample(OpKind::Copy))
        };
        let n = wire::encode(&e, OpLayout::Original, &mut eb).unwrap();
        b.extend_from_slice(&eb[..n]).unwrap();
        b
    };
    let early = HeaderV1Early {
        world: 2,
        channels: 1,
        collective: CollectiveV1Early::SendRecv { src: 0, dst: 1 },
        algorithm: Algorithm::Direct,
        req_world: 2,
        req_channels: 1,
        bytes: 4096,
        dtype: crate::dtype::DType::U8,
        op: crate::dtype::ReduceOp::Sum,
        chunk_bytes: 0,
        slots: 0,
        source: Source::Host { simulated: true },
        time_unit_ns: 1,
    };
    let mut hb = [0u8; MAX_HEADER];
    let bytes = v1(postcard::to_slice(&early, &mut hb).unwrap());
    let r = Reader::new(&bytes).unwrap();
    let want = Request::new(
        Collective::SendRecv { src: 0, dst: 1 },
        Algorithm::Direct,
        2,
        4096,
        crate::dtype::DType::U8,
        crate::dtype::ReduceOp::Sum,
    );
    assert_eq!(r.header().request, want);
    assert_eq!(read_all(&bytes), Ok((1, None)));

    let mut h = header();
    h.request = Request::new(
        Collective::AllToAllV,
        Algorithm::Pairwise,
        4,
        4096,
        crate::dtype::DType::U8,
        crate::dtype::ReduceOp::Sum,
    );
    let bytes = v1(postcard::to_slice(&v2_header(&h), &mut hb).unwrap());
    assert_eq!(Reader::new(&bytes).unwrap().header(), &h);
}

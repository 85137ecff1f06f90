mod golden;
mod versions;

use super::old::HeaderV2;
use super::*;
use crate::dtype::{DType, ReduceOp};
use crate::op::{Buf, Loc};
use crate::sched::{Algorithm, Collective};

fn header() -> Header {
    Header {
        world: 4,
        channels: 1,
        request: Request::new(
            Collective::AllReduce,
            Algorithm::Ring,
            4,
            1024,
            DType::F32,
            ReduceOp::Sum,
        ),
        source: Source::Host { simulated: true },
        time_unit_ns: 1,
        team: None,
    }
}

fn event(i: u32) -> Event {
    Event {
        time: 10 * i as u64,
        rank: 2,
        channel: 0,
        index: i,
        kind: EventKind::End,
        op: Op::Copy {
            src: Loc::new(2, Buf::Input, 64),
            dst: Loc::new(3, Buf::Scratch, 0),
            bytes: 256 + i as u64,
        },
        contents: Some(0b0100),
    }
}

type Bytes = heapless::Vec<u8, 4096>;

fn trace(h: &Header, n: u32) -> Bytes {
    let mut w = Writer::new(Bytes::new(), h).unwrap();
    for i in 0..n {
        w.event(&event(i)).unwrap();
    }
    w.finish().unwrap()
}

/// Reads to the end: the events and the error the iteration stopped with.
fn read_all(bytes: &[u8]) -> Result<(usize, Option<TraceError>), TraceError> {
    let mut n = 0;
    for e in Reader::new(bytes)? {
        match e {
            Ok(_) => n += 1,
            Err(e) => return Ok((n, Some(e))),
        }
    }
    Ok((n, None))
}

/// Byte offsets where the records start (events, then the end record).
fn record_starts(bytes: &[u8]) -> heapless::Vec<usize, 64> {
    let mut r = Reader::new(bytes).unwrap();
    let mut out = heapless::Vec::new();
    out.push(r.offset()).unwrap();
    while let Some(e) = r.next() {
        e.unwrap();
        out.push(r.offset()).unwrap();
    }
    out
}

#[test]
fn round_trip_with_end_record() {
    let bytes = trace(&header(), 20);
    let r = Reader::new(&bytes).unwrap();
    assert_eq!(r.header(), &header());
    assert_eq!(r.version(), VERSION);
    let evs: heapless::Vec<Event, 32> = r.map(|e| e.unwrap()).collect();
    assert_eq!(evs.len(), 20);
    assert_eq!(evs[7], event(7));
    assert_eq!(bytes[bytes.len() - END_LEN], TAG_END);
    assert_eq!(read_all(&bytes), Ok((20, None)));
    // An empty trace is a header and an end record.
    assert_eq!(read_all(&trace(&header(), 0)), Ok((0, None)));
}

#[test]
fn every_cut_is_reported_at_its_offset() {
    let bytes = trace(&header(), 12);
    let starts = record_starts(&bytes);
    let first = starts[0];
    for cut in 0..bytes.len() {
        let got = read_all(&bytes[..cut]);
        if cut < first {
            assert!(got.is_err(), "cut {cut}: {got:?}");
            continue;
        }
        let (n, err) = got.unwrap();
        let at = starts.iter().rposition(|s| *s <= cut).unwrap();
        let want = if starts[at] == cut {
            TraceError::MissingEnd { offset: cut }
        } else {
            TraceError::Truncated { offset: starts[at] }
        };
        assert_eq!(err, Some(want), "cut {cut}");
        assert!(want.is_truncation());
        assert_eq!(n, at.min(12), "cut {cut}");
    }
}

#[test]
fn every_byte_mutation_is_detected() {
    let bytes = trace(&header(), 12);
    let (mut errors, mut warnings) = (0, 0);
    for i in 0..bytes.len() {
        for x in [0x01u8, 0x80, 0xff, 0x5a ^ 0x45] {
            let mut b = bytes.clone();
            b[i] ^= x;
            match read_all(&b) {
                Ok((_, None)) => panic!("byte {i} ^ {x:#x} decodes silently"),
                Ok((_, Some(e))) if e.is_truncation() => warnings += 1,
                _ => errors += 1,
            }
        }
    }
    // A damaged trace reads as cut short only in rare cases (a mutated end tag).
    assert!(
        warnings * 50 < errors,
        "{warnings} warnings, {errors} errors"
    );
}

#[test]
fn end_record_checks() {
    let bytes = trace(&header(), 3);
    let end = bytes.len() - END_LEN;
    let mut extra = bytes.clone();
    extra.push(0).unwrap();
    assert_eq!(
        read_all(&extra),
        Ok((
            3,
            Some(TraceError::TrailingBytes {
                offset: bytes.len()
            })
        ))
    );
    let mut sum = bytes.clone();
    sum[bytes.len() - 1] ^= 1;
    assert_eq!(
        read_all(&sum),
        Ok((3, Some(TraceError::BadChecksum { offset: end })))
    );
    let mut tag = bytes.clone();
    tag[end] = 0x42;
    assert_eq!(
        read_all(&tag),
        Ok((3, Some(TraceError::Corrupt { offset: end })))
    );
}

#[test]
fn headers_are_validated() {
    // Too few scratch slots for the schedule is a run that deadlocks, not an unreadable header.
    let mut h = header();
    h.request = h.request.with_pipeline(64, 1);
    assert!(h.request.validate().is_err());
    assert_eq!(h.validate(), Ok(()));
    assert!(Reader::new(&trace(&h, 0)).is_ok());
    // A request whose slot layout overflows u32.
    let mut h = header();
    h.request = h.request.with_channels(u16::MAX);
    h.request.world = u16::MAX;
    h.world = u16::MAX;
    h.channels = u16::MAX;
    let got = Reader::new(&trace(&h, 0)).err();
    assert!(
        matches!(
            got,
            Some(TraceError::InvalidHeader {
                offset: HEADER_OFFSET,
                reason: HeaderError::Request(SchedError::BadWorld { .. })
            })
        ),
        "{got:?}"
    );
    // Header and request disagree.
    let mut h = header();
    h.world = 1000;
    assert_eq!(
        Reader::new(&trace(&h, 0)).err(),
        Some(TraceError::InvalidHeader {
            offset: HEADER_OFFSET,
            reason: HeaderError::World {
                header: 1000,
                request: 4
            }
        })
    );
    let mut h = header();
    h.channels = 64;
    assert!(matches!(
        Reader::new(&trace(&h, 0)).err(),
        Some(TraceError::InvalidHeader {
            reason: HeaderError::Channels { .. },
            ..
        })
    ));
    // Buffers that do not fit.
    let mut h = header();
    h.request.bytes = 1 << 48;
    h.request = h.request.with_pipeline(u64::MAX - 3, 255).with_channels(64);
    h.channels = 64;
    let got = Reader::new(&trace(&h, 0)).err();
    assert!(
        matches!(
            got,
            Some(TraceError::InvalidHeader {
                reason: HeaderError::Request(SchedError::TooLarge { .. }),
                ..
            })
        ),
        "{got:?}"
    );
}

#[test]
fn events_outside_the_world_are_errors() {
    let mut w = Writer::new(Bytes::new(), &header()).unwrap();
    w.event(&event(0)).unwrap();
    let at = w.finish().unwrap().len() - END_LEN;
    let mut w = Writer::new(Bytes::new(), &header()).unwrap();
    w.event(&event(0)).unwrap();
    w.event(&Event {
        rank: 4,
        ..event(1)
    })
    .unwrap();
    let bytes = w.finish().unwrap();
    assert_eq!(
        read_all(&bytes),
        Ok((
            1,
            Some(TraceError::OutOfRange {
                offset: at,
                rank: 4,
                channel: 0
            })
        ))
    );
}

fn v2_header(h: &Header) -> HeaderV2 {
    HeaderV2 {
        world: h.world,
        channels: h.channels,
        request: h.request,
        source: h.source.clone(),
        time_unit_ns: h.time_unit_ns,
    }
}

/// A version 2 trace (no team in the header) written as that version wrote it.
#[test]
fn version_2_still_reads_as_a_world_trace() {
    let mut v2 = Bytes::new();
    let mut hb = [0u8; MAX_HEADER];
    let hdr = postcard::to_slice(&v2_header(&header()), &mut hb).unwrap();
    v2.extend_from_slice(&MAGIC).unwrap();
    v2.extend_from_slice(&2u16.to_le_bytes()).unwrap();
    v2.extend_from_slice(&(hdr.len() as u32).to_le_bytes())
        .unwrap();
    v2.extend_from_slice(hdr).unwrap();
    // The records are the same in versions 2 and 3: take them from a version 3 trace.
    let v3 = trace(&header(), 5);
    let records = record_starts(&v3)[0];
    v2.extend_from_slice(&v3[records..v3.len() - 8]).unwrap();
    let mut h = Fnv::new();
    h.update(&v2);
    v2.extend_from_slice(&h.0.to_le_bytes()).unwrap();
    let r = Reader::new(&v2).unwrap();
    assert_eq!(r.version(), 2);
    assert_eq!(r.header(), &header());
    assert_eq!(read_all(&v2), Ok((5, None)));
    // A version 3 header read as version 2 (or the reverse) is refused, not misread.
    let mut wrong = trace(&header(), 1);
    wrong[8] = 2;
    assert!(Reader::new(&wrong).is_err());
}

#[test]
fn team_tags_round_trip_and_are_validated() {
    let mut h = header();
    h.team = Some(TeamTag {
        id: 2,
        world: 8,
        members: [7, 1, 4, 0].into_iter().collect(),
    });
    let bytes = trace(&h, 3);
    assert_eq!(Reader::new(&bytes).unwrap().header(), &h);
    for members in [&[7u16, 1, 4][..], &[7, 1, 4, 4], &[7, 1, 4, 8]] {
        let mut bad = h.clone();
        bad.team.as_mut().unwrap().members = members.iter().copied().collect();
        assert_eq!(bad.validate(), Err(HeaderError::Team), "{members:?}");
    }
    let mut small = h.clone();
    small.team.as_mut().unwrap().world = 3;
    assert_eq!(small.validate(), Err(HeaderError::Team));
    let team = crate::team::Team::new(2, 8, &[7, 1, 4, 0]).unwrap();
    assert_eq!(TeamTag::of(&team), h.team);
}

#[test]
fn version_1_still_reads() {
    let mut v1 = Bytes::new();
    let mut hb = [0u8; MAX_HEADER];
    let hdr = postcard::to_slice(&v2_header(&header()), &mut hb).unwrap();
    v1.extend_from_slice(&MAGIC).unwrap();
    v1.extend_from_slice(&1u16.to_le_bytes()).unwrap();
    v1.extend_from_slice(&(hdr.len() as u32).to_le_bytes())
        .unwrap();
    v1.extend_from_slice(hdr).unwrap();
    for i in 0..5 {
        let mut eb = [0u8; MAX_EVENT];
        v1.extend_from_slice(postcard::to_slice(&event(i), &mut eb).unwrap())
            .unwrap();
    }
    assert_eq!(read_all(&v1), Ok((5, None)));
    let (n, err) = read_all(&v1[..v1.len() - 2]).unwrap();
    assert_eq!(n, 4);
    assert!(matches!(err, Some(TraceError::Truncated { .. })));
}

#[test]
fn preamble_errors() {
    let bytes = trace(&header(), 1);
    let mut future = bytes.clone();
    future[8] = VERSION as u8 + 1;
    let err = Reader::new(&future).err();
    assert_eq!(err, Some(TraceError::NewerVersion { found: VERSION + 1 }));
    future[8] = 0;
    assert_eq!(
        Reader::new(&future).err(),
        Some(TraceError::UnsupportedVersion { found: 0 })
    );
    assert_eq!(Reader::new(b"nope").err(), Some(TraceError::BadMagic));
    assert_eq!(
        Reader::new(b"SYMM").err(),
        Some(TraceError::Truncated { offset: 0 })
    );
}

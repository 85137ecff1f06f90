//! Hostile traces through the whole path (decode -> viewer model -> Perfetto export): crafted
//! headers and events, every cut of a real trace, random mutations, the committed traces, and
//! version 3 traces of every op layout written by earlier builds (`tests/fixtures`).

use std::path::Path;
use symm_core::perfetto;
use symm_core::sched::SchedError;
use symm_core::symbolic::Rng;
use symm_core::trace::{self, HeaderError, OpLayout, Reader, TraceError, HEADER_OFFSET};
use symm_tests::{fuzz, hostile};
use symm_viz::buffers::ENTRIES_PER_SPAN;
use symm_viz::model::{LoadError, Trace};

fn viz_error(bytes: &[u8]) -> Option<TraceError> {
    match Trace::decode("t.trace", bytes.to_vec()) {
        Err(LoadError::Decode { error, .. }) => Some(error),
        _ => None,
    }
}

#[test]
fn crafted_headers_are_typed_errors() {
    let overflow = hostile::slots_overflow(200);
    let got = trace::decode(&overflow).err();
    assert!(
        matches!(
            got,
            Some(TraceError::InvalidHeader {
                offset: HEADER_OFFSET,
                reason: HeaderError::Request(SchedError::BadWorld { world: u16::MAX })
            })
        ),
        "{got:?}"
    );
    assert_eq!(viz_error(&overflow), got);
    let text = got.unwrap().to_string();
    assert!(text.contains("at byte 14"), "{text}");

    let mismatch = hostile::world_mismatch(200);
    let got = trace::decode(&mismatch).err();
    assert_eq!(
        got,
        Some(TraceError::InvalidHeader {
            offset: HEADER_OFFSET,
            reason: HeaderError::World {
                header: u16::MAX,
                request: 4
            }
        })
    );
    assert_eq!(viz_error(&mismatch), got);
    fuzz::trace_pipeline(&overflow);
    fuzz::trace_pipeline(&mismatch);
}

#[test]
fn crafted_events_open_with_tables_sized_by_the_events() {
    // 1024 ranks x 64 channels, events on one stream: one process and one thread row.
    let huge = hostile::huge_world(300);
    let t = Trace::decode("huge.trace", huge.clone()).unwrap();
    assert_eq!(t.lanes.len(), 1);
    let json = perfetto::to_json(&t.header, &t.full_events());
    assert_eq!(json.matches("\"process_name\"").count(), 1);
    assert_eq!(json.matches("\"thread_name\"").count(), 1);
    assert!(json.len() < 400 * 300, "{}", json.len());

    // Op indices 65536 apart: every event is its own span, no table in between.
    let fan = hostile::span_fanout(300);
    let t = Trace::decode("fan.trace", fan.clone()).unwrap();
    assert_eq!(t.spans.len(), 300);
    assert_eq!(perfetto::spans(&t.full_events()).len(), 300);

    // Multicast stores over every cell of 64 ranks: the history is capped.
    let mc = hostile::multicast_fanout(300);
    let t = Trace::decode("mc.trace", mc.clone()).unwrap();
    let entries = t.cells.entries();
    let cap = t.spans.len() * ENTRIES_PER_SPAN + t.cells.cells() * t.cells.world as usize;
    assert!(t.cells.written && entries <= cap, "{entries} > {cap}");
    for b in [huge, fan, mc] {
        fuzz::trace_pipeline(&b);
    }
}

/// (record start offsets, the end record's offset) of a whole trace.
fn records(bytes: &[u8]) -> Vec<usize> {
    let mut r = Reader::new(bytes).unwrap();
    let mut starts = vec![r.offset()];
    while let Some(e) = r.next() {
        e.unwrap();
        starts.push(r.offset());
    }
    starts
}

#[test]
fn every_cut_of_a_real_trace_is_reported_at_its_offset() {
    let good = hostile::sample();
    let starts = records(&good);
    let events = starts.len() - 1;
    assert!(events > 100);
    assert_eq!(trace::decode(&good).unwrap().warning, None);
    for cut in 0..good.len() {
        let bytes = &good[..cut];
        if cut < starts[0] {
            assert!(trace::decode(bytes).is_err(), "cut {cut}");
            assert!(Trace::decode("cut.trace", bytes.to_vec()).is_err());
            continue;
        }
        let at = starts.iter().rposition(|s| *s <= cut).unwrap();
        let want = if starts[at] == cut {
            TraceError::MissingEnd { offset: cut }
        } else {
            TraceError::Truncated { offset: starts[at] }
        };
        let d = trace::decode(bytes).unwrap();
        assert_eq!(d.warning, Some(want), "cut {cut}");
        assert_eq!(d.events.len(), at.min(events), "cut {cut}");
        let offset = format!("at byte {}", starts[at]);
        match Trace::decode("cut.trace", bytes.to_vec()) {
            Ok(t) => {
                assert_eq!(t.events.len(), d.events.len());
                let w = t.warning_text().unwrap();
                assert!(w.contains("cut.trace") && w.contains(&offset), "{w}");
            }
            Err(e @ LoadError::Empty { .. }) => {
                assert_eq!(at, 0);
                assert!(e.to_string().contains(&offset), "{e}");
            }
            Err(e) => panic!("cut {cut}: {e}"),
        }
    }
}

#[test]
fn crash_truncated_trace_exports_what_it_holds() {
    let good = hostile::sample();
    let cut = &good[..good.len() * 3 / 5];
    let d = trace::decode(cut).unwrap();
    let w = d.warning.unwrap();
    assert!(w.is_truncation());
    assert!(d.events.len() > 50);
    let whole = trace::decode(&good).unwrap().events;
    assert_eq!(d.events[..], whole[..d.events.len()]);
    let t = Trace::decode("crash.trace", cut.to_vec()).unwrap();
    assert_eq!(t.warning, Some(w));
    let json = perfetto::to_json(&t.header, &t.full_events());
    assert!(json.contains("\"ph\":\"X\""));
}

#[test]
fn random_mutations_are_detected() {
    let good = hostile::sample();
    let mut rng = Rng::new(7);
    let (mut errors, mut warnings, mut n) = (0, 0, 0);
    while n < 20_000 {
        let mut b = good.clone();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(b.len() as u64) as usize;
            b[i] = rng.next_u64() as u8;
        }
        if b == good {
            continue;
        }
        n += 1;
        match trace::decode(&b) {
            Ok(d) if d.warning.is_none() => panic!("a mutation decodes silently"),
            Ok(_) => warnings += 1,
            Err(_) => errors += 1,
        }
        if n % 50 == 0 {
            fuzz::trace_pipeline(&b);
        }
    }
    // A damaged trace reads as cut short only when the damage reaches the end record's tag.
    assert!(warnings * 100 < n, "{warnings} of {n} read as cut short");
    println!("{n} mutations: {errors} errors, {warnings} truncation warnings, 0 silent");
}

#[test]
fn committed_traces_open() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/gpu-traces");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "trace") {
            let bytes = std::fs::read(&p).unwrap();
            let d = trace::decode(&bytes).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            assert_eq!(d.warning, None, "{}", p.display());
            assert!(!d.events.is_empty());
            let t = Trace::decode("gpu.trace", bytes.clone()).unwrap();
            assert!(t.warning.is_none());
            fuzz::trace_pipeline(&bytes);
            n += 1;
        }
    }
    assert!(n >= 10, "{n} committed traces");
}

/// Version 3 traces written by earlier builds, one per op layout (`tests/fixtures/README.md`):
/// each reads back as exactly the events that build decoded, through the decoder, the viewer and
/// the export; every cut reads as cut short, every mutation is detected.
#[test]
fn version_3_fixtures_read_back_as_written() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
    for (name, layout, kinds) in [
        (
            "v3-original-multicast",
            OpLayout::Original,
            ["mc_reduce", "mc_store"],
        ),
        (
            "v3-kway-multicast",
            OpLayout::KWay,
            ["mc_reduce", "mc_store"],
        ),
        (
            "v3-low-latency-ll",
            OpLayout::LowLatency,
            ["ll_put", "ll_reduce"],
        ),
    ] {
        let bytes = std::fs::read(dir.join(format!("{name}.trace"))).unwrap();
        let want = std::fs::read_to_string(dir.join(format!("{name}.events"))).unwrap();
        assert!(bytes.len() < 50 * 1024);
        let r = Reader::new(&bytes).unwrap();
        assert_eq!((r.version(), r.layout()), (3, layout), "{name}");
        let d = trace::decode(&bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(d.warning, None);
        let got: Vec<String> = d.events.iter().map(|e| format!("{e:?}")).collect();
        assert_eq!(got, want.lines().collect::<Vec<_>>(), "{name}");
        for k in kinds {
            assert!(
                d.events.iter().any(|e| e.op.kind_name() == k),
                "{name}: {k}"
            );
        }
        let t = Trace::decode("old.trace", bytes.clone()).unwrap();
        assert!(t.warning.is_none());
        assert_eq!(t.events.len(), d.events.len());
        fuzz::trace_pipeline(&bytes);

        let starts = records(&bytes);
        for cut in starts[0]..bytes.len() {
            let c = trace::decode(&bytes[..cut]).unwrap();
            assert!(
                c.warning.is_some_and(|w| w.is_truncation()),
                "{name} cut {cut}"
            );
            assert_eq!(c.events[..], d.events[..c.events.len()], "{name} cut {cut}");
            fuzz::trace_pipeline(&bytes[..cut]);
        }
        let mut rng = Rng::new(3);
        for _ in 0..2000 {
            let mut b = bytes.clone();
            let i = rng.below(b.len() as u64) as usize;
            b[i] ^= 1 + rng.below(255) as u8;
            if let Ok(x) = trace::decode(&b) {
                assert!(
                    x.warning.is_some(),
                    "{name}: byte {i} changed, decodes silently"
                );
            }
            fuzz::trace_pipeline(&b);
        }
    }
}

/// A trace from a newer build says so by name, through the decoder and the viewer.
#[test]
fn a_newer_version_is_named() {
    let mut b = hostile::sample();
    b[8..10].copy_from_slice(&(trace::VERSION + 1).to_le_bytes());
    let err = trace::decode(&b).err().unwrap();
    assert_eq!(
        err,
        TraceError::NewerVersion {
            found: trace::VERSION + 1
        }
    );
    assert!(
        err.to_string().contains("is newer than this build reads"),
        "{err}"
    );
    assert_eq!(viz_error(&b), Some(err));
    fuzz::trace_pipeline(&b);
}

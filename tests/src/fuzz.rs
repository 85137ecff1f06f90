//! The fuzz targets' bodies, shared by `fuzz/` (cargo-fuzz) and the corpus-replay test.
//!
//! Each function takes arbitrary bytes and panics only when an oracle is violated.

use symm_core::dtype::{DType, ReduceOp};
use symm_core::heap::{check, Heap, HeapError};
use symm_core::perfetto;
use symm_core::sched::{Algorithm, Collective, Request};
use symm_core::symbolic::{self, SymError};
use symm_core::trace::Reader;
use symm_driver::host;
use symm_viz::model::{LoadError, Trace};
use symm_viz::{describe, hang};

/// The trace decoder never panics; it either yields events or a typed error, and stops.
pub fn trace_decode(data: &[u8]) {
    if let Ok(r) = Reader::new(data) {
        let mut n = 0usize;
        for e in r {
            n += 1;
            if e.is_err() {
                break;
            }
            assert!(n <= data.len(), "more events than bytes");
        }
    }
}

/// Most bytes of Perfetto JSON per byte of trace: a span's slice is a few hundred bytes and
/// takes at least one 10-byte event.
pub const JSON_PER_BYTE: usize = 64;

/// The whole path of a trace: bytes -> decode -> the viewer's model (spans, lanes, pairs,
/// buffers, hang report, words) -> Perfetto export, and the command line's export. Never panics;
/// the viewer and the command line agree on what opens, what is a warning and what is an error;
/// the viewer's export is the export of its events; the JSON is a bounded multiple of the input.
pub fn trace_pipeline(data: &[u8]) {
    let cli = perfetto::fold(data);
    let viz = Trace::decode("fuzz.trace", data.to_vec());
    match (&cli, &viz) {
        (Ok(x), Ok(t)) => {
            assert_eq!(x.warning, t.warning);
            assert_eq!(x.events, t.events.len() as u64);
            assert_eq!(t.warning.is_some(), t.warning_text().is_some());
        }
        (Ok(x), Err(LoadError::Empty { warning, .. })) => {
            assert_eq!(x.events, 0);
            assert_eq!(&x.warning, warning);
        }
        (Err(e), Err(LoadError::Decode { error, .. })) => {
            assert_eq!(e, error);
            assert!(!e.is_truncation() || Reader::new(data).is_err(), "{e:?}");
        }
        (c, v) => panic!(
            "the command line reads {:?}, the viewer {:?}",
            c.as_ref().err(),
            v.as_ref().err()
        ),
    }
    if let Ok(x) = &cli {
        let json = x.to_json();
        assert!(
            json.len() <= JSON_PER_BYTE * data.len(),
            "{} bytes of JSON from {} bytes",
            json.len(),
            data.len()
        );
    }
    let Ok(t) = viz else { return };
    for s in 0..t.spans.len() {
        let _ = describe::op(&t, s);
    }
    if let Some(h) = hang::analyse(&t) {
        let _ = hang::describe_root(&t, &h.root);
    }
    let n = t.events.len();
    for pos in [0, n / 2, n] {
        let _ = t.time_at(pos);
        let _ = t.current_span(pos);
        for r in 0..t.cells.world as usize {
            for c in 0..t.cells.cells() {
                let _ = t.cells.at(r, c, pos);
                let _ = t.scratch.at(r, c, pos);
            }
        }
    }
    for lane in &t.lanes {
        let _ = t.lane_span_at(lane, t.end / 2);
        let _ = t.lane_first_ending_after(lane, t.start);
    }
    let json = t.to_json();
    assert_eq!(json, perfetto::to_json(&t.header, &t.full_events()));
    assert!(json.len() <= JSON_PER_BYTE * data.len());
}

/// Heap operation sequences: the allocator's invariants hold after every call, live blocks are
/// aligned and disjoint, and a second heap replaying the same calls agrees.
pub fn heap_ops(data: &[u8]) {
    let cap = 1 << 16;
    let mut a = Heap::new(cap);
    let mut b = Heap::new(cap);
    let mut live: Vec<(u64, u64)> = Vec::new();
    for w in data.chunks(3) {
        let (k, x, y) = (
            w[0],
            *w.get(1).unwrap_or(&0) as u64,
            *w.get(2).unwrap_or(&0) as u64,
        );
        if k % 3 != 0 || live.is_empty() {
            let size = (x << 4) | (y & 0xf);
            let align = 1u64 << (y % 13);
            let r = a.alloc(size, align);
            assert_eq!(r, b.alloc(size, align));
            match r {
                Ok(off) => {
                    assert_eq!(off % align, 0);
                    assert!(off + size <= cap);
                    for &(o, s) in &live {
                        assert!(off + size <= o || o + s <= off, "overlap");
                    }
                    live.push((off, size));
                }
                Err(
                    HeapError::OutOfMemory { .. } | HeapError::ZeroSize | HeapError::TooManyBlocks,
                ) => {}
                Err(e) => panic!("unexpected {e:?}"),
            }
        } else {
            let i = (x as usize) % live.len();
            let (off, _) = live.swap_remove(i);
            assert_eq!(a.free(off), Ok(()));
            assert_eq!(b.free(off), Ok(()));
            if y % 2 == 0 {
                assert!(matches!(
                    a.free(off),
                    Err(HeapError::DoubleFree { .. } | HeapError::UnknownBlock { .. })
                ));
                assert!(b.free(off).is_err());
            }
        }
        assert!(a.invariants_hold());
        assert_eq!(a.used(), live.iter().map(|l| l.1).sum::<u64>());
    }
    assert_eq!(check(&a, &b), Ok(()));
}

/// A request from bytes (any request, valid or not): worlds 1..=128, every collective and
/// algorithm, any chunk (up to 2^64 - 1 bytes), any slot count, channels 0..=66 (0 and above
/// the limit are invalid on purpose).
pub fn request_from(data: &[u8]) -> Option<(Request, u64)> {
    if data.len() < 8 {
        return None;
    }
    let byte = |i: usize| *data.get(i).unwrap_or(&0);
    let world = 1 + (byte(0) as u16 % 128);
    let cs = [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::AllGather,
        Collective::Broadcast {
            root: byte(2) as u16 % (world + 1),
        },
        Collective::Reduce {
            root: byte(2) as u16 % world,
        },
        Collective::Scatter {
            root: byte(2) as u16 % world,
        },
        Collective::Gather {
            root: byte(2) as u16 % world,
        },
        Collective::AllToAll,
        Collective::SendRecv {
            src: byte(2) as u16 % world,
            dst: byte(3) as u16 % world,
        },
    ];
    let c = cs[byte(1) as usize % cs.len()];
    let a = Algorithm::ALL[byte(4) as usize % Algorithm::ALL.len()];
    let dt = DType::ALL[byte(5) as usize % DType::ALL.len()];
    let op = ReduceOp::ALL[byte(6) as usize % ReduceOp::ALL.len()];
    let elems = byte(7) as u64 % 97;
    let extra = u64::from(byte(8) % 7 == 0);
    let channels = byte(9) as u16 % 67;
    // Chunk: a small element count most of the time, any 64-bit byte count otherwise.
    let chunk = if byte(10) & 0x80 == 0 {
        (byte(10) as u64 % 9) * dt.size()
    } else {
        let mut b = [0u8; 8];
        for (i, x) in b.iter_mut().enumerate() {
            *x = byte(13 + i);
        }
        u64::from_le_bytes(b)
    };
    let slots = byte(11);
    let req = Request::new(c, a, world, elems * dt.size() + extra, dt, op)
        .with_channels(channels)
        .with_pipeline(chunk, slots);
    Some((req, byte(12) as u64))
}

/// Schedule requests: an invalid one is the same typed error from `validate` and from the
/// symbolic check; a valid one passes the symbolic check under the interleaving the input picks
/// (worlds up to 64 whose buffers hold at most 4 Mi elements in all), else runs on the simulator
/// against the reference (at most 16 MiB of buffers in all), else is timed on the simulator
/// without buffers (every stream finishes, no deadlock).
pub fn sched_request(data: &[u8]) {
    let Some((req, seed)) = request_from(data) else {
        return;
    };
    if let Err(e) = req.validate() {
        assert_eq!(symbolic::check(&req, seed).err(), Some(SymError::Sched(e)));
        return;
    }
    let sz = req.buffer_sizes();
    let bytes = sz
        .input
        .saturating_add(sz.output)
        .saturating_add(sz.scratch)
        .saturating_mul(req.world as u64);
    let elems = bytes / req.dtype.size();
    if req.world <= 64 && elems <= 4 << 20 {
        if let Err(e) = symbolic::check(&req, seed) {
            panic!("{req:?}: symbolic check {e:?}");
        }
        return;
    }
    let data = bytes <= 16 << 20;
    let opts = host::SimOptions {
        trace: false,
        data,
        ..Default::default()
    };
    let inputs = if data {
        host::random_inputs(&req, seed)
    } else {
        Vec::new()
    };
    let run = match host::simulate(&req, &inputs, &opts) {
        Ok(run) => run,
        // A schedule longer than the host backend runs is refused, by design.
        Err(host::HostError::TooManyOps { .. }) => return,
        Err(e) => panic!("{req:?}: simulator {e}"),
    };
    if data {
        if let Err(m) = host::compare(&req, &run.outputs, &host::reference(&req, &inputs)) {
            panic!("{req:?}: {m:?}");
        }
    }
}

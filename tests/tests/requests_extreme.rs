//! Requests at the edges of every field, through the public core API a library user (or the C
//! and Python bindings) reaches: validation answers every one, and what it accepts sizes its
//! buffers, prices, picks an algorithm and starts its schedule on every rank's first and last
//! channel without a panic (arithmetic overflow is checked in these builds).

use symm_core::cost::{predict, select, Link};
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request, Schedule};
use symm_core::symbolic::Rng;

const WORLDS: [u16; 12] = [0, 1, 2, 3, 7, 64, 65, 128, 1000, 1024, 1025, u16::MAX];
const BYTES: [u64; 12] = [
    0,
    1,
    3,
    4,
    4096,
    1 << 20,
    1 << 32,
    1 << 40,
    1 << 48,
    (1 << 48) + 4,
    1 << 63,
    u64::MAX,
];
const CHANNELS: [u16; 8] = [0, 1, 2, 16, 64, 65, 1000, u16::MAX];
const CHUNKS: [u64; 7] = [0, 1, 7, 4096, 1 << 20, 1 << 48, u64::MAX];
const SLOTS: [u8; 5] = [0, 1, 2, 8, u8::MAX];
const ROOTS: [u16; 5] = [0, 1, 63, 1023, u16::MAX];

fn pick<T: Copy>(rng: &mut Rng, xs: &[T]) -> T {
    xs[rng.below(xs.len() as u64) as usize]
}

/// Ops of one stream started: enough to reach every phase of a small schedule, bounded for a
/// long one.
const OPS: usize = 2000;

#[test]
fn requests_at_every_edge_validate_or_schedule_without_a_panic() {
    let mut rng = Rng::new(0x5eed);
    let (mut valid, mut refused, mut ops) = (0u32, 0u32, 0usize);
    for _ in 0..50_000 {
        let world = pick(&mut rng, &WORLDS);
        let collective = pick(&mut rng, &Collective::ALL).with_root(pick(&mut rng, &ROOTS));
        let req = Request::new(
            collective,
            pick(&mut rng, &Algorithm::ALL),
            world,
            pick(&mut rng, &BYTES),
            pick(&mut rng, &DType::ALL),
            pick(&mut rng, &ReduceOp::ALL),
        )
        .with_channels(pick(&mut rng, &CHANNELS))
        .with_pipeline(pick(&mut rng, &CHUNKS), pick(&mut rng, &SLOTS));
        if req.validate().is_err() {
            refused += 1;
            continue;
        }
        valid += 1;
        let sz = req.buffer_sizes();
        assert!(sz.input.max(sz.output) <= 1 << 56, "{req:?}: {sz:?}");
        let _ = req.layout();
        let t = predict(&req, &Link::NVLINK4);
        assert!(t.is_finite() && t > 0.0, "{req:?}: {t}");
        let _ = select(&req, &Link::NVLINK4, true);
        for rank in [0, req.world - 1] {
            for channel in [0, req.channels.max(1) - 1] {
                let s = match Schedule::new(req, rank, channel) {
                    Ok(s) => s,
                    // Its counts come with the call (`sched::alltoallv`): a typed refusal here.
                    Err(_) if req.collective == Collective::AllToAllV => continue,
                    Err(e) => panic!("{req:?}: a valid request's schedule: {e}"),
                };
                // A stream may be empty (a rank a broadcast's chain skips on this channel).
                ops += s.take(OPS).count();
            }
        }
    }
    // Both sides of validation were reached.
    assert!(
        valid > 1000 && refused > 1000,
        "{valid} valid, {refused} refused"
    );
    assert!(ops > 100_000, "{ops} ops");
}

/// The heap at the edges of size, alignment and capacity: every call answers, typed, and the
/// heap keeps its invariants.
#[test]
fn the_heap_answers_every_size_and_alignment() {
    use symm_core::heap::Heap;
    let edges = [
        0u64,
        1,
        2,
        3,
        4095,
        4096,
        1 << 32,
        1 << 48,
        1 << 62,
        1 << 63,
        u64::MAX - 1,
        u64::MAX,
    ];
    for cap in [0u64, 1, 4096, 1 << 48, u64::MAX] {
        let mut h = Heap::new(cap);
        let mut live = Vec::new();
        for &size in &edges {
            for &align in &edges {
                match h.alloc(size, align) {
                    Ok(off) => {
                        assert!(align.is_power_of_two() && off % align == 0);
                        assert!(off.checked_add(size).is_some_and(|end| end <= cap));
                        live.push(off);
                    }
                    Err(e) => {
                        let _ = e.to_string();
                    }
                }
                assert!(h.invariants_hold(), "cap {cap} size {size} align {align}");
            }
        }
        for &off in &edges {
            let _ = h.free(off);
            assert!(h.invariants_hold());
        }
        for off in live {
            let _ = h.free(off);
        }
        assert!(h.invariants_hold());
    }
    // The symmetric layout over the same edges, every world: an answer, never a panic.
    for &base in &[0u64, 1 << 47, u64::MAX] {
        for &stride in &[0u64, 4096, 1 << 40, u64::MAX] {
            for &size in &[0u64, 4096, u64::MAX] {
                for world in [0u16, 1, 1024, u16::MAX] {
                    let _ = symm_core::heap::Layout::new(base, stride, size, world);
                }
            }
        }
    }
}

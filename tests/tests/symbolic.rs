//! The symbolic check: every schedule, on contribution sets, for every world size 1..=64.
//!
//! Every output element must hold each rank's contribution exactly once (or the one element the
//! collective defines), under random interleavings, with no deadlock, no read of unwritten data
//! and every signal balanced.

use std::time::Instant;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::symbolic::check;
use symm_tests::{pairs, request};

#[test]
fn every_schedule_is_correct_for_worlds_1_to_64() {
    let t = Instant::now();
    let mut runs = 0;
    let mut ops = 0;
    for world in 1..=64u16 {
        let w = world as u64;
        for (c, a) in pairs(world) {
            // Slots 1, 2 and 3 (raised to what the schedule needs: see `Request::min_slots`).
            for (elems, channels, chunk, slots) in
                [(1, 1, 0, 2), (2 * w + 3, 2, 2, 1), (5 * w + 1, 1, 3, 3)]
            {
                let seeds = if world <= 8 { 3 } else { 1 };
                for seed in 0..seeds {
                    let req = request(c, a, world, elems, DType::F32, ReduceOp::Sum)
                        .with_channels(channels);
                    let req = req.with_pipeline(chunk * 4, slots.max(req.min_slots()));
                    let rep =
                        check(&req, seed).unwrap_or_else(|e| panic!("{req:?} seed {seed}: {e:?}"));
                    runs += 1;
                    ops += rep.ops;
                }
            }
        }
    }
    println!(
        "symbolic: {runs} runs, {ops} ops, worlds 1..=64, {:.2?}",
        t.elapsed()
    );
}

/// A request the checker cannot model in bounded memory is refused before anything is
/// allocated: a cell per element of every rank's buffers, at most `MAX_CELLS`.
#[test]
fn requests_past_the_checkers_cells_are_refused_at_once() {
    use symm_core::sched::{Algorithm, Collective, Request};
    use symm_core::symbolic::{SymError, MAX_CELLS};
    let t = Instant::now();
    for (world, bytes) in [(64, 1u64 << 40), (2, 1 << 30), (64, 1 << 20)] {
        let req = Request::new(
            Collective::AllGather,
            Algorithm::Direct,
            world,
            bytes,
            DType::U8,
            ReduceOp::Sum,
        );
        match check(&req, 1) {
            Err(SymError::TooManyCells { cells }) => assert!(cells > MAX_CELLS, "{cells}"),
            other => panic!("world {world}, {bytes} bytes: {other:?}"),
        }
    }
    assert!(t.elapsed().as_secs() < 5, "{:?}", t.elapsed());
}

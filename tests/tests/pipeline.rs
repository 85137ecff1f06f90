//! Pipeline parameters: every setting either runs correctly or is refused by `validate`.
//!
//! Worlds 2, 3, 6 and 7 x every collective x algorithm x scratch slots 1..=4 x chunks of one
//! element, three elements (odd), the default and more than the data x channels 1, 3 and 8, on
//! the simulator, on real threads and through the symbolic check. A refused setting must be the
//! typed `TooFewSlots` error, and only where `Request::min_slots` says the schedule needs more.

use std::time::Instant;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Request, SchedError};
use symm_core::symbolic;
use symm_driver::backend::{Backend, Simulator, Threads};
use symm_driver::host::{compare, random_inputs, reference, simulate, SimOptions};
use symm_tests::{pairs, request};

const WORLDS: [u16; 4] = [2, 3, 6, 7];
const SLOTS: [u8; 4] = [1, 2, 3, 4];
const CHANNELS: [u16; 3] = [1, 3, 8];

/// Every request of the grid at `world`: (request, refused by validate).
fn grid(world: u16) -> Vec<Request> {
    let elems = 5 * world as u64 + 3;
    let dt = DType::I32;
    let mut out = Vec::new();
    for (c, a) in pairs(world) {
        for slots in SLOTS {
            // One element, an odd three, the default (0), and more than the whole buffer.
            for chunk_elems in [1u64, 3, 0, 4 * elems * world as u64] {
                for channels in CHANNELS {
                    out.push(
                        request(c, a, world, elems, dt, ReduceOp::Sum)
                            .with_channels(channels)
                            .with_pipeline(chunk_elems * dt.size(), slots),
                    );
                }
            }
        }
    }
    out
}

/// `Ok(true)` when the request runs, `Ok(false)` when it is refused as it must be.
fn admitted(req: &Request) -> bool {
    match req.validate() {
        Ok(()) => {
            assert!(req.slot_count() >= req.min_slots() as u64, "{req:?}");
            true
        }
        Err(SchedError::TooFewSlots { slots, min }) => {
            assert_eq!(slots, req.slots);
            assert_eq!(min, req.min_slots());
            assert!((slots as u64) < min as u64);
            false
        }
        Err(e) => panic!("{req:?}: unexpected {e}"),
    }
}

#[test]
fn one_slot_ring_is_refused_with_a_typed_error() {
    for c in [
        symm_core::sched::Collective::AllReduce,
        symm_core::sched::Collective::ReduceScatter,
    ] {
        let req = Request::new(
            c,
            symm_core::sched::Algorithm::Ring,
            3,
            12,
            DType::I32,
            ReduceOp::Sum,
        )
        .with_pipeline(4, 1);
        assert_eq!(
            req.validate(),
            Err(SchedError::TooFewSlots { slots: 1, min: 2 })
        );
        let inputs = random_inputs(&req.with_pipeline(4, 2), 1);
        assert!(simulate(&req, &inputs, &SimOptions::default()).is_err());
        // Two slots: the same request completes, with the reference's result.
        let ok = req.with_pipeline(4, 2);
        let run = simulate(&ok, &inputs, &SimOptions::default()).unwrap();
        compare(&ok, &run.outputs, &reference(&ok, &inputs)).unwrap();
        // World 2 needs only one slot.
        let two = Request::new(
            c,
            symm_core::sched::Algorithm::Ring,
            2,
            12,
            DType::I32,
            ReduceOp::Sum,
        )
        .with_pipeline(4, 1);
        assert_eq!(two.validate(), Ok(()));
    }
}

/// Runs the grid on `backend` (and, with `symbolic`, through the symbolic check); every
/// admitted request must equal the reference. Returns (passed, refused).
fn run_grid(backend: &mut dyn Backend, symbolic: bool) -> (u64, u64) {
    let (mut runs, mut refused) = (0u64, 0u64);
    for world in WORLDS {
        for req in grid(world) {
            if !admitted(&req) {
                refused += 1;
                continue;
            }
            let inputs = random_inputs(&req, runs);
            let out = backend
                .run(&req, &inputs, false)
                .unwrap_or_else(|e| panic!("{req:?}: {e}"));
            if let Err(m) = compare(&req, &out.outputs, &reference(&req, &inputs)) {
                panic!("{req:?}: {m:?}");
            }
            if symbolic {
                symbolic::check(&req, runs).unwrap_or_else(|e| panic!("{req:?}: {e:?}"));
            }
            runs += 1;
        }
    }
    (runs, refused)
}

#[test]
fn pipeline_grid_on_the_simulator_and_symbolically() {
    let t = Instant::now();
    let (runs, refused) = run_grid(&mut Simulator::default(), true);
    println!(
        "pipeline grid (simulator + symbolic): {runs} requests passed, {refused} refused, {:.2?}",
        t.elapsed()
    );
    assert!(runs > 0 && refused > 0);
}

#[test]
fn pipeline_grid_on_real_threads() {
    let t = Instant::now();
    let (runs, refused) = run_grid(&mut Threads::default(), false);
    println!(
        "pipeline grid (threads): {runs} requests passed, {refused} refused, {:.2?}",
        t.elapsed()
    );
    assert!(runs > 0 && refused > 0);
}

//! Conformance: every collective x algorithm (multicast through the host model) x world
//! {1, 2, 3, 4, 5, 8} x sizes {0, 1 element, odd, 1 KiB, 1 MiB} x dtypes x reduce ops on the host
//! backend equals the sequential reference.
//!
//! Integers must match exactly. Floats must match within a relative 1e-2 (f16, bf16) or 1e-5
//! (f32, f64); inputs are small integers, so in practice they match exactly too.
//!
//! The full matrix runs on the deterministic simulator; a cross-section (every collective x
//! algorithm x world at 1 KiB and 64 KiB + 2 elements, f32 and bf16 sum) also runs with one real
//! thread per (rank, channel) and real atomics.

use std::time::Instant;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::Request;
use symm_driver::host::{
    compare, random_inputs, reference, run_threads, simulate, SimOptions, ThreadOptions,
};
use symm_tests::pairs;

const WORLDS: [u16; 6] = [1, 2, 3, 4, 5, 8];

fn sizes(dt: DType) -> [u64; 5] {
    let e = dt.size();
    [0, e, 37 * e, 1024, 1 << 20]
}

fn check_sim(req: &Request, seed: u64) {
    let inputs = random_inputs(req, seed);
    let opts = SimOptions {
        trace: false,
        ..Default::default()
    };
    let run = simulate(req, &inputs, &opts).unwrap_or_else(|e| panic!("{req:?}: {e}"));
    let want = reference(req, &inputs);
    if let Err(m) = compare(req, &run.outputs, &want) {
        panic!("{req:?}: {m:?}");
    }
}

#[test]
fn full_matrix_on_the_simulator() {
    let t = Instant::now();
    let mut runs = 0;
    for world in WORLDS {
        for (c, a) in pairs(world) {
            for dt in DType::ALL {
                let ops: &[ReduceOp] = if c.reduces() {
                    &ReduceOp::ALL
                } else {
                    &[ReduceOp::Sum]
                };
                for &op in ops {
                    for bytes in sizes(dt) {
                        // The 1 MiB column runs every dtype with sum and every op with f32, to
                        // keep the matrix inside the CI budget; smaller sizes run the full cross.
                        if bytes == 1 << 20 && op != ReduceOp::Sum && dt != DType::F32 {
                            continue;
                        }
                        let channels = if bytes >= 1024 { 2 } else { 1 };
                        let req = Request::new(c, a, world, bytes, dt, op)
                            .with_channels(channels)
                            .with_pipeline(if bytes == 1 << 20 { 64 << 10 } else { 256 }, 2);
                        check_sim(&req, runs);
                        runs += 1;
                    }
                }
            }
        }
    }
    println!(
        "conformance (simulator): {runs} runs passed in {:.2?}",
        t.elapsed()
    );
}

#[test]
fn cross_section_on_real_threads() {
    let t = Instant::now();
    let mut runs = 0;
    for world in WORLDS {
        for (c, a) in pairs(world) {
            for dt in [DType::F32, DType::Bf16] {
                for bytes in [1024, (64 << 10) + 2 * dt.size()] {
                    let req = Request::new(c, a, world, bytes, dt, ReduceOp::Sum)
                        .with_channels(2)
                        .with_pipeline(4096, 2);
                    let inputs = random_inputs(&req, runs);
                    let opts = ThreadOptions {
                        trace: false,
                        ..Default::default()
                    };
                    let run = run_threads(&req, &inputs, &opts)
                        .unwrap_or_else(|e| panic!("{req:?}: {e}"));
                    if let Err(m) = compare(&req, &run.outputs, &reference(&req, &inputs)) {
                        panic!("{req:?}: {m:?}");
                    }
                    runs += 1;
                }
            }
        }
    }
    println!(
        "conformance (threads): {runs} runs passed in {:.2?}",
        t.elapsed()
    );
}

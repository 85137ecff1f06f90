//! The cost model against the simulator: over worlds 2..72 (odd ones included) and 1 KiB..1 GiB,
//! `cost::select`'s pick must run within 1.25x of the simulator's fastest algorithm at every
//! point. The model's error (predicted / simulated) is reported per algorithm, and the closed
//! forms (`core/src/sched/*`'s costs) are derived from the simulator's rules (shared ports,
//! posted puts, signals that cost their sender only the issue), so the prediction of every
//! algorithm (multicast included) must stay within 1.25x of the simulated time, either way.
//!
//! The simulator runs timing only (no buffers), so a 1 GiB all-reduce of 72 ranks costs a few
//! seconds. Sizes are the total data, as in nccl-tests: a collective whose request names a
//! per-rank block (reduce-scatter, all-gather, all-to-all, scatter, gather) gets `size / world`.

use std::collections::BTreeMap;
use std::time::Instant;
use symm_core::cost::{predict, select, Link};
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{algorithms, Algorithm, Collective, Request};
use symm_driver::host::{simulate, SimOptions};
use symm_tests::collectives;

const WORLDS: [u16; 20] = [
    2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 24, 31, 32, 33, 48, 63, 64, 72,
];

fn request_bytes(c: Collective, size: u64, world: u16) -> u64 {
    match c {
        Collective::AllReduce
        | Collective::Broadcast { .. }
        | Collective::Reduce { .. }
        | Collective::SendRecv { .. } => size,
        _ => (size / world as u64 / 2).max(1) * 2,
    }
}

#[test]
fn select_is_within_1_25x_of_the_simulated_best_everywhere() {
    let link = Link::NVLINK4;
    let opts = SimOptions {
        link,
        trace: false,
        data: false,
        ..Default::default()
    };
    let t0 = Instant::now();
    let sizes: Vec<u64> = (0..11).map(|i| 1024u64 << (2 * i)).collect();
    let mut error: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    let (mut points, mut worst, mut failures) = (0, (1.0f64, String::new()), Vec::new());
    for world in WORLDS {
        for c in collectives(world) {
            // Multicast and `cost::MEASURED_ONLY` are timed too (their model error is
            // reported) but are not candidates: `select` considers multicast only when the
            // machine has it, and the others only through a calibration table.
            let algs: Vec<Algorithm> = algorithms(c).to_vec();
            for &size in &sizes {
                let bytes = request_bytes(c, size, world);
                let mut times = Vec::new();
                for &a in algs.iter().filter(|a| a.takes(bytes)) {
                    let req = Request::new(c, a, world, bytes, DType::Bf16, ReduceOp::Sum);
                    let sim = simulate(&req, &[], &opts)
                        .unwrap_or_else(|e| panic!("{req:?}: {e}"))
                        .time_us;
                    let model = predict(&req, &link);
                    let e = error
                        .entry(format!("{}/{}", c.name(), a.name()))
                        .or_insert((f64::MAX, 0.0));
                    e.0 = e.0.min(model / sim);
                    e.1 = e.1.max(model / sim);
                    times.push((a, sim));
                }
                let candidate = |a: Algorithm| {
                    a != Algorithm::Multicast && !symm_core::cost::MEASURED_ONLY.contains(&a)
                };
                let best = times
                    .iter()
                    .filter(|t| candidate(t.0))
                    .map(|t| t.1)
                    .fold(f64::MAX, f64::min);
                let req = Request::new(c, algs[0], world, bytes, DType::Bf16, ReduceOp::Sum);
                let pick = select(&req, &link, false);
                let picked = times
                    .iter()
                    .find(|t| t.0 == pick)
                    .map(|t| t.1)
                    .unwrap_or(f64::MAX);
                let ratio = picked / best;
                // The model's error on an algorithm at this point (1: exact).
                let off = |a: Algorithm| {
                    let sim = times.iter().find(|t| t.0 == a).map_or(f64::MAX, |t| t.1);
                    let req = Request::new(c, a, world, bytes, DType::Bf16, ReduceOp::Sum);
                    let r = predict(&req, &link) / sim;
                    r.max(1.0 / r)
                };
                let fastest = times
                    .iter()
                    .filter(|t| candidate(t.0))
                    .min_by(|x, y| x.1.total_cmp(&y.1))
                    .map_or(pick, |t| t.0);
                let at = format!(
                    "{} world {world} {size} B: picked {}",
                    c.name(),
                    pick.name()
                );
                if ratio > worst.0 {
                    worst = (ratio, at.clone());
                }
                if ratio > 1.25 {
                    failures.push(format!(
                        "{at} at {ratio:.2}x the best ({}), model off by {:.2}x / {:.2}x",
                        fastest.name(),
                        off(pick),
                        off(fastest)
                    ));
                }
                points += 1;
            }
        }
    }
    println!("cost model: predicted / simulated, per algorithm, over the grid:");
    for (k, (lo, hi)) in &error {
        println!("  {k:<28} {lo:.2} .. {hi:.2}");
    }
    println!(
        "cost model: {points} points, worst pick {:.2}x the best ({}), {:.1?}",
        worst.0,
        worst.1,
        t0.elapsed()
    );
    for (k, (lo, hi)) in &error {
        if *lo < 0.8 || *hi > 1.25 {
            failures.push(format!("{k}: model / simulated {lo:.2} .. {hi:.2}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

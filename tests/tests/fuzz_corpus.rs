//! Replays the committed fuzz corpora (`fuzz/corpus/<target>/`) through the fuzz targets' bodies,
//! and feeds the trace decoder 100k+ random, truncated and mutated inputs.

use std::path::Path;
use std::time::Instant;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_core::symbolic::Rng;
use symm_core::trace::{Reader, TraceError};
use symm_driver::host::{random_inputs, simulate, SimOptions};
use symm_tests::fuzz;

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files.iter().map(|p| std::fs::read(p).unwrap()).collect()
}

#[test]
fn corpora_replay() {
    for (name, f) in [
        ("trace_decode", fuzz::trace_decode as fn(&[u8])),
        ("trace_pipeline", fuzz::trace_pipeline),
        ("heap_ops", fuzz::heap_ops),
        ("sched_request", fuzz::sched_request),
    ] {
        let inputs = corpus(name);
        assert!(!inputs.is_empty(), "corpus {name} is empty");
        for i in &inputs {
            f(i);
        }
        println!("fuzz corpus {name}: {} inputs replayed", inputs.len());
    }
}

fn sample_trace() -> Vec<u8> {
    let req = Request::new(
        Collective::AllReduce,
        Algorithm::Ring,
        4,
        4096,
        DType::F32,
        ReduceOp::Sum,
    )
    .with_pipeline(512, 2);
    let opts = SimOptions {
        contents: true,
        ..Default::default()
    };
    simulate(&req, &random_inputs(&req, 1), &opts)
        .unwrap()
        .trace
}

#[test]
fn trace_decoder_survives_100k_hostile_inputs() {
    let t = Instant::now();
    let good = sample_trace();
    let events = Reader::new(&good).unwrap().filter(|e| e.is_ok()).count();
    assert!(events > 100);
    let mut rng = Rng::new(42);
    let mut errors = 0;
    let mut n = 0;
    // Random bytes, with and without a valid preamble.
    for i in 0..50_000 {
        let len = rng.below(256) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        if i % 2 == 0 {
            let pre = &good[..14.min(good.len())];
            b.splice(0..0, pre.iter().copied());
        }
        fuzz::trace_decode(&b);
        n += 1;
    }
    // Every truncation of a real trace is a typed error, or reads as cut short.
    for cut in (0..good.len()).step_by(7) {
        let r = Reader::new(&good[..cut]);
        match r {
            Err(_) => errors += 1,
            Ok(r) => {
                let last = r.last();
                assert!(
                    last.is_some_and(|e| e.is_err_and(|e| e.is_truncation())),
                    "cut {cut}: {last:?}"
                );
                errors += 1;
            }
        }
        n += 1;
    }
    // Mutations of a real trace.
    while n < 110_000 {
        let mut b = good.clone();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(b.len() as u64) as usize;
            b[i] = rng.next_u64() as u8;
        }
        fuzz::trace_decode(&b);
        n += 1;
    }
    let mut future = good.clone();
    future[8] = symm_core::trace::VERSION as u8 + 1;
    assert_eq!(
        Reader::new(&future).err(),
        Some(TraceError::NewerVersion {
            found: symm_core::trace::VERSION + 1
        })
    );
    assert!(errors > 0);
    println!(
        "trace decoder: {n} hostile inputs, no panic, {errors} truncations reported ({:.2?})",
        t.elapsed()
    );
}

//! The viewer replays traces of the fused k-way reduce and the low-latency protocol.
//!
//! The simulator traces a one-shot all-reduce (one `ReduceN` per rank) and a low-latency one
//! (`LlPut`s and an `LlReduce`), with contents; the viewer's model (`symm_viz::model`, the code
//! the browser app runs) decodes each, describes every op in words, and its output-buffer view
//! ends with every rank's contribution in every output cell.

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::host::{self, SimOptions};
use symm_viz::describe;
use symm_viz::model::Trace;

fn replay(a: Algorithm, world: u16) -> Vec<String> {
    let req = Request::new(
        Collective::AllReduce,
        a,
        world,
        1024,
        DType::F32,
        ReduceOp::Sum,
    );
    let inputs = host::random_inputs(&req, 5);
    let opts = SimOptions {
        contents: true,
        ..SimOptions::default()
    };
    let run = host::simulate(&req, &inputs, &opts).unwrap();
    assert_eq!(run.outputs, host::reference(&req, &inputs));
    let t = Trace::decode(a.name(), run.trace).unwrap();
    assert!(t.warning_text().is_none());
    let words: Vec<String> = (0..t.spans.len()).map(|s| describe::op(&t, s)).collect();
    // At the end of playback every output cell of every rank holds all ranks.
    let all = (1u64 << world) - 1;
    let end = t.events.len();
    assert!(t.cells.recorded && t.cells.written, "{}", a.name());
    for r in 0..world as usize {
        for c in 0..t.cells.cells() {
            assert_eq!(t.cells.at(r, c, end), all, "{} rank {r} cell {c}", a.name());
        }
    }
    words
}

#[test]
fn the_viewer_replays_the_k_way_reduce() {
    let words = replay(Algorithm::OneShot, 4);
    let fused: Vec<&String> = words.iter().filter(|w| w.contains("in one pass")).collect();
    assert_eq!(fused.len(), 4, "one k-way reduce per rank: {words:#?}");
    assert!(fused[0].contains("one rounding"), "{}", fused[0]);
}

#[test]
fn the_viewer_replays_the_low_latency_protocol() {
    let words = replay(Algorithm::OneShotLl, 3);
    let puts = words
        .iter()
        .filter(|w| w.contains("low-latency lines"))
        .count();
    let reduces = words
        .iter()
        .filter(|w| w.contains("waits for the flags of 3 low-latency regions"))
        .count();
    assert_eq!((puts, reduces), (9, 3), "{words:#?}");
}

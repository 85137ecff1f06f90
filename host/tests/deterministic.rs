//! Deterministic mode on the host: every request that honours it
//! (`Request::is_deterministic`) gives the rank-order fold's bits
//! (`reference_in_rank_order`), whatever its algorithm, channel count and size, on inputs whose
//! float sums depend on the order of addition; the other algorithms, run on the same inputs,
//! show that the inputs do tell orders apart (and how often they differ is printed).

use std::time::Duration;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{algorithms, Collective, Request};
use symm_host::{
    hard_inputs, reference_in_rank_order, run_threads, simulate, SimOptions, ThreadOptions,
};

fn collectives(world: u16) -> [Collective; 3] {
    [
        Collective::AllReduce,
        Collective::ReduceScatter,
        Collective::Reduce { root: world - 1 },
    ]
}

fn sim(req: &Request, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let opts = SimOptions {
        trace: false,
        contents: false,
        ..SimOptions::default()
    };
    simulate(req, inputs, &opts)
        .unwrap_or_else(|e| panic!("{req:?}: {e}"))
        .outputs
}

#[test]
fn every_deterministic_request_gives_the_rank_order_bits_at_every_size_and_channel_count() {
    let mut runs = 0;
    let mut differ = Vec::new();
    for world in [2u16, 3, 4, 8] {
        for c in collectives(world) {
            for dtype in [DType::Bf16, DType::F16, DType::F32] {
                for op in [ReduceOp::Sum, ReduceOp::Avg] {
                    let es = dtype.size();
                    // One element per rank, a few KiB, and an odd count of elements.
                    for elems in [world as u64, 1024, 1531] {
                        let bytes = elems * es;
                        for &a in algorithms(c) {
                            for channels in [1u16, 3] {
                                let req = Request::new(c, a, world, bytes, dtype, op)
                                    .with_channels(channels);
                                if req.validate().is_err() {
                                    continue;
                                }
                                let inputs = hard_inputs(&req, elems ^ world as u64);
                                let want = reference_in_rank_order(&req, &inputs);
                                let got = sim(&req, &inputs);
                                if req.is_deterministic() {
                                    assert_eq!(got, want, "{req:?}");
                                    runs += 1;
                                } else {
                                    let n = got
                                        .iter()
                                        .zip(&want)
                                        .flat_map(|(g, w)| {
                                            g.chunks(es as usize).zip(w.chunks(es as usize))
                                        })
                                        .filter(|(g, w)| g != w)
                                        .count();
                                    differ.push((
                                        req,
                                        n,
                                        got.iter().map(Vec::len).sum::<usize>() / es as usize,
                                    ));
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(runs > 500, "{runs}");
    // The default mode's other algorithms on the same inputs: how often their bits differ.
    let total: usize = differ.iter().map(|d| d.2).sum();
    let off: usize = differ.iter().map(|d| d.1).sum();
    println!(
        "deterministic requests: {runs} runs, every one the rank-order bits; the others: {off} \
         of {total} output elements differ from them ({:.1}%)",
        100.0 * off as f64 / total.max(1) as f64
    );
    // The inputs tell orders apart: without the mode, rings and trees come out other bits.
    assert!(off > 0, "the inputs do not tell summation orders apart");
}

#[test]
fn threads_give_the_same_bits_as_the_simulator_in_this_mode() {
    for (c, a) in [
        (Collective::AllReduce, symm_core::sched::Algorithm::TwoShot),
        (
            Collective::AllReduce,
            symm_core::sched::Algorithm::OneShotLl,
        ),
        (
            Collective::ReduceScatter,
            symm_core::sched::Algorithm::Direct,
        ),
    ] {
        for dtype in [DType::Bf16, DType::F32] {
            let req =
                Request::new(c, a, 4, 512 * dtype.size(), dtype, ReduceOp::Sum).with_channels(2);
            assert!(req.is_deterministic());
            let inputs = hard_inputs(&req, 9);
            let opts = ThreadOptions {
                deadline: Duration::from_secs(20),
                trace: false,
            };
            let got = run_threads(&req, &inputs, &opts).unwrap().outputs;
            assert_eq!(got, reference_in_rank_order(&req, &inputs), "{req:?}");
        }
    }
}

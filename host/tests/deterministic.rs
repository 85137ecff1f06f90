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

/// The MoE combine honours deterministic mode by construction: a token's output is its
/// partials summed in rank order in f32, each partial its experts' weighted rows in `k` order.
/// So a token's bits do not depend on the batch around it: the same token, routed the same way,
/// combines to the same bits alone and among 15 others, on the host protocol (no barrier, both
/// calls back to back) as in the reference. The experts here apply a fixed function of their
/// row, as a model's experts do.
#[test]
fn moe_combine_gives_a_token_the_same_bits_alone_and_in_a_batch() {
    use symm_core::moe::MoeConfig;
    use symm_host::moe::{
        moe_combine_reference, moe_reference, run_moe_threads, MoeDtype, MoeRankDispatch,
        MoeRankInput, MoeWorld,
    };
    let (world, experts, topk, hidden) = (4u16, 8u32, 3u16, 64u32);
    let cfg = MoeConfig::new(world, experts, topk, 16, hidden).unwrap();
    let dt = MoeDtype::Bf16;
    let mut rng = symm_core::symbolic::Rng::new(0x5eed);
    let token = |rng: &mut symm_core::symbolic::Rng| {
        let mut x = vec![0u8; hidden as usize * dt.bytes()];
        for i in 0..hidden as usize {
            let mag = (1u64 << rng.below(22)) as f32 / 1024.0;
            let sign = if rng.below(2) == 0 { 1.0 } else { -1.0 };
            dt.put(
                &mut x,
                i,
                sign * mag * (1.0 + rng.below(1024) as f32 / 1024.0),
            );
        }
        let idx: Vec<i64> = (0..topk)
            .map(|_| rng.below(u64::from(experts)) as i64)
            .collect();
        let w: Vec<f32> = (0..topk)
            .map(|_| rng.below(1 << 12) as f32 / 777.0 - 2.0)
            .collect();
        (x, idx, w)
    };
    let mine: Vec<_> = (0..world).map(|_| token(&mut rng)).collect();
    let batch = |n: usize, at: usize, rng: &mut symm_core::symbolic::Rng| -> Vec<MoeRankInput> {
        mine.iter()
            .map(|t| {
                let mut input = MoeRankInput::default();
                for i in 0..n {
                    let (x, idx, w) = if i == at { t.clone() } else { token(rng) };
                    input.x.extend(x);
                    input.topk_idx.extend(idx);
                    input.topk_weights.extend(w);
                }
                input
            })
            .collect()
    };
    let alone = batch(1, 0, &mut rng);
    let among = batch(16, 5, &mut rng);
    // Expert e maps its row x to x * (e + 1) / 3 - e / 7, element by element.
    let local = experts / u32::from(world);
    let expert = |r: u16, d: &MoeRankDispatch| {
        let mut y = vec![0u8; d.expert_x.len()];
        for (j, &(first, count)) in d.spans.iter().enumerate() {
            let e = (u32::from(r) * local + j as u32) as f32;
            for row in first..first + count {
                for i in 0..hidden as usize {
                    let at = row as usize * hidden as usize + i;
                    dt.put(
                        &mut y,
                        at,
                        dt.get(&d.expert_x, at) * (e + 1.0) / 3.0 - e / 7.0,
                    );
                }
            }
        }
        y
    };
    let w = MoeWorld::new(cfg, dt, Duration::from_secs(20)).unwrap();
    let runs = run_moe_threads(&w, &[alone.clone(), among.clone()], expert).unwrap();
    let tb = hidden as usize * dt.bytes();
    for (call, inputs, at) in [(0, &alone, 0), (1, &among, 5)] {
        let d = moe_reference(&cfg, dt, inputs).unwrap();
        let ys: Vec<Vec<u8>> = (0..world).map(|r| expert(r, &d[usize::from(r)])).collect();
        let want = moe_combine_reference(&cfg, dt, inputs, &ys).unwrap();
        for (r, want) in want.iter().enumerate() {
            assert_eq!(&runs[call].1[r], want, "call {call} rank {r}");
            assert_eq!(
                &runs[call].1[r][at * tb..][..tb],
                &runs[0].1[r][..tb],
                "rank {r}: the token alone and in a batch"
            );
        }
    }
}

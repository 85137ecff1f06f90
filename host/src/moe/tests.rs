use super::*;
use std::time::Duration;
use symm_core::moe::MoeConfig;
use symm_core::symbolic::Rng;

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn to_f32s(b: &[u8]) -> Vec<f32> {
    (0..b.len() / 4).map(|i| MoeDtype::F32.get(b, i)).collect()
}

/// Two ranks, four experts (two each), two per token, hidden 2, f32.
fn hand() -> (MoeConfig, Vec<MoeRankInput>) {
    let cfg = MoeConfig::new(2, 4, 2, 3, 2).unwrap();
    let inputs = vec![
        // Rank 0: t0 -> experts 0, 3; t1 -> 1 twice; t2 -> nothing and an invalid index.
        MoeRankInput {
            x: f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            topk_idx: vec![0, 3, 1, 1, -1, 9],
            topk_weights: vec![0.5, 0.25, 1.0, 2.0, 7.0, 7.0],
        },
        // Rank 1: t0 -> experts 3, 0.
        MoeRankInput {
            x: f32s(&[10.0, 20.0]),
            topk_idx: vec![3, 0],
            topk_weights: vec![1.0, -1.0],
        },
    ];
    (cfg, inputs)
}

#[test]
fn reference_dispatch_on_a_hand_worked_example() {
    let (cfg, inputs) = hand();
    let d = moe_reference(&cfg, MoeDtype::F32, &inputs).unwrap();
    // Rank 0 experts: 0 gets (r0 t0), (r1 t0); 1 gets (r0 t1) twice. Rows 0..2, then 2..4.
    assert_eq!(d[0].spans, [(0, 2), (2, 2)]);
    assert_eq!(
        to_f32s(&d[0].expert_x)[..8],
        [1.0, 2.0, 10.0, 20.0, 3.0, 4.0, 3.0, 4.0]
    );
    assert!(to_f32s(&d[0].expert_x)[8..].iter().all(|&v| v == 0.0));
    assert_eq!((d[0].dropped, d[0].invalid), (0, 1));
    // Rank 1: expert 2 (local 0) nothing; expert 3 gets (r0 t0), (r1 t0).
    assert_eq!(d[1].spans, [(0, 0), (0, 2)]);
    assert_eq!(to_f32s(&d[1].expert_x)[..4], [1.0, 2.0, 10.0, 20.0]);
    assert_eq!((d[1].dropped, d[1].invalid), (0, 0));
    assert_eq!(d[0].expert_x.len(), cfg.rows_max as usize * 2 * 4);
}

#[test]
fn reference_combine_on_a_hand_worked_example() {
    let (cfg, inputs) = hand();
    let d = moe_reference(&cfg, MoeDtype::F32, &inputs).unwrap();
    // Identity experts: each sender gets back the weighted sum of its token.
    let out: Vec<Vec<u8>> = d.iter().map(|d| d.expert_x.clone()).collect();
    let c = moe_combine_reference(&cfg, MoeDtype::F32, &inputs, &out).unwrap();
    assert_eq!(
        to_f32s(&c[0]),
        [0.75, 1.5, 9.0, 12.0, 0.0, 0.0],
        "t0: 0.5 x + 0.25 x; t1: 1 x + 2 x; t2 has no destination"
    );
    assert_eq!(to_f32s(&c[1]), [0.0, 0.0]);
    // Dropping every row past the first on each rank drops (r1 t0) on rank 0 and on rank 1.
    let clipped = cfg.with_rows_max(1).unwrap();
    let d = moe_reference(&clipped, MoeDtype::F32, &inputs).unwrap();
    assert_eq!((d[0].dropped, d[1].dropped), (3, 1));
    let out: Vec<Vec<u8>> = d.iter().map(|d| d.expert_x.clone()).collect();
    let c = moe_combine_reference(&clipped, MoeDtype::F32, &inputs, &out).unwrap();
    assert_eq!(to_f32s(&c[0]), [0.75, 1.5, 0.0, 0.0, 0.0, 0.0]);
    assert_eq!(to_f32s(&c[1]), [0.0, 0.0]);
}

#[test]
fn combine_fuses_each_multiply_add_and_rounds_once() {
    // One rank, two experts, both entries on expert 0; hidden 1.
    let cfg = MoeConfig::new(1, 2, 2, 1, 1).unwrap();
    let (w, y) = (1.0 + f32::EPSILON, 1.0 - f32::EPSILON);
    let inputs = vec![MoeRankInput {
        x: f32s(&[y]),
        topk_idx: vec![0, 0],
        topk_weights: vec![w, -w],
    }];
    let d = moe_reference(&cfg, MoeDtype::F32, &inputs).unwrap();
    let c = moe_combine_reference(&cfg, MoeDtype::F32, &inputs, &[d[0].expert_x.clone()]).unwrap();
    // w * y = 1 - eps^2 rounds to 1; the fused second step keeps the exact product and leaves
    // eps^2, where a multiply then an add would leave 0.
    let want = (-w).mul_add(y, w.mul_add(y, 0.0));
    assert_eq!(want, f32::EPSILON * f32::EPSILON);
    assert_eq!(to_f32s(&c[0]), [want]);
    // bf16: sums in f32, one rounding at the end (256 + 1 + 1 = 258, not 256 twice).
    let cfg = MoeConfig::new(1, 3, 3, 1, 1).unwrap();
    let one = symm_core::dtype::f32_to_bf16(1.0).to_le_bytes().to_vec();
    let inputs = vec![MoeRankInput {
        x: one,
        topk_idx: vec![0, 0, 0],
        topk_weights: vec![256.0, 1.0, 1.0],
    }];
    let d = moe_reference(&cfg, MoeDtype::Bf16, &inputs).unwrap();
    let c = moe_combine_reference(&cfg, MoeDtype::Bf16, &inputs, &[d[0].expert_x.clone()]).unwrap();
    assert_eq!(MoeDtype::Bf16.get(&c[0], 0), 258.0);
}

#[test]
fn nan_and_negative_weights_are_data() {
    let (cfg, mut inputs) = hand();
    inputs[1].topk_weights = vec![f32::NAN, -2.0];
    let d = moe_reference(&cfg, MoeDtype::F32, &inputs).unwrap();
    let out: Vec<Vec<u8>> = d.iter().map(|d| d.expert_x.clone()).collect();
    let c = to_f32s(&moe_combine_reference(&cfg, MoeDtype::F32, &inputs, &out).unwrap()[1]);
    assert!(c.iter().all(|v| v.is_nan()), "{c:?}");
    inputs[1].topk_weights = vec![0.5, -2.0];
    let c = to_f32s(&moe_combine_reference(&cfg, MoeDtype::F32, &inputs, &out).unwrap()[1]);
    assert_eq!(c, [-15.0, -30.0]);
}

#[test]
fn malformed_inputs_are_typed_errors() {
    let (cfg, inputs) = hand();
    let e = moe_reference(&cfg, MoeDtype::F32, &inputs[..1]).unwrap_err();
    assert!(
        matches!(e, MoeError::BadLength { what: "inputs", .. }),
        "{e:?}"
    );
    let mut bad = inputs.clone();
    bad[0].x.pop();
    let e = moe_reference(&cfg, MoeDtype::F32, &bad).unwrap_err();
    assert!(matches!(e, MoeError::BadLength { what: "x", .. }), "{e:?}");
    let mut bad = inputs.clone();
    bad[1].topk_weights.push(1.0);
    let e = moe_reference(&cfg, MoeDtype::F32, &bad).unwrap_err();
    assert!(
        matches!(
            e,
            MoeError::BadLength {
                what: "topk_weights",
                ..
            }
        ),
        "{e:?}"
    );
    let mut bad = inputs.clone();
    bad[1].topk_idx = vec![0; 8];
    let e = moe_reference(&cfg, MoeDtype::F32, &bad).unwrap_err();
    assert!(
        matches!(
            e,
            MoeError::TooManyTokens {
                tokens: 4,
                bound: 3
            }
        ),
        "{e:?}"
    );
    let e = moe_combine_reference(&cfg, MoeDtype::F32, &inputs, &[vec![0; 3], vec![0; 3]]);
    assert!(
        matches!(
            e,
            Err(MoeError::BadLength {
                what: "expert_out",
                ..
            })
        ),
        "{e:?}"
    );
}

/// A random call: per rank a token count (some 0), uniform or skewed routing, random data.
fn call(rng: &mut Rng, cfg: &MoeConfig, dtype: MoeDtype, skewed: bool) -> MoeCall {
    let (k, h) = (cfg.topk as usize, cfg.hidden as usize);
    let hot = rng.below(u64::from(cfg.experts)) as i64;
    (0..cfg.world)
        .map(|_| {
            let t = match rng.below(4) {
                0 => 0,
                _ => rng.below(u64::from(cfg.tokens_max) + 1) as usize,
            };
            let mut x = vec![0u8; t * h * dtype.bytes()];
            for i in 0..t * h {
                dtype.put(&mut x, i, (rng.below(2001) as f32 - 1000.0) / 64.0);
            }
            MoeRankInput {
                x,
                topk_idx: (0..t * k)
                    .map(|_| match (skewed, rng.below(16)) {
                        (true, _) => hot,
                        (false, 0) => -1,
                        (false, 1) => i64::from(cfg.experts) + 1,
                        _ => rng.below(u64::from(cfg.experts)) as i64,
                    })
                    .collect(),
                topk_weights: (0..t * k)
                    .map(|_| (rng.below(512) as f32 - 128.0) / 256.0)
                    .collect(),
            }
        })
        .collect()
}

/// The expert every test runs: y = 1.5 x + row / 4 on every row (unused rows too).
fn expert(dtype: MoeDtype, cfg: &MoeConfig, d: &MoeRankDispatch) -> Vec<u8> {
    let h = cfg.hidden as usize;
    let mut y = vec![0u8; d.expert_x.len()];
    for i in 0..d.expert_x.len() / dtype.bytes() {
        let v = 1.5f32.mul_add(dtype.get(&d.expert_x, i), (i / h) as f32 / 4.0);
        dtype.put(&mut y, i, v);
    }
    y
}

#[test]
fn threads_match_the_reference_over_back_to_back_calls() {
    let mut rng = Rng::new(11);
    for world in 2..=4u16 {
        for topk in [1u16, 8] {
            for dtype in [MoeDtype::Bf16, MoeDtype::F32] {
                let mut cfg = MoeConfig::new(world, 4 * u32::from(world), topk, 5, 3).unwrap();
                if topk == 8 && dtype == MoeDtype::F32 {
                    cfg = cfg.with_rows_max(cfg.rows_max / 3).unwrap();
                }
                let calls: Vec<MoeCall> = (0..5)
                    .map(|i| call(&mut rng, &cfg, dtype, i % 2 == 1))
                    .collect();
                let mw = MoeWorld::new(cfg, dtype, Duration::from_secs(20)).unwrap();
                let got = run_moe_threads(&mw, &calls, |_, d| expert(dtype, &cfg, d)).unwrap();
                for (i, (inputs, (d, c))) in calls.iter().zip(&got).enumerate() {
                    let want = moe_reference(&cfg, dtype, inputs).unwrap();
                    assert_eq!(d, &want, "world {world} topk {topk} {dtype:?} call {i}");
                    let y: Vec<Vec<u8>> = want.iter().map(|d| expert(dtype, &cfg, d)).collect();
                    let wc = moe_combine_reference(&cfg, dtype, inputs, &y).unwrap();
                    assert_eq!(c, &wc, "world {world} topk {topk} {dtype:?} call {i}");
                }
            }
        }
    }
}

#[test]
fn a_missing_peer_times_out_naming_it() {
    let cfg = MoeConfig::new(2, 2, 1, 1, 1).unwrap();
    let mw = MoeWorld::new(cfg, MoeDtype::F32, Duration::from_millis(50)).unwrap();
    let mut r0 = MoeRank::new(0);
    let input = MoeRankInput {
        x: f32s(&[1.0]),
        topk_idx: vec![1],
        topk_weights: vec![1.0],
    };
    let e = r0.dispatch(&mw, &input).unwrap_err();
    assert_eq!(
        e,
        MoeThreadError::Timeout {
            rank: 0,
            phase: MoePhase::Dispatch,
            epoch: 1,
            sender: 1,
            word: 0,
            found: 0
        }
    );
    assert!(e.to_string().contains("from rank 1"), "{e}");
}

#[test]
fn combine_needs_a_dispatch_and_the_right_lengths() {
    let cfg = MoeConfig::new(1, 1, 1, 1, 1).unwrap();
    let mw = MoeWorld::new(cfg, MoeDtype::F32, Duration::from_secs(5)).unwrap();
    let mut r = MoeRank::new(0);
    assert_eq!(
        r.combine(&mw, &[0; 4]),
        Err(MoeThreadError::NoDispatch { rank: 0 })
    );
    let bad = MoeRankInput {
        x: vec![0; 3],
        topk_idx: vec![0],
        topk_weights: vec![1.0],
    };
    let e = r.dispatch(&mw, &bad).unwrap_err();
    assert!(matches!(e, MoeThreadError::Shape { rank: 0, .. }), "{e:?}");
    let ok = MoeRankInput {
        x: f32s(&[2.0]),
        ..bad
    };
    let d = r.dispatch(&mw, &ok).unwrap();
    assert_eq!(to_f32s(&d.expert_x), [2.0]);
    let e = r.combine(&mw, &[0; 3]).unwrap_err();
    assert!(matches!(e, MoeThreadError::Shape { .. }), "{e:?}");
    assert_eq!(to_f32s(&r.combine(&mw, &f32s(&[3.0])).unwrap()), [3.0]);
}

#[test]
fn a_world_serves_run_after_run_and_refuses_runs_after_a_failure() {
    let mut rng = Rng::new(5);
    let dtype = MoeDtype::Bf16;
    let cfg = MoeConfig::new(3, 12, 2, 5, 3).unwrap();
    let mw = MoeWorld::new(cfg, dtype, Duration::from_secs(5)).unwrap();
    let check = |calls: &[MoeCall], got: &[(Vec<MoeRankDispatch>, Vec<Vec<u8>>)]| {
        for (inputs, (d, c)) in calls.iter().zip(got) {
            let want = moe_reference(&cfg, dtype, inputs).unwrap();
            assert_eq!(d, &want);
            let y: Vec<Vec<u8>> = want.iter().map(|d| expert(dtype, &cfg, d)).collect();
            assert_eq!(c, &moe_combine_reference(&cfg, dtype, inputs, &y).unwrap());
        }
    };
    // Runs of 3, 1 and 2 calls on one world: each goes on from the last one's epochs (a new
    // run starting again at epoch 1 would read the first run's headers as its own).
    for n in [3, 1, 2] {
        let calls: Vec<MoeCall> = (0..n)
            .map(|i| call(&mut rng, &cfg, dtype, i == 1))
            .collect();
        let got = run_moe_threads(&mw, &calls, |_, d| expert(dtype, &cfg, d)).unwrap();
        check(&calls, &got);
    }
    // A call that gives rank 2 no input fails the run, and the world says so from then on.
    let mut bad = call(&mut rng, &cfg, dtype, false);
    bad.truncate(2);
    let err = run_moe_threads(&mw, &[bad], |_, d| expert(dtype, &cfg, d)).unwrap_err();
    assert!(
        matches!(err, MoeThreadError::Shape { rank: 2, .. }),
        "{err}"
    );
    let good = vec![call(&mut rng, &cfg, dtype, false)];
    let err = run_moe_threads(&mw, &good, |_, d| expert(dtype, &cfg, d)).unwrap_err();
    assert_eq!(err, MoeThreadError::WorldFailed);
    assert!(err.to_string().contains("make a new MoeWorld"));
    // A new world runs it.
    let fresh = MoeWorld::new(cfg, dtype, Duration::from_secs(5)).unwrap();
    check(
        &good,
        &run_moe_threads(&fresh, &good, |_, d| expert(dtype, &cfg, d)).unwrap(),
    );
}

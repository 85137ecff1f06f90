//! MoE dispatch and combine as op streams (`symm_core::moe::sched`): the symbolic checker and the
//! simulator run them at worlds 2, 3 and 4 with skewed, uniform, top-1 and top-8 routings, a rank
//! without tokens, "no expert" and out-of-range entries and dropped rows; the outputs must equal,
//! bit for bit, a direct computation from the layout functions (`route`, `stage_row`,
//! `expert_row`).

use symm_core::moe::sched::{MoePlan, PlanError, Routing};
use symm_core::moe::{expert_row, route, MoeConfig, NONE};
use symm_core::op::{Buf, Op};
use symm_core::sched::Request;
use symm_core::symbolic::Rng;
use symm_driver::host::POISON;
use symm_labs::run::{lint, simulate, symbolic};

/// How a scenario's tokens pick their experts.
#[derive(Clone, Copy, Debug)]
enum Pick {
    /// Entry k of token t: expert `(t * topk + k + rank) % experts`.
    Uniform,
    /// Three tokens in four pick experts 0 .. topk (rank 0's, mostly); the rest at random.
    Skewed,
    /// At random, with "no expert" (-1) and out-of-range entries.
    Random,
}

struct Scenario {
    cfg: MoeConfig,
    idx: Vec<Vec<i64>>,
}

fn scenario(
    world: u16,
    experts: u32,
    topk: u16,
    tokens: &[u32],
    pick: Pick,
    seed: u64,
) -> Scenario {
    let tokens_max = tokens.iter().copied().max().unwrap_or(0).max(1);
    let cfg = MoeConfig::new(world, experts, topk, tokens_max, 3).unwrap();
    let mut rng = Rng::new(seed);
    let k = topk as u64;
    let idx = tokens
        .iter()
        .enumerate()
        .map(|(r, &n)| {
            (0..n as u64 * k)
                .map(|i| {
                    let (t, j) = (i / k, i % k);
                    match pick {
                        Pick::Uniform => ((t * k + j + r as u64) % experts as u64) as i64,
                        Pick::Skewed if t % 4 != 3 => j as i64,
                        Pick::Skewed => rng.below(experts as u64) as i64,
                        Pick::Random => match rng.below(10) {
                            0 => -1,
                            1 => (experts + 2) as i64,
                            _ => rng.below(experts as u64) as i64,
                        },
                    }
                })
                .collect()
        })
        .collect();
    Scenario { cfg, idx }
}

/// Every scenario: worlds 2, 3, 4; rank 1 has no tokens in several.
fn scenarios() -> Vec<(String, Scenario)> {
    let mut v = Vec::new();
    let mut add = |name: &str, s: Scenario| v.push((format!("{name}, world {}", s.cfg.world), s));
    add(
        "uniform top-2",
        scenario(2, 4, 2, &[5, 3], Pick::Uniform, 1),
    );
    add(
        "skewed top-2",
        scenario(3, 6, 2, &[6, 0, 4], Pick::Skewed, 2),
    );
    add(
        "random top-3",
        scenario(4, 8, 3, &[7, 0, 5, 2], Pick::Random, 3),
    );
    add("top-1", scenario(2, 2, 1, &[4, 0], Pick::Random, 4));
    add("top-1", scenario(3, 3, 1, &[3, 5, 2], Pick::Uniform, 5));
    add("top-1", scenario(4, 4, 1, &[6, 1, 0, 3], Pick::Skewed, 6));
    add("top-8", scenario(2, 8, 8, &[3, 2], Pick::Uniform, 7));
    add("top-8", scenario(3, 24, 8, &[2, 0, 3], Pick::Random, 8));
    add("top-8", scenario(4, 16, 8, &[4, 3, 0, 2], Pick::Skewed, 9));
    add(
        "uniform top-4",
        scenario(4, 16, 4, &[5, 5, 5, 5], Pick::Uniform, 10),
    );
    // Few expert rows: entries past them are dropped.
    let mut s = scenario(3, 6, 2, &[5, 4, 3], Pick::Skewed, 11);
    s.cfg = s.cfg.with_rows_max(4).unwrap();
    add("skewed top-2, 4 expert rows", s);
    v
}

/// The sender's side, straight from `route`.
struct Sent {
    slots: Vec<u32>,
    eslots: Vec<u32>,
    ecounts: Vec<u32>,
}

fn sent(cfg: &MoeConfig, idx: &[i64]) -> Sent {
    let (w, k) = (cfg.world as usize, cfg.topk as usize);
    let t = idx.len() / k;
    let mut s = Sent {
        slots: vec![0; t * w],
        eslots: vec![0; t * k],
        ecounts: vec![0; cfg.experts as usize],
    };
    let mut counts = vec![0; w];
    route(
        cfg,
        idx,
        &mut s.slots,
        &mut s.eslots,
        &mut counts,
        &mut s.ecounts,
    )
    .unwrap();
    s
}

fn f32s(v: &[u8]) -> Vec<f32> {
    v.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Inputs with fractions, so the order of a sum shows in its bits.
fn inputs(req: &Request, seed: u64) -> Vec<Vec<u8>> {
    let mut rng = Rng::new(seed);
    (0..req.world)
        .map(|_| {
            (0..req.bytes / 4)
                .flat_map(|_| ((rng.below(20001) as f32 - 10000.0) / 7.0).to_le_bytes())
                .collect()
        })
        .collect()
}

fn put(out: &mut [u8], elem: u64, row: &[u8]) {
    let at = elem as usize * 4;
    out[at..at + row.len()].copy_from_slice(row);
}

fn row(buf: &[u8], elem: u64, hidden: u32) -> &[u8] {
    &buf[elem as usize * 4..(elem + u64::from(hidden)) as usize * 4]
}

/// Dispatch outputs computed from the layout: staging rows, then expert rows.
fn dispatch_want(cfg: &MoeConfig, idx: &[Vec<i64>], ins: &[Vec<u8>], bytes: u64) -> Vec<Vec<u8>> {
    let (w, k, h) = (cfg.world as usize, cfg.topk as usize, cfg.hidden);
    let l = cfg.local_experts() as usize;
    let s: Vec<Sent> = idx.iter().map(|i| sent(cfg, i)).collect();
    let mut outs = vec![vec![POISON; bytes as usize]; w];
    for (q, out) in outs.iter_mut().enumerate() {
        let ecol: Vec<u32> = (0..w * l)
            .map(|i| s[i / l].ecounts[q * l + i % l])
            .collect();
        for (p, sp) in s.iter().enumerate() {
            for t in 0..idx[p].len() / k {
                let slot = sp.slots[t * w + q];
                if slot == NONE {
                    continue;
                }
                let token = row(&ins[p], t as u64 * u64::from(h), h);
                let staging = cfg.stage_row(p as u16, slot) * u64::from(h);
                put(out, staging, token);
                for j in 0..k {
                    let Some((owner, e)) = cfg.owner(idx[p][t * k + j]) else {
                        continue;
                    };
                    if owner as usize != q {
                        continue;
                    }
                    let eslot = sp.eslots[t * k + j];
                    if let Some(r) = expert_row(cfg, &ecol, p as u16, e, eslot) {
                        put(out, (cfg.stage_rows() + u64::from(r)) * u64::from(h), token);
                    }
                }
            }
        }
    }
    outs
}

/// Combine outputs from the layout: each token's partials summed in ascending rank order, then
/// the combine staging rows.
fn combine_want(cfg: &MoeConfig, idx: &[Vec<i64>], ins: &[Vec<u8>], bytes: u64) -> Vec<Vec<u8>> {
    let (w, k, h) = (cfg.world as usize, cfg.topk as usize, cfg.hidden);
    let mut outs = vec![vec![POISON; bytes as usize]; w];
    for (r, out) in outs.iter_mut().enumerate() {
        let s = sent(cfg, &idx[r]);
        for t in 0..idx[r].len() / k {
            let mut acc: Option<Vec<f32>> = None;
            for (q, input) in ins.iter().enumerate() {
                let slot = s.slots[t * w + q];
                if slot == NONE {
                    continue;
                }
                let from = cfg.stage_row(r as u16, t as u32) * u64::from(h);
                let part = row(input, from, h);
                let staging =
                    (u64::from(cfg.tokens_max) + cfg.stage_row(q as u16, slot)) * u64::from(h);
                put(out, staging, part);
                let p = f32s(part);
                acc = Some(match acc {
                    None => p,
                    Some(a) => a.iter().zip(&p).map(|(x, y)| x + y).collect(),
                });
            }
            if let Some(a) = acc {
                let b: Vec<u8> = a.iter().flat_map(|x| x.to_le_bytes()).collect();
                put(out, t as u64 * u64::from(h), &b);
            }
        }
    }
    outs
}

fn first_difference(found: &[Vec<u8>], want: &[Vec<u8>]) -> Option<(usize, usize)> {
    for (r, (f, w)) in found.iter().zip(want).enumerate() {
        if let Some(i) = f
            .chunks_exact(4)
            .zip(w.chunks_exact(4))
            .position(|(a, b)| a != b)
        {
            return Some((r, i));
        }
    }
    None
}

fn check_streams(
    what: &str,
    req: &Request,
    streams: &[Vec<Op>],
    want: &[Vec<u8>],
    ins: &[Vec<u8>],
) {
    lint(req, streams).unwrap_or_else(|p| panic!("{what}: {}", p.words(req)));
    for seed in 0..6 {
        if let Err(p) = symbolic(req, streams, seed, false).result {
            panic!("{what}, seed {seed}: {}", p.words(req));
        }
    }
    let run = simulate(req, streams, ins, true).unwrap_or_else(|e| panic!("{what}: {e}"));
    if let Some((r, i)) = first_difference(&run.outputs, want) {
        panic!(
            "{what}: rank {r}'s output element {i} is {:?}, the layout says {:?}",
            f32s(&run.outputs[r])[i],
            f32s(&want[r])[i]
        );
    }
    assert!(!run.trace.is_empty());
}

#[test]
fn dispatch_and_combine_match_the_layout_on_the_simulator_and_the_symbolic_checker() {
    for (n, (name, s)) in scenarios().into_iter().enumerate() {
        let cfg = s.cfg;
        let routings: Vec<Routing> = s
            .idx
            .iter()
            .map(|i| Routing::new(&cfg, i).unwrap())
            .collect();
        let plan = MoePlan::new(cfg, &routings).unwrap();
        let req = plan.dispatch_request();
        let streams: Vec<Vec<Op>> = (0..cfg.world).map(|r| plan.dispatch(r)).collect();
        let ins = inputs(&req, n as u64);
        let want = dispatch_want(&cfg, &s.idx, &ins, req.bytes);
        check_streams(&format!("dispatch, {name}"), &req, &streams, &want, &ins);
        let req = plan.combine_request();
        let streams: Vec<Vec<Op>> = (0..cfg.world).map(|r| plan.combine(r)).collect();
        let ins = inputs(&req, 100 + n as u64);
        let want = combine_want(&cfg, &s.idx, &ins, req.bytes);
        check_streams(&format!("combine, {name}"), &req, &streams, &want, &ins);
    }
}

/// A token crosses to a rank once however many of its experts live there, and fans out there
/// to one expert row per entry that has a row.
#[test]
fn a_token_crosses_once_per_rank_and_fans_out_per_entry() {
    let s = scenario(2, 4, 4, &[6, 2], Pick::Skewed, 3);
    let cfg = s.cfg;
    let routings: Vec<Routing> = s
        .idx
        .iter()
        .map(|i| Routing::new(&cfg, i).unwrap())
        .collect();
    let plan = MoePlan::new(cfg, &routings).unwrap();
    for r in 0..cfg.world {
        let ops = plan.dispatch(r);
        let (mut puts, mut fans) = (0u32, 0u32);
        for op in &ops {
            if let Op::Copy { src, .. } = *op {
                match src.buf {
                    Buf::Input => puts += 1,
                    _ => fans += 1,
                }
            }
        }
        let k = cfg.topk as usize;
        let crossings: u32 = s.idx[r as usize]
            .chunks(k)
            .map(|t| symm_core::moe::dest_mask(&cfg, t).count_ones())
            .sum();
        assert_eq!(
            puts, crossings,
            "rank {r}: one copy per (token, destination)"
        );
        assert!(
            puts < s.idx[r as usize].len() as u32,
            "the skewed tokens share a rank"
        );
        let entries = plan.arrivals(r).iter().filter(|a| a.row.is_some()).count();
        assert_eq!(fans as usize, entries, "rank {r}: one local copy per entry");
        let signals = ops
            .iter()
            .filter(|o| matches!(o, Op::Signal { .. }))
            .count();
        assert_eq!(
            signals, cfg.world as usize,
            "one header per rank, itself included"
        );
    }
}

#[test]
fn bad_routings_are_refused_with_what_is_wrong() {
    let s = scenario(2, 4, 2, &[3, 2], Pick::Uniform, 1);
    let cfg = s.cfg;
    let routings: Vec<Routing> = s
        .idx
        .iter()
        .map(|i| Routing::new(&cfg, i).unwrap())
        .collect();
    assert_eq!(
        MoePlan::new(cfg, &routings[..1]).err(),
        Some(PlanError::Ranks { len: 1, world: 2 })
    );
    let mut bad = routings.clone();
    let i = bad[0].slots.iter().position(|&x| x != NONE).unwrap();
    bad[0].slots[i] = cfg.tokens_max;
    let e = MoePlan::new(cfg, &bad).unwrap_err();
    assert!(matches!(e, PlanError::Slot { sender: 0, .. }), "{e:?}");
    let far = |_: &MoeConfig, _: &[u32], _: u16, _: u32, _: u32| Some(cfg.rows_max);
    let e = MoePlan::with_rows(cfg, &routings, &far).unwrap_err();
    assert!(matches!(e, PlanError::Row { .. }), "{e:?}");
    assert!(e.to_string().contains("past rows_max"), "{e}");
    let mut short = routings.clone();
    short[1].ecounts.pop();
    assert!(matches!(
        MoePlan::new(cfg, &short).err(),
        Some(PlanError::Moe(_))
    ));
}

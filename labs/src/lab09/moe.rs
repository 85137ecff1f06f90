//! Lab 9's MoE dispatch placement: the student's `route` (the sender's slots and expert slots)
//! and `expert_row` (the receiver's prefix sums) against `symm_core::moe`'s, on batches with
//! top-k routing, "no expert" and out-of-range entries, a rank without tokens and dropped rows;
//! then the dispatch and combine op streams built from them (`symm_core::moe::sched`) through
//! every check of a case, against the layout computed directly from the library's functions.

use crate::grade::{Graded, Grader};
use crate::kit::Kit;
use crate::run::Case;
use std::panic::{self, AssertUnwindSafe};
use symm_core::moe::sched::{combine_stage_elem, expert_elem, out_elem, partial_elem};
use symm_core::moe::sched::{stage_elem, token_elem, MoePlan, Routing, RowFn};
use symm_core::moe::{expert_row, MoeConfig, NONE};
use symm_core::op::Op;
use symm_core::sched::Request;
use symm_core::symbolic::Rng;
use symm_driver::host::POISON;

/// The sender's placement: `symm_core::moe::route`'s signature, without the result.
pub type RouteFn<'a> =
    &'a dyn Fn(&MoeConfig, &[i64], &mut [u32], &mut [u32], &mut [u32], &mut [u32]);

/// One batch: the shape and every rank's expert indices.
pub struct Batch {
    /// The shape.
    pub cfg: MoeConfig,
    /// Rank r's `topk` indices per token.
    pub idx: Vec<Vec<i64>>,
}

/// A batch of `tokens[r]` tokens on rank r, `hidden` 4, experts drawn from `seed`: about one
/// entry in twelve is "no expert" (-1) and one in twelve out of range, and every third token's
/// second entry is another expert of its first entry's rank (a token that reaches a rank through
/// two experts).
pub fn batch(world: u16, experts: u32, topk: u16, tokens: &[u32], seed: u64) -> Batch {
    let tokens_max = tokens.iter().copied().max().unwrap_or(0).max(1);
    let cfg = MoeConfig::new(world, experts, topk, tokens_max, 4).expect("a valid shape");
    let (mut rng, k, l) = (Rng::new(seed), topk as usize, cfg.local_experts());
    let idx = tokens
        .iter()
        .map(|&n| {
            let mut v: Vec<i64> = (0..n * u32::from(topk))
                .map(|_| match rng.below(12) {
                    0 => -1,
                    1 => i64::from(experts) + 1,
                    _ => rng.below(u64::from(experts)) as i64,
                })
                .collect();
            for t in (1..n as usize).step_by(3).filter(|_| k > 1 && l > 1) {
                let e = rng.below(u64::from(experts)) as u32;
                v[t * k] = i64::from(e);
                v[t * k + 1] = i64::from(e - e % l + (e % l + 1) % l);
            }
            v
        })
        .collect();
    Batch { cfg, idx }
}

/// The graded batches (worlds 2, 3, 4; the last has room for 12 expert rows per rank only).
pub fn batches() -> Vec<Batch> {
    let mut last = batch(4, 16, 4, &[4, 4, 3, 4], 4);
    last.cfg = last.cfg.with_rows_max(12).expect("a valid shape");
    vec![
        batch(2, 4, 2, &[5, 3], 1),
        batch(3, 6, 2, &[6, 0, 4], 2),
        batch(4, 8, 3, &[5, 2, 0, 4], 3),
        last,
    ]
}

/// The batch the traces show: world 4, two experts per rank, top-2.
pub fn showcase() -> Batch {
    batch(4, 8, 2, &[4, 3, 4, 2], 5)
}

fn label(what: &str, b: &Batch) -> String {
    let c = &b.cfg;
    let tokens: Vec<usize> = b.idx.iter().map(|i| i.len() / c.topk as usize).collect();
    let rows = if c.rows_max < c.world as u32 * c.tokens_max * c.topk as u32 {
        format!(", {} expert rows", c.rows_max)
    } else {
        String::new()
    };
    format!(
        "MoE {what}, world {}, {} experts, top-{}, tokens {tokens:?}{rows}",
        c.world, c.experts, c.topk
    )
}

/// The library's routings of a batch.
pub fn routings(b: &Batch) -> Vec<Routing> {
    b.idx
        .iter()
        .map(|i| Routing::new(&b.cfg, i).expect("routable"))
        .collect()
}

fn copy_row(from: &[u8], at: u64, to: &mut [u8], dst: u64, hidden: u32) {
    let (a, d, n) = (at as usize * 4, dst as usize * 4, hidden as usize * 4);
    to[d..d + n].copy_from_slice(&from[a..a + n]);
}

/// Receiver q's column of expert counts: `ecol[p * L + j]` entries of its expert j from p.
fn ecol(cfg: &MoeConfig, senders: &[Routing], q: usize) -> Vec<u32> {
    let l = cfg.local_experts() as usize;
    (0..cfg.world as usize * l)
        .map(|i| senders[i / l].ecounts[q * l + i % l])
        .collect()
}

/// Dispatch outputs straight from the layout: each token in its staging row on every rank it
/// goes to, and in the expert row of each of its entries there.
fn dispatch_reference(cfg: &MoeConfig, s: &[Routing], ins: &[Vec<u8>], bytes: u64) -> Vec<Vec<u8>> {
    let (w, k, h) = (cfg.world as usize, cfg.topk as usize, cfg.hidden);
    let mut outs = vec![vec![POISON; bytes as usize]; w];
    for (q, out) in outs.iter_mut().enumerate() {
        let col = ecol(cfg, s, q);
        for (p, r) in s.iter().enumerate() {
            for t in 0..r.tokens(cfg) {
                let slot = r.slots[t as usize * w + q];
                if slot == NONE {
                    continue;
                }
                let src = token_elem(cfg, t);
                copy_row(&ins[p], src, out, stage_elem(cfg, p as u16, slot), h);
                for j in 0..k {
                    let i = t as usize * k + j;
                    match cfg.owner(r.idx[i]) {
                        Some((o, e)) if o as usize == q => {
                            if let Some(row) = expert_row(cfg, &col, p as u16, e, r.eslots[i]) {
                                copy_row(&ins[p], src, out, expert_elem(cfg, row), h);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
    }
    outs
}

/// Combine outputs straight from the layout: each token's partials summed in ascending rank
/// order, and every partial in its combine staging row.
fn combine_reference(cfg: &MoeConfig, s: &[Routing], ins: &[Vec<u8>], bytes: u64) -> Vec<Vec<u8>> {
    let (w, h) = (cfg.world as usize, cfg.hidden as usize);
    let mut outs = vec![vec![POISON; bytes as usize]; w];
    for (r, out) in outs.iter_mut().enumerate() {
        for t in 0..s[r].tokens(cfg) {
            let mut sum: Option<Vec<f32>> = None;
            for (q, input) in ins.iter().enumerate() {
                let slot = s[r].slots[t as usize * w + q];
                if slot == NONE {
                    continue;
                }
                let at = partial_elem(cfg, r as u16, t);
                copy_row(
                    input,
                    at,
                    out,
                    combine_stage_elem(cfg, q as u16, slot),
                    cfg.hidden,
                );
                let part = (0..h).map(|i| {
                    let b = (at as usize + i) * 4;
                    f32::from_le_bytes(input[b..b + 4].try_into().unwrap_or([0; 4]))
                });
                sum = Some(match sum {
                    None => part.collect(),
                    Some(a) => a.iter().zip(part).map(|(x, y)| x + y).collect(),
                });
            }
            if let Some(v) = sum {
                let b = out_elem(cfg, t) as usize * 4;
                for (i, x) in v.iter().enumerate() {
                    out[b + 4 * i..b + 4 * i + 4].copy_from_slice(&x.to_le_bytes());
                }
            }
        }
    }
    outs
}

/// The dispatch case of a batch, compared with the layout.
pub fn dispatch_case(b: &Batch) -> Case {
    let lib = routings(b);
    let (cfg, req) = (b.cfg, request(b, true));
    Case::new(label("dispatch", b), req)
        .without_handshake()
        .reference(Box::new(move |req: &Request, ins| {
            dispatch_reference(&cfg, &lib, ins, req.bytes)
        }))
}

fn combine_case(b: &Batch) -> Case {
    let lib = routings(b);
    let (cfg, req) = (b.cfg, request(b, false));
    Case::new(label("combine", b), req)
        .without_handshake()
        .reference(Box::new(move |req: &Request, ins| {
            combine_reference(&cfg, &lib, ins, req.bytes)
        }))
}

fn request(b: &Batch, dispatch: bool) -> Request {
    let lib = routings(b);
    let plan = MoePlan::new(b.cfg, &lib).expect("the library's routing plans");
    if dispatch {
        plan.dispatch_request()
    } else {
        plan.combine_request()
    }
}

/// The student's routing of every rank, or what panicked.
fn student_routings(b: &Batch, route: RouteFn) -> Result<Vec<Routing>, String> {
    let (w, k) = (b.cfg.world as usize, b.cfg.topk as usize);
    b.idx
        .iter()
        .map(|idx| {
            let t = idx.len() / k;
            let mut r = Routing {
                idx: idx.clone(),
                slots: vec![0; t * w],
                eslots: vec![0; t * k],
                counts: vec![0; w],
                ecounts: vec![0; b.cfg.experts as usize],
            };
            let (s, e, c, ec) = (&mut r.slots, &mut r.eslots, &mut r.counts, &mut r.ecounts);
            panic::catch_unwind(AssertUnwindSafe(|| route(&b.cfg, idx, s, e, c, ec)))
                .map_err(|p| panic_words("route", p))?;
            Ok(r)
        })
        .collect()
}

fn panic_words(what: &str, p: Box<dyn std::any::Any + Send>) -> String {
    let msg = p
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into());
    format!("your {what} panicked: {msg}")
}

fn shown(x: u32) -> String {
    if x == NONE {
        "NONE".into()
    } else {
        x.to_string()
    }
}

/// The first difference between the student's routing and the library's, in words.
fn route_difference(b: &Batch, mine: &[Routing], lib: &[Routing]) -> Option<String> {
    let (cfg, w, k) = (&b.cfg, b.cfg.world as usize, b.cfg.topk as usize);
    for (r, (m, l)) in mine.iter().zip(lib).enumerate() {
        for (i, (&x, &y)) in m.slots.iter().zip(&l.slots).enumerate() {
            if x == y {
                continue;
            }
            let (t, q) = (i / w, i % w);
            let experts = &l.idx[t * k..(t + 1) * k];
            let why = if y == NONE {
                format!("none of its experts lives on rank {q}, so it does not go there (NONE)")
            } else {
                let before = (0..t).filter(|&u| l.slots[u * w + q] != NONE).count();
                let tokens = if before == 1 {
                    format!("token of rank {r} also goes")
                } else {
                    format!("tokens of rank {r} also go")
                };
                format!("it should have slot {y}: {before} earlier {tokens} to rank {q}")
            };
            return Some(format!(
                "rank {r}'s token {t} (experts {experts:?}) has slot {} on rank {q}; {why}",
                shown(x)
            ));
        }
        for (q, (&x, &y)) in m.counts.iter().zip(&l.counts).enumerate() {
            if x != y {
                return Some(format!(
                    "rank {r} counts {x} tokens for rank {q}; {y} of its tokens go there"
                ));
            }
        }
        for (i, (&x, &y)) in m.eslots.iter().zip(&l.eslots).enumerate() {
            if x != y {
                let (t, j, e) = (i / k, i % k, l.idx[i]);
                let valid = cfg.owner(e).is_some();
                let why = if valid {
                    format!("rank {r} has {y} earlier entries of expert {e}")
                } else {
                    format!("expert {e} is skipped (NONE)")
                };
                return Some(format!(
                    "rank {r}'s token {t} entry {j} (expert {e}) has eslot {}; {why}",
                    shown(x)
                ));
            }
        }
        for (e, (&x, &y)) in m.ecounts.iter().zip(&l.ecounts).enumerate() {
            if x != y {
                return Some(format!(
                    "rank {r} counts {x} entries of expert {e}; it has {y}"
                ));
            }
        }
    }
    None
}

/// The first entry the student's `expert_row` places elsewhere than the library, in words.
fn row_difference(b: &Batch, rows: RowFn, lib: &[Routing]) -> Result<Option<String>, String> {
    let cfg = &b.cfg;
    let plan = MoePlan::new(*cfg, lib).map_err(|e| e.to_string())?;
    let l = cfg.local_experts() as usize;
    for q in 0..cfg.world {
        let col = ecol(cfg, lib, q as usize);
        for a in plan.arrivals(q) {
            let eslot =
                lib[a.sender as usize].eslots[a.token as usize * cfg.topk as usize + a.k as usize];
            let got = panic::catch_unwind(AssertUnwindSafe(|| {
                rows(cfg, &col, a.sender, a.expert, eslot)
            }))
            .map_err(|p| panic_words("expert_row", p))?;
            if got == a.row {
                continue;
            }
            let j = a.expert as usize;
            let base: u32 = (0..j)
                .flat_map(|jj| (0..cfg.world as usize).map(move |p| (p, jj)))
                .map(|(p, jj)| col[p * l + jj])
                .sum();
            let before: u32 = (0..a.sender as usize).map(|p| col[p * l + j]).sum();
            let place = |r: Option<u32>| match r {
                Some(r) => format!("row {r}"),
                None => format!("no row (dropped: rows_max is {})", cfg.rows_max),
            };
            return Ok(Some(format!(
                "on rank {q}, rank {}'s token {} entry {} (local expert {j}, eslot {eslot}) gets \
                 {}; it should get {}: {base} rows of local experts 0..{j} come first, then \
                 {before} rows of expert {j} from ranks 0..{}, then the eslot",
                a.sender,
                a.token,
                a.k,
                place(got),
                place(a.row),
                a.sender
            )));
        }
    }
    Ok(None)
}

const ROUTE_HINT: &str = "a token goes to a rank once, however many of its experts live \
    there: slot(t, q) counts the earlier tokens that also go to q, and counts[q] counts tokens, \
    not entries; eslot(t, k) counts the earlier entries (row-major) that name the same expert";

const ROW_HINT: &str = "expert rows are expert-major: first every row of local experts 0 .. j \
    from every sender (a prefix sum over the whole world x L column), then expert j's rows from \
    ranks 0 .. sender (a prefix sum down column j), then the eslot; a row at or past rows_max \
    is dropped (None)";

/// The dispatch ops of rank `k.rank()` built from `route` and `rows` on batch `b` (none when they
/// do not make a plan: the placement checks say why).
pub fn plan_ops(b: &Batch, route: RouteFn, rows: RowFn, k: &Kit, dispatch: bool) -> Vec<Op> {
    let Ok(mine) = student_routings(b, route) else {
        return Vec::new();
    };
    match MoePlan::with_rows(b.cfg, &mine, rows) {
        Ok(p) if dispatch => p.dispatch(k.rank()),
        Ok(p) => p.combine(k.rank()),
        Err(_) => Vec::new(),
    }
}

/// Grades the placement on every batch, then the op streams it makes.
pub fn check(g: &mut Grader, route: RouteFn, rows: RowFn) -> Graded {
    let none = |_: &crate::problem::Problem| None;
    for b in batches() {
        let case = dispatch_case(&b);
        let lib = routings(&b);
        let mine = student_routings(&b, route)
            .map_err(|m| Grader::lab_failure(&case, "route", m, ROUTE_HINT))?;
        if let Some(m) = route_difference(&b, &mine, &lib) {
            return Err(Grader::lab_failure(&case, "route", m, ROUTE_HINT));
        }
        match row_difference(&b, rows, &lib) {
            Ok(None) => {}
            Ok(Some(m)) | Err(m) => {
                return Err(Grader::lab_failure(&case, "expert_row", m, ROW_HINT));
            }
        }
        g.note(format!("pass  {}: placement", case.label));
        g.case(&case, &|k: &Kit| plan_ops(&b, route, rows, k, true), &none)?;
        g.case(
            &combine_case(&b),
            &|k: &Kit| plan_ops(&b, route, rows, k, false),
            &none,
        )?;
    }
    Ok(())
}

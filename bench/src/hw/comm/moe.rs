//! Phase `moe`: MoE dispatch and combine, and the all-to-allv with device counts, on the GPU.
//!
//! Every rank builds every rank's inputs from one seed, so each can compute the host reference
//! (`symm_driver::host::moe`) of the whole world and compare its own part bit for bit: the
//! expert spans, the expert rows inside them, the skipped and dropped counts, and the combined
//! tokens. Cases: uniform and skewed routing, top-1 to top-8, a rank with no tokens, invalid
//! and negative indices, clipped expert rows, f32 tokens, both modes; then a CUDA graph of
//! dispatch + combine replayed with a new routing before every replay (the counts change on
//! the device, the graph does not). The all-to-allv: random counts, a count that is negative
//! and one that overflows the output, and graph replays with new counts.
//!
//! The latency table: dispatch + combine in both modes, and the all-to-allv of the token rows
//! with device counts against the same call after a host round trip of the counts (wait for
//! the stream, copy the counts to the host), per call, in one run.

use std::time::{Duration, Instant};

use symm_core::moe::{Mode, MoeConfig};
use symm_driver::cuda::device::Stream;
use symm_driver::cuda::Tensors as Blocks;
use symm_driver::cuda::{Comm, CudaError, MoeLayer, Span, TokenType};
use symm_driver::host::moe::{moe_combine_reference, moe_reference, MoeDtype, MoeRankInput};

use super::{e, opts, Check, Params};

/// A Comm with the framework tensors these checks allocate from, and the SM cap of the MoE
/// layers they make ([`MoeLayer::set_sms`]).
pub(super) struct Gpu {
    comm: Comm,
    pub(super) tensors: Blocks,
    sms: std::cell::Cell<u32>,
}

impl std::ops::Deref for Gpu {
    type Target = Comm;

    fn deref(&self) -> &Comm {
        &self.comm
    }
}

impl Gpu {
    /// Caps the blocks of the layers made from now on at `sms` (0: the default grids).
    pub(super) fn set_moe_sms(&self, sms: u32) {
        self.sms.set(sms);
    }

    /// A MoE layer over this rank's tensors, capped as [`Gpu::set_moe_sms`] says.
    pub(super) fn moe_layer(
        &self,
        cfg: MoeConfig,
        ty: TokenType,
        stream: &Stream,
    ) -> Result<MoeLayer, CudaError> {
        let layer = MoeLayer::new(&self.comm, &self.tensors, cfg, ty, stream)?;
        layer.set_sms(self.sms.get());
        Ok(layer)
    }
}

/// A tiny deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    /// A float in [-1, 1) with few mantissa bits (exact in bf16).
    fn float(&mut self) -> f32 {
        (self.below(256) as f32 - 128.0) / 128.0
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) enum Route {
    Uniform,
    /// Every entry names one of the first `topk` experts (all on rank 0).
    Skewed,
    /// Uniform, with about one entry in eight past the experts and one in eight negative.
    Hostile,
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Case {
    pub(super) name: &'static str,
    pub(super) topk: u16,
    pub(super) route: Route,
    pub(super) mode: Mode,
    pub(super) dtype: MoeDtype,
    pub(super) rows_max: Option<u32>,
    pub(super) empty_rank: bool,
    /// Elements per token (250 takes the kernels' paths for rows that are not whole 16-byte
    /// vectors).
    pub(super) hidden: u32,
    /// Tokens per rank (`tokens_max`; rank r dispatches 3r fewer).
    pub(super) tokens: u32,
}

const HIDDEN: u32 = 256;
const TOKENS: u32 = 96;

impl Case {
    /// A bf16 case of `TOKENS` tokens of `HIDDEN` elements, every rank with tokens, room for
    /// every entry.
    pub(super) fn new(name: &'static str, topk: u16, route: Route, mode: Mode) -> Case {
        Case {
            name,
            topk,
            route,
            mode,
            dtype: MoeDtype::Bf16,
            rows_max: None,
            empty_rank: false,
            hidden: HIDDEN,
            tokens: TOKENS,
        }
    }
}

fn cases() -> Vec<Case> {
    let c = Case::new;
    vec![
        c("uniform top-8", 8, Route::Uniform, Mode::Normal),
        c(
            "uniform top-8, low latency",
            8,
            Route::Uniform,
            Mode::LowLatency,
        ),
        c("uniform top-1", 1, Route::Uniform, Mode::Normal),
        c(
            "skewed top-1: every token to expert 0",
            1,
            Route::Skewed,
            Mode::Normal,
        ),
        c(
            "skewed top-8: the first 8 experts",
            8,
            Route::Skewed,
            Mode::LowLatency,
        ),
        Case {
            empty_rank: true,
            ..c(
                "rank 1 without tokens, top-4",
                4,
                Route::Uniform,
                Mode::LowLatency,
            )
        },
        Case {
            empty_rank: true,
            ..c(
                "rank 1 without tokens, top-4, normal",
                4,
                Route::Uniform,
                Mode::Normal,
            )
        },
        c(
            "invalid and negative indices, top-4",
            4,
            Route::Hostile,
            Mode::Normal,
        ),
        Case {
            rows_max: Some(100),
            ..c(
                "expert rows clipped at 100, top-8",
                8,
                Route::Uniform,
                Mode::Normal,
            )
        },
        Case {
            dtype: MoeDtype::F32,
            ..c("f32 tokens, top-2", 2, Route::Uniform, Mode::LowLatency)
        },
        Case {
            hidden: 250,
            ..c(
                "250 bf16 elements per token, top-3",
                3,
                Route::Uniform,
                Mode::Normal,
            )
        },
        Case {
            dtype: MoeDtype::F32,
            hidden: 250,
            ..c(
                "250 f32 elements per token, top-3, low latency",
                3,
                Route::Hostile,
                Mode::LowLatency,
            )
        },
        Case {
            hidden: 64,
            tokens: 4000,
            ..c(
                "4000 tokens, top-2: several routing chunks per block",
                2,
                Route::Uniform,
                Mode::Normal,
            )
        },
    ]
}

pub(super) fn config(world: u16, case: &Case) -> Result<MoeConfig, String> {
    let experts = 4 * u32::from(world).max(2);
    let cfg = MoeConfig::new(world, experts, case.topk, case.tokens, case.hidden)
        .map_err(|e| e.to_string())?;
    match case.rows_max {
        Some(r) => cfg.with_rows_max(r).map_err(|e| e.to_string()),
        None => Ok(cfg),
    }
}

/// Every rank's inputs of round `round`.
pub(super) fn inputs(
    cfg: &MoeConfig,
    case: &Case,
    dtype: MoeDtype,
    round: u64,
) -> Vec<MoeRankInput> {
    (0..cfg.world)
        .map(|r| {
            let mut g =
                Rng(0x9e37_79b9 ^ (u64::from(r) << 32) ^ (round << 8) ^ u64::from(case.topk));
            let tokens = if case.empty_rank && r == 1 {
                0
            } else {
                cfg.tokens_max - u32::from(r) * 3
            } as usize;
            let k = case.topk as usize;
            let e = u64::from(cfg.experts);
            let h = cfg.hidden as usize;
            let mut x = vec![0u8; tokens * h * dtype.bytes()];
            for i in 0..tokens * h {
                dtype.put(&mut x, i, g.float());
            }
            let topk_idx = (0..tokens * k)
                .map(|i| match case.route {
                    Route::Uniform => g.below(e) as i64,
                    Route::Skewed => (i % k) as i64,
                    Route::Hostile => match g.below(8) {
                        0 => (e + g.below(5)) as i64,
                        1 => -1 - g.below(3) as i64,
                        _ => g.below(e) as i64,
                    },
                })
                .collect();
            let topk_weights = (0..tokens * k).map(|_| g.float() * 2.0).collect();
            MoeRankInput {
                x,
                topk_idx,
                topk_weights,
            }
        })
        .collect()
}

pub(super) fn expert_out(cfg: &MoeConfig, dtype: MoeDtype, round: u64) -> Vec<Vec<u8>> {
    (0..cfg.world)
        .map(|q| {
            let mut g = Rng(0x51_7cc1_b727 ^ (u64::from(q) << 40) ^ round);
            let n = cfg.rows_max as usize * cfg.hidden as usize;
            let mut b = vec![0u8; n * dtype.bytes()];
            for i in 0..n {
                dtype.put(&mut b, i, g.float());
            }
            b
        })
        .collect()
}

/// Symmetric blocks of the user's tensors (the same sizes on every rank).
pub(super) struct Tensors {
    pub(super) x: u64,
    pub(super) idx: u64,
    pub(super) w: u64,
    pub(super) eout: u64,
    pub(super) out: u64,
}

pub(super) fn tensors(
    comm: &Gpu,
    cfg: &MoeConfig,
    dtype: MoeDtype,
    stream: &Stream,
) -> Result<Tensors, String> {
    let (t, h, k) = (
        u64::from(cfg.tokens_max),
        u64::from(cfg.hidden),
        u64::from(cfg.topk),
    );
    let es = dtype.bytes() as u64;
    let a = |len: u64| {
        comm.tensors
            .alloc_block(comm, len.max(16), stream)
            .map_err(e)
    };
    Ok(Tensors {
        x: a(t * h * es)?,
        idx: a(t * k * 8)?,
        w: a(t * k * 4)?,
        eout: a(u64::from(cfg.rows_max) * h * es)?,
        out: a(t * h * es)?,
    })
}

pub(super) fn span(comm: &Gpu, off: u64, len: u64) -> Result<Span, String> {
    Ok(Span {
        ptr: comm.memory().ptr(comm.rank(), off).map_err(e)?,
        len,
    })
}

pub(super) fn upload(comm: &Gpu, t: &Tensors, mine: &MoeRankInput) -> Result<(), String> {
    comm.memory().write(t.x, &mine.x).map_err(e)?;
    let idx: Vec<u8> = mine.topk_idx.iter().flat_map(|v| v.to_le_bytes()).collect();
    comm.memory().write(t.idx, &idx).map_err(e)?;
    let w: Vec<u8> = mine
        .topk_weights
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    comm.memory().write(t.w, &w).map_err(e)
}

/// Enqueues dispatch then combine of this rank's `tokens`.
pub(super) fn enqueue(
    comm: &Gpu,
    layer: &MoeLayer,
    t: &Tensors,
    mode: Mode,
    tokens: u32,
    stream: &Stream,
) -> Result<(), String> {
    let c = layer.config();
    let es = layer.token_type().bytes() as u64;
    let (tk, h, k) = (u64::from(tokens), u64::from(c.hidden), u64::from(c.topk));
    // SAFETY-free: the spans are blocks of this Comm's heap, alive until the layer is freed.
    let x = span(comm, t.x, tk * h * es)?;
    let idx = span(comm, t.idx, tk * k * 8)?;
    let w = span(comm, t.w, tk * k * 4)?;
    let eout = span(comm, t.eout, u64::from(c.rows_max) * h * es)?;
    let out = span(comm, t.out, tk * h * es)?;
    // SAFETY: every span is a block of this rank's heap that outlives the enqueued work (the
    // check synchronises before it frees anything).
    unsafe {
        layer
            .dispatch(comm, &comm.tensors, mode, tokens, x, idx, w, stream)
            .map_err(e)?;
        layer
            .combine(comm, &comm.tensors, mode, eout, out, stream)
            .map_err(e)
    }
}

/// Compares this rank's dispatch and combine with the reference of `ins`.
pub(super) fn compare(
    comm: &Gpu,
    layer: &MoeLayer,
    t: &Tensors,
    ins: &[MoeRankInput],
    eouts: &[Vec<u8>],
    dtype: MoeDtype,
) -> Result<(u32, u32), String> {
    let cfg = layer.config();
    let me = usize::from(comm.rank());
    let want = moe_reference(&cfg, dtype, ins).map_err(|e| e.to_string())?;
    let mine = &want[me];
    let spans = layer.spans(comm).map_err(e)?;
    if spans != mine.spans {
        return Err(format!("rank {me}: spans {spans:?}, want {:?}", mine.spans));
    }
    let used: u32 = spans.iter().map(|s| s.1).sum();
    let rows = layer.read_rows(comm, 0, used).map_err(e)?;
    let row = cfg.hidden as usize * dtype.bytes();
    if rows[..] != mine.expert_x[..used as usize * row] {
        let bad = (0..used as usize)
            .find(|&i| rows[i * row..][..row] != mine.expert_x[i * row..][..row])
            .unwrap_or(0);
        return Err(format!("rank {me}: expert row {bad} of {used} differs"));
    }
    let status = layer.status(comm).map_err(e)?;
    if (status.invalid, status.dropped) != (mine.invalid, mine.dropped) {
        return Err(format!(
            "rank {me}: {} invalid / {} dropped, want {} / {}",
            status.invalid, status.dropped, mine.invalid, mine.dropped
        ));
    }
    let combined = moe_combine_reference(&cfg, dtype, ins, eouts).map_err(|e| e.to_string())?;
    let got = comm
        .memory()
        .read(t.out, combined[me].len() as u64)
        .map_err(e)?;
    if got != combined[me] {
        let es = dtype.bytes();
        let bad = (0..got.len() / es)
            .find(|&i| got[i * es..][..es] != combined[me][i * es..][..es])
            .unwrap_or(0);
        return Err(format!(
            "rank {me}: combined element {bad} (token {}) is {}, want {}",
            bad / cfg.hidden as usize,
            dtype.get(&got, bad),
            dtype.get(&combined[me], bad)
        ));
    }
    Ok((used, status.dropped))
}

pub(super) fn free(comm: &Gpu, layer: MoeLayer, t: Tensors) -> Result<(), String> {
    layer.free(comm, &comm.tensors).map_err(e)?;
    for b in [t.x, t.idx, t.w, t.eout, t.out] {
        comm.tensors.release_block(b).map_err(e)?;
    }
    Ok(())
}

/// One case: dispatch and combine, compared with the reference.
fn case(comm: &Gpu, stream: &Stream, c: &Case) -> Result<String, String> {
    let cfg = config(comm.world(), c)?;
    let layer = comm.moe_layer(cfg, c.dtype, stream).map_err(e)?;
    let t = tensors(comm, &cfg, c.dtype, stream)?;
    let ins = inputs(&cfg, c, c.dtype, 0);
    let eouts = expert_out(&cfg, c.dtype, 0);
    let me = usize::from(comm.rank());
    upload(comm, &t, &ins[me])?;
    comm.memory().write(t.eout, &eouts[me]).map_err(e)?;
    let tokens = (ins[me].topk_idx.len() / c.topk as usize) as u32;
    enqueue(comm, &layer, &t, c.mode, tokens, stream)?;
    comm.synchronize(stream).map_err(e)?;
    let (rows, dropped) = compare(comm, &layer, &t, &ins, &eouts, c.dtype)?;
    free(comm, layer, t)?;
    Ok(format!("{rows} expert rows, {dropped} dropped"))
}

/// A graph of dispatch + combine, replayed with a new routing and new tokens each time.
fn graph(comm: &Gpu, stream: &Stream, mode: Mode, replays: u64) -> Result<String, String> {
    let c = Case::new("graph", 8, Route::Uniform, mode);
    let cfg = config(comm.world(), &c)?;
    let layer = comm.moe_layer(cfg, c.dtype, stream).map_err(e)?;
    let t = tensors(comm, &cfg, c.dtype, stream)?;
    let me = usize::from(comm.rank());
    let first = inputs(&cfg, &c, c.dtype, 0);
    let tokens = (first[me].topk_idx.len() / 8) as u32;
    upload(comm, &t, &first[me])?;
    // One eager call first (the kernels are loaded when the layer is made).
    enqueue(comm, &layer, &t, mode, tokens, stream)?;
    comm.synchronize(stream).map_err(e)?;
    let g = comm
        .capture(stream, |cap| {
            enqueue(comm, &layer, &t, mode, tokens, cap.stream())
                .map_err(symm_driver::cuda::CudaError::Invalid)
        })
        .map_err(e)?;
    for round in 1..=replays {
        let ins = inputs(&cfg, &c, c.dtype, round);
        let eouts = expert_out(&cfg, c.dtype, round);
        upload(comm, &t, &ins[me])?;
        comm.memory().write(t.eout, &eouts[me]).map_err(e)?;
        // Every rank's inputs are in place before any rank's replay reads a peer's.
        comm.exchange(b"moe inputs").map_err(e)?;
        g.launch(stream).map_err(e)?;
        comm.synchronize(stream).map_err(e)?;
        compare(comm, &layer, &t, &ins, &eouts, c.dtype)
            .map_err(|m| format!("replay {round}: {m}"))?;
        comm.exchange(b"moe compared").map_err(e)?;
    }
    drop(g);
    free(comm, layer, t)?;
    Ok(format!(
        "{replays} replays, each with a new routing, bit exact"
    ))
}

/// Runs the phase.
pub(super) fn run(p: &Params) -> Result<Vec<Check>, String> {
    let local: u16 = std::env::var("LOCAL_RANK")
        .ok()
        .and_then(|v| v.parse().ok())
        .ok_or("LOCAL_RANK is not set")?;
    let _ = symm_driver::cuda::comm::placement(local).map_err(e)?;
    let comm = Comm::from_env(opts(Duration::from_secs(10), 3 << 30)).map_err(e)?;
    let comm = Gpu {
        tensors: Blocks::new(&comm),
        comm,
        sms: std::cell::Cell::new(0),
    };
    let stream = Stream::new(comm.device()).map_err(e)?;
    let mut checks = Vec::new();
    let all = cases();
    checks.push(Check::timed(
        "MoE dispatch and combine vs host reference",
        all.len() + 2,
        || {
            let mut notes = Vec::new();
            for c in &all {
                let n = case(&comm, &stream, c).map_err(|m| format!("{}: {m}", c.name))?;
                notes.push(format!("{}: {n}", c.name));
            }
            // Small grids, a different one on each rank (`MoeLayer::set_sms`): the kernels and
            // the protocol between ranks work with any grid.
            let sms = 3 + u32::from(comm.rank());
            comm.set_moe_sms(sms);
            let small = all.iter().take(2).try_for_each(|c| {
                case(&comm, &stream, c)
                    .map(drop)
                    .map_err(|m| format!("{} at {sms} SMs: {m}", c.name))
            });
            comm.set_moe_sms(0);
            small?;
            notes.push("the first two again at 3 + rank SMs: bit exact".into());
            Ok(notes.join("; "))
        },
    ));
    checks.push(Check::timed(
        "MoE and all-to-allv hostile calls refused, nothing lost",
        14,
        || super::moe_a2av::hostile(&comm, &stream),
    ));
    checks.push(Check::timed("MoE graph replay, normal mode", 10, || {
        graph(&comm, &stream, Mode::Normal, 10)
    }));
    checks.push(Check::timed("MoE graph replay, low latency", 10, || {
        graph(&comm, &stream, Mode::LowLatency, 10)
    }));
    checks.push(Check::timed(
        "all-to-allv with device counts vs host reference, graph replay",
        6,
        || super::moe_a2av::run(&comm, &stream),
    ));
    checks.push(Check::timed("MoE latency", 1, || {
        super::moe_a2av::latency(&comm, &stream, p)
    }));
    drop(stream);
    comm.comm.finish().map_err(e)?;
    Ok(checks)
}

/// Wall-clock microseconds per call of `f`, over `iters` calls after `warm` (synchronising at
/// the end of each batch).
pub(super) fn per_call(
    comm: &Gpu,
    stream: &Stream,
    warm: u32,
    iters: u32,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    for _ in 0..warm {
        f()?;
    }
    comm.synchronize(stream).map_err(e)?;
    comm.exchange(b"moe timing").map_err(e)?;
    let t = Instant::now();
    for _ in 0..iters {
        f()?;
    }
    comm.synchronize(stream).map_err(e)?;
    Ok(t.elapsed().as_secs_f64() * 1e6 / f64::from(iters))
}

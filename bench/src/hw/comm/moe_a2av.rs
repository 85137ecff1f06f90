//! The all-to-allv with device counts on the GPU, and the MoE latency table (phase `moe`).
//!
//! The all-to-allv's bounds, which the host model below states: a negative count is 0; a
//! sender's row stops where its input ends; a receiver keeps sender p's block from
//! `sum_{p' < p} n[p'][q]` and drops what passes its output, reporting the kept counts.

use symm_core::moe::Mode;
use symm_driver::cuda::device::Stream;
use symm_driver::cuda::{A2avLayer, Span};

use super::moe::{compare, config, expert_out, free, span};
use super::moe::{
    enqueue as moe_enqueue, inputs as moe_inputs, per_call, tensors as moe_tensors, Gpu,
};
use super::moe::{upload as moe_upload, Case as MoeCase, Route as MoeRoute};
use super::{e, Params};
use symm_driver::host::moe::MoeDtype;

const IN_MAX: u64 = 1024;
const OUT_MAX: u64 = 1000;

/// Counts of round `round`: `kind` 0 random, 1 with negative counts, 2 past the bounds.
fn counts(world: u16, round: u64, kind: u8) -> Vec<i64> {
    let w = u64::from(world);
    (0..w * w)
        .map(|i| {
            let mut x = (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (round << 17);
            x ^= x >> 29;
            let c = (x % 120) as i64;
            match kind {
                1 if i % 3 == 0 => -c - 1,
                2 => c * 7,
                _ => c,
            }
        })
        .collect()
}

/// The host model: per receiver, (output elements, kept counts per sender, dropped).
fn model(world: u16, raw: &[i64], inputs: &[Vec<f32>]) -> Vec<(Vec<f32>, Vec<i64>, u64)> {
    let w = usize::from(world);
    let n: Vec<u64> = (0..w)
        .flat_map(|r| {
            let mut used = 0u64;
            (0..w)
                .map(|q| {
                    let c = raw[r * w + q].max(0) as u64;
                    let c = c.min(IN_MAX - used);
                    used += c;
                    c
                })
                .collect::<Vec<_>>()
        })
        .collect();
    (0..w)
        .map(|q| {
            let mut out = vec![f32::NAN; OUT_MAX as usize];
            let (mut kept, mut dropped, mut off) = (Vec::new(), 0, 0u64);
            for p in 0..w {
                let c = n[p * w + q];
                let k = c.min(OUT_MAX.saturating_sub(off));
                let send: u64 = (0..q).map(|j| n[p * w + j]).sum();
                for i in 0..k {
                    out[(off + i) as usize] = inputs[p][(send + i) as usize];
                }
                kept.push(k as i64);
                dropped += c - k;
                off += c;
            }
            (out, kept, dropped)
        })
        .collect()
}

struct Bufs {
    counts: u64,
    input: u64,
    recv: u64,
}

fn enqueue(comm: &Gpu, l: &A2avLayer, b: &Bufs, stream: &Stream) -> Result<(), String> {
    let w = u64::from(comm.world());
    let (c, i, r) = (
        span(comm, b.counts, w * 8)?,
        span(comm, b.input, IN_MAX * 4)?,
        span(comm, b.recv, w * 8)?,
    );
    // SAFETY: the spans are blocks of this rank's heap, freed only after a synchronisation.
    unsafe { l.enqueue(comm, &comm.tensors, c, i, r, stream) }.map_err(e)
}

/// Every rank's input: element i of rank r is r * 4096 + i, exact in f32.
fn rank_inputs(world: usize) -> Vec<Vec<f32>> {
    (0..world)
        .map(|r| {
            (0..IN_MAX)
                .map(|i| (r as f32) * 4096.0 + i as f32)
                .collect()
        })
        .collect()
}

fn round(comm: &Gpu, b: &Bufs, raw: &[i64]) -> Result<(), String> {
    let (me, w) = (usize::from(comm.rank()), usize::from(comm.world()));
    let inputs = rank_inputs(w);
    let mine: Vec<u8> = raw[me * w..(me + 1) * w]
        .iter()
        .flat_map(|c| c.to_le_bytes())
        .collect();
    comm.memory().write(b.counts, &mine).map_err(e)?;
    let bytes: Vec<u8> = inputs[me].iter().flat_map(|v| v.to_le_bytes()).collect();
    comm.memory().write(b.input, &bytes).map_err(e)
}

fn verify(comm: &Gpu, l: &A2avLayer, b: &Bufs, raw: &[i64], what: &str) -> Result<u64, String> {
    let (me, w) = (usize::from(comm.rank()), usize::from(comm.world()));
    let inputs = rank_inputs(w);
    let (want, kept, dropped) = &model(comm.world(), raw, &inputs)[me];
    let rc: Vec<i64> = comm
        .memory()
        .read(b.recv, w as u64 * 8)
        .map_err(e)?
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect();
    if &rc != kept {
        return Err(format!(
            "{what}: rank {me} received counts {rc:?}, want {kept:?}"
        ));
    }
    let total: i64 = kept.iter().sum();
    let got = comm
        .memory()
        .read(l.output(), total as u64 * 4)
        .map_err(e)?;
    for (i, c) in got.chunks_exact(4).enumerate() {
        let v = f32::from_le_bytes(c.try_into().unwrap_or([0; 4]));
        if v.to_bits() != want[i].to_bits() {
            return Err(format!(
                "{what}: rank {me} output element {i} is {v}, want {}",
                want[i]
            ));
        }
    }
    let d = l.dropped(comm).map_err(e)?;
    if u64::from(d) != *dropped {
        return Err(format!("{what}: rank {me} dropped {d}, want {dropped}"));
    }
    Ok(total as u64)
}

/// The all-to-allv check: three kinds of counts eagerly, then graph replays with new counts.
pub(super) fn run(comm: &Gpu, stream: &Stream) -> Result<String, String> {
    let w = u64::from(comm.world());
    let l = A2avLayer::new(comm, &comm.tensors, 4, OUT_MAX, stream).map_err(e)?;
    let b = Bufs {
        counts: comm.tensors.alloc_block(comm, w * 8, stream).map_err(e)?,
        input: comm
            .tensors
            .alloc_block(comm, IN_MAX * 4, stream)
            .map_err(e)?,
        recv: comm.tensors.alloc_block(comm, w * 8, stream).map_err(e)?,
    };
    let mut moved = 0;
    for (kind, what) in [
        (0, "random"),
        (1, "negative counts"),
        (2, "past the bounds"),
    ] {
        let raw = counts(comm.world(), 0, kind);
        round(comm, &b, &raw)?;
        comm.exchange(b"a2av inputs").map_err(e)?;
        enqueue(comm, &l, &b, stream)?;
        comm.synchronize(stream).map_err(e)?;
        moved += verify(comm, &l, &b, &raw, what)?;
        comm.exchange(b"a2av compared").map_err(e)?;
    }
    let g = comm
        .capture(stream, |cap| {
            enqueue(comm, &l, &b, cap.stream()).map_err(symm_driver::cuda::CudaError::Invalid)
        })
        .map_err(e)?;
    let replays = 5;
    for r in 1..=replays {
        let raw = counts(comm.world(), r, (r % 3) as u8);
        round(comm, &b, &raw)?;
        comm.exchange(b"a2av inputs").map_err(e)?;
        g.launch(stream).map_err(e)?;
        comm.synchronize(stream).map_err(e)?;
        moved += verify(comm, &l, &b, &raw, &format!("replay {r}"))?;
        comm.exchange(b"a2av compared").map_err(e)?;
    }
    drop(g);
    for off in [b.counts, b.input, b.recv] {
        comm.tensors.release_block(off).map_err(e)?;
    }
    Ok(format!(
        "3 eager calls and {replays} graph replays with new device counts, {moved} elements received here, bit exact"
    ))
}

/// The latency table (see the module doc of `moe`).
pub(super) fn latency(comm: &Gpu, stream: &Stream, p: &Params) -> Result<String, String> {
    let iters = if p.iters > 0 { p.iters } else { 200 };
    let world = comm.world();
    let mut notes = Vec::new();
    // The default grids (every SM), then fewer blocks (`MoeLayer::set_sms`): whether the
    // waiting blocks' polling costs more than their copies gain.
    for (mode, tokens, sms) in [
        (Mode::LowLatency, 128u32, 0u32),
        (Mode::LowLatency, 128, 32),
        (Mode::LowLatency, 128, 8),
        (Mode::Normal, 128, 0),
        (Mode::Normal, 128, 32),
        (Mode::Normal, 1024, 0),
        (Mode::Normal, 1024, 32),
    ] {
        comm.set_moe_sms(sms);
        let case = MoeCase {
            hidden: 7168,
            tokens,
            ..MoeCase::new("latency", 8, MoeRoute::Uniform, mode)
        };
        let experts = 8 * u32::from(world);
        let cfg = symm_core::moe::MoeConfig::new(world, experts, 8, tokens, 7168)
            .map_err(|e| e.to_string())?;
        let cfg = cfg
            .with_rows_max(2 * tokens * 8)
            .map_err(|e| e.to_string())?;
        let layer = comm
            .moe_layer(cfg, symm_driver::cuda::TokenType::Bf16, stream)
            .map_err(e)?;
        let t = moe_tensors(comm, &cfg, MoeDtype::Bf16, stream)?;
        let ins = moe_inputs(&cfg, &case, MoeDtype::Bf16, 0);
        let me = usize::from(comm.rank());
        moe_upload(comm, &t, &ins[me])?;
        let n = (ins[me].topk_idx.len() / 8) as u32;
        let eager = per_call(comm, stream, 5, iters, || {
            moe_enqueue(comm, &layer, &t, mode, n, stream)
        })?;
        let g = comm
            .capture(stream, |cap| {
                moe_enqueue(comm, &layer, &t, mode, n, cap.stream())
                    .map_err(symm_driver::cuda::CudaError::Invalid)
            })
            .map_err(e)?;
        let graph = per_call(comm, stream, 5, iters, || g.launch(stream).map_err(e))?;
        drop(g);
        let status = layer.status(comm).map_err(e)?;
        let grid = match sms {
            0 => String::new(),
            n => format!(" at {n} SMs"),
        };
        notes.push(format!(
            "{} {n} tokens x 7168 bf16 top-8 dispatch+combine{grid}: {eager:.1} us eager, {graph:.1} us graph ({} dropped)",
            if mode == Mode::LowLatency { "low-latency" } else { "normal" },
            status.dropped
        ));
        comm.set_moe_sms(0);
        layer.free(comm, &comm.tensors).map_err(e)?;
        for b in [t.x, t.idx, t.w, t.eout, t.out] {
            comm.tensors.release_block(b).map_err(e)?;
        }
    }
    // The token rows of a 128-token top-8 dispatch as an all-to-allv: device counts against a
    // host round trip of the same counts.
    let w = u64::from(world);
    let row = 7168u64;
    let per_dest = 128 * 8 / w.max(1);
    let elems = per_dest.min(128) * row;
    let l = A2avLayer::new(comm, &comm.tensors, 2, w * elems, stream).map_err(e)?;
    let cb = comm.tensors.alloc_block(comm, w * 8, stream).map_err(e)?;
    let ib = comm
        .tensors
        .alloc_block(comm, w * elems * 2, stream)
        .map_err(e)?;
    let rb = comm.tensors.alloc_block(comm, w * 8, stream).map_err(e)?;
    let mine: Vec<u8> = (0..w).flat_map(|_| (elems as i64).to_le_bytes()).collect();
    comm.memory().write(cb, &mine).map_err(e)?;
    let go = |s: &Stream| -> Result<(), String> {
        let (c, i, r) = (
            span(comm, cb, w * 8)?,
            span(comm, ib, w * elems * 2)?,
            span(comm, rb, w * 8)?,
        );
        // SAFETY: heap blocks of this rank, released after a synchronisation below.
        unsafe { l.enqueue(comm, &comm.tensors, c, i, r, s) }.map_err(e)
    };
    let device = per_call(comm, stream, 5, iters, || go(stream))?;
    let host = per_call(comm, stream, 5, iters, || {
        comm.synchronize(stream).map_err(e)?;
        let c = comm.memory().read(cb, w * 8).map_err(e)?;
        if c.len() as u64 != w * 8 {
            return Err("short count read".into());
        }
        go(stream)
    })?;
    notes.push(format!(
        "all-to-allv of {} KiB per peer: device counts {device:.1} us, host round trip of the counts {host:.1} us ({:.2}x)",
        elems * 2 / 1024,
        host / device
    ));
    for b in [cb, ib, rb] {
        comm.tensors.release_block(b).map_err(e)?;
    }
    Ok(notes.join("; "))
}

/// Hostile calls on a MoE layer and an all-to-allv layer: each is refused with its typed error
/// before anything is enqueued; then a good dispatch and combine on the same layer still match
/// the host reference, and the layer, once released, is refused too.
pub(super) fn hostile(comm: &Gpu, stream: &Stream) -> Result<String, String> {
    use symm_core::moe::MoeConfig;
    use symm_driver::cuda::{CudaError, MAX_GPU_EXPERTS};
    let mut refused = Vec::new();
    let mut expect = |what: &'static str,
                      r: symm_driver::cuda::Result<()>,
                      ok: fn(&CudaError) -> bool|
     -> Result<(), String> {
        match r {
            Err(err) if ok(&err) => {
                refused.push(what);
                Ok(())
            }
            Err(err) => Err(format!("{what}: refused with the wrong error: {err}")),
            Ok(()) => Err(format!("{what}: accepted")),
        }
    };
    let (w, bf16) = (comm.world(), MoeDtype::Bf16);
    let other =
        MoeConfig::new(w + 1, 4 * (u32::from(w) + 1), 2, 8, 64).map_err(|e| e.to_string())?;
    expect(
        "a shape for another world",
        comm.moe_layer(other, bf16, stream).map(drop),
        |e| matches!(e, CudaError::SizeMismatch { .. }),
    )?;
    let many = (MAX_GPU_EXPERTS / u32::from(w) + 1) * u32::from(w);
    let wide = MoeConfig::new(w, many, 2, 8, 64).map_err(|e| e.to_string())?;
    expect(
        "more experts than the GPU layer holds",
        comm.moe_layer(wide, bf16, stream).map(drop),
        |e| matches!(e, CudaError::TooLarge { .. }),
    )?;
    expect(
        "all-to-allv elements of 3 bytes",
        A2avLayer::new(comm, &comm.tensors, 3, 16, stream).map(drop),
        |e| matches!(e, CudaError::BadElementSize { bytes: 3, .. }),
    )?;
    let c = MoeCase::new("hostile", 4, MoeRoute::Hostile, Mode::Normal);
    let cfg = config(w, &c)?;
    let layer = comm.moe_layer(cfg, bf16, stream).map_err(e)?;
    let t = moe_tensors(comm, &cfg, bf16, stream)?;
    let (tm, h, k) = (
        u64::from(cfg.tokens_max),
        u64::from(cfg.hidden),
        u64::from(cfg.topk),
    );
    let x = span(comm, t.x, tm * h * 2)?;
    let idx = span(comm, t.idx, tm * k * 8)?;
    let wt = span(comm, t.w, tm * k * 4)?;
    let eout = span(comm, t.eout, u64::from(cfg.rows_max) * h * 2)?;
    let out = span(comm, t.out, tm * h * 2)?;
    let short = |s: Span| Span {
        len: s.len - 2,
        ..s
    };
    let n = cfg.tokens_max;
    let nm = Mode::Normal;
    // SAFETY: every span is a block of this rank's heap that lives until `free` below, after a
    // synchronisation; the calls are meant to be refused before anything is enqueued.
    unsafe {
        expect(
            "more tokens than tokens_max",
            layer.dispatch(comm, &comm.tensors, nm, n + 1, x, idx, wt, stream),
            |e| matches!(e, CudaError::Moe(_)),
        )?;
        expect(
            "a token buffer one element short",
            layer.dispatch(comm, &comm.tensors, nm, n, short(x), idx, wt, stream),
            |e| matches!(e, CudaError::SizeMismatch { .. }),
        )?;
        let odd = Span {
            ptr: idx.ptr + 4,
            ..idx
        };
        expect(
            "expert indices not 8-byte aligned",
            layer.dispatch(comm, &comm.tensors, nm, n, x, odd, wt, stream),
            |e| matches!(e, CudaError::Misaligned { .. }),
        )?;
        let nowhere = Span { ptr: 1 << 20, ..wt };
        expect(
            "weights at an address that is no device memory",
            layer.dispatch(comm, &comm.tensors, nm, n, x, idx, nowhere, stream),
            |e| matches!(e, CudaError::NotDeviceMemory { .. }),
        )?;
        expect(
            "expert outputs one element short",
            layer.combine(comm, &comm.tensors, nm, short(eout), out, stream),
            |e| matches!(e, CudaError::SizeMismatch { .. }),
        )?;
        let odd = Span {
            ptr: out.ptr + 1,
            ..out
        };
        expect(
            "an output not aligned to its elements",
            layer.combine(comm, &comm.tensors, nm, eout, odd, stream),
            |e| matches!(e, CudaError::Misaligned { .. }),
        )?;
    }
    // Nothing was lost: a good call on the same layer matches the reference.
    let ins = moe_inputs(&cfg, &c, bf16, 0);
    let eouts = expert_out(&cfg, bf16, 0);
    let me = usize::from(comm.rank());
    moe_upload(comm, &t, &ins[me])?;
    comm.memory().write(t.eout, &eouts[me]).map_err(e)?;
    let tokens = (ins[me].topk_idx.len() / c.topk as usize) as u32;
    moe_enqueue(comm, &layer, &t, nm, tokens, stream)?;
    comm.synchronize(stream).map_err(e)?;
    compare(comm, &layer, &t, &ins, &eouts, bf16)
        .map_err(|m| format!("after the refusals: {m}"))?;
    comm.tensors.release_block(layer.block().0).map_err(e)?;
    // SAFETY: as above.
    expect(
        "a layer whose block was released",
        unsafe { layer.dispatch(comm, &comm.tensors, nm, tokens, x, idx, wt, stream) }.map(drop),
        |e| matches!(e, CudaError::NotLive { .. }),
    )?;
    free(comm, layer, t)?;
    let l = A2avLayer::new(comm, &comm.tensors, 4, OUT_MAX, stream).map_err(e)?;
    let cb = comm
        .tensors
        .alloc_block(comm, u64::from(w) * 8, stream)
        .map_err(e)?;
    let counts = span(comm, cb, u64::from(w) * 8)?;
    let inside = span(comm, l.output(), 64)?;
    let odd = Span {
        ptr: counts.ptr + 4,
        len: counts.len,
    };
    let short = Span {
        len: counts.len - 8,
        ..counts
    };
    // SAFETY: heap blocks of this rank; the calls are refused before anything is enqueued.
    unsafe {
        expect(
            "an all-to-allv input inside its own output",
            l.enqueue(comm, &comm.tensors, counts, inside, counts, stream),
            |e| matches!(e, CudaError::Overlap { .. }),
        )?;
        expect(
            "all-to-allv counts not 8-byte aligned",
            l.enqueue(comm, &comm.tensors, odd, inside, counts, stream),
            |e| matches!(e, CudaError::Misaligned { .. }),
        )?;
        expect(
            "all-to-allv counts one rank short",
            l.enqueue(comm, &comm.tensors, short, inside, counts, stream),
            |e| matches!(e, CudaError::SizeMismatch { .. }),
        )?;
    }
    comm.tensors.release_block(cb).map_err(e)?;
    comm.tensors.release_block(l.block()).map_err(e)?;
    Ok(format!(
        "{} refused ({}); a good dispatch + combine after them bit exact",
        refused.len(),
        refused.join(", ")
    ))
}

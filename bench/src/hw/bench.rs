//! `cargo xtask hw --bench-quick`: first all-reduce numbers beside NCCL, nccl-tests columns.
//!
//! Both run in this process on the same GPUs, streams and heap buffers (out of place, bf16 sum).
//! Time per op is the slowest rank's CUDA-event time over back-to-back launches after warm-up.
//! busbw = algbw * 2 (n - 1) / n, as nccl-tests reports for all-reduce.

use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::cuda::CudaError;
use symm_driver::host;
use symm_harness::nccl::Nccl;
use symm_harness::World;

use super::data;

/// One measured line.
pub struct Line {
    /// Bytes per rank.
    pub bytes: u64,
    /// (algorithm, channels, us) for each symm algorithm timed.
    pub symm: Vec<(Algorithm, u16, Result<f64, String>)>,
    /// NCCL us.
    pub nccl: Result<f64, String>,
}

fn busbw(bytes: u64, us: f64, w: u16) -> (f64, f64) {
    let alg = bytes as f64 / (us * 1e-6) / 1e9;
    (alg, alg * 2.0 * (w as f64 - 1.0) / w as f64)
}

/// (algorithm, channels) candidates timed for a size.
fn candidates(bytes: u64) -> Vec<(Algorithm, u16)> {
    let algos = [Algorithm::OneShot, Algorithm::TwoShot, Algorithm::Ring];
    let chans: &[u16] = match bytes {
        0..=65_536 => &[1],
        65_537..=16_777_216 => &[8, 16],
        _ => &[32, 64],
    };
    algos
        .iter()
        .flat_map(|&a| chans.iter().map(move |&c| (a, c)))
        .collect()
}

/// Times all-reduce at 1 KiB, 1 MiB and 256 MiB.
pub fn run(world: &World, seed: &mut u64) -> Vec<Line> {
    let w = world.world();
    let nccl = Nccl::new(world).map_err(|e| e.to_string());
    if let Ok(n) = &nccl {
        println!("bench: NCCL {} in process, {} GPUs", n.version, w);
    }
    let mut lines = Vec::new();
    for bytes in [1u64 << 10, 1 << 20, 256 << 20] {
        let (warm, iters) = match bytes {
            0..=65_536 => (20, 500),
            65_537..=16_777_216 => (10, 200),
            _ => (3, 10),
        };
        let mut line = Line {
            bytes,
            symm: Vec::new(),
            nccl: Err("not run".into()),
        };
        for (a, ch) in candidates(bytes) {
            let req = Request::new(
                Collective::AllReduce,
                a,
                w,
                bytes,
                DType::Bf16,
                ReduceOp::Sum,
            )
            .with_channels(ch);
            *seed += 1;
            let r = time_one(world, &req, *seed, warm, iters);
            line.symm.push((a, ch, r));
        }
        if let Ok(n) = &nccl {
            let req = Request::new(
                Collective::AllReduce,
                Algorithm::Ring,
                w,
                bytes,
                DType::Bf16,
                ReduceOp::Sum,
            );
            line.nccl = (|| -> Result<f64, CudaError> {
                let b = world.alloc(&req)?;
                let t = n.time_all_reduce(
                    world,
                    &b,
                    (bytes / 2) as usize,
                    DType::Bf16,
                    ReduceOp::Sum,
                    warm,
                    iters,
                );
                world.free(&b)?;
                t
            })()
            .map_err(|e| e.to_string());
        } else if let Err(e) = &nccl {
            line.nccl = Err(e.clone());
        }
        lines.push(line);
    }
    lines
}

fn time_one(world: &World, req: &Request, seed: u64, warm: u32, iters: u32) -> Result<f64, String> {
    let e = |e: CudaError| e.to_string();
    let inputs = data::inputs(req, seed);
    let b = world.alloc(req).map_err(e)?;
    let r = (|| {
        for (r, inp) in inputs.iter().enumerate() {
            world.write(r as u16, b.input, inp).map_err(e)?;
            world
                .fill(r as u16, b.output, b.sizes.output, host::POISON)
                .map_err(e)?;
        }
        let us = world.time(req, &b, warm, iters).map_err(e)?;
        let found: Vec<Vec<u8>> = (0..req.world)
            .map(|r| world.read(r, b.output, b.sizes.output))
            .collect::<Result<_, _>>()
            .map_err(e)?;
        symm_tests::matrix::exact(req, &found, &host::reference(req, &inputs))
            .map_err(|m| format!("wrong result after timing: {m}"))?;
        Ok(us)
    })();
    world.free(&b).map_err(e)?;
    r
}

/// Prints the lines in nccl-tests columns, symm's best algorithm beside NCCL.
pub fn print(w: u16, lines: &[Line]) {
    println!("\n# all-reduce, world {w}, bf16 sum, out of place (time us, algbw/busbw GB/s)");
    println!(
        "# {:>12} {:>12} {:>6} {:>6} | {:>9} {:>7} {:>7} {:>18} | {:>9} {:>7} {:>7}",
        "size",
        "count",
        "type",
        "redop",
        "symm us",
        "algbw",
        "busbw",
        "algorithm",
        "nccl us",
        "algbw",
        "busbw"
    );
    for l in lines {
        let best = l
            .symm
            .iter()
            .filter_map(|(a, c, r)| r.as_ref().ok().map(|t| (*a, *c, *t)))
            .min_by(|x, y| x.2.total_cmp(&y.2));
        let (s_t, s_a, s_b, s_n) = match best {
            Some((a, c, t)) => {
                let (al, bu) = busbw(l.bytes, t, w);
                (
                    format!("{t:.2}"),
                    format!("{al:.2}"),
                    format!("{bu:.2}"),
                    format!("{}/{}ch", a.name(), c),
                )
            }
            None => ("-".into(), "-".into(), "-".into(), "failed".into()),
        };
        let (n_t, n_a, n_b) = match &l.nccl {
            Ok(t) => {
                let (al, bu) = busbw(l.bytes, *t, w);
                (format!("{t:.2}"), format!("{al:.2}"), format!("{bu:.2}"))
            }
            Err(_) => ("-".into(), "-".into(), "-".into()),
        };
        println!(
            "  {:>12} {:>12} {:>6} {:>6} | {:>9} {:>7} {:>7} {:>18} | {:>9} {:>7} {:>7}",
            l.bytes,
            l.bytes / 2,
            "bf16",
            "sum",
            s_t,
            s_a,
            s_b,
            s_n,
            n_t,
            n_a,
            n_b
        );
        for (a, c, r) in &l.symm {
            match r {
                Ok(t) => println!("  #   {:>9} {:>3}ch {t:>10.2} us", a.name(), c),
                Err(m) => println!("  #   {:>9} {:>3}ch failed: {m}", a.name(), c),
            }
        }
        if let Err(m) = &l.nccl {
            println!("  #   nccl failed: {m}");
        }
    }
}

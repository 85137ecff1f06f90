//! The simulator fitted to real GPU times: the 104 samples of `docs/perf/sim-fit-shared-w2.md`
//! (two ranks sharing one H100 under MPS; every candidate algorithm at 4, 16 and 64 channels,
//! 1 MiB and more) are fitted with `fit_link` (link and per-block model), and the worst
//! simulated / measured ratio must stay under a bound. Without the per-block model the same fit
//! was 5.21x off (the record's own header): one thread block moves data at a bounded rate, so
//! 4 channels are far slower than 64 on the same bytes.

use std::time::Instant;

use symm_core::cost::Link;
use symm_core::dtype::{DType, ReduceOp};
use symm_core::sched::{Algorithm, Collective, Request};
use symm_driver::host::{fit_link, FitSample};

const RECORD: &str = include_str!("../../docs/perf/sim-fit-shared-w2.md");

/// The worst simulated / measured ratio (either way) the fit must reach. The fit reaches
/// 1.65x: what is left is the 64-channel samples, bound by the one GPU's memory that both
/// ranks share (the simulator gives each rank its own ports), so large reductions at 64
/// channels come out too fast and small copies at 64 channels too slow.
const BOUND: f64 = 1.7;

/// `1M`, `64M`, `512K`, `100` as bytes.
fn bytes(s: &str) -> Option<u64> {
    let (num, mul) = match s.as_bytes().last()? {
        b'K' => (&s[..s.len() - 1], 1u64 << 10),
        b'M' => (&s[..s.len() - 1], 1 << 20),
        b'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    Some(num.parse::<u64>().ok()? * mul)
}

/// The table's rows as samples: collective, bytes, algorithm, channels, GPU us.
fn samples(md: &str) -> Vec<FitSample> {
    md.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('|').map(str::trim).collect();
            if f.len() < 7 {
                return None;
            }
            let c = Collective::parse(f[1]).ok()?;
            let b = bytes(f[2])?;
            let a = Algorithm::parse(f[3]).ok()?;
            let ch = f[4].parse::<u16>().ok()?;
            let us = f[5].parse::<f64>().ok()?;
            let req = Request::new(c, a, 2, b, DType::Bf16, ReduceOp::Sum).with_channels(ch);
            Some(FitSample {
                req,
                measured_us: us,
            })
        })
        .collect()
}

#[test]
fn the_record_parses() {
    assert_eq!(bytes("4M"), Some(4 << 20));
    assert_eq!(bytes("512K"), Some(512 << 10));
    assert_eq!(bytes("x"), None);
    let s = samples(RECORD);
    assert_eq!(s.len(), 104);
    assert_eq!(s[0].req.collective, Collective::AllReduce);
    assert_eq!((s[0].req.bytes, s[0].req.channels), (1 << 20, 4));
    assert_eq!(s[0].measured_us, 34.77);
}

#[test]
fn the_fitted_simulator_is_near_the_shared_h100() {
    let t0 = Instant::now();
    let s = samples(RECORD);
    assert_eq!(s.len(), 104);
    let fit = fit_link(&s, &Link::SHARED_DEVICE).expect("fits");
    let (l, b) = (fit.link, fit.block);
    println!(
        "fit of {} samples in {:.1} s ({} steps): launch {:.2} us, alpha {:.3} us, beta {:.0} B/us, \
         block {:.0} B/us (reduce {:.0}), op {:.3} us; worst simulated / measured {:.3}x",
        fit.rows.len(),
        t0.elapsed().as_secs_f64(),
        fit.steps,
        l.launch_us,
        l.alpha_us,
        l.beta_bytes_per_us,
        b.bytes_per_us,
        b.reduce_bytes_per_us,
        b.op_us,
        fit.worst
    );
    let mut rows = fit.rows.clone();
    rows.sort_by(|x, y| y.error().total_cmp(&x.error()));
    println!("| collective | bytes | algorithm | channels | GPU us | simulator us | ratio |");
    for r in rows.iter().take(5) {
        println!(
            "| {} | {} | {} | {} | {:.2} | {:.2} | {:.3} |",
            r.req.collective.name(),
            r.req.bytes,
            r.req.algorithm.name(),
            r.req.channels,
            r.measured_us,
            r.simulated_us,
            r.ratio()
        );
    }
    assert_eq!((fit.rows.len(), fit.skipped), (104, 0));
    assert!(fit.worst <= BOUND, "worst {:.3}x > {BOUND}x", fit.worst);
}

//! The simulator against the GPU: a link fitted to the bench's own samples, and how far the
//! simulator then is from every measurement.
//!
//! The samples are symm's eager times at 1 MiB and more: every candidate (algorithm, channels)
//! when the run calibrates (`CANDIDATE` samples), else the fastest one per size.
//! [`symm_driver::host::fit_link`] fits (launch, alpha, beta) and the per-block model (a
//! channel's own bandwidth for copies and reductions, its cost per op) by least squares on the
//! relative error, starting from the topology's model link; each sample is then simulated on the fitted
//! link, and the report gives simulated / measured per sample and the worst ratio (the larger of
//! the ratio and its inverse).

use std::fmt::Write as _;

use symm_core::cost::{Link, Topology};
use symm_core::sched::Algorithm;
use symm_driver::host::{self, FitSample, LinkFit};

use super::report::human;
use super::{Sample, CANDIDATE};

/// Smallest size fitted.
pub(super) const MIN_BYTES: u64 = 1 << 20;

/// The (algorithm, channels) of a symm label `algorithm/Nch` (what follows a space, the SMs
/// occupied, is left out).
pub(super) fn parse_label(label: &str) -> Option<(Algorithm, u16)> {
    let first = label.split(' ').next()?;
    let (alg, ch) = first.split_once('/')?;
    let a = Algorithm::parse(alg).ok()?;
    let ch = ch.strip_suffix("ch")?.parse::<u16>().ok()?;
    Some((a, ch))
}

/// The fit's samples: the calibration candidates when there are any, else symm's eager ones,
/// from `MIN_BYTES` up.
pub(super) fn fit_samples(world: u16, samples: &[Sample]) -> Vec<FitSample> {
    let candidates = samples.iter().any(|s| s.system == CANDIDATE);
    samples
        .iter()
        .filter(|s| {
            s.size >= MIN_BYTES
                && s.mode == "eager"
                && if candidates {
                    s.system == CANDIDATE
                } else {
                    s.system == "symm"
                }
        })
        .filter_map(|s| {
            let (a, ch) = parse_label(&s.label)?;
            let req = super::rank::request(s.kind, s.size, world, a, ch)?;
            Some(FitSample {
                req,
                measured_us: s.us,
            })
        })
        .collect()
}

/// Fits the link to `samples` and returns it with the report (markdown), or why not.
pub(super) fn fit(
    world: u16,
    topology: Topology,
    samples: &[Sample],
) -> Result<(LinkFit, String), String> {
    let fs = fit_samples(world, samples);
    let fit = host::fit_link(&fs, &topology.link()).map_err(|e| e.to_string())?;
    Ok((fit.clone(), markdown(world, topology, &fit)))
}

/// One line for the generated calibration table's header.
pub(super) fn summary(fit: &LinkFit) -> String {
    let l = &fit.link;
    format!(
        "simulator link fitted to {} samples of 1 MiB and more: launch {:.2} us, alpha {:.3} us, \
         beta {:.0} B/us, per block {:.0} B/us (reductions {:.0}) and {:.2} us an op; worst \
         simulated / measured {:.2}x",
        fit.rows.len(),
        l.launch_us,
        l.alpha_us,
        l.beta_bytes_per_us,
        fit.block.bytes_per_us,
        fit.block.reduce_bytes_per_us,
        fit.block.op_us,
        fit.worst
    )
}

fn markdown(world: u16, topology: Topology, fit: &LinkFit) -> String {
    let mut m = String::new();
    let Link {
        launch_us,
        alpha_us,
        beta_bytes_per_us,
        ..
    } = fit.link;
    let start = topology.link();
    let _ = writeln!(
        m,
        "### The simulator against the GPU (world {world}, {})\n",
        topology.name()
    );
    let _ = writeln!(
        m,
        "Link fitted to {} samples of {} and more ({} Gauss-Newton steps; {} skipped): launch \
         {launch_us:.2} us, alpha {alpha_us:.3} us, beta {beta_bytes_per_us:.0} B/us (the model's: \
         {:.2}, {:.3}, {:.0}); per block {:.0} B/us (reductions {:.0}) and {:.2} us an op. \
         **Worst simulated / measured: {:.2}x.**\n",
        fit.rows.len(),
        human(MIN_BYTES),
        fit.steps,
        fit.skipped,
        start.launch_us,
        start.alpha_us,
        start.beta_bytes_per_us,
        fit.block.bytes_per_us,
        fit.block.reduce_bytes_per_us,
        fit.block.op_us,
        fit.worst
    );
    let _ = writeln!(
        m,
        "| collective | bytes | algorithm | channels | GPU us | simulator us | simulator / GPU |"
    );
    let _ = writeln!(m, "|---|---|---|---|---|---|---|");
    for r in &fit.rows {
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} |",
            r.req.collective.name(),
            human(r.req.bytes),
            r.req.algorithm.name(),
            r.req.channels,
            r.measured_us,
            r.simulated_us,
            r.ratio()
        );
    }
    m
}

#[cfg(test)]
mod tests {
    use super::super::Kind;
    use super::*;

    /// Labels are parsed field by field; candidates win over the best-of samples; small sizes,
    /// graphs, peers and labels that name no algorithm are left out.
    #[test]
    fn samples_become_requests() {
        assert_eq!(parse_label("two_shot/64ch"), Some((Algorithm::TwoShot, 64)));
        assert_eq!(parse_label("ring/4ch 4sm"), Some((Algorithm::Ring, 4)));
        for bad in ["", "two_shot", "two_shot/64", "warp/4ch", "ring/xch"] {
            assert_eq!(parse_label(bad), None, "{bad:?}");
        }
        let s = |size, system: &str, mode: &str, us, label: &str| {
            Sample::new(Kind::AllReduce, size, system, mode, us, 0, label)
        };
        let mut v = vec![
            s(1 << 20, "symm", "eager", 15.0, "two_shot/64ch"),
            s(1 << 10, "symm", "eager", 8.0, "one_shot_ll/1ch"),
            s(1 << 20, "symm", "graph", 12.0, "two_shot/64ch"),
            s(1 << 20, "nccl", "eager", 16.0, "nccl"),
            s(4 << 20, "symm", "eager", 27.0, "bogus"),
        ];
        let best = fit_samples(2, &v);
        assert_eq!(best.len(), 1);
        assert_eq!(best[0].req.algorithm, Algorithm::TwoShot);
        assert_eq!((best[0].req.channels, best[0].measured_us), (64, 15.0));
        v.push(s(1 << 20, CANDIDATE, "eager", 20.0, "ring/16ch"));
        v.push(s(1 << 20, CANDIDATE, "eager", 15.0, "two_shot/64ch"));
        let all = fit_samples(2, &v);
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].req.algorithm, Algorithm::Ring);
    }

    /// The report names the fitted link and one row per sample.
    #[test]
    fn the_report_has_a_row_per_sample() {
        let v: Vec<Sample> = [1u64 << 20, 4 << 20, 16 << 20]
            .into_iter()
            .flat_map(|size| {
                [("two_shot", 1.0), ("one_shot", 1.5)].map(|(a, f)| {
                    let us = f * (10.0 + size as f64 / 300_000.0);
                    Sample::new(
                        Kind::AllReduce,
                        size,
                        CANDIDATE,
                        "eager",
                        us,
                        0,
                        &format!("{a}/4ch"),
                    )
                })
            })
            .collect();
        let (fit, md) = fit(2, Topology::Nvlink, &v).expect("fits");
        assert_eq!(fit.rows.len(), 6);
        assert_eq!(md.matches("| all_reduce |").count(), 6, "{md}");
        assert!(md.contains("Worst simulated / measured"), "{md}");
        assert!(summary(&fit).contains("6 samples"));
    }
}

//! The bench's outputs: nccl-tests columns on stdout, `bench-wN.json`, SVG plots of time and
//! bus bandwidth against size (one line per system and mode), and `bench-wN.md` (the tables
//! docs/perf.md shows).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use super::{Kind, Sample, REPORTED};

fn algbw(s: &Sample) -> f64 {
    s.size as f64 / s.us / 1e3
}

fn busbw(s: &Sample, world: u16) -> f64 {
    algbw(s) * s.kind.bus_factor(world)
}

fn human(size: u64) -> String {
    match size {
        s if s >= 1 << 30 => format!("{}G", s >> 30),
        s if s >= 1 << 20 => format!("{}M", s >> 20),
        s if s >= 1 << 10 => format!("{}K", s >> 10),
        s => s.to_string(),
    }
}

/// The (system, mode) series present, in a stable order (symm first).
fn series(samples: &[Sample]) -> Vec<(String, String)> {
    let set: BTreeSet<(u8, String, String)> = samples
        .iter()
        .map(|s| {
            let rank = match s.system.as_str() {
                "symm" => 0,
                "nccl" => 1,
                _ => 2,
            };
            (rank, s.system.clone(), s.mode.clone())
        })
        .collect();
    set.into_iter().map(|(_, a, b)| (a, b)).collect()
}

/// Prints, writes the JSON record, the plots and the markdown tables.
pub(super) fn write(world: u16, samples: &[Sample], out: &Path) -> Result<(), String> {
    print_tables(world, samples);
    let io = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    let json = out.join(format!("bench-w{world}.json"));
    std::fs::write(&json, to_json(world, samples)).map_err(|e| io(&json, e))?;
    for kind in REPORTED {
        let these: Vec<&Sample> = samples.iter().filter(|s| s.kind == kind).collect();
        if these.is_empty() {
            continue;
        }
        for (what, f) in [
            ("time", (|s: &Sample, _| s.us) as fn(&Sample, u16) -> f64),
            ("busbw", busbw as fn(&Sample, u16) -> f64),
        ] {
            let p = out.join(format!("w{world}-{}-{what}.svg", kind.name()));
            let svg = plot(world, kind, what, &these, f);
            std::fs::write(&p, svg).map_err(|e| io(&p, e))?;
        }
    }
    let md = out.join(format!("bench-w{world}.md"));
    std::fs::write(&md, markdown(world, samples)).map_err(|e| io(&md, e))?;
    println!(
        "bench: wrote {}, {} and the plots to {}",
        json.display(),
        md.display(),
        out.display()
    );
    Ok(())
}

fn print_tables(world: u16, samples: &[Sample]) {
    for kind in REPORTED {
        for (system, mode) in series(samples) {
            let rows: Vec<&Sample> = samples
                .iter()
                .filter(|s| s.kind == kind && s.system == system && s.mode == mode)
                .collect();
            if rows.is_empty() {
                continue;
            }
            println!(
                "\n# {} | {system} {mode} | world {world} | bf16 sum, out of place",
                kind.name()
            );
            println!(
                "# {:>12} {:>12} {:>6} {:>6} {:>5} {:>10} {:>8} {:>8} {:>7}  what",
                "size", "count", "type", "redop", "root", "time(us)", "algbw", "busbw", "#wrong"
            );
            for s in rows {
                let root = if kind == Kind::Broadcast { "0" } else { "-1" };
                let wrong = if s.wrong == u64::MAX {
                    "n/c".to_string()
                } else {
                    s.wrong.to_string()
                };
                println!(
                    "  {:>12} {:>12} {:>6} {:>6} {:>5} {:>10.2} {:>8.2} {:>8.2} {:>7}  {}",
                    s.size,
                    s.size / 2,
                    "bf16",
                    "sum",
                    root,
                    s.us,
                    algbw(s),
                    busbw(s, world),
                    wrong,
                    s.label
                );
            }
        }
    }
}

fn to_json(world: u16, samples: &[Sample]) -> String {
    let mut j = format!("{{\n  \"world\": {world},\n  \"dtype\": \"bf16\",\n  \"redop\": \"sum\",\n  \"samples\": [\n");
    for (i, s) in samples.iter().enumerate() {
        let wrong = if s.wrong == u64::MAX {
            "null".to_string()
        } else {
            s.wrong.to_string()
        };
        let _ = writeln!(
            j,
            "    {{\"collective\": \"{}\", \"size\": {}, \"system\": \"{}\", \"mode\": \"{}\", \"us\": {:.3}, \"algbw\": {:.3}, \"busbw\": {:.3}, \"wrong\": {wrong}, \"what\": \"{}\"}}{}",
            s.kind.name(),
            s.size,
            s.system,
            s.mode,
            s.us,
            algbw(s),
            busbw(s, world),
            s.label,
            if i + 1 < samples.len() { "," } else { "" }
        );
    }
    j.push_str("  ]\n}\n");
    j
}

/// Per collective: time (us) per size for every series, and symm's ratio to the best peer in
/// the same mode (below 1: symm is faster).
fn markdown(world: u16, samples: &[Sample]) -> String {
    let mut m = String::new();
    let all = series(samples);
    for kind in REPORTED {
        let these: Vec<&Sample> = samples.iter().filter(|s| s.kind == kind).collect();
        if these.is_empty() {
            continue;
        }
        let cols: Vec<&(String, String)> = all
            .iter()
            .filter(|(sys, mode)| these.iter().any(|s| &s.system == sys && &s.mode == mode))
            .collect();
        let _ = writeln!(
            m,
            "\n### {} (world {world}, time per op in us, busbw GB/s)\n",
            kind.name()
        );
        let head: Vec<String> = cols.iter().map(|(s, md)| format!("{s} {md}")).collect();
        let _ = writeln!(
            m,
            "| size | {} | symm / best peer, eager | symm / best peer, graph |",
            head.join(" | ")
        );
        let _ = writeln!(m, "|---|{}---|---|", "---|".repeat(cols.len()));
        let sizes: BTreeSet<u64> = these.iter().map(|s| s.size).collect();
        for size in sizes {
            let get = |sys: &str, mode: &str| {
                these
                    .iter()
                    .find(|s| s.size == size && s.system == sys && s.mode == mode)
                    .copied()
            };
            let cells: Vec<String> = cols
                .iter()
                .map(|(sys, mode)| {
                    get(sys, mode).map_or("-".into(), |s| {
                        format!("{:.2} ({:.0})", s.us, busbw(s, world))
                    })
                })
                .collect();
            let ratio = |mode: &str| {
                let symm = get("symm", mode)?;
                let peer = these
                    .iter()
                    .filter(|s| s.size == size && s.system != "symm" && s.mode == mode)
                    .map(|s| s.us)
                    .fold(f64::MAX, f64::min);
                (peer < f64::MAX).then(|| format!("{:.2}", symm.us / peer))
            };
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} |",
                human(size),
                cells.join(" | "),
                ratio("eager").unwrap_or("-".into()),
                ratio("graph").unwrap_or("-".into())
            );
        }
    }
    m
}

/// symm-core's calibration table from the best symm eager samples (label `algorithm/Nch`).
pub(super) fn calibration(world: u16, samples: &[Sample]) -> String {
    let mut rows = Vec::new();
    for s in samples
        .iter()
        .filter(|s| s.system == "symm" && s.mode == "eager")
    {
        let Some((alg, ch)) = s.label.split_once('/') else {
            continue;
        };
        let Some(a) = symm_core::sched::Algorithm::ALL
            .into_iter()
            .find(|a| a.name() == alg)
        else {
            continue;
        };
        let Ok(ch) = ch.trim_end_matches("ch").parse::<u16>() else {
            continue;
        };
        let Some(req) = super::rank::request(s.kind, s.size, world, a, ch) else {
            continue;
        };
        rows.push((
            req.collective.name(),
            world,
            req.bytes,
            format!("{a:?}"),
            ch,
            s.us,
        ));
    }
    rows.sort_by(|x, y| (x.0, x.1, x.2).cmp(&(y.0, y.1, y.2)));
    let mut t = String::from(
        "//! GENERATED by `cargo xtask hw bench --calibrate` (measured on GPUs). Do not edit by hand.\n\
         //! Each entry: the fastest (algorithm, channels) symm measured for a collective at a world size\n\
         //! and a request size (`Request::bytes`), eager, one process per GPU.\n\n\
         use super::Calibrated;\n#[allow(unused_imports)]\nuse crate::sched::Algorithm::*;\n\n",
    );
    let _ = writeln!(
        t,
        "/// Where the table was measured.\npub const SOURCE: &str = \"world {world}, bf16 sum, one process per GPU, {} entries\";\n",
        rows.len()
    );
    t.push_str("/// The entries, sorted by (collective, world, bytes).\n#[rustfmt::skip]\npub const TABLE: &[Calibrated] = &[\n");
    for (c, w, bytes, a, ch, us) in rows {
        let _ = writeln!(
            t,
            "    Calibrated {{ collective: \"{c}\", world: {w}, bytes: {bytes}, algorithm: {a}, channels: {ch}, us: {us:.2} }},"
        );
    }
    t.push_str("];\n");
    t
}

const COLORS: [&str; 8] = [
    "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
];

/// A log-x plot of `f` against size, one polyline per series (log y for time).
fn plot(
    world: u16,
    kind: Kind,
    what: &str,
    samples: &[&Sample],
    f: fn(&Sample, u16) -> f64,
) -> String {
    let (w, h, l, r, t, b) = (720.0, 420.0, 70.0, 190.0, 40.0, 50.0);
    let sizes: Vec<u64> = samples
        .iter()
        .map(|s| s.size)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let (xmin, xmax) = (
        (*sizes.first().unwrap_or(&1) as f64).log2(),
        (*sizes.last().unwrap_or(&2) as f64).log2().max(1.0),
    );
    let vals: Vec<f64> = samples
        .iter()
        .map(|s| f(s, world))
        .filter(|v| *v > 0.0)
        .collect();
    let log_y = what == "time";
    let (ylo, yhi) = if log_y {
        let lo = vals
            .iter()
            .copied()
            .fold(f64::MAX, f64::min)
            .max(1e-3)
            .log10()
            .floor();
        let hi = vals
            .iter()
            .copied()
            .fold(0.0, f64::max)
            .max(1e-3)
            .log10()
            .ceil();
        (lo, hi.max(lo + 1.0))
    } else {
        let hi = vals.iter().copied().fold(0.0, f64::max);
        let step = if hi > 200.0 {
            100.0
        } else if hi > 40.0 {
            20.0
        } else {
            5.0
        };
        (0.0, ((hi / step).ceil() * step).max(step))
    };
    let px = |size: u64| {
        let x = (size as f64).log2();
        l + (x - xmin) / (xmax - xmin).max(1e-9) * (w - l - r)
    };
    let py = |v: f64| {
        let y = if log_y { v.max(1e-3).log10() } else { v };
        h - b - (y - ylo) / (yhi - ylo).max(1e-9) * (h - t - b)
    };
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let title = if log_y {
        "time per op (us, log scale)"
    } else {
        "bus bandwidth (GB/s)"
    };
    let _ = writeln!(
        s,
        "<text x=\"{l}\" y=\"24\" font-size=\"14\">{} — {title}, world {world}, bf16</text>",
        kind.name()
    );
    // Axes and grid.
    for &size in &sizes {
        let x = px(size);
        let _ = writeln!(
            s,
            "<line x1=\"{x:.1}\" y1=\"{t}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#eee\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            h - b,
            h - b + 16.0,
            human(size)
        );
    }
    let ticks: Vec<f64> = if log_y {
        (ylo as i32..=yhi as i32).map(|e| 10f64.powi(e)).collect()
    } else {
        let step = (yhi - ylo) / 5.0;
        (0..=5).map(|i| ylo + step * i as f64).collect()
    };
    for v in ticks {
        let y = py(v);
        let _ = writeln!(
            s,
            "<line x1=\"{l}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            w - r,
            l - 6.0,
            y + 4.0,
            if v >= 1.0 { format!("{v:.0}") } else { format!("{v}") }
        );
    }
    let _ = writeln!(
        s,
        "<line x1=\"{l}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"black\"/><line x1=\"{l}\" y1=\"{t}\" x2=\"{l}\" y2=\"{:.1}\" stroke=\"black\"/>",
        h - b,
        w - r,
        h - b,
        h - b
    );
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">message size (bytes, nccl-tests convention)</text>",
        (l + w - r) / 2.0,
        h - 12.0
    );
    let owned: Vec<Sample> = samples.iter().map(|s| (*s).clone()).collect();
    for (i, (sys, mode)) in series(&owned).iter().enumerate() {
        let mut pts: Vec<&&Sample> = samples
            .iter()
            .filter(|s| &s.system == sys && &s.mode == mode && f(s, world) > 0.0)
            .collect();
        pts.sort_by_key(|s| s.size);
        if pts.is_empty() {
            continue;
        }
        let color = COLORS[i % COLORS.len()];
        let dash = if mode == "graph" {
            " stroke-dasharray=\"5,3\""
        } else {
            ""
        };
        let path: Vec<String> = pts
            .iter()
            .map(|s| format!("{:.1},{:.1}", px(s.size), py(f(s, world))))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash} points=\"{}\"/>",
            path.join(" ")
        );
        let ly = t + 16.0 * i as f64 + 10.0;
        let _ = writeln!(
            s,
            "<line x1=\"{:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{color}\" stroke-width=\"2\"{dash}/><text x=\"{:.1}\" y=\"{:.1}\">{sys} {mode}</text>",
            w - r + 10.0,
            w - r + 34.0,
            w - r + 40.0,
            ly + 4.0
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn samples() -> Vec<Sample> {
        let mut v = Vec::new();
        for (i, size) in [1u64 << 10, 1 << 20, 1 << 28].into_iter().enumerate() {
            let t = 10.0 * (i as f64 + 1.0);
            v.push(Sample::new(
                Kind::AllReduce,
                size,
                "symm",
                "eager",
                t,
                0,
                "two_shot/1ch",
            ));
            v.push(Sample::new(
                Kind::AllReduce,
                size,
                "nccl",
                "eager",
                2.0 * t,
                u64::MAX,
                "nccl",
            ));
        }
        v
    }

    #[test]
    fn outputs_carry_the_measurements() {
        let s = samples();
        let md = markdown(2, &s);
        assert!(
            md.contains("| 1K | 10.00 (0) | 20.00 (0) | 0.50 | - |"),
            "{md}"
        );
        let j = to_json(2, &s);
        assert!(
            j.contains("\"size\": 268435456, \"system\": \"symm\""),
            "{j}"
        );
        assert!(j.contains("\"wrong\": null"));
        let svg = plot(
            2,
            Kind::AllReduce,
            "time",
            &s.iter().collect::<Vec<_>>(),
            |s, _| s.us,
        );
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("symm eager") && svg.contains("nccl eager"));
        let line = s[0].line();
        assert_eq!(Sample::parse(&line), Some(s[0].clone()));
        // Lines from a rank's file or the PyTorch script's output are checked field by field.
        for bad in [
            "",
            "all_reduce\t1024",
            "frobnicate\t1024\tsymm\teager\t1.0\t0\tx",
            "all_reduce\t-1\tsymm\teager\t1.0\t0\tx",
            "all_reduce\t1024\tsymm\teager\tNaNx\t0\tx",
            "all_reduce\t1024\tsymm\teager\t1.0\t0\tx\textra",
        ] {
            assert_eq!(Sample::parse(bad), None, "{bad:?}");
        }
    }
}

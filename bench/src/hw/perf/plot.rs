//! SVG plots of the bench: time and bus bandwidth against size (one line per system and mode),
//! and symm's time over the best peer's in the same mode against size.
//!
//! Every series of a plot has its own (colour, marker); symm's lines are drawn heavier than the
//! peers'; graph-mode lines are dashed.

use std::collections::BTreeSet;
use std::fmt::Write as _;

use super::report::{human, series};
use super::{Kind, Sample};

/// Colours of the series, in order (10, coprime with the count of markers).
const COLORS: [&str; 10] = [
    "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
    "#7f7f7f", "#bcbd22",
];

/// Marker shapes of the series, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Marker {
    Circle,
    Square,
    Triangle,
    Diamond,
    Cross,
    Star,
    Plus,
}

const MARKERS: [Marker; 7] = [
    Marker::Circle,
    Marker::Square,
    Marker::Triangle,
    Marker::Diamond,
    Marker::Cross,
    Marker::Star,
    Marker::Plus,
];

/// The (colour, marker) of series `i`: distinct for the first 70 series of a plot.
pub(super) fn style(i: usize) -> (&'static str, Marker) {
    (COLORS[i % COLORS.len()], MARKERS[i % MARKERS.len()])
}

/// One line of a plot.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Line {
    /// Legend text.
    pub name: String,
    /// (size, value) points, by size.
    pub points: Vec<(u64, f64)>,
    /// symm's lines are drawn heavier.
    pub heavy: bool,
    /// Graph-mode lines are dashed.
    pub dashed: bool,
}

/// The lines of `f` against size, one per (system, mode) of `samples`.
pub(super) fn lines(samples: &[&Sample], world: u16, f: fn(&Sample, u16) -> f64) -> Vec<Line> {
    let owned: Vec<Sample> = samples.iter().map(|s| (*s).clone()).collect();
    series(&owned)
        .into_iter()
        .filter_map(|(sys, mode)| {
            let mut points: Vec<(u64, f64)> = samples
                .iter()
                .filter(|s| s.system == sys && s.mode == mode)
                .map(|s| (s.size, f(s, world)))
                .filter(|&(_, v)| v > 0.0 && v.is_finite())
                .collect();
            points.sort_by_key(|p| p.0);
            (!points.is_empty()).then(|| Line {
                heavy: sys == "symm",
                dashed: mode == "graph",
                name: format!("{sys} {mode}"),
                points,
            })
        })
        .collect()
}

/// Per mode: symm's time over the fastest peer's (any other system, same mode and size), at
/// every size where both were measured. Below 1: symm is faster.
pub(super) fn ratios(samples: &[&Sample]) -> Vec<Line> {
    let modes: BTreeSet<&str> = samples.iter().map(|s| s.mode.as_str()).collect();
    let mut out = Vec::new();
    for mode in modes {
        let mut points = Vec::new();
        for symm in samples
            .iter()
            .filter(|s| s.system == "symm" && s.mode == mode)
        {
            let best = samples
                .iter()
                .filter(|s| !s.system.starts_with("symm") && s.mode == mode && s.size == symm.size)
                .map(|s| s.us)
                .filter(|&us| us > 0.0)
                .fold(f64::INFINITY, f64::min);
            if best.is_finite() && symm.us > 0.0 {
                points.push((symm.size, symm.us / best));
            }
        }
        points.sort_by_key(|p| p.0);
        if !points.is_empty() {
            out.push(Line {
                name: format!("symm / best peer, {mode}"),
                points,
                heavy: true,
                dashed: mode == "graph",
            });
        }
    }
    out
}

/// What the y axis shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Axis {
    /// Time per op, log scale.
    Time,
    /// Bus bandwidth, linear from 0.
    Busbw,
    /// A ratio, log scale, with a reference line at 1.
    Ratio,
}

impl Axis {
    fn title(self) -> &'static str {
        match self {
            Axis::Time => "time per op (us, log scale)",
            Axis::Busbw => "bus bandwidth (GB/s)",
            Axis::Ratio => "symm time / best peer's (log scale; below 1: symm faster)",
        }
    }
}

/// The marker of one point as SVG.
fn marker(m: Marker, x: f64, y: f64, color: &str) -> String {
    let r = 4.0;
    let pts = |p: &[(f64, f64)]| -> String {
        p.iter()
            .map(|(a, b)| format!("{:.1},{:.1}", x + a, y + b))
            .collect::<Vec<_>>()
            .join(" ")
    };
    match m {
        Marker::Circle => format!("<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"{r}\" fill=\"{color}\"/>"),
        Marker::Square => format!(
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{}\" height=\"{}\" fill=\"{color}\"/>",
            x - r,
            y - r,
            2.0 * r,
            2.0 * r
        ),
        Marker::Triangle => format!(
            "<polygon points=\"{}\" fill=\"{color}\"/>",
            pts(&[(0.0, -r - 1.0), (r + 1.0, r), (-r - 1.0, r)])
        ),
        Marker::Diamond => format!(
            "<polygon points=\"{}\" fill=\"{color}\"/>",
            pts(&[(0.0, -r - 1.0), (r + 1.0, 0.0), (0.0, r + 1.0), (-r - 1.0, 0.0)])
        ),
        Marker::Cross => format!(
            "<path d=\"M{:.1} {:.1}L{:.1} {:.1}M{:.1} {:.1}L{:.1} {:.1}\" stroke=\"{color}\" stroke-width=\"2\"/>",
            x - r, y - r, x + r, y + r, x - r, y + r, x + r, y - r
        ),
        Marker::Star => format!(
            "<polygon points=\"{}\" fill=\"{color}\"/>",
            pts(&(0..10)
                .map(|k| {
                    let a = std::f64::consts::PI * k as f64 / 5.0 - std::f64::consts::FRAC_PI_2;
                    let rr = if k % 2 == 0 { r + 1.5 } else { r / 2.0 };
                    (rr * a.cos(), rr * a.sin())
                })
                .collect::<Vec<_>>())
        ),
        Marker::Plus => format!(
            "<path d=\"M{:.1} {y:.1}H{:.1}M{x:.1} {:.1}V{:.1}\" stroke=\"{color}\" stroke-width=\"2\"/>",
            x - r - 1.0,
            x + r + 1.0,
            y - r - 1.0,
            y + r + 1.0
        ),
    }
}

/// A log-x plot of `lines` against size.
pub(super) fn svg(world: u16, kind: Kind, axis: Axis, lines: &[Line]) -> String {
    let (w, h, l, r, t, b) = (760.0, 420.0, 70.0, 230.0, 40.0, 50.0);
    let sizes: Vec<u64> = lines
        .iter()
        .flat_map(|x| x.points.iter().map(|p| p.0))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let (xmin, xmax) = (
        (*sizes.first().unwrap_or(&1) as f64).log2(),
        (*sizes.last().unwrap_or(&2) as f64).log2().max(1.0),
    );
    let mut vals: Vec<f64> = lines
        .iter()
        .flat_map(|x| x.points.iter().map(|p| p.1))
        .filter(|v| *v > 0.0 && v.is_finite())
        .collect();
    if axis == Axis::Ratio {
        vals.push(1.0);
    }
    let log_y = axis != Axis::Busbw;
    let (ylo, yhi) = if log_y {
        let lo = vals.iter().copied().fold(f64::MAX, f64::min).max(1e-3);
        let hi = vals.iter().copied().fold(0.0, f64::max).max(1e-3);
        let (lo, hi) = (lo.log10().floor(), hi.log10().ceil());
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
    let _ = writeln!(
        s,
        "<text x=\"{l}\" y=\"24\" font-size=\"14\">{} — {}, world {world}, bf16</text>",
        kind.name(),
        axis.title()
    );
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
    if axis == Axis::Ratio {
        let y = py(1.0);
        let _ = writeln!(
            s,
            "<line x1=\"{l}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"black\" stroke-dasharray=\"2,2\"/>",
            w - r
        );
    }
    let _ = writeln!(
        s,
        "<line x1=\"{l}\" y1=\"{0:.1}\" x2=\"{1:.1}\" y2=\"{0:.1}\" stroke=\"black\"/><line x1=\"{l}\" y1=\"{t}\" x2=\"{l}\" y2=\"{0:.1}\" stroke=\"black\"/>",
        h - b,
        w - r,
    );
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">message size (bytes, nccl-tests convention)</text>",
        (l + w - r) / 2.0,
        h - 12.0
    );
    for (i, line) in lines.iter().enumerate() {
        let (color, m) = style(i);
        let dash = if line.dashed {
            " stroke-dasharray=\"6,3\""
        } else {
            ""
        };
        let width = if line.heavy { 3.5 } else { 1.5 };
        let path: Vec<String> = line
            .points
            .iter()
            .map(|&(x, v)| format!("{:.1},{:.1}", px(x), py(v)))
            .collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"{width}\"{dash} points=\"{}\"/>",
            path.join(" ")
        );
        for &(x, v) in &line.points {
            s.push_str(&marker(m, px(x), py(v), color));
            s.push('\n');
        }
        let ly = t + 18.0 * i as f64 + 10.0;
        let _ = writeln!(
            s,
            "<line x1=\"{:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{color}\" stroke-width=\"{width}\"{dash}/>{}<text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            w - r + 10.0,
            w - r + 40.0,
            marker(m, w - r + 25.0, ly, color),
            w - r + 46.0,
            ly + 4.0,
            line.name
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(size: u64, system: &str, mode: &str, us: f64) -> Sample {
        Sample::new(Kind::AllReduce, size, system, mode, us, 0, "x")
    }

    #[test]
    fn every_series_has_its_own_colour_and_marker() {
        let systems = [
            "symm",
            "nccl",
            "torch-one-shot",
            "torch-two-shot",
            "torch-nccl",
        ];
        let mut v = Vec::new();
        for sys in systems {
            for mode in ["eager", "graph"] {
                v.push(sample(1 << 10, sys, mode, 3.0));
                v.push(sample(1 << 20, sys, mode, 30.0));
            }
        }
        let refs: Vec<&Sample> = v.iter().collect();
        let ls = lines(&refs, 2, |s, _| s.us);
        assert_eq!(ls.len(), 10);
        let styles: BTreeSet<(&str, String)> = (0..ls.len())
            .map(|i| {
                let (c, m) = style(i);
                (c, format!("{m:?}"))
            })
            .collect();
        assert_eq!(styles.len(), ls.len(), "a (colour, marker) is shared");
        // Colours alone differ too for up to 10 series (symm and torch two-shot no longer share).
        let colours: BTreeSet<&str> = (0..ls.len()).map(|i| style(i).0).collect();
        assert_eq!(colours.len(), ls.len());
        // Far beyond one plot's series the pairs stay distinct.
        let many: BTreeSet<(usize, usize)> = (0..70)
            .map(|i| (i % COLORS.len(), i % MARKERS.len()))
            .collect();
        assert_eq!(many.len(), 70);
        let svg = svg(2, Kind::AllReduce, Axis::Time, &ls);
        assert_eq!(svg.matches("<polyline").count(), 10);
        // symm's lines are the heavy ones, peers' are not.
        assert_eq!(svg.matches("stroke-width=\"3.5\"").count(), 2 * 2);
        assert!(ls.iter().all(|l| l.heavy == l.name.starts_with("symm ")));
        for (i, _) in ls.iter().enumerate() {
            assert!(svg.contains(style(i).0));
        }
    }

    #[test]
    fn the_ratio_is_symm_over_the_best_peer() {
        let v = vec![
            sample(1 << 10, "symm", "eager", 4.0),
            sample(1 << 10, "nccl", "eager", 8.0),
            sample(1 << 10, "torch-two-shot", "eager", 5.0),
            sample(1 << 20, "symm", "eager", 30.0),
            sample(1 << 20, "nccl", "eager", 20.0),
            sample(1 << 20, "symm", "graph", 9.0),
            sample(1 << 20, "nccl", "graph", 3.0),
            // No peer at this size: no point.
            sample(1 << 28, "symm", "eager", 1000.0),
            // A peer in another mode is not compared.
            sample(1 << 10, "nccl", "graph", 1.0),
        ];
        let refs: Vec<&Sample> = v.iter().collect();
        let r = ratios(&refs);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].name, "symm / best peer, eager");
        assert_eq!(
            r[0].points,
            vec![(1 << 10, 4.0 / 5.0), (1 << 20, 30.0 / 20.0)]
        );
        assert_eq!(r[1].name, "symm / best peer, graph");
        assert_eq!(r[1].points, vec![(1 << 20, 3.0)]);
        let svg = svg(2, Kind::AllReduce, Axis::Ratio, &r);
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("stroke-dasharray=\"2,2\""), "the line at 1");
        // Nothing to compare: no line, and the plot still draws.
        assert!(ratios(&refs[7..8]).is_empty());
    }
}
